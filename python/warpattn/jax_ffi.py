"""warpattn for JAX inside jax.jit: XLA FFI custom calls that run on XLA's own stream.

    from warpattn import jax_ffi
    out = jax.jit(jax_ffi.flash_attn, static_argnames="causal")(q, k, v, causal=True)
    dq, dk, dv = jax.grad(lambda q, k, v: jax_ffi.flash_attn(q, k, v).sum(), argnums=(0, 1, 2))(q, k, v)
    out = jax.jit(lambda q, k, v: jax_ffi.flash_attn_fp8(jax_ffi.quantize_fp8(q, k, v), causal=True))(q, k, v)

The kernels are registered with XLA (jax.ffi.register_ffi_target, platform "CUDA") as seven
custom calls: warpattn_forward, warpattn_backward, warpattn_forward_varlen,
warpattn_backward_varlen, FP8's warpattn_quantize_fp8 and warpattn_forward_fp8 (forward
only: FP8 has no backward), and warpattn_forward_kvcache (flash_attn_with_kvcache: inference
only, the grown caches returned). XLA hands them its buffers and its stream: nothing is copied, nothing
waits for the host, and the calls compose with jax.jit, jax.grad (jax.custom_vjp over the
forward and backward calls; the sliding window, softcap and sinks included, the sinks getting
their gradient from the backward call's dsinks result) and jax.vmap. Shapes and dtypes are
checked when the call is traced, with the C++ library's messages (ValueError), so a bad call
fails in jax.jit's tracing rather than on the device. The backward's workspace (dQ's fp32
accumulator) is an output of its XLA call, sized at trace time: XLA allocates it per call like
any temporary, so two jitted programs never share it. The forward's scheduler memory comes from
the library's stream-ordered pool, per launch (see warpattn.hpp).

vmap: over the dense calls a mapped axis is more batch (the handler folds the leading axes
into the batch axis, no copy; an operand that is not mapped is broadcast first, which copies
it). Over the packed (varlen) calls vmap runs the calls one after the other (lax.map), and so
it does over quantize_fp8 with per_tensor scaling, whose one descale per tensor must not span
the mapped examples.

The FP8 forward does not read its descales back (the library's check_descales would wait for
XLA's stream from inside the call): flash_attn_fp8 checks concrete descales on the host before
the call instead, and traced ones (under jax.jit) are not checked; quantize_fp8's are valid by
construction.

Needs a build of warpattn that found jaxlib's FFI headers (jax importable when the package was
built); available() says whether this one did. Importing this module imports JAX, then the
handlers' module warpattn._warpattn_jax (in that order: see python/src/jax_module.cpp).
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from .api import _check_rank, _scale, _window
from .fp8 import Fp8Operands, _blocks, _dtype_name, _qk_int8
from .varlen import _batch_size
from .varlen import _check_rank as _check_packed_rank

FORWARD = "warpattn_forward"
BACKWARD = "warpattn_backward"
FORWARD_VARLEN = "warpattn_forward_varlen"
BACKWARD_VARLEN = "warpattn_backward_varlen"
QUANTIZE_FP8 = "warpattn_quantize_fp8"
FORWARD_FP8 = "warpattn_forward_fp8"
FORWARD_KVCACHE = "warpattn_forward_kvcache"
TARGETS = (FORWARD, BACKWARD, FORWARD_VARLEN, BACKWARD_VARLEN, QUANTIZE_FP8, FORWARD_FP8, FORWARD_KVCACHE)

_UNAVAILABLE = (
    "warpattn.jax_ffi: this build of warpattn has no XLA FFI handlers (jax was not importable when the "
    "package was built, so jaxlib's FFI headers were not found; or CMake had WARPATTN_JAX_FFI=OFF). "
    "Install jax, then rebuild: "
    "pip install --no-build-isolation . (with scikit-build-core and nanobind installed), or "
    "pip install . -Ccmake.define.WARPATTN_JAX_INCLUDE_DIR=$(python -c 'import jax.ffi; print(jax.ffi.include_dir())')")


try:  # after JAX: python/src/jax_module.cpp says why the handlers are a module of their own
    from . import _warpattn_jax as _handlers
except ImportError:
    _handlers = None


def available():
    """True if this build of warpattn has the XLA FFI handlers."""
    return _handlers is not None


@functools.lru_cache(maxsize=None)
def register():
    """Registers the custom calls (TARGETS) with XLA for the CUDA platform (once; every call here
    does it first). RuntimeError if this build has no FFI handlers."""
    if not available():
        raise RuntimeError(_UNAVAILABLE)
    for name, capsule in _handlers.jax_ffi_targets().items():
        jax.ffi.register_ffi_target(name, capsule, platform="CUDA")
    return True


# ------------------------------------------------------------------------- the FFI calls

def _spec(x):
    """(shape, dtype name) of an array, a tracer or a ShapeDtypeStruct: what validation takes."""
    return tuple(int(d) for d in x.shape), np.dtype(x.dtype).name


def _model(window_size=(-1, -1), softcap=0.0):
    """The calls' model options other than the sinks (an operand): (window_left, window_right,
    softcap), static (hashable: nondiff arguments of the custom VJPs)."""
    return _window(window_size) + (float(softcap),)


def _attrs(scale, causal, batch_invariant=None, deterministic=None, max_seqlens=None, model=None):
    """The call's attributes, typed as the handlers bind them (f32, pred, s32, s64). model: a
    _model(), for the 16-bit calls and the FP8 forward (quantize_fp8 has no such attributes)."""
    attrs = {"causal": np.bool_(causal), "has_scale": np.bool_(scale is not None),
             "softmax_scale": np.float32(0.0 if scale is None else scale)}
    if batch_invariant is not None:
        attrs["batch_invariant"] = np.bool_(batch_invariant)
    if deterministic is not None:
        attrs["deterministic"] = np.bool_(deterministic)
    if max_seqlens is not None:
        attrs["max_seqlen_q"], attrs["max_seqlen_k"] = (np.int64(n) for n in max_seqlens)
    if model is not None:
        attrs["window_left"], attrs["window_right"] = np.int32(model[0]), np.int32(model[1])
        attrs["softcap"] = np.float32(model[2])
    return attrs


def _with_sinks(operands, sinks):
    return tuple(operands) + (() if sinks is None else (sinks,))


def _forward_batching(sinks):
    """ffi_call's vmap method for a dense call (forward or backward): mapped axes folded into the
    batch, except with sinks, which would then be folded too (the handler could not tell sinks
    shared by the mapped examples from sinks of each): then one call per example."""
    return "broadcast_all" if sinks is None else "sequential"


def _validate(target, operands, results, attrs):
    """Every argument rule of the handler's library call, checked on the shapes and dtypes
    (ValueError with the library's message)."""
    register()
    _handlers.jax_ffi_validate(target, [_spec(x) for x in operands], [_spec(r) for r in results],
                               {name: value.item() for name, value in attrs.items()})


def _call(target, operands, results, attrs, vmap_method, validated=False):
    """ffi_call of `target`, after _validate (unless the caller has done it)."""
    if not validated:
        _validate(target, operands, results, attrs)
    return jax.ffi.ffi_call(target, results, vmap_method=vmap_method)(*operands, **attrs)


def _like(x, dtype=None, shape=None):
    """A result's type: x's, with this shape and dtype. Taken from x's abstract value rather than
    made anew so that it keeps what shard_map's manual axes say of x (which of them it varies
    over): a result that did not would not match its operand's type, and jax.custom_vjp refuses
    a gradient whose type is not that of its primal."""
    return jax.typeof(x).update(shape=x.shape if shape is None else tuple(shape),
                                dtype=x.dtype if dtype is None else jnp.dtype(dtype), weak_type=False)


def _forward(q, k, v, sinks, scale, causal, batch_invariant, model, with_lse):
    results = [_like(q, shape=q.shape[:-1] + v.shape[-1:])]  # out: v's head dim
    if with_lse:
        results.append(_like(q, jnp.float32, (q.shape[0], q.shape[2], q.shape[1])))
    outs = _call(FORWARD, _with_sinks((q, k, v), sinks), results, _attrs(scale, causal, batch_invariant, model=model),
                 _forward_batching(sinks))
    return (outs[0], outs[1]) if with_lse else (outs[0], None)


def _workspace_bytes(target, q, batch, attrs, sinks):
    """The backward call's workspace result's bytes (more with sinks: their gradient's partial sums)."""
    register()
    attrs = {n: a.item() for n, a in attrs.items()}
    attrs["has_sinks"] = sinks is not None
    return _handlers.jax_ffi_workspace_bytes(target, _spec(q), batch, attrs)


def _backward_results(q, k, v, sinks, workspace):
    """dq, dk, dv, the workspace, and with sinks dsinks (float32 (heads,), typed as the sinks: the
    cotangent custom_vjp takes for them)."""
    results = [_like(q), _like(k), _like(v), _like(q, jnp.uint8, (workspace,))]
    return results + ([] if sinks is None else [_like(sinks, jnp.float32)])


def _backward(dout, q, k, v, out, lse, sinks, scale, causal, deterministic, batch_invariant, model):
    """dq, dk, dv and dsinks (None without sinks)."""
    attrs = _attrs(scale, causal, batch_invariant, deterministic, model=model)
    workspace = _workspace_bytes(BACKWARD, q, 0, attrs, sinks)
    outs = _call(BACKWARD, _with_sinks((dout, q, k, v, out, lse), sinks), _backward_results(q, k, v, sinks, workspace),
                 attrs, _forward_batching(sinks))
    return outs[0], outs[1], outs[2], (outs[4] if sinks is not None else None)


def _forward_varlen(q, k, v, offsets, sinks, max_seqlens, scale, causal, batch_invariant, model, with_lse):
    results = [_like(q, shape=q.shape[:-1] + v.shape[-1:])]  # out: v's head dim
    if with_lse:
        results.append(_like(q, jnp.float32, (q.shape[1], q.shape[0])))
    operands = _with_sinks((q, k, v) + tuple(o for o in offsets if o is not None), sinks)
    attrs = _attrs(scale, causal, batch_invariant, max_seqlens=max_seqlens, model=model)
    # Which of the two optional operands came (the handler's varlen_optionals).
    attrs["has_sinks"] = np.bool_(sinks is not None)
    outs = _call(FORWARD_VARLEN, operands, results, attrs, "sequential")
    return (outs[0], outs[1]) if with_lse else (outs[0], None)


def _backward_varlen(dout, q, k, v, out, lse, offsets, sinks, max_seqlens, scale, causal, deterministic,
                     batch_invariant, model):
    """dq, dk, dv and dsinks (None without sinks)."""
    attrs = _attrs(scale, causal, batch_invariant, deterministic, max_seqlens, model=model)
    workspace = _workspace_bytes(BACKWARD_VARLEN, q, _batch_size(offsets[0]), attrs, sinks)
    operands = _with_sinks((dout, q, k, v, out, lse) + tuple(o for o in offsets if o is not None), sinks)
    # Which of the two optional operands came (the handler's varlen_optionals), as the forward's.
    attrs["has_sinks"] = np.bool_(sinks is not None)
    outs = _call(BACKWARD_VARLEN, operands, _backward_results(q, k, v, sinks, workspace), attrs, "sequential")
    return outs[0], outs[1], outs[2], (outs[4] if sinks is not None else None)


# ------------------------------------------------------------------------- differentiation

_LSE_GRADIENT = ("lse: warpattn's backward has no term for a gradient of lse (as FlashAttention's); "
                 "apply jax.lax.stop_gradient to lse before using it in what is differentiated")


def _is_zero(t):
    return isinstance(t, jax.custom_derivatives.SymbolicZero)


def _cotangent_out(cotangents, out, return_lse):
    """dout from the cotangents of (out[, lse]): a symbolic zero becomes zeros; a gradient of lse
    is refused when traced (NotImplementedError)."""
    dout, dlse = cotangents if return_lse else (cotangents, None)
    if return_lse and not _is_zero(dlse):
        raise NotImplementedError(_LSE_GRADIENT)
    return jnp.zeros(out.shape, out.dtype) if _is_zero(dout) else dout


def _values(*primals):
    return tuple(None if p is None else p.value for p in primals)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7, 8, 9))
def _attention(q, k, v, sinks, scale, causal, return_lse, deterministic, batch_invariant, model):
    out, lse = _forward(q, k, v, sinks, scale, causal, batch_invariant, model, return_lse)
    return (out, lse) if return_lse else out


def _attention_fwd(q, k, v, sinks, scale, causal, return_lse, deterministic, batch_invariant, model):
    q, k, v, sinks = _values(q, k, v, sinks)
    _check_on_gpu(q=q, k=k, v=v)  # concrete here under an eager jax.grad, where flash_attn saw tracers
    out, lse = _forward(q, k, v, sinks, scale, causal, batch_invariant, model, True)
    return ((out, lse) if return_lse else out), (q, k, v, out, lse, sinks)


def _attention_bwd(scale, causal, return_lse, deterministic, batch_invariant, model, residuals, cotangents):
    q, k, v, out, lse, sinks = residuals
    dout = _cotangent_out(cotangents, out, return_lse)
    # dq, dk, dv, and the sinks' cotangent (None: no sinks).
    return _backward(dout, q, k, v, out, lse, sinks, scale, causal, deterministic, batch_invariant, model)


_attention.defvjp(_attention_fwd, _attention_bwd, symbolic_zeros=True)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9, 10, 11, 12, 13))
def _attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, sinks, max_seqlens, scale, causal, return_lse,
                      deterministic, batch_invariant, model):
    out, lse = _forward_varlen(q, k, v, (cu_seqlens_q, cu_seqlens_k, seqused_k), sinks, max_seqlens, scale, causal,
                               batch_invariant, model, return_lse)
    return (out, lse) if return_lse else out


def _attention_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, sinks, max_seqlens, scale, causal,
                          return_lse, deterministic, batch_invariant, model):
    q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, sinks = _values(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                                                    sinks)
    _check_on_gpu(q=q, k=k, v=v)
    offsets = (cu_seqlens_q, cu_seqlens_k, seqused_k)
    out, lse = _forward_varlen(q, k, v, offsets, sinks, max_seqlens, scale, causal, batch_invariant, model, True)
    return ((out, lse) if return_lse else out), (q, k, v, out, lse, offsets, sinks)


def _attention_varlen_bwd(max_seqlens, scale, causal, return_lse, deterministic, batch_invariant, model, residuals,
                          cotangents):
    q, k, v, out, lse, offsets, sinks = residuals
    dout = _cotangent_out(cotangents, out, return_lse)
    dq, dk, dv, dsinks = _backward_varlen(dout, q, k, v, out, lse, offsets, sinks, max_seqlens, scale, causal,
                                          deterministic, batch_invariant, model)
    return dq, dk, dv, None, None, None, dsinks  # the offsets are integers: no gradient


_attention_varlen.defvjp(_attention_varlen_fwd, _attention_varlen_bwd, symbolic_zeros=True)


# ------------------------------------------------------------------------- the API

def _check_on_gpu(**arrays):
    """TypeError for a concrete array that is not on a GPU (under jax.jit the arrays are abstract,
    and XLA reports a call on another platform: no handler for it)."""
    for name, a in arrays.items():
        if isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer):
            platforms = sorted({d.platform for d in a.devices()})
            if platforms != ["gpu"]:
                raise TypeError("%s: CUDA tensor required (warpattn runs on the GPU), got a JAX array on %s"
                                % (name, ", ".join(platforms)))


def _static_lengths(max_seqlen_q, max_seqlen_k):
    """The max_seqlen values: Python ints (attributes of the XLA call, fixed when it is traced;
    the library checks them >= 0 and does not otherwise need them)."""
    lengths = []
    for name, x in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(x, jax.core.Tracer):
            raise TypeError("%s: expected a Python int (an attribute of the XLA call, fixed when it is traced), "
                            "got a traced value" % name)
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
            raise TypeError("%s: expected a Python int, got %s.%s" % (name, type(x).__module__, type(x).__name__))
        lengths.append(int(x))
    return tuple(lengths)


def flash_attn(q, k, v, softmax_scale=None, causal=False, return_lse=False, deterministic=False,
               batch_invariant=False, window_size=(-1, -1), softcap=0.0, sinks=None):
    """softmax(softmax_scale q k^T [+ causal mask, bottom-right]) v on JAX arrays on a CUDA
    device, eagerly or under jax.jit, differentiable in q, k and v (jax.grad, jax.vjp).

    q: (batch, seqlen_q, heads, head_dim); k, v: (batch, seqlen_k, heads_kv, head_dim), heads a
    multiple of heads_kv (GQA/MQA); float16 or bfloat16; head_dim a multiple of 8 from 8 to 256. softmax_scale
    (default 1/sqrt(head_dim)), causal, return_lse, deterministic and batch_invariant are static
    (Python values). Returns out, or (out, lse) with return_lse, lse (batch, heads, seqlen_q)
    float32; lse takes no gradient (NotImplementedError when traced for one: stop_gradient it).
    deterministic: the backward gives the same bits on every run (slower). batch_invariant: a
    sequence's bits do not depend on the batch around it (warpattn.flash_attn_func; implies
    deterministic). Argument errors raise ValueError with the library's message when traced.
    Under vmap, mapped axes become batch (with sinks: one call per example).
    window_size (left, right), softcap and sinks: as warpattn.flash_attn_func takes them;
    window_size and softcap static (attributes of the call), sinks a float32 (heads,) array (an
    operand), differentiable too: jax.grad gives the sinks their gradient. softcap's backward
    runs at every head dim (at 64 or less in the head-dim-128 kernel)."""
    _check_rank(q)
    _check_on_gpu(q=q, k=k, v=v, sinks=sinks)
    return _attention(q, k, v, sinks, _scale(softmax_scale), bool(causal), bool(return_lse), bool(deterministic),
                      bool(batch_invariant), _model(window_size, softcap))


def flash_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None,
                      causal=False, return_lse=False, seqused_k=None, deterministic=False, batch_invariant=False,
                      window_size=(-1, -1), softcap=0.0, sinks=None):
    """flash_attn on a packed batch of sequences of different lengths, in FlashAttention's
    conventions (see warpattn.flash_attn_varlen_func): q (total_q, heads, head_dim); k, v
    (total_k, heads_kv, head_dim); cu_seqlens_q, cu_seqlens_k (batch + 1,) int32 arrays, read on
    the device only; seqused_k optional (batch,) int32; max_seqlen_q, max_seqlen_k Python ints
    >= 0 (static). lse: (heads, total_q). Differentiable in q, k and v (and the sinks); the
    gradients are zero for rows and keys that no sequence uses. window_size, softcap and sinks as
    flash_attn's (the window per sequence)."""
    _check_packed_rank(q)
    _check_on_gpu(q=q, k=k, v=v, sinks=sinks)
    max_seqlens = _static_lengths(max_seqlen_q, max_seqlen_k)
    return _attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, sinks, max_seqlens,
                             _scale(softmax_scale), bool(causal), bool(return_lse), bool(deterministic),
                             bool(batch_invariant), _model(window_size, softcap))


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, sinks=None,
                            batch_invariant=False, num_splits=0, return_lse=False):
    """warpattn.flash_attn_with_kvcache on JAX arrays on a CUDA device, eagerly or under jax.jit:
    attention of q (batch, seqlen_q, heads, head_dim) over each sequence's KV cache, dense
    (batch, S_cache, heads_kv, head_dim) or paged (num_pages, page_size, heads_kv, head_dim) with
    block_table (batch, max_pages) int32, cache_seqlens (batch,) int32 (None: every cache full),
    read on the device only. k, v (batch, seqlen_new, heads_kv, head_dim), both or neither: appended
    at cache_seqlens before the attention. JAX arrays are immutable, so the grown caches are
    results: returns (out, k_cache, v_cache) (out: (out, lse) with return_lse); donate the caches
    (jax.jit(..., donate_argnums=...)) and XLA appends in place, else it copies them first. The
    other arguments as warpattn.flash_attn_with_kvcache's (softmax_scale, causal, window_size,
    softcap, batch_invariant and num_splits static; sinks a float32 (heads,) array). Returns out,
    or (out, lse), without k and v. Inference only: no gradient (JAX refuses to differentiate
    through the call). Under vmap, one call per example. Argument errors: ValueError with the
    library's message when traced."""
    _check_rank(q)
    _check_on_gpu(q=q, k_cache=k_cache, v_cache=v_cache, k=k, v=v, cache_seqlens=cache_seqlens,
                  block_table=block_table, sinks=sinks)
    if (k is None) != (v is None):
        raise ValueError("k, v: give both new keys and values, or neither")
    appending = k is not None
    optional = [x for x in (k, v, cache_seqlens, block_table, sinks) if x is not None]
    operands = (q, k_cache, v_cache) + tuple(optional)
    results = [_like(q, shape=q.shape[:-1] + v_cache.shape[-1:])]  # out: the caches' value head dim
    if return_lse:
        results.append(_like(q, jnp.float32, (q.shape[0], q.shape[2], q.shape[1])))
    if appending:
        results += [_like(k_cache), _like(v_cache)]
    attrs = _attrs(_scale(softmax_scale), bool(causal), bool(batch_invariant), model=_model(window_size, softcap))
    attrs.update(has_new_kv=np.bool_(appending), has_cache_seqlens=np.bool_(cache_seqlens is not None),
                 has_block_table=np.bool_(block_table is not None), has_sinks=np.bool_(sinks is not None),
                 has_lse=np.bool_(return_lse), num_splits=np.int32(num_splits))
    _validate(FORWARD_KVCACHE, operands, results, attrs)
    # The grown caches alias the cache operands (results 2-3, or 1-2 without lse).
    aliases = {1: len(results) - 2, 2: len(results) - 1} if appending else {}
    outs = jax.ffi.ffi_call(FORWARD_KVCACHE, results, vmap_method="sequential",
                            input_output_aliases=aliases)(*operands, **attrs)
    attended = (outs[0], outs[1]) if return_lse else outs[0]
    return (attended, outs[-2], outs[-1]) if appending else attended


def flash_attn_backward(dout, q, k, v, out, lse, softmax_scale=None, causal=False, deterministic=False,
                        batch_invariant=False, window_size=(-1, -1), softcap=0.0, sinks=None):
    """(dq, dk, dv) of flash_attn(q, k, v, softmax_scale, causal, ...) given dout and the forward's
    out and lse (return_lse=True): the backward call alone, for those who drive it themselves.
    window_size, softcap, sinks: the forward's; with sinks, (dq, dk, dv, dsinks), dsinks the
    sinks' gradient (float32 (heads,))."""
    _check_rank(q)
    _check_on_gpu(dout=dout, q=q, sinks=sinks)
    dq, dk, dv, dsinks = _backward(dout, q, k, v, out, lse, sinks, _scale(softmax_scale), bool(causal),
                                   bool(deterministic), bool(batch_invariant), _model(window_size, softcap))
    return (dq, dk, dv) if sinks is None else (dq, dk, dv, dsinks)


def flash_attn_varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               softmax_scale=None, causal=False, seqused_k=None, deterministic=False,
                               batch_invariant=False, window_size=(-1, -1), softcap=0.0, sinks=None):
    """(dq, dk, dv) of flash_attn_varlen(...) given dout and the forward's out and lse; rows and
    keys that no sequence uses get zero gradients. window_size, softcap, sinks: the forward's;
    with sinks, (dq, dk, dv, dsinks) as flash_attn_backward's."""
    _check_packed_rank(q)
    _check_on_gpu(dout=dout, q=q, sinks=sinks)
    max_seqlens = _static_lengths(max_seqlen_q, max_seqlen_k)
    dq, dk, dv, dsinks = _backward_varlen(dout, q, k, v, out, lse, (cu_seqlens_q, cu_seqlens_k, seqused_k), sinks,
                                          max_seqlens, _scale(softmax_scale), bool(causal), bool(deterministic),
                                          bool(batch_invariant), _model(window_size, softcap))
    return (dq, dk, dv) if sinks is None else (dq, dk, dv, dsinks)


# ------------------------------------------------------------------------- FP8

_FP8_NO_GRADIENT = ("FP8 attention has no backward (warpattn.jax_ffi.flash_attn_fp8 and quantize_fp8 are forward "
                    "only): differentiate flash_attn, or apply jax.lax.stop_gradient to the FP8 call's inputs")


def _seed(seed):
    """quantize_fp8's seed, an int in [0, 2^64), as the int64 with its bits: the XLA call's
    attribute (JAX builds integer attributes through int64, which 2^63 and above overflow)."""
    if isinstance(seed, jax.core.Tracer):
        raise TypeError("seed: expected a Python int (an attribute of the XLA call, fixed when it is traced), "
                        "got a traced value")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError("seed: expected a Python int, got %s.%s" % (type(seed).__module__, type(seed).__name__))
    if not 0 <= int(seed) < 2 ** 64:
        raise ValueError("seed: expected an int in [0, 2^64), got %d" % int(seed))
    return int(seed) - 2 ** 64 if int(seed) >= 2 ** 63 else int(seed)


def _quantize(q, k, v, rotate, seed, per_tensor, int8):
    """The call, its results shaped from q (Q's codes and descales) and k (the rest), so that a
    q and k that do not match are reported as such by the library."""
    b, sq, hq, d = q.shape
    bk, sk, hkv = k.shape[:3]
    codes = jnp.int8 if int8 else jnp.float8_e4m3fn
    results = [_like(q, codes), _like(k, codes), _like(k, jnp.float8_e4m3fn, (bk, hkv, d, (sk + 15) // 16 * 16)),
               _like(q, jnp.float32, (b, hq, _blocks(sq))), _like(k, jnp.float32, (bk, hkv, _blocks(sk))),
               _like(k, jnp.float32, (bk, hkv, _blocks(sk)))]
    attrs = {"rotate": np.bool_(rotate), "seed": np.int64(seed), "per_tensor": np.bool_(per_tensor)}
    # Per tensor, one descale spans the whole tensor: folding vmap's axis into the batch would
    # make it span every mapped example, so vmap runs those calls one after the other.
    return Fp8Operands(*_call(QUANTIZE_FP8, (q, k, v), results, attrs,
                              "sequential" if per_tensor else "broadcast_all"))


def _check_descales(ops):
    """The library's check_descales on the host for descales that are concrete arrays (one read
    back each; traced ones have no values yet): ValueError with its message for the first that
    is not finite and > 0. As the library, k's and v's only when there are keys."""
    names = ("q_descale", "k_descale", "v_descale")
    checked = names if ops.k.shape[1] > 0 else names[:1]
    for name in checked:
        d = getattr(ops, name)
        if not isinstance(d, jax.Array) or isinstance(d, jax.core.Tracer):
            continue
        host = np.asarray(d, np.float32)
        bad = np.argwhere(~(np.isfinite(host) & (host > 0)))
        if len(bad):
            at = tuple(int(i) for i in bad[0])
            raise ValueError("%s: every descale must be finite and > 0, got %g at [%s]"
                             % (name, float(host[at]), ", ".join(str(i) for i in at)))


def _forward_fp8(ops, scale, causal, out_dtype, return_lse, check_descales, sinks=None, model=_model(),
                 batch_invariant=False):
    b, sq, hq, d = ops.q.shape
    results = [_like(ops.q, out_dtype, (b, sq, hq, d))]
    if return_lse:
        results.append(_like(ops.q, jnp.float32, (b, hq, sq)))
    operands = _with_sinks(ops, sinks)
    attrs = _attrs(scale, causal, batch_invariant=batch_invariant, model=model)
    _validate(FORWARD_FP8, operands, results, attrs)
    if check_descales and b and sq and hq:  # an empty problem launches nothing, and reads none
        _check_descales(ops)
    outs = _call(FORWARD_FP8, operands, results, attrs, _forward_batching(sinks), validated=True)
    return (outs[0], outs[1]) if return_lse else outs[0]


@jax.custom_jvp
def _no_gradient(x):
    """x, refusing to be differentiated with warpattn's words (NotImplementedError) rather than
    XLA's ("the FFI call cannot be differentiated"). Its JVP runs only for an x that carries a
    tangent: stop_gradient'ed or undifferentiated inputs pass."""
    return x


@_no_gradient.defjvp
def _no_gradient_jvp(primals, tangents):
    raise NotImplementedError(_FP8_NO_GRADIENT)


def quantize_fp8(q, k, v, rotate=True, seed=0, per_tensor=False, qk_dtype="e4m3"):
    """warpattn.quantize_fp8 under jax.jit: the FP8 operands (warpattn.Fp8Operands of JAX
    arrays) of q, k, v, float16 or bfloat16 (batch, seqlen, heads, head_dim) arrays on a CUDA
    device. q and k become jnp.float8_e4m3fn codes (qk_dtype "e4m3") or jnp.int8 ("int8"; any
    spelling warpattn.quantize_fp8 takes), vt (batch, heads_kv, head_dim, seqlen_k rounded up to
    16) float8_e4m3fn, the descales (batch, heads, ceil(seqlen / 128)) float32. rotate, seed,
    per_tensor and qk_dtype are static; see warpattn.quantize_fp8 for what they do. Not
    differentiable (FP8 has no backward)."""
    int8 = _qk_int8(qk_dtype)
    if len(q.shape) != 4 or len(k.shape) != 4:
        raise ValueError("q, k: expected rank 4 (batch, seqlen, heads, head_dim)")
    _check_on_gpu(q=q, k=k, v=v)
    q, k, v = (_no_gradient(t) for t in (q, k, v))
    return _quantize(q, k, v, bool(rotate), _seed(seed), bool(per_tensor), int8)


def flash_attn_fp8(ops, softmax_scale=None, causal=False, out_dtype="bfloat16", return_lse=False,
                   check_descales=True, window_size=(-1, -1), softcap=0.0, sinks=None, batch_invariant=False):
    """warpattn.flash_attn_fp8_func under jax.jit: attention on FP8 operands (quantize_fp8's, or
    an Fp8Operands built by hand in fp8.hpp's layout, e4m3 as jnp.float8_e4m3fn). out (batch,
    seqlen_q, heads, head_dim) in out_dtype ("bfloat16" or "float16", or the jnp dtype); lse
    (batch, heads, seqlen_q) float32 with return_lse. softmax_scale, causal, out_dtype,
    return_lse and check_descales are static. check_descales: descales that are concrete
    arrays are read back and checked (finite, > 0) before the call, as the library does;
    traced ones (under jax.jit) are not. Forward only (FP8 has no backward). window_size and
    sinks as flash_attn's; softcap is refused by the library (16-bit forward only). batch_invariant
    as flash_attn's (static)."""
    if not isinstance(ops, Fp8Operands):
        ops = Fp8Operands(*ops)
    _check_rank(ops.q)
    kind = _dtype_name(out_dtype, "out_dtype", {"bfloat16", "float16"})
    _check_on_gpu(q=ops.q, k=ops.k, vt=ops.vt, q_descale=ops.q_descale, k_descale=ops.k_descale,
                  v_descale=ops.v_descale, sinks=sinks)
    ops = Fp8Operands(*(_no_gradient(t) for t in ops))
    sinks = None if sinks is None else _no_gradient(sinks)
    return _forward_fp8(ops, _scale(softmax_scale), bool(causal), jnp.dtype(kind), bool(return_lse),
                        bool(check_descales), sinks, _model(window_size, softcap), bool(batch_invariant))
