"""flash_attn_varlen_func and flash_attn_varlen_backward: attention on packed variable-length
batches, in FlashAttention's conventions, for any DLPack tensor (PyTorch: torch.library custom
ops in torch_op.py, differentiable; CuPy; JAX: warpattn.jax_ffi where this build has its XLA
FFI handlers, else eagerly through DLPack).

This module imports no framework: each is imported by the first call that takes its tensors.
"""
import operator

from . import _warpattn
from .api import (_array_module, _common_framework, _current_stream, _jax_ffi, _jax_run, _model_options, _no_out,
                  _scale, _torch_ops, _wait_for_jax_arrays, device_of)


def _check_rank(q):
    if len(q.shape) != 3:
        raise ValueError("q: expected rank 3 (total_q, heads, head_dim), got rank %d" % len(q.shape))


def _lse_shape(q):
    # FlashAttention's varlen layout: (heads, total_q).
    return (q.shape[1], q.shape[0])


def _max_seqlen(x, name):
    """An int (or a torch.SymInt under torch.compile, passed on as it is so that it is not
    specialised). warpattn reads the lengths on the device and does not need these values; they
    are taken for FlashAttention's signature and must be >= 0 (checked by the library)."""
    if isinstance(x, bool):
        raise TypeError("%s: expected an int, got bool" % name)
    if isinstance(x, int) or type(x).__name__ == "SymInt":
        return x
    try:
        return operator.index(x)
    except TypeError:
        raise TypeError("%s: expected an int, got %s.%s" % (name, type(x).__module__, type(x).__name__)) from None


def _batch_size(cu_seqlens_q):
    """B = len(cu_seqlens_q) - 1, from the shape alone (no read of the offsets); 0 for a tensor of
    the wrong rank, which the library then reports by name."""
    return max(int(cu_seqlens_q.shape[0]) - 1, 0) if len(cu_seqlens_q.shape) == 1 else 0


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None,
                           causal=False, return_lse=False, out=None, seqused_k=None, deterministic=False,
                           batch_invariant=False, window_size=(-1, -1), softcap=0.0, sinks=None):
    """Exact attention on a packed batch of B sequences of different lengths (FlashAttention's
    flash_attn_varlen_func).

    q: (total_q, heads, head_dim); k, v: (total_k, heads_kv, head_dim) with heads a multiple of
    heads_kv (GQA/MQA); float16 or bfloat16 on a CUDA device; head_dim a multiple of 8 from 8 to 512
    (with gradients: warpattn.backward_head_dims, the same); any row
    and head strides with a contiguous last dimension (e.g. slices of a packed qkv tensor).
    Sequence b is q[cu_seqlens_q[b]:cu_seqlens_q[b+1]] against k and v[cu_seqlens_k[b]:
    cu_seqlens_k[b+1]]; it attends only within itself. cu_seqlens_q, cu_seqlens_k: (B + 1,)
    int32 on the device, starting at 0, non-decreasing (zero-length sequences allowed); they are
    read on the device only (no host synchronisation: CUDA graphs and torch.compile work), so
    offsets that break these rules give wrong numbers for the sequences concerned, never an
    access outside the tensors. max_seqlen_q, max_seqlen_k: ints >= 0 as FlashAttention takes
    them (warpattn does not need them). seqused_k: optional (B,) int32: sequence b uses only its
    first seqused_k[b] keys (a KV cache larger than what is filled; the keys past it must be
    finite). causal: aligned bottom-right within each sequence. softmax_scale: default
    1/sqrt(head_dim). out: optional output tensor to write (not differentiable). Returns out, or
    (out, lse) with return_lse, lse being (heads, total_q) float32 (FlashAttention's varlen
    layout). A query row that sees no key gets 0 and lse -inf; rows no sequence covers are left
    unwritten. Runs on the caller's current stream; argument errors raise ValueError (a message
    naming the argument), a tensor that is not on a CUDA device or not a tensor TypeError.
    PyTorch: differentiable in q, k and v (deterministic=True: the same bits on every backward);
    CuPy: see flash_attn_varlen_backward; JAX: warpattn.jax_ffi.flash_attn_varlen (differentiable,
    under jax.jit too; max_seqlen_q and max_seqlen_k must then be Python ints), or without the
    FFI handlers eagerly (flash_attn_varlen_backward for gradients). batch_invariant=True: each
    sequence's bits do not depend on the other sequences (no tile height chosen from the longest;
    the backward deterministic). window_size, softcap and sinks: as warpattn.flash_attn_func takes
    them, the window aligned bottom-right within each sequence; differentiable as there (PyTorch:
    sinks that require grad get their gradient; softcap's backward at every head dim).
    """
    fw = _common_framework(q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k,
                           out=out, sinks=sinks)
    _check_rank(q)
    lengths = (_max_seqlen(max_seqlen_q, "max_seqlen_q"), _max_seqlen(max_seqlen_k, "max_seqlen_k"))
    scale, causal = _scale(softmax_scale), bool(causal)
    model = _model_options(window_size, softcap, sinks)
    if fw == "torch":
        return _torch_ops().flash_attn_varlen_torch(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, *lengths, scale,
                                                    causal, return_lse, out, bool(deterministic),
                                                    bool(batch_invariant), **model)
    if fw == "jax":
        _no_out(out)
        ffi = _jax_ffi()
        if ffi is not None:
            return ffi.flash_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *lengths, scale, causal, return_lse,
                                         seqused_k, deterministic, batch_invariant,
                                         window_size=(model["window_left"], model["window_right"]),
                                         softcap=model["softcap"], sinks=sinks)
        _wait_for_jax_arrays(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                             **{name: t for name, t in (("seqused_k", seqused_k), ("sinks", sinks)) if t is not None})

        def run(empty):
            o = empty(tuple(q.shape[:-1]) + (v.shape[-1],), str(q.dtype))  # v's head dim
            lse = empty(_lse_shape(q), "float32") if return_lse else None
            # Stream 0: the legacy default stream of the tensors' device (see api._jax_run).
            _warpattn.forward_varlen(q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, *lengths, scale, causal, 0,
                                     bool(batch_invariant), **model)
            return o, lse

        o, lse = _jax_run(q.devices().pop().id, run)
        return (o, lse) if return_lse else o
    xp = _array_module(fw)
    with device_of(q, fw):  # allocate on q's device and take that device's current stream
        if out is None:
            out = xp.empty(tuple(q.shape[:-1]) + (v.shape[-1],), dtype=q.dtype)  # v's head dim
        lse = xp.empty(_lse_shape(q), dtype=xp.float32) if return_lse else None
        _warpattn.forward_varlen(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, *lengths, scale, causal,
                                 _current_stream(fw, q), bool(batch_invariant), **model)
    return (out, lse) if return_lse else out


def flash_attn_varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               softmax_scale=None, causal=False, deterministic=False, dq=None, dk=None, dv=None,
                               seqused_k=None, window_size=(-1, -1), softcap=0.0, sinks=None):
    """The gradients (dq, dk, dv) of out = flash_attn_varlen_func(q, k, v, cu_seqlens_q,
    cu_seqlens_k, ..., seqused_k=seqused_k, window_size=window_size, softcap=softcap, sinks=sinks)
    with respect to q, k and v, given dout = dL/d(out) and the forward's out and lse
    (return_lse=True, (heads, total_q)); with sinks, (dq, dk, dv, dsinks), dsinks the gradient of
    the sinks: float32 (heads,), summed over every sequence, a new tensor of the call's framework.

    Tensors of one framework (PyTorch, CuPy, JAX); the arguments as in flash_attn_varlen_func.
    dq, dk, dv: tensors to write (PyTorch, CuPy), shaped as q, k, v (dk and dv summed over the
    query heads of a group); each one not given is allocated zero-filled: the kernels write dk and
    dv only for the keys a sequence uses, so the keys no sequence uses (past seqused_k included:
    the padding of warpattn.integrations.transformers) keep a zero gradient. Head dims:
    warpattn.backward_head_dims. Runs on the current stream (PyTorch, CuPy); JAX arrays go
    through warpattn.jax_ffi (XLA's stream), or without its handlers are waited for and the
    result handed back once computed. PyTorch users get this through autograd. window_size, softcap
    and sinks: the forward's (softcap at every head dim).
    """
    fw = _common_framework(q, dout=dout, k=k, v=v, out=out, lse=lse, cu_seqlens_q=cu_seqlens_q,
                           cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k, dq=dq, dk=dk, dv=dv, sinks=sinks)
    model = _model_options(window_size, softcap, sinks)
    _check_rank(q)
    args = (dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, _max_seqlen(max_seqlen_q, "max_seqlen_q"),
            _max_seqlen(max_seqlen_k, "max_seqlen_k"), _scale(softmax_scale), bool(causal), bool(deterministic))
    if fw == "jax":
        if any(g is not None for g in (dq, dk, dv)):
            raise ValueError("dq, dk, dv: JAX arrays are immutable; call without them")
        ffi = _jax_ffi()
        if ffi is not None:
            return ffi.flash_attn_varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                  max_seqlen_k, softmax_scale, causal, seqused_k, deterministic,
                                                  window_size=(model["window_left"], model["window_right"]),
                                                  softcap=model["softcap"], sinks=sinks)
        _wait_for_jax_arrays(dout=dout, q=q, k=k, v=v, out=out, lse=lse, cu_seqlens_q=cu_seqlens_q,
                             cu_seqlens_k=cu_seqlens_k,
                             **{name: t for name, t in (("seqused_k", seqused_k), ("sinks", sinks)) if t is not None})

        def run(empty):
            def zeros(t):
                z = empty(t.shape, str(t.dtype))
                z.zero_() if hasattr(z, "zero_") else z.fill(0)  # torch or CuPy memory
                return z
            return _varlen_backward_into(*args, (None, None, None), zeros, lambda n: empty((n,), "uint8"), 0, model)
        return tuple(_jax_run(q.devices().pop().id, run))
    with device_of(q, fw):  # allocate on q's device
        return _varlen_backward_into(*args, (dq, dk, dv), *_zeros_allocators(fw, q), _current_stream(fw, q), model)


def _varlen_backward_into(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                          scale, causal, deterministic, grads, new_zeros_like, new_workspace, stream, model):
    """Runs the varlen backward on `stream` into `grads` (dq, dk, dv), allocating each one that is
    None with new_zeros_like(the tensor it is the gradient of); with sinks (in model,
    _model_options' keywords) also dsinks = new_zeros_like(sinks), returned fourth. The workspace
    comes from new_workspace(bytes) (None: the library's own pool): the caller framework's memory,
    so that it is stream-ordered and may be taken during CUDA graph capture (as
    api._backward_into)."""
    native = getattr(_warpattn, "backward_varlen", None)
    if native is None:
        raise NotImplementedError("warpattn: this build of the extension has no backward on packed batches "
                                  "(_warpattn.backward_varlen); rebuild the package")
    dq, dk, dv = (g if g is not None else new_zeros_like(t) for g, t in zip(grads, (q, k, v)))
    sinks = model["sinks"]
    dsinks = None if sinks is None else new_zeros_like(sinks)
    need = _warpattn.backward_varlen_workspace_bytes(q, _batch_size(cu_seqlens_q), scale, causal, deterministic,
                                                     **model)
    native(dout, q, k, v, out, lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
           scale, causal, deterministic, new_workspace(need), stream, dsinks=dsinks, **model)
    return (dq, dk, dv) if sinks is None else (dq, dk, dv, dsinks)


def _zeros_allocators(fw, q):
    """(new_zeros_like, new_workspace) in the framework of q, on q's device. Zero-filled
    gradients: the kernels write only the rows and keys the sequences use (warpattn.hpp leaves
    the others undefined; the stores are predicated on each sequence's lengths)."""
    if fw == "torch":
        import torch

        def new_workspace(n):
            return torch.empty(n, dtype=torch.uint8, device=q.device) if q.is_cuda else None
        return (lambda t: t.new_zeros(t.shape)), new_workspace
    xp = _array_module(fw)

    def new_workspace(n):
        return xp.empty(n, dtype=xp.uint8) if fw == "cupy" else None
    return (lambda t: xp.zeros(t.shape, dtype=t.dtype)), new_workspace
