"""warpattn: exact attention for NVIDIA Hopper GPUs (H100/H200, sm_90a), built the way
FlashAttention-3 is built (TMA producer warpgroup, WGMMA consumers, ping-pong, online softmax).

    out = warpattn.flash_attn_func(q, k, v, causal=True)

q, k, v are (batch, seqlen, heads, head_dim) CUDA tensors of PyTorch, JAX or CuPy (any DLPack
tensor), float16 or bfloat16; nothing is copied and the result is the caller's framework's
tensor. Gradients: PyTorch's autograd through flash_attn_func; warpattn.flash_attn_backward
(CuPy, any framework); warpattn.jax_flash_attn (JAX, jax.grad). JAX arrays go through XLA FFI
calls (warpattn.jax_ffi: on XLA's stream, under jax.jit too) where the build has them, else
eagerly through DLPack; importing warpattn imports no JAX. FP8 (PyTorch, CuPy, JAX):
ops = warpattn.quantize_fp8(q, k, v); warpattn.flash_attn_fp8_func(ops). Packed batches of
sequences of different lengths: warpattn.flash_attn_varlen_func (FlashAttention's signature);
FP8 on them: warpattn.quantize_fp8_varlen and warpattn.flash_attn_fp8_varlen_func.
Decoding over KV caches, dense or paged, with the new keys and values appended in place:
warpattn.flash_attn_with_kvcache (FlashAttention's signature; inference only, no gradients);
an E4M3 cache (half the bytes a step reads): warpattn.empty_kvcache_fp8 or
warpattn.quantize_kvcache_fp8, then flash_attn_with_kvcache(..., k_descale=, v_descale=).
Hugging Face transformers: import warpattn.integrations.transformers, then
attn_implementation="warpattn".
"""
from ._warpattn import backward_head_dims, forward_head_dims, supported_head_dims
from .api import flash_attn_backward, flash_attn_func
from .fp8 import (FP8_BLOCK_ROWS, FP8_KEY_ORDER, Fp8Operands, flash_attn_fp8_func, flash_attn_fp8_varlen_func,
                  fp8_varlen_rows, quantize_fp8, quantize_fp8_varlen)
from .jax_op import jax_flash_attn
from .kvcache import flash_attn_with_kvcache
from .kvcache_fp8 import Fp8KvCache, dequantize_kvcache_fp8, empty_kvcache_fp8, quantize_kvcache_fp8
from .varlen import flash_attn_varlen_backward, flash_attn_varlen_func

__all__ = ["flash_attn_func", "flash_attn_backward", "jax_flash_attn", "supported_head_dims", "backward_head_dims",
           "forward_head_dims",
           "quantize_fp8", "flash_attn_fp8_func", "Fp8Operands", "FP8_KEY_ORDER", "FP8_BLOCK_ROWS",
           "flash_attn_varlen_func", "flash_attn_varlen_backward", "quantize_fp8_varlen", "flash_attn_fp8_varlen_func",
           "fp8_varlen_rows", "flash_attn_with_kvcache", "Fp8KvCache", "empty_kvcache_fp8", "quantize_kvcache_fp8",
           "dequantize_kvcache_fp8"]
__version__ = "0.1.0"
