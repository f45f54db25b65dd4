"""warpattn: exact attention for NVIDIA Hopper GPUs (H100/H200, sm_90a), built the way
FlashAttention-3 is built (TMA producer warpgroup, WGMMA consumers, ping-pong, online softmax).

    out = warpattn.flash_attn_func(q, k, v, causal=True)

q, k, v are (batch, seqlen, heads, head_dim) CUDA tensors of PyTorch, JAX or CuPy (any DLPack
tensor), float16 or bfloat16; nothing is copied and the result is the caller's framework's
tensor.
"""
from ._warpattn import supported_head_dims
from .api import flash_attn_func

__all__ = ["flash_attn_func", "supported_head_dims"]
__version__ = "0.1.0"
