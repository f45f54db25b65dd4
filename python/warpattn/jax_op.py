"""warpattn for JAX: attention with a custom VJP, so that jax.grad differentiates it in q, k and v.

Where this build has the XLA FFI handlers (warpattn.jax_ffi.available()), jax_flash_attn is
warpattn.jax_ffi.flash_attn: custom calls on XLA's stream, eager or under jax.jit and vmap.
Without them it falls back to the eager path below: the forward and the backward run on
concrete arrays through DLPack (see api.py's JAX section), so they are refused under jax.jit,
vmap and the like. JAX is imported on the first call, so that importing warpattn does not need it.
"""
import functools

from .api import _check_rank, _common_framework, _flash_attn_jax, _jax_ffi, _model_options, _scale, flash_attn_backward


def jax_flash_attn(q, k, v, softmax_scale=None, causal=False, deterministic=False, window_size=(-1, -1), softcap=0.0,
                   sinks=None):
    """softmax(softmax_scale q k^T [+ causal mask, bottom-right]) v on JAX arrays, differentiable
    in q, k and v, and in the sinks when given (jax.grad, jax.vjp; head dims:
    warpattn.backward_head_dims). Shapes and dtypes as flash_attn_func; deterministic: the
    backward gives the same bits on every run (slower). window_size, softcap and sinks as
    flash_attn_func takes them (softcap's backward at every head dim)."""
    if _common_framework(q, k=k, v=v, sinks=sinks) != "jax":
        raise TypeError("q: expected a JAX array, got %s.%s (flash_attn_func takes the others)"
                        % (type(q).__module__, type(q).__name__))
    _check_rank(q)
    ffi = _jax_ffi()
    if ffi is not None:
        return ffi.flash_attn(q, k, v, softmax_scale, causal, deterministic=deterministic, window_size=window_size,
                              softcap=softcap, sinks=sinks)
    model = _model_options(window_size, softcap, None)
    static = (model["window_left"], model["window_right"], model["softcap"])
    return _attention()(q, k, v, sinks, _scale(softmax_scale), bool(causal), bool(deterministic), static)


@functools.lru_cache(maxsize=None)
def _attention():
    """The DLPack fallback's custom VJP."""
    import jax

    def model_options(static, sinks):
        return dict(window_left=static[0], window_right=static[1], softcap=static[2], sinks=sinks)

    # The options are static (hashable, not differentiated): nondiff_argnums. The sinks are an
    # array, a primal argument with its gradient (None when there are none).
    @functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
    def attention(q, k, v, sinks, scale, causal, deterministic, static):
        return _flash_attn_jax(q, k, v, scale, causal, False, None, model=model_options(static, sinks))

    def forward(q, k, v, sinks, scale, causal, deterministic, static):
        out, lse = _flash_attn_jax(q, k, v, scale, causal, True, None, model=model_options(static, sinks))
        return out, (q, k, v, out, lse, sinks)

    def backward(scale, causal, deterministic, static, residuals, dout):
        *residuals, sinks = residuals
        # DLPack too: no handlers
        grads = flash_attn_backward(dout, *residuals, scale, causal, deterministic, window_size=static[:2],
                                    softcap=static[2], sinks=sinks)
        return tuple(grads) if sinks is not None else tuple(grads) + (None,)

    attention.defvjp(forward, backward)
    return attention
