"""warpattn for JAX: attention with a custom VJP, so that jax.grad differentiates it in q, k and v.

Where this build has the XLA FFI handlers (warpattn.jax_ffi.available()), jax_flash_attn is
warpattn.jax_ffi.flash_attn: custom calls on XLA's stream, eager or under jax.jit and vmap.
Without them it falls back to the eager path below: the forward and the backward run on
concrete arrays through DLPack (see api.py's JAX section), so they are refused under jax.jit,
vmap and the like. JAX is imported on the first call, so that importing warpattn does not need it.
"""
import functools

from .api import _check_rank, _common_framework, _flash_attn_jax, _jax_ffi, _scale, flash_attn_backward


def jax_flash_attn(q, k, v, softmax_scale=None, causal=False, deterministic=False):
    """softmax(softmax_scale q k^T [+ causal mask, bottom-right]) v on JAX arrays, differentiable
    in q, k and v (jax.grad, jax.vjp; head dims: warpattn.backward_head_dims). Shapes and dtypes
    as flash_attn_func; deterministic: the backward gives the same bits on every run (slower)."""
    if _common_framework(q, k=k, v=v) != "jax":
        raise TypeError("q: expected a JAX array, got %s.%s (flash_attn_func takes the others)"
                        % (type(q).__module__, type(q).__name__))
    _check_rank(q)
    ffi = _jax_ffi()
    if ffi is not None:
        return ffi.flash_attn(q, k, v, softmax_scale, causal, deterministic=deterministic)
    return _attention()(q, k, v, _scale(softmax_scale), bool(causal), bool(deterministic))


@functools.lru_cache(maxsize=None)
def _attention():
    """The DLPack fallback's custom VJP."""
    import jax

    # The options are static (hashable, not differentiated): nondiff_argnums.
    @functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
    def attention(q, k, v, scale, causal, deterministic):
        return _flash_attn_jax(q, k, v, scale, causal, False, None)

    def forward(q, k, v, scale, causal, deterministic):
        out, lse = _flash_attn_jax(q, k, v, scale, causal, True, None)
        return out, (q, k, v, out, lse)

    def backward(scale, causal, deterministic, residuals, dout):
        return flash_attn_backward(dout, *residuals, scale, causal, deterministic)  # DLPack too: no handlers

    attention.defvjp(forward, backward)
    return attention
