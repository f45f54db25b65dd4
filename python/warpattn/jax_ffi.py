"""warpattn for JAX inside jax.jit: XLA FFI custom calls that run on XLA's own stream.

    from warpattn import jax_ffi
    out = jax.jit(jax_ffi.flash_attn, static_argnames="causal")(q, k, v, causal=True)
    dq, dk, dv = jax.grad(lambda q, k, v: jax_ffi.flash_attn(q, k, v).sum(), argnums=(0, 1, 2))(q, k, v)

The kernels are registered with XLA (jax.ffi.register_ffi_target, platform "CUDA") as four
custom calls: warpattn_forward, warpattn_backward, warpattn_forward_varlen and
warpattn_backward_varlen. XLA hands them its buffers and its stream: nothing is copied, nothing
waits for the host, and the calls compose with jax.jit, jax.grad (jax.custom_vjp over the
forward and backward calls) and jax.vmap. Shapes and dtypes are checked when the call is traced,
with the C++ library's messages (ValueError), so a bad call fails in jax.jit's tracing rather
than on the device. The backward's workspace (dQ's fp32 accumulator) is an output of its XLA
call, sized at trace time: XLA allocates it per call like any temporary, so two jitted
programs never share it. The forward's scheduler memory comes from the library's stream-ordered
pool, per launch (see warpattn.hpp).

vmap: over the dense calls a mapped axis is more batch (the handler folds the leading axes
into the batch axis, no copy; an operand that is not mapped is broadcast first, which copies
it). Over the packed (varlen) calls vmap runs the calls one after the other (lax.map).

Needs a build of warpattn that found jaxlib's FFI headers (jax importable when the package was
built); available() says whether this one did. Importing this module imports JAX, then the
handlers' module warpattn._warpattn_jax (in that order: see python/src/jax_module.cpp).
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from .api import _check_rank, _scale
from .varlen import _batch_size
from .varlen import _check_rank as _check_packed_rank

FORWARD = "warpattn_forward"
BACKWARD = "warpattn_backward"
FORWARD_VARLEN = "warpattn_forward_varlen"
BACKWARD_VARLEN = "warpattn_backward_varlen"
TARGETS = (FORWARD, BACKWARD, FORWARD_VARLEN, BACKWARD_VARLEN)

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
    """Registers the four custom calls with XLA for the CUDA platform (once; every call here
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


def _attrs(scale, causal, deterministic=None, max_seqlens=None):
    """The call's attributes, typed as the handlers bind them (f32, pred, s64)."""
    attrs = {"causal": np.bool_(causal), "has_scale": np.bool_(scale is not None),
             "softmax_scale": np.float32(0.0 if scale is None else scale)}
    if deterministic is not None:
        attrs["deterministic"] = np.bool_(deterministic)
    if max_seqlens is not None:
        attrs["max_seqlen_q"], attrs["max_seqlen_k"] = (np.int64(n) for n in max_seqlens)
    return attrs


def _call(target, operands, results, attrs, vmap_method):
    """ffi_call of `target`, after checking every argument rule of the handler's library call on
    the shapes and dtypes (ValueError with the library's message)."""
    register()
    _handlers.jax_ffi_validate(target, [_spec(x) for x in operands], [_spec(r) for r in results],
                               {name: value.item() for name, value in attrs.items()})
    return jax.ffi.ffi_call(target, results, vmap_method=vmap_method)(*operands, **attrs)


def _like(x, dtype=None, shape=None):
    return jax.ShapeDtypeStruct(x.shape if shape is None else shape, x.dtype if dtype is None else dtype)


def _forward(q, k, v, scale, causal, with_lse):
    results = [_like(q)]
    if with_lse:
        results.append(_like(q, jnp.float32, (q.shape[0], q.shape[2], q.shape[1])))
    outs = _call(FORWARD, (q, k, v), results, _attrs(scale, causal), "broadcast_all")
    return (outs[0], outs[1]) if with_lse else (outs[0], None)


def _backward(dout, q, k, v, out, lse, scale, causal, deterministic):
    attrs = _attrs(scale, causal, deterministic)
    register()
    workspace = _handlers.jax_ffi_workspace_bytes(BACKWARD, _spec(q), 0, {n: a.item() for n, a in attrs.items()})
    results = [_like(q), _like(k), _like(v), jax.ShapeDtypeStruct((workspace,), jnp.uint8)]
    dq, dk, dv, _ = _call(BACKWARD, (dout, q, k, v, out, lse), results, attrs, "broadcast_all")
    return dq, dk, dv


def _forward_varlen(q, k, v, offsets, max_seqlens, scale, causal, with_lse):
    results = [_like(q)]
    if with_lse:
        results.append(_like(q, jnp.float32, (q.shape[1], q.shape[0])))
    operands = (q, k, v) + tuple(o for o in offsets if o is not None)
    outs = _call(FORWARD_VARLEN, operands, results, _attrs(scale, causal, max_seqlens=max_seqlens), "sequential")
    return (outs[0], outs[1]) if with_lse else (outs[0], None)


def _backward_varlen(dout, q, k, v, out, lse, offsets, max_seqlens, scale, causal, deterministic):
    attrs = _attrs(scale, causal, deterministic, max_seqlens)
    register()
    workspace = _handlers.jax_ffi_workspace_bytes(BACKWARD_VARLEN, _spec(q), _batch_size(offsets[0]),
                                                  {n: a.item() for n, a in attrs.items()})
    results = [_like(q), _like(k), _like(v), jax.ShapeDtypeStruct((workspace,), jnp.uint8)]
    operands = (dout, q, k, v, out, lse) + tuple(o for o in offsets if o is not None)
    dq, dk, dv, _ = _call(BACKWARD_VARLEN, operands, results, attrs, "sequential")
    return dq, dk, dv


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


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _attention(q, k, v, scale, causal, return_lse, deterministic):
    out, lse = _forward(q, k, v, scale, causal, return_lse)
    return (out, lse) if return_lse else out


def _attention_fwd(q, k, v, scale, causal, return_lse, deterministic):
    q, k, v = _values(q, k, v)
    out, lse = _forward(q, k, v, scale, causal, True)
    return ((out, lse) if return_lse else out), (q, k, v, out, lse)


def _attention_bwd(scale, causal, return_lse, deterministic, residuals, cotangents):
    q, k, v, out, lse = residuals
    dout = _cotangent_out(cotangents, out, return_lse)
    return _backward(dout, q, k, v, out, lse, scale, causal, deterministic)


_attention.defvjp(_attention_fwd, _attention_bwd, symbolic_zeros=True)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8, 9, 10))
def _attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlens, scale, causal, return_lse,
                      deterministic):
    out, lse = _forward_varlen(q, k, v, (cu_seqlens_q, cu_seqlens_k, seqused_k), max_seqlens, scale, causal,
                               return_lse)
    return (out, lse) if return_lse else out


def _attention_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlens, scale, causal, return_lse,
                          deterministic):
    q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k = _values(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k)
    offsets = (cu_seqlens_q, cu_seqlens_k, seqused_k)
    out, lse = _forward_varlen(q, k, v, offsets, max_seqlens, scale, causal, True)
    return ((out, lse) if return_lse else out), (q, k, v, out, lse, offsets)


def _attention_varlen_bwd(max_seqlens, scale, causal, return_lse, deterministic, residuals, cotangents):
    q, k, v, out, lse, offsets = residuals
    dout = _cotangent_out(cotangents, out, return_lse)
    dq, dk, dv = _backward_varlen(dout, q, k, v, out, lse, offsets, max_seqlens, scale, causal, deterministic)
    return dq, dk, dv, None, None, None  # the offsets are integers: no gradient


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


def flash_attn(q, k, v, softmax_scale=None, causal=False, return_lse=False, deterministic=False):
    """softmax(softmax_scale q k^T [+ causal mask, bottom-right]) v on JAX arrays on a CUDA
    device, eagerly or under jax.jit, differentiable in q, k and v (jax.grad, jax.vjp).

    q: (batch, seqlen_q, heads, head_dim); k, v: (batch, seqlen_k, heads_kv, head_dim), heads a
    multiple of heads_kv (GQA/MQA); float16 or bfloat16; head_dim 64, 128 or 256. softmax_scale
    (default 1/sqrt(head_dim)), causal, return_lse and deterministic are static (Python values).
    Returns out, or (out, lse) with return_lse, lse (batch, heads, seqlen_q) float32; lse takes
    no gradient (NotImplementedError when traced for one: stop_gradient it). deterministic: the
    backward gives the same bits on every run (slower). Argument errors raise ValueError with the
    library's message when traced. Under vmap, mapped axes become batch."""
    _check_rank(q)
    _check_on_gpu(q=q, k=k, v=v)
    return _attention(q, k, v, _scale(softmax_scale), bool(causal), bool(return_lse), bool(deterministic))


def flash_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None,
                      causal=False, return_lse=False, seqused_k=None, deterministic=False):
    """flash_attn on a packed batch of sequences of different lengths, in FlashAttention's
    conventions (see warpattn.flash_attn_varlen_func): q (total_q, heads, head_dim); k, v
    (total_k, heads_kv, head_dim); cu_seqlens_q, cu_seqlens_k (batch + 1,) int32 arrays, read on
    the device only; seqused_k optional (batch,) int32; max_seqlen_q, max_seqlen_k Python ints
    >= 0 (static). lse: (heads, total_q). Differentiable in q, k and v; the gradients are zero
    for rows and keys that no sequence uses."""
    _check_packed_rank(q)
    _check_on_gpu(q=q, k=k, v=v)
    max_seqlens = _static_lengths(max_seqlen_q, max_seqlen_k)
    return _attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlens, _scale(softmax_scale),
                             bool(causal), bool(return_lse), bool(deterministic))


def flash_attn_backward(dout, q, k, v, out, lse, softmax_scale=None, causal=False, deterministic=False):
    """(dq, dk, dv) of flash_attn(q, k, v, softmax_scale, causal) given dout and the forward's out
    and lse (return_lse=True): the backward call alone, for those who drive it themselves."""
    _check_rank(q)
    _check_on_gpu(dout=dout, q=q)
    return _backward(dout, q, k, v, out, lse, _scale(softmax_scale), bool(causal), bool(deterministic))


def flash_attn_varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               softmax_scale=None, causal=False, seqused_k=None, deterministic=False):
    """(dq, dk, dv) of flash_attn_varlen(...) given dout and the forward's out and lse; rows and
    keys that no sequence uses get zero gradients."""
    _check_packed_rank(q)
    _check_on_gpu(dout=dout, q=q)
    max_seqlens = _static_lengths(max_seqlen_q, max_seqlen_k)
    return _backward_varlen(dout, q, k, v, out, lse, (cu_seqlens_q, cu_seqlens_k, seqused_k), max_seqlens,
                            _scale(softmax_scale), bool(causal), bool(deterministic))
