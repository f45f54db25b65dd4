"""FP8 (e4m3) attention for PyTorch tensors: quantise once, then run the FP8 kernel.

    ops = warpattn.quantize_fp8(q, k, v)              # rotation + per-block scales (default)
    out = warpattn.flash_attn_fp8_func(ops, causal=True)
    ops = warpattn.quantize_fp8(q, k, v, qk_dtype=torch.int8)   # INT8 Q and K: ~1.5x less error

The operands follow include/warpattn/fp8.hpp: q (B, Sq, Hq, D) and k (B, Sk, Hkv, D) in
float8_e4m3fn (or both int8), vt (B, Hkv, D, Sk rounded up to 16) in float8_e4m3fn holding V
transposed with the keys of every 16-key group in warpattn.FP8_KEY_ORDER, and float32 descales
per block of 128 rows (keys). A caller may build them itself. Head dims 64, 128 and 256.
"""
from typing import NamedTuple, Optional

import torch

from . import _warpattn

FP8_BLOCK_ROWS = 128
FP8_KEY_ORDER = (0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15)


class Fp8Operands(NamedTuple):
    q: torch.Tensor
    k: torch.Tensor
    vt: torch.Tensor
    q_descale: torch.Tensor
    k_descale: torch.Tensor
    v_descale: torch.Tensor


def _stream(t):
    return torch.cuda.current_stream(t.device).cuda_stream


def _bytes(t, name, int8_ok=False):
    if int8_ok and t.dtype == torch.int8:
        return t
    if t.dtype != torch.float8_e4m3fn:
        raise TypeError("%s: expected a float8_e4m3fn%s tensor, got %s" % (name, " or int8" if int8_ok else "", t.dtype))
    return t.view(torch.uint8)


def _blocks(n):
    return (n + FP8_BLOCK_ROWS - 1) // FP8_BLOCK_ROWS


def quantize_fp8(q, k, v, rotate=True, seed=0, per_tensor=False, qk_dtype=torch.float8_e4m3fn):
    """FP8 operands of q, k, v (float16 or bfloat16 CUDA tensors, (batch, seqlen, heads,
    head_dim)). rotate: incoherent processing of Q and K (random signs from `seed`, then the
    normalised Walsh-Hadamard transform); per_tensor: one descale per tensor instead of one per
    block of 128 rows; qk_dtype: torch.float8_e4m3fn, or torch.int8 for INT8 Q and K (best with
    rotate; P and V stay e4m3, same speed). Runs on the current stream."""
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        raise TypeError("quantize_fp8: expected PyTorch tensors")
    if qk_dtype not in (torch.float8_e4m3fn, torch.int8):
        raise TypeError("qk_dtype: expected torch.float8_e4m3fn or torch.int8, got %s" % (qk_dtype,))
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    dev = q.device
    e4m3 = torch.float8_e4m3fn
    ops = Fp8Operands(
        q=torch.empty((b, sq, hq, d), dtype=qk_dtype, device=dev),
        k=torch.empty((b, sk, hkv, d), dtype=qk_dtype, device=dev),
        vt=torch.empty((b, hkv, d, (sk + 15) // 16 * 16), dtype=e4m3, device=dev),
        q_descale=torch.empty((b, hq, _blocks(sq)), dtype=torch.float32, device=dev),
        k_descale=torch.empty((b, hkv, _blocks(sk)), dtype=torch.float32, device=dev),
        v_descale=torch.empty((b, hkv, _blocks(sk)), dtype=torch.float32, device=dev))
    _warpattn.quantize_fp8(q, k, v, _bytes(ops.q, "q", True), _bytes(ops.k, "k", True), _bytes(ops.vt, "vt"),
                           ops.q_descale, ops.k_descale, ops.v_descale, bool(rotate), int(seed),
                           bool(per_tensor), _stream(q))
    return ops


def flash_attn_fp8_func(ops: Fp8Operands, softmax_scale: Optional[float] = None, causal=False,
                        out_dtype=torch.bfloat16, return_lse=False, out=None, check_descales=True):
    """softmax(softmax_scale q k^T [+ causal mask, bottom-right]) v on FP8 operands; out is
    (batch, seqlen_q, heads, head_dim) in out_dtype (bfloat16 or float16). With check_descales
    the descales are read back and checked (finite, > 0) before the launch (one
    synchronisation); quantize_fp8's operands are valid by construction."""
    q = ops.q
    if out is None:
        out = torch.empty(tuple(q.shape), dtype=out_dtype, device=q.device)
    lse = (torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)
           if return_lse else None)
    _warpattn.forward_fp8(_bytes(ops.q, "q", True), _bytes(ops.k, "k", True), _bytes(ops.vt, "vt"), ops.q_descale,
                          ops.k_descale, ops.v_descale, out, lse,
                          None if softmax_scale is None else float(softmax_scale), bool(causal),
                          _stream(q), bool(check_descales))
    return (out, lse) if return_lse else out
