"""flash_attn_with_kvcache: attention of new queries over each sequence's KV cache, dense or
paged, with the new keys and values appended into the cache in place first, in FlashAttention's
conventions (warpattn::forward_kvcache), for any DLPack tensor (PyTorch: torch.library custom
ops in torch_op.py, for CUDA graph capture and torch.compile; CuPy; JAX: through the XLA FFI
call where the build has it, under jax.jit too, else eagerly; without the append either way,
which warpattn.jax_ffi.flash_attn_with_kvcache offers, returning the grown caches). Inference only: no gradients, as FlashAttention's flash_attn_with_kvcache has none.

This module imports no framework: each is imported by the first call that takes its tensors.
"""
import operator

from . import _warpattn
from .api import (_INT32, _array_module, _call_framework, _check_rank, _current_stream, _jax_ffi, _jax_run,
                  _lse_shape, _model_values, _no_out, _scale, _torch_ops, _wait_for_jax_arrays, device_of)
from .kvcache_fp8 import is_e4m3


def _cache_length(cache_seqlens):
    """cache_seqlens given as a Python int (or any integer that is not a tensor: NumPy's scalars):
    that int, to be filled into a (batch,) int32 tensor of the call's framework on q's device, as
    FlashAttention does; None for a tensor (or None), which goes to the library as it is. An int
    is known on the host, so it is checked here: >= 0 and within int32."""
    if cache_seqlens is None or hasattr(cache_seqlens, "__dlpack__"):
        return None
    if isinstance(cache_seqlens, bool):
        raise TypeError("cache_seqlens: expected an int32 tensor (batch,) or an int, got bool")
    try:
        n = operator.index(cache_seqlens)
    except TypeError:
        raise TypeError("cache_seqlens: expected an int32 tensor (batch,) or an int, got %s.%s"
                        % (type(cache_seqlens).__module__, type(cache_seqlens).__name__)) from None
    if not 0 <= n <= _INT32[1]:
        raise ValueError("cache_seqlens: expected an int from 0 to 2^31 - 1 (keys in each cache), got %d" % n)
    return n


def _full_lengths(fw, q, n):
    """A (batch,) int32 tensor filled with n, of q's framework on q's device (CuPy: inside
    device_of(q)). PyTorch: torch.full on the device, a fill kernel on the current stream (under
    CUDA graph capture, from the graph's pool: n is then fixed in the graph)."""
    shape = (int(q.shape[0]),) if fw != "torch" else (q.shape[0],)
    if fw == "torch":
        import torch
        return torch.full(shape, n, dtype=torch.int32, device=q.device)
    if fw == "jax":
        import jax
        import jax.numpy as jnp
        return jax.device_put(jnp.full(shape, n, jnp.int32), q.devices().pop())
    xp = _array_module(fw)
    return xp.full(shape, n, dtype=xp.int32)


def _out_shape(q, v_cache):
    """q's shape with the caches' value head dim: v_cache's last, or q's for an E4M3 cache (whose V
    is transposed and has q's head dim: the library checks v_cache against it, naming v_cache)."""
    return tuple(q.shape) if is_e4m3(v_cache) else tuple(q.shape[:-1]) + (v_cache.shape[-1],)


def _refuse_jax_fp8(k_cache, v_cache, k_descale, v_descale):
    if any(t is not None for t in (k_descale, v_descale)) or is_e4m3(k_cache) or is_e4m3(v_cache):
        raise TypeError("k_cache, v_cache: an E4M3 KV cache is taken from PyTorch and CuPy in this version, not JAX")


def _refuse_jax_append(k, v):
    """New keys and values with JAX arrays: refused, since their append into the caches in place
    cannot be expressed (JAX arrays are immutable)."""
    if k is not None or v is not None:
        raise TypeError("k, v: JAX arrays are immutable, so appending into k_cache and v_cache in place cannot be "
                        "expressed; call warpattn.jax_ffi.flash_attn_with_kvcache, which returns the grown caches, "
                        "or write the new rows into the caches yourself (cache.at[...].set(...)) and call without "
                        "k and v, with cache_seqlens counting them")


def _refuse_jax(k, v, **arrays):
    """JAX arrays without the XLA FFI handlers run eagerly: refused when traced, and refused with
    new keys and values (_refuse_jax_append)."""
    _refuse_jax_append(k, v)
    import jax
    tracer = getattr(jax.core, "Tracer", ())
    for name, a in arrays.items():
        if isinstance(a, tracer):
            raise TypeError("%s: flash_attn_with_kvcache takes concrete JAX arrays only (it runs eagerly, reading "
                            "their memory through DLPack), not traced ones under jax.jit, vmap or the like" % name)


# flash_attn_with_kvcache's tensor arguments after q, in the order it checks their framework.
_TENSOR_ARGUMENTS = ("k_cache", "v_cache", "k", "v", "cache_seqlens", "block_table", "out", "sinks", "k_descale",
                     "v_descale")


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, sinks=None,
                            batch_invariant=False, num_splits=0, return_lse=False, out=None, k_descale=None,
                            v_descale=None):
    """Exact attention of new queries over each sequence's KV cache (FlashAttention's
    flash_attn_with_kvcache; decoding and chunked prefill), the new keys and values appended into
    the cache first.

    q: (batch, seqlen_q, heads, head_dim), float16 or bfloat16 on a CUDA device, head_dim a
    multiple of 8 from 8 to 512 (above 256 in the 512 kernel, not yet run on the H200). k_cache, v_cache: dense (batch, seqlen_cache, heads_kv,
    head_dim), or paged (num_pages, page_size, heads_kv, head_dim) with block_table, a
    (batch, max_pages) int32 tensor whose row b lists sequence b's pages in order (page_size
    any size from 1 key, fastest from 16 up where it is a power of two: a key tile comes in
    boxes of the largest power of two dividing the page size; sequence b's key j is row
    j % page_size of page block_table[b, j // page_size]); heads a multiple of heads_kv (GQA/MQA); q's dtype; the strides rules of
    flash_attn_func. cache_seqlens: None (every cache full: seqlen_cache, or max_pages x
    page_size keys), a (batch,) int32 tensor on the device, or an int (FlashAttention's
    convenience: a (batch,) int32 tensor filled with it is made on q's device; under CUDA graph
    capture its value is then fixed in the graph: pass a tensor to change it at replay).
    k, v: optional new keys and values (batch, seqlen_new, heads_kv, head_dim), both or neither,
    needing cache_seqlens: written into the caches in place at rows cache_seqlens[b] ..
    cache_seqlens[b] + seqlen_new (through block_table when paged) before the attention, which
    then sees len = cache_seqlens[b] + seqlen_new keys; cache_seqlens itself is not advanced (as
    FlashAttention): the caller adds seqlen_new for the next step.

    The lengths and page indices are read on the device only (no host synchronisation: CUDA
    graphs replay with new lengths and block tables, and torch.compile traces the call), so they
    are not validated: a length is clamped to [0, capacity] (appended rows past the capacity are
    dropped), and a page index outside [0, num_pages) is never read (its keys read as zeros) nor
    written. Cache rows past a sequence's length inside its pages are read: they must be finite.
    causal and window_size: aligned bottom-right on each sequence's len keys, so new query row i
    sees keys up to len - seqlen_q + i. softmax_scale (default 1/sqrt(head_dim)), softcap, sinks
    and batch_invariant: as flash_attn_func takes them. num_splits: how many pieces each work
    tile's keys are cut into over the SMs (flash-decoding, combined through their log-sum-exps):
    0 (FlashAttention's default) chooses from the shape and the SM count, 1 to 128 asks for that
    many (fewer where their partial states would pass 1 GiB).
    out: optional output tensor to write.

    k_descale, v_descale: an E4M3 (FP8) cache's (heads_kv) float32 descales, given exactly when
    k_cache and v_cache are float8_e4m3fn (CuPy: uint8 e4m3 bytes): half the bytes a step reads.
    Such a cache keeps V transposed (warpattn.kvcache_fp8: its layouts, empty_kvcache_fp8 and
    quantize_kvcache_fp8 to make one); q, out and the new k and v stay 16-bit, the new rows
    quantised on append with the descales, each step's q with one descale per work tile; head
    dims 64, 128 and 256, no softcap. PyTorch and CuPy.

    Returns out (batch, seqlen_q, heads, head_dim), or (out, lse) with return_lse, lse being
    (batch, heads, seqlen_q) float32 (as flash_attn_func's); a row that sees no key gets 0 and
    lse -inf (its sink with sinks). Runs on the caller's current stream; argument errors raise
    ValueError (a message naming the argument), a tensor that is not on a CUDA device or not a
    tensor TypeError; nothing is written (the caches included) before every rule has passed.

    No gradients (inference only, as FlashAttention's kvcache call): PyTorch refuses a backward
    through the result (the custom op has no autograd formula). PyTorch: custom ops
    (warpattn::flash_attn_kvcache_forward, and warpattn::flash_attn_kvcache_append_forward that
    declares k_cache and v_cache mutated), so the call works under CUDA graph capture and
    torch.compile(fullgraph=True) (out= is outside them: a graph break under compile). CuPy: on
    the current stream. JAX: eagerly on concrete arrays through DLPack (the inputs are waited for
    and the results handed back once computed; not under jax.jit), and without k and v: JAX arrays
    are immutable, so the in-place append is refused with a TypeError.
    """
    length = _cache_length(cache_seqlens)
    fw = _call_framework(q, _TENSOR_ARGUMENTS, k_cache, v_cache, k, v, cache_seqlens if length is None else None,
                         block_table, out, sinks, k_descale, v_descale)
    _check_rank(q)
    scale, causal, batch_invariant = _scale(softmax_scale), bool(causal), bool(batch_invariant)
    window_left, window_right, softcap = _model_values(window_size, softcap)
    num_splits = operator.index(num_splits)
    if fw == "torch":  # positional: a decode step's host cost (issue 16)
        if length is not None:
            cache_seqlens = _full_lengths(fw, q, length)
        return _torch_ops().flash_attn_kvcache_torch(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale,
                                                     causal, return_lse, out, batch_invariant, window_left,
                                                     window_right, softcap, sinks, num_splits, k_descale, v_descale)
    model = {"window_left": window_left, "window_right": window_right, "softcap": softcap, "sinks": sinks,
             "num_splits": num_splits}
    if fw == "jax":
        _no_out(out)
        _refuse_jax_fp8(k_cache, v_cache, k_descale, v_descale)
        ffi = _jax_ffi()
        if ffi is not None:  # the XLA FFI call: under jax.jit too
            _refuse_jax_append(k, v)
            if length is not None:
                import jax.numpy as jnp
                cache_seqlens = jnp.full((int(q.shape[0]),), length, jnp.int32)
            return ffi.flash_attn_with_kvcache(
                q, k_cache, v_cache, cache_seqlens=cache_seqlens, block_table=block_table, softmax_scale=scale,
                causal=causal, window_size=(model["window_left"], model["window_right"]), softcap=model["softcap"],
                sinks=sinks, batch_invariant=batch_invariant, num_splits=model["num_splits"], return_lse=return_lse)
        given = dict(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens, block_table=block_table,
                     sinks=sinks)
        given = {name: t for name, t in given.items() if t is not None and hasattr(t, "__dlpack__")}
        _refuse_jax(k, v, **given)
        if length is not None:
            cache_seqlens = _full_lengths(fw, q, length)
        _wait_for_jax_arrays(**dict(given, **({} if cache_seqlens is None else {"cache_seqlens": cache_seqlens})))

        def run(empty):
            o = empty(_out_shape(q, v_cache), str(q.dtype))
            lse = empty(_lse_shape(q), "float32") if return_lse else None
            # Stream 0: the legacy default stream of the tensors' device (see api._jax_run).
            _warpattn.forward_kvcache(q, k_cache, v_cache, o, lse, None, None, cache_seqlens, block_table, scale,
                                      causal, 0, batch_invariant, **model)
            return o, lse

        o, lse = _jax_run(q.devices().pop().id, run)
        return (o, lse) if return_lse else o
    xp = _array_module(fw)
    with device_of(q, fw):  # allocate on q's device and take that device's current stream
        if length is not None:
            cache_seqlens = _full_lengths(fw, q, length)
        if out is None:
            out = xp.empty(_out_shape(q, v_cache), dtype=q.dtype)
        lse = xp.empty(_lse_shape(q), dtype=xp.float32) if return_lse else None
        _warpattn.forward_kvcache(q, k_cache, v_cache, out, lse, k, v, cache_seqlens, block_table, scale, causal,
                                  _current_stream(fw, q), batch_invariant, **model, k_descale=k_descale,
                                  v_descale=v_descale)
    return (out, lse) if return_lse else out
