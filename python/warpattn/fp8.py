"""FP8 (e4m3) attention: quantise once, then run the FP8 kernel. PyTorch, CuPy and JAX.

    ops = warpattn.quantize_fp8(q, k, v)              # rotation + per-block scales (default)
    out = warpattn.flash_attn_fp8_func(ops, causal=True)
    ops = warpattn.quantize_fp8(q, k, v, qk_dtype="int8")   # INT8 Q and K: ~1.4x less error

The operands follow include/warpattn/fp8.hpp: q (B, Sq, Hq, D) and k (B, Sk, Hkv, D) in e4m3
(or both int8), vt (B, Hkv, D, Sk rounded up to 16) in e4m3 holding V transposed with the keys
of every 16-key group in warpattn.FP8_KEY_ORDER, and float32 descales per block of 128 rows
(keys). A caller may build them itself. Head dims 64, 128 and 256.

e4m3 tensors are torch.float8_e4m3fn with PyTorch and jnp.float8_e4m3fn with JAX; CuPy has no
FP8 type, so there they are uint8 arrays holding the e4m3 bytes. CuPy has no bfloat16 either:
its outputs are float16.

JAX arrays go to warpattn.jax_ffi.quantize_fp8 and flash_attn_fp8 (XLA FFI calls on XLA's
stream, under jax.jit too) where this build has the handlers; else, and for the packed forms,
which have no FFI call yet, they run eagerly through DLPack.
"""
from typing import Any, NamedTuple, Optional

from . import _warpattn
from .api import (_current_stream, _cupy_empty, _jax_ffi, _jax_run, _model_options, _no_out, _torch_empty,
                  _wait_for_jax_arrays, framework_of)

FP8_BLOCK_ROWS = 128
FP8_KEY_ORDER = (0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15)


class Fp8Operands(NamedTuple):
    q: Any
    k: Any
    vt: Any
    q_descale: Any
    k_descale: Any
    v_descale: Any


def _blocks(n):
    return (n + FP8_BLOCK_ROWS - 1) // FP8_BLOCK_ROWS


def _dtype_name(dtype, name, allowed):
    """A dtype given as a string, a PyTorch / NumPy / CuPy / JAX dtype or type, by its name."""
    text = str(getattr(dtype, "__name__", dtype)).replace("torch.", "")
    if text not in allowed:
        raise TypeError("%s: expected one of %s, got %r" % (name, ", ".join(sorted(allowed)), dtype))
    return text


def _qk_int8(qk_dtype):
    return _dtype_name(qk_dtype, "qk_dtype", {"float8_e4m3fn", "e4m3", "int8"}) == "int8"


# ------------------------------------------------------------------------------ allocation

def _bytes(t, name, int8_ok=False):
    """What the module takes for an FP8 operand: its e4m3 bytes as uint8 (a view for PyTorch,
    the array itself for CuPy), or an int8 tensor (Q and K)."""
    text = str(t.dtype).replace("torch.", "")
    if int8_ok and text == "int8":
        return t
    if text == "float8_e4m3fn":
        import torch
        return t.view(torch.uint8)
    if text == "uint8" and framework_of(t, name) == "cupy":
        return t
    raise TypeError("%s: expected a float8_e4m3fn%s tensor (CuPy: uint8 e4m3 bytes), got %s"
                    % (name, " or int8" if int8_ok else "", t.dtype))


def _call_args(ops):
    return (_bytes(ops.q, "q", True), _bytes(ops.k, "k", True), _bytes(ops.vt, "vt"),
            ops.q_descale, ops.k_descale, ops.v_descale)


# ---------------------------------------------------------------------------------- JAX

def _jax_e4m3(a):
    import jax
    import jax.numpy as jnp
    return jax.lax.bitcast_convert_type(a, jnp.float8_e4m3fn)


def _jax_bytes(a):
    import jax
    import jax.numpy as jnp
    a.block_until_ready()
    if str(a.dtype) == "float8_e4m3fn":
        a = jax.lax.bitcast_convert_type(a, jnp.uint8)  # a byte copy: DLPack may not carry FP8
        a.block_until_ready()
    return a


def _check_sinks(sinks, fw):
    """sinks: None or a tensor of the operands' framework (its rules are the library's)."""
    if sinks is not None and framework_of(sinks, "sinks") != fw:
        raise TypeError("sinks: expected a %s tensor like q, got %s.%s" % (fw, type(sinks).__module__,
                                                                            type(sinks).__name__))


def _jax_sinks(sinks):
    """The sinks for the DLPack path: computed, and named for _wait_for_jax_arrays."""
    return {} if sinks is None else {"sinks": sinks}


# -------------------------------------------------------------------------------- the API

def _inputs_framework(q, k, v):
    """The framework of q, which k and v must share (TypeError naming the one that does not)."""
    fw = framework_of(q, "q")
    for name, t in (("k", k), ("v", v)):
        if framework_of(t, name) != fw:
            raise TypeError("%s: expected a %s tensor like q, got %s" % (name, fw, type(t).__module__))
    return fw


def _run_quantize(fw, q, k, v, int8, run, **jax_offsets):
    """quantize_fp8's launch on q's framework: run(empty, stream, inputs, call_args) makes the
    operands and calls the module. JAX: eagerly, on concrete arrays (the offsets too), its
    results viewed as float8_e4m3fn where they are E4M3."""
    if fw == "torch":
        return run(_torch_empty(q.device.index), _current_stream(fw, q), (q, k, v))
    if fw == "cupy":
        return run(_cupy_empty(q.device.id), _current_stream(fw, q), (q, k, v))
    if fw == "jax":
        _wait_for_jax_arrays(q=q, k=k, v=v, **jax_offsets)
        ops = Fp8Operands(*_jax_run(q.devices().pop().id, lambda empty: run(empty, 0, (q, k, v), tuple)))
        if int8:
            return ops._replace(vt=_jax_e4m3(ops.vt))
        return ops._replace(q=_jax_e4m3(ops.q), k=_jax_e4m3(ops.k), vt=_jax_e4m3(ops.vt))
    raise TypeError("q: FP8 needs a CUDA tensor (PyTorch, CuPy or JAX), got a %s array" % fw)


def _run_forward(fw, ops, out, run, wait_for_jax):
    """forward_fp8's launch on the operands' framework: run(empty, stream, args) makes out and
    lse and calls the module; returns (out, lse). JAX: eagerly, once wait_for_jax() has waited
    for the arrays the call reads (and refused those it cannot: first, for a clear message)."""
    if fw == "torch":
        return run(_torch_empty(ops.q.device.index), _current_stream(fw, ops.q), _call_args(ops))
    if fw == "cupy":
        return run(_cupy_empty(ops.q.device.id), _current_stream(fw, ops.q), _call_args(ops))
    if fw == "jax":
        _no_out(out)
        wait_for_jax()
        args = (_jax_bytes(ops.q), _jax_bytes(ops.k), _jax_bytes(ops.vt), ops.q_descale, ops.k_descale,
                ops.v_descale)
        return _jax_run(ops.q.devices().pop().id, lambda empty: run(empty, 0, args))
    raise TypeError("q: FP8 needs a CUDA tensor (PyTorch, CuPy or JAX), got a %s array" % fw)


def quantize_fp8(q, k, v, rotate=True, seed=0, per_tensor=False, qk_dtype="e4m3"):
    """FP8 operands of q, k, v (float16 or bfloat16 CUDA tensors, (batch, seqlen, heads,
    head_dim); PyTorch, CuPy or JAX). rotate: incoherent processing of Q and K (random signs from
    `seed`, then the normalised Walsh-Hadamard transform); per_tensor: one descale per tensor
    instead of one per block of 128 rows; qk_dtype: "e4m3" (or torch.float8_e4m3fn), or "int8"
    (torch.int8, ...) for INT8 Q and K (best with rotate; P and V stay e4m3, same speed). Runs on
    the current stream (PyTorch, CuPy)."""
    fw = _inputs_framework(q, k, v)
    int8 = _qk_int8(qk_dtype)
    if len(q.shape) != 4 or len(k.shape) != 4:
        raise ValueError("q, k: expected rank 4 (batch, seqlen, heads, head_dim)")
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    qk = "int8" if int8 else "e4m3"

    def run(empty, stream, inputs, call_args=_call_args):
        ops = Fp8Operands(
            q=empty((b, sq, hq, d), qk), k=empty((b, sk, hkv, d), qk),
            vt=empty((b, hkv, d, (sk + 15) // 16 * 16), "e4m3"),
            q_descale=empty((b, hq, _blocks(sq)), "float32"),
            k_descale=empty((b, hkv, _blocks(sk)), "float32"),
            v_descale=empty((b, hkv, _blocks(sk)), "float32"))
        _warpattn.quantize_fp8(*inputs, *call_args(ops), bool(rotate), int(seed), bool(per_tensor), stream)
        return ops

    ffi = _jax_ffi() if fw == "jax" else None
    if ffi is not None:
        return ffi.quantize_fp8(q, k, v, rotate, seed, per_tensor, qk_dtype)
    return _run_quantize(fw, q, k, v, int8, run)


def flash_attn_fp8_func(ops: Fp8Operands, softmax_scale: Optional[float] = None, causal=False,
                        out_dtype="bfloat16", return_lse=False, out=None, check_descales=True, window_size=(-1, -1),
                        softcap=0.0, sinks=None, batch_invariant=False):
    """softmax(softmax_scale q k^T [+ causal mask, bottom-right]) v on FP8 operands; out is
    (batch, seqlen_q, heads, head_dim) in out_dtype (bfloat16 or float16, as a string or the
    framework's dtype; CuPy: float16). With check_descales the descales are read back and
    checked (finite, > 0) before the launch (one synchronisation); quantize_fp8's operands
    are valid by construction. window_size and sinks as warpattn.flash_attn_func takes them;
    softcap is refused by the library (the FP8 kernel scales scores per block inside the
    softmax's exponent, where a tanh does not fit), as is anything but its default of 0.
    batch_invariant as warpattn.flash_attn_func's (README: modes)."""
    fw = framework_of(ops.q, "q")
    _check_sinks(sinks, fw)
    kind = _dtype_name(out_dtype, "out_dtype", {"bfloat16", "float16"})
    b, sq, hq, d = ops.q.shape
    scale = None if softmax_scale is None else float(softmax_scale)
    model = _model_options(window_size, softcap, sinks)

    def run(empty, stream, args):
        o = out if out is not None else empty((b, sq, hq, d), kind)
        lse = empty((b, hq, sq), "float32") if return_lse else None
        _warpattn.forward_fp8(*args, o, lse, scale, bool(causal), stream, bool(check_descales),
                              batch_invariant=bool(batch_invariant), **model)
        return o, lse

    if fw == "jax":
        _no_out(out)
        ffi = _jax_ffi()
        if ffi is not None:
            return ffi.flash_attn_fp8(ops, softmax_scale, causal, kind, return_lse, check_descales,
                                      window_size=(model["window_left"], model["window_right"]),
                                      softcap=model["softcap"], sinks=sinks, batch_invariant=bool(batch_invariant))

    def wait_for_jax():
        # concrete arrays on a GPU (TypeError otherwise)
        _wait_for_jax_arrays(q=ops.q, k=ops.k, vt=ops.vt, **_jax_sinks(sinks))
        for t in (ops.q_descale, ops.k_descale, ops.v_descale):
            t.block_until_ready()

    o, lse = _run_forward(fw, ops, out, run, wait_for_jax)
    return (o, lse) if return_lse else o


# ----------------------------------------------------------------- packed (varlen) batches

def fp8_varlen_rows(total, batch):
    """Rows of the padded row space of a packed batch (include/warpattn/fp8.hpp): each sequence
    starts a 128-row block, sequence b at (cu_seqlens[b] + 128 b) rounded down to 128."""
    return (total + batch * 128 + 127) // 128 * 128


def _sequences(cu_seqlens_q):
    return max(int(cu_seqlens_q.shape[0]) - 1, 0) if len(cu_seqlens_q.shape) == 1 else 0


def quantize_fp8_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, rotate=True, seed=0, per_tensor=False,
                        qk_dtype="e4m3"):
    """quantize_fp8 on a packed batch: q (total_q, heads, head_dim), k, v (total_k, heads_kv,
    head_dim) and the int32 offsets as flash_attn_varlen_func takes them (read on the device
    only). The operands (fp8.hpp): q and k packed like the inputs; vt (heads_kv, head_dim,
    fp8_varlen_rows(total_k, B)) and the descales over the padded row space, so that no block
    spans two sequences. PyTorch, CuPy and JAX (eager)."""
    fw = _inputs_framework(q, k, v)
    int8 = _qk_int8(qk_dtype)
    if len(q.shape) != 3 or len(k.shape) != 3:
        raise ValueError("q, k: expected rank 3 (total, heads, head_dim)")
    tq, hq, d = q.shape
    tk, hkv = k.shape[0], k.shape[1]
    n = _sequences(cu_seqlens_q)
    rows_q, rows_k = fp8_varlen_rows(tq, n), fp8_varlen_rows(tk, n)
    qk = "int8" if int8 else "e4m3"

    def run(empty, stream, inputs, call_args=_call_args):
        ops = Fp8Operands(
            q=empty((tq, hq, d), qk), k=empty((tk, hkv, d), qk), vt=empty((hkv, d, rows_k), "e4m3"),
            q_descale=empty((hq, rows_q // FP8_BLOCK_ROWS), "float32"),
            k_descale=empty((hkv, rows_k // FP8_BLOCK_ROWS), "float32"),
            v_descale=empty((hkv, rows_k // FP8_BLOCK_ROWS), "float32"))
        _warpattn.quantize_fp8_varlen(*inputs, *call_args(ops), cu_seqlens_q, cu_seqlens_k, bool(rotate), int(seed),
                                      bool(per_tensor), stream)
        return ops

    return _run_quantize(fw, q, k, v, int8, run, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)


def flash_attn_fp8_varlen_func(ops: Fp8Operands, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               softmax_scale: Optional[float] = None, causal=False, out_dtype="bfloat16",
                               return_lse=False, out=None, seqused_k=None, check_descales=True, window_size=(-1, -1),
                               softcap=0.0, sinks=None, batch_invariant=False):
    """flash_attn_fp8_func on a packed batch (quantize_fp8_varlen's operands): out (total_q,
    heads, head_dim) in out_dtype, lse (heads, total_q); the offsets and max_seqlen_* as
    flash_attn_varlen_func takes them; window_size and sinks as flash_attn_fp8_func (softcap
    refused)."""
    fw = framework_of(ops.q, "q")
    _check_sinks(sinks, fw)
    kind = _dtype_name(out_dtype, "out_dtype", {"bfloat16", "float16"})
    tq, hq, d = ops.q.shape
    scale = None if softmax_scale is None else float(softmax_scale)
    model = _model_options(window_size, softcap, sinks)

    def run(empty, stream, args):
        o = out if out is not None else empty((tq, hq, d), kind)
        lse = empty((hq, tq), "float32") if return_lse else None
        _warpattn.forward_fp8_varlen(*args, o, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, int(max_seqlen_q),
                                     int(max_seqlen_k), scale, bool(causal), stream, bool(check_descales),
                                     batch_invariant=bool(batch_invariant), **model)
        return o, lse

    def wait_for_jax():
        _wait_for_jax_arrays(q_descale=ops.q_descale, k_descale=ops.k_descale, v_descale=ops.v_descale,
                             cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, **_jax_sinks(sinks))

    o, lse = _run_forward(fw, ops, out, run, wait_for_jax)
    return (o, lse) if return_lse else o
