"""warpattn: exact attention for NVIDIA Hopper GPUs (H100/H200, sm_90a), built the way
FlashAttention-3 is built (TMA producer warpgroup, WGMMA consumers, ping-pong, online softmax).

    out = warpattn.flash_attn_func(q, k, v, causal=True)

q, k, v are (batch, seqlen, heads, head_dim) CUDA tensors of PyTorch, JAX or CuPy (any DLPack
tensor), float16 or bfloat16; nothing is copied and the result is the caller's framework's
tensor. FP8 (PyTorch): ops = warpattn.quantize_fp8(q, k, v); warpattn.flash_attn_fp8_func(ops).
"""
from ._warpattn import supported_head_dims
from .api import flash_attn_func

__all__ = ["flash_attn_func", "supported_head_dims", "quantize_fp8", "flash_attn_fp8_func", "Fp8Operands"]
_FP8 = ("quantize_fp8", "flash_attn_fp8_func", "Fp8Operands", "FP8_KEY_ORDER", "FP8_BLOCK_ROWS")


def __getattr__(name):  # the FP8 API needs PyTorch: imported on first use only
    if name in _FP8:
        from . import fp8
        return getattr(fp8, name)
    raise AttributeError("module 'warpattn' has no attribute %r" % name)
__version__ = "0.1.0"
