"""warpattn.jax_ffi: warpattn as XLA FFI custom calls, inside jax.jit.

Without a GPU (any machine with JAX): the lowering for the CUDA platform (the custom calls, their
target names, operands, results and attributes), the handlers' bindings (each call decodes on
the CPU up to the CUDA stream it asks for), vmap's and shard_map's lowering, the trace-time
argument errors with the library's messages (the same as the NumPy path's), FP8's pair
(quantize_fp8, flash_attn_fp8) likewise, and warpattn's public functions routing JAX arrays
through the FFI calls. On an sm_90 GPU: jitted against eager bitwise, values and gradients
against jax.nn.dot_product_attention in fp32 (XLA's), packed batches against each sequence
alone, vmap, no host synchronisation in a jitted call, FP8 against the DLPack path bitwise and
against fp32 XLA within FP8's bounds, and a 2-GPU shard_map against the unsharded call.
"""
import contextlib
import re
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed")
import jax.numpy as jnp  # noqa: E402

import warpattn  # noqa: E402
from warpattn import jax_ffi  # noqa: E402

if not jax_ffi.available():
    pytest.skip("this build of warpattn has no XLA FFI handlers (jax was not importable when it was built)",
                allow_module_level=True)

from warpattn import _warpattn, _warpattn_jax, api  # noqa: E402

SDS = jax.ShapeDtypeStruct
BF16 = jnp.bfloat16


def _gpu_reason():
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        return "JAX sees no GPU"
    capability = getattr(gpus[0], "compute_capability", None)
    if capability is not None and str(capability) not in ("9.0", "90"):
        return "needs an sm_90 GPU, found compute capability %s" % capability
    return None


def lower_for_cuda(fn, *args):
    """The StableHLO text of jax.jit(fn) lowered for the CUDA platform from abstract arguments
    (no GPU needed)."""
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def custom_calls(text, target):
    """The lines of `text` that call `target`."""
    return [line for line in text.splitlines() if "custom_call @%s(" % target in line]


def qkv_specs(b=2, sq=256, sk=256, hq=8, hkv=8, d=64, dtype=BF16):
    return SDS((b, sq, hq, d), dtype), SDS((b, sk, hkv, d), dtype), SDS((b, sk, hkv, d), dtype)


E4M3 = jnp.float8_e4m3fn


def blocks(n):
    return (n + 127) // 128


def fp8_specs(b=2, sq=300, sk=500, hq=8, hkv=2, d=128, codes=E4M3):
    """Shapes and dtypes of FP8 operands (include/warpattn/fp8.hpp's layout)."""
    return warpattn.Fp8Operands(
        SDS((b, sq, hq, d), codes), SDS((b, sk, hkv, d), codes), SDS((b, hkv, d, (sk + 15) // 16 * 16), E4M3),
        SDS((b, hq, blocks(sq)), jnp.float32), SDS((b, hkv, blocks(sk)), jnp.float32),
        SDS((b, hkv, blocks(sk)), jnp.float32))


def fp8_arrays(specs):
    """Arrays of those shapes: zero codes, descales of one (valid)."""
    return warpattn.Fp8Operands(*(jnp.ones(s.shape, s.dtype) if s.dtype == jnp.float32 else jnp.zeros(s.shape, s.dtype)
                                  for s in specs))


# ====================================================================== no GPU needed

def test_module_and_targets():
    assert jax_ffi.available()
    targets = _warpattn_jax.jax_ffi_targets()
    assert sorted(targets) == sorted(jax_ffi.TARGETS)
    assert all(type(c).__name__ == "PyCapsule" for c in targets.values())
    assert jax_ffi.register() is True and jax_ffi.register() is True  # once; a second call is free


@pytest.mark.parametrize("order", ["import warpattn, jax", "import jax, warpattn",
                                   "import warpattn; from warpattn import jax_ffi"])
def test_import_orders(order):
    # warpattn imported before JAX, or jax_ffi alone: JAX (and its ml_dtypes) must still load. With
    # the FFI handlers inside _warpattn this crashed in ml_dtypes' float4 finfo (jax 0.11.2, run
    # 114), hence their own module (python/src/jax_module.cpp). A fresh interpreter per order.
    code = order + "; import jax.numpy as jnp, ml_dtypes; print(ml_dtypes.finfo(ml_dtypes.float4_e2m1fn).eps)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (order, done.returncode, done.stderr[-2000:])


def test_forward_lowering():
    text = lower_for_cuda(lambda q, k, v: jax_ffi.flash_attn(q, k, v, softmax_scale=0.5, causal=True),
                          *qkv_specs(hkv=2))
    (call,) = custom_calls(text, "warpattn_forward")
    assert "mhlo.backend_config = {" in call  # the typed FFI (api_version 4): attributes as a dictionary
    assert "causal = true" in call and "has_scale = true" in call and "softmax_scale = 5.000000e-01 : f32" in call
    assert "(tensor<2x256x8x64xbf16>, tensor<2x256x2x64xbf16>, tensor<2x256x2x64xbf16>) -> tensor<2x256x8x64xbf16>" \
        in call  # no lse asked for: none written
    text = lower_for_cuda(lambda q, k, v: jax_ffi.flash_attn(q, k, v, return_lse=True), *qkv_specs())
    (call,) = custom_calls(text, "warpattn_forward")
    assert "has_scale = false" in call and "causal = false" in call
    assert "-> (tensor<2x256x8x64xbf16>, tensor<2x8x256xf32>)" in call


def test_backward_lowering_and_workspace():
    q, k, v = qkv_specs(sq=300, sk=500, hkv=4, d=128)

    def loss(q, k, v):
        return jax_ffi.flash_attn(q, k, v, causal=True, deterministic=True).astype(jnp.float32).sum()
    text = lower_for_cuda(jax.grad(loss, argnums=(0, 1, 2)), q, k, v)
    (forward,) = custom_calls(text, "warpattn_forward")
    (backward,) = custom_calls(text, "warpattn_backward")
    assert "-> (tensor<2x300x8x128xbf16>, tensor<2x8x300xf32>)" in forward  # lse kept for the backward
    assert "deterministic = true" in backward and "causal = true" in backward
    # The workspace is a result of the call (XLA's memory, per call), 256 bytes beyond what the
    # library asks for (the handler aligns its start).
    need = _warpattn.backward_workspace_bytes(np.empty((2, 300, 8, 128), np.float16), None, True, True)
    assert ("tensor<%dxui8>" % (need + 256)) in backward
    assert "-> (tensor<2x300x8x128xbf16>, tensor<2x500x4x128xbf16>, tensor<2x500x4x128xbf16>, tensor<%dxui8>)" \
        % (need + 256) in backward


def test_varlen_lowering():
    q, k = SDS((1000, 8, 64), BF16), SDS((1200, 2, 64), BF16)
    cu = SDS((4,), jnp.int32)
    used = SDS((3,), jnp.int32)

    def loss(q, k, v, cu_q, cu_k, used):
        out = jax_ffi.flash_attn_varlen(q, k, v, cu_q, cu_k, 600, 700, causal=True, seqused_k=used)
        return out.astype(jnp.float32).sum()
    text = lower_for_cuda(jax.grad(loss, argnums=(0, 1, 2)), q, k, k, cu, cu, used)
    (forward,) = custom_calls(text, "warpattn_forward_varlen")
    (backward,) = custom_calls(text, "warpattn_backward_varlen")
    assert "max_seqlen_q = 600" in forward and "max_seqlen_k = 700" in forward
    assert "tensor<4xi32>, tensor<4xi32>, tensor<3xi32>) -> (tensor<1000x8x64xbf16>, tensor<8x1000xf32>)" in forward
    need = _warpattn.backward_varlen_workspace_bytes(np.empty((1000, 8, 64), np.float16), 3, None, True, False)
    assert "tensor<%dxui8>" % (need + 256) in backward and "deterministic = false" in backward
    text = lower_for_cuda(lambda q, k, v, cu_q, cu_k: jax_ffi.flash_attn_varlen(q, k, v, cu_q, cu_k, 1, 1),
                          q, k, k, cu, cu)
    (forward,) = custom_calls(text, "warpattn_forward_varlen")
    assert "tensor<4xi32>, tensor<4xi32>) -> tensor<1000x8x64xbf16>" in forward  # no seqused_k, no lse


def test_vmap_lowering_folds_into_batch():
    q, k, v = (SDS((3,) + s.shape, s.dtype) for s in qkv_specs(hkv=2))
    text = lower_for_cuda(jax.vmap(lambda q, k, v: jax_ffi.flash_attn(q, k, v)), q, k, v)
    (call,) = custom_calls(text, "warpattn_forward")
    assert "(tensor<3x2x256x8x64xbf16>, tensor<3x2x256x2x64xbf16>, tensor<3x2x256x2x64xbf16>)" in call
    # k and v shared by every mapped q: broadcast to the mapped axis first.
    text = lower_for_cuda(jax.vmap(lambda q, k, v: jax_ffi.flash_attn(q, k, v), in_axes=(0, None, None)),
                          q, *qkv_specs(hkv=2)[1:])
    assert len(custom_calls(text, "warpattn_forward")) == 1 and "broadcast_in_dim" in text
    # The gradient under vmap: one backward call over the mapped axis too.
    text = lower_for_cuda(jax.vmap(jax.grad(lambda q, k, v: jax_ffi.flash_attn(q, k, v).astype(jnp.float32).sum())),
                          q, k, v)
    (backward,) = custom_calls(text, "warpattn_backward")
    assert "tensor<3x2x256x8x64xbf16>" in backward
    # Packed batches under vmap: one call after the other (a loop), not folded.
    pq, pk, cu = SDS((2, 100, 8, 64), BF16), SDS((2, 100, 8, 64), BF16), SDS((2, 3), jnp.int32)
    text = lower_for_cuda(jax.vmap(lambda q, k, c: jax_ffi.flash_attn_varlen(q, k, k, c, c, 50, 50)), pq, pk, cu)
    (call,) = custom_calls(text, "warpattn_forward_varlen")
    assert "(tensor<100x8x64xbf16>, tensor<100x8x64xbf16>, tensor<100x8x64xbf16>, tensor<3xi32>" in call


@pytest.fixture(scope="module")
def host_check():
    """Registers the host check under the targets' names for XLA's CPU platform: the same
    handlers without a stream, which decode the call, build the views (vmap's folding, the
    workspace's placement) and check every argument rule of the library call on XLA's CPU
    buffers, then stop at the library's device check. run(fn, *args) runs jax.jit(fn) on the CPU
    and returns the message it failed with."""
    for name, capsule in _warpattn_jax.jax_ffi_host_check_targets().items():
        jax.ffi.register_ffi_target(name, capsule, platform="cpu")
    cpu = jax.devices("cpu")[0]

    def run(fn, *args):
        with jax.default_device(cpu), pytest.raises(jax.errors.JaxRuntimeError) as info:
            jax.block_until_ready(jax.jit(fn)(*(jax.device_put(a, cpu) for a in args)))
        return str(info.value)
    return run


# Where a call that passed every argument rule stops on the CPU: without a CUDA device at all,
# or on a GPU machine at the CPU buffers.
PAST_THE_RULES = r"INVALID_ARGUMENT: (no CUDA device with compute capability 9\.0|.*expected device memory|.*cudaPointerGetAttributes)"


def host_check_cases():
    q = jnp.zeros((1, 128, 2, 64), BF16)
    kv = jnp.zeros((1, 200, 1, 64), BF16)
    lse = jnp.zeros((1, 2, 128), jnp.float32)
    packed, packed_kv = jnp.zeros((128, 4, 128), BF16), jnp.zeros((150, 2, 128), BF16)
    packed_lse = jnp.zeros((4, 128), jnp.float32)
    cu_q, cu_k = jnp.array([0, 100, 128], jnp.int32), jnp.array([0, 50, 150], jnp.int32)
    mapped = jnp.zeros((3, 1, 128, 2, 64), BF16)
    sinks, packed_sinks = jnp.zeros(2, jnp.float32), jnp.zeros(4, jnp.float32)
    return {
        "forward": (lambda q, k: jax_ffi.flash_attn(q, k, k, causal=True), q, kv),
        "forward_lse": (lambda q, k: jax_ffi.flash_attn(q, k, k, softmax_scale=0.1, return_lse=True), q, kv),
        "backward": (lambda q, k, l: jax_ffi.flash_attn_backward(q, q, k, k, q, l, causal=True, deterministic=True),
                     q, kv, lse),
        "varlen": (lambda p, k, a, b: jax_ffi.flash_attn_varlen(p, k, k, a, b, 100, 100), packed, packed_kv, cu_q, cu_k),
        "varlen_seqused_lse": (lambda p, k, a, b: jax_ffi.flash_attn_varlen(
            p, k, k, a, b, 100, 100, seqused_k=b[1:], causal=True, return_lse=True), packed, packed_kv, cu_q, cu_k),
        "varlen_backward": (lambda p, k, l, a, b: jax_ffi.flash_attn_varlen_backward(
            p, p, k, k, p, l, a, b, 100, 100, seqused_k=b[1:]), packed, packed_kv, packed_lse, cu_q, cu_k),
        "vmap_forward": (jax.vmap(lambda q: jax_ffi.flash_attn(q, q, q, return_lse=True)), mapped),
        "vmap_shared_kv": (jax.vmap(lambda q, k: jax_ffi.flash_attn(q, k, k), in_axes=(0, None)), mapped, kv),
        "vmap_backward": (jax.vmap(lambda q, l: jax_ffi.flash_attn_backward(q, q, q, q, q, l)), mapped,
                          jnp.zeros((3,) + lse.shape, jnp.float32)),
        "vmap_varlen": (jax.vmap(lambda p: jax_ffi.flash_attn_varlen(p, p, p, cu_q, cu_q, 100, 100)),
                        jnp.zeros((2,) + packed.shape, BF16)),
        "backward_batch_invariant": (lambda q, k, l: jax_ffi.flash_attn_backward(
            q, q, k, k, q, l, batch_invariant=True), q, kv, lse),
        "quantize_fp8": (lambda q, k: jax_ffi.quantize_fp8(q, k, k), q, kv),
        "quantize_fp8_int8_per_tensor": (lambda q, k: jax_ffi.quantize_fp8(
            q, k, k, rotate=False, seed=2 ** 64 - 1, per_tensor=True, qk_dtype="int8"), q, kv),
        "forward_fp8": (lambda *ops: jax_ffi.flash_attn_fp8(ops, causal=True), *fp8_arrays(fp8_specs())),
        "forward_fp8_int8_lse": (lambda *ops: jax_ffi.flash_attn_fp8(ops, softmax_scale=0.3, out_dtype="float16",
                                                                     return_lse=True),
                                 *fp8_arrays(fp8_specs(b=1, sq=129, sk=17, hq=4, hkv=4, d=256, codes=jnp.int8))),
        "vmap_quantize_fp8": (jax.vmap(lambda q: jax_ffi.quantize_fp8(q, q, q)), mapped),
        "vmap_quantize_fp8_per_tensor": (jax.vmap(lambda q: jax_ffi.quantize_fp8(q, q, q, per_tensor=True)), mapped),
        "vmap_forward_fp8": (jax.vmap(lambda *ops: jax_ffi.flash_attn_fp8(ops, return_lse=True)),
                             *fp8_arrays(SDS((3,) + s.shape, s.dtype) for s in fp8_specs(1, 128, 200, 2, 1, 64))),
        # window_size, softcap and sinks (issue 19): attributes and the optional operand decoded.
        "forward_model_options": (lambda q, k, s: jax_ffi.flash_attn(
            q, k, k, causal=True, window_size=(32, 0), softcap=20.0, sinks=s, return_lse=True), q, kv, sinks),
        "varlen_sinks_alone": (lambda p, k, a, b, s: jax_ffi.flash_attn_varlen(
            p, k, k, a, b, 100, 100, window_size=(16, 16), sinks=s), packed, packed_kv, cu_q, cu_k, packed_sinks),
        "varlen_seqused_and_sinks": (lambda p, k, a, b, s: jax_ffi.flash_attn_varlen(
            p, k, k, a, b, 100, 100, seqused_k=b[1:], softcap=3.0, sinks=s), packed, packed_kv, cu_q, cu_k,
            packed_sinks),
        "vmap_forward_sinks": (jax.vmap(lambda q, s: jax_ffi.flash_attn(q, q, q, sinks=s)), mapped,
                               jnp.zeros((3, 2), jnp.float32)),
        "forward_fp8_window_sinks": (lambda s, *ops: jax_ffi.flash_attn_fp8(ops, causal=True, window_size=(64, 0),
                                                                            sinks=s),
                                     jnp.zeros(8, jnp.float32), *fp8_arrays(fp8_specs())),
        # The backward calls with them: the sinks operand and the dsinks result decoded too.
        "backward_window_sinks": (lambda q, k, l, s: jax_ffi.flash_attn_backward(
            q, q, k, k, q, l, causal=True, window_size=(32, 0), sinks=s), q, kv, lse, sinks),
        "backward_softcap_128": (lambda p, l: jax_ffi.flash_attn_backward(
            p[None], p[None], p[None], p[None], p[None], l[None], softcap=5.0), packed, packed_lse),
        "varlen_backward_sinks_alone": (lambda p, k, l, a, b, s: jax_ffi.flash_attn_varlen_backward(
            p, p, k, k, p, l, a, b, 100, 100, window_size=(16, 16), softcap=3.0, sinks=s), packed, packed_kv,
            packed_lse, cu_q, cu_k, packed_sinks),
        "varlen_backward_seqused_and_sinks": (lambda p, k, l, a, b, s: jax_ffi.flash_attn_varlen_backward(
            p, p, k, k, p, l, a, b, 100, 100, seqused_k=b[1:], causal=True, window_size=(8, 0), sinks=s), packed,
            packed_kv, packed_lse, cu_q, cu_k, packed_sinks),
        "vmap_backward_sinks": (jax.vmap(lambda q, l, s: jax_ffi.flash_attn_backward(q, q, q, q, q, l, sinks=s)),
                                mapped, jnp.zeros((3,) + lse.shape, jnp.float32), jnp.zeros((3, 2), jnp.float32)),
        # The KV-cache call (issue 16): its optional operands and results as its flags name them.
        **kvcache_host_cases(),
    }


def kvcache_host_cases():
    q = jnp.zeros((2, 3, 8, 64), BF16)
    cache, pages = jnp.zeros((2, 96, 2, 64), BF16), jnp.zeros((7, 16, 2, 64), BF16)
    new = jnp.zeros((2, 3, 2, 64), BF16)
    lens, table = jnp.array([5, 90], jnp.int32), jnp.array([[3, 0, 6, 1, 2, 4], [5, 1, 2, 3, 4, 0]], jnp.int32)
    sinks = jnp.zeros(8, jnp.float32)
    return {
        "kvcache_dense_full": (lambda q, c: jax_ffi.flash_attn_with_kvcache(q, c, c), q, cache),
        "kvcache_dense_lengths": (lambda q, c, l: jax_ffi.flash_attn_with_kvcache(q, c, c, cache_seqlens=l,
                                                                                  causal=True), q, cache, lens),
        "kvcache_paged_lse_model_options": (lambda q, p, l, t, s: jax_ffi.flash_attn_with_kvcache(
            q, p, p, cache_seqlens=l, block_table=t, window_size=(8, 0), causal=True, softcap=10.0, sinks=s,
            num_splits=3, return_lse=True), q, pages, lens, table, sinks),
        "kvcache_append": (lambda q, c, n, l: jax_ffi.flash_attn_with_kvcache(q, c, c, n, n, cache_seqlens=l),
                           q, cache, new, lens),
        "kvcache_paged_append_lse": (lambda q, p, n, l, t: jax_ffi.flash_attn_with_kvcache(
            q, p, p, n, n, cache_seqlens=l, block_table=t, return_lse=True, batch_invariant=True),
            q, pages, new, lens, table),
        "vmap_kvcache": (jax.vmap(lambda q, c, l: jax_ffi.flash_attn_with_kvcache(q, c, c, cache_seqlens=l)),
                         jnp.zeros((3,) + q.shape, BF16), jnp.zeros((3,) + cache.shape, BF16),
                         jnp.zeros((3, 2), jnp.int32)),
    }


@pytest.mark.parametrize("case", sorted(host_check_cases()))
def test_handlers_on_the_host(host_check, case):
    # Each call's operands, results and attributes decode as the handler binds them, and the views
    # it builds pass every argument rule: the call stops only at the device check.
    fn, *args = host_check_cases()[case]
    message = host_check(fn, *args)
    assert re.match(PAST_THE_RULES, message), message


def test_handlers_on_the_host_controls(host_check):
    # What the check above would see otherwise: a broken rule gives the library's message as an
    # InvalidArgument error (the trace-time check is bypassed here by calling ffi_call directly),
    # an attribute of the wrong type fails the decoding. (Not tested: one attribute too many. That
    # is XLA's own check, and the jaxlib on the H200 host crashed in it, run 108.)
    q = jnp.zeros((1, 128, 2, 100), BF16)
    out = jax.ShapeDtypeStruct(q.shape, q.dtype)
    attrs = {"causal": True, "has_scale": False, "softmax_scale": np.float32(0), "batch_invariant": False}
    model = {"window_left": np.int32(-1), "window_right": np.int32(-1), "softcap": np.float32(0)}  # the forward's
    message = host_check(lambda q: jax.ffi.ffi_call("warpattn_forward", out)(q, q, q, **attrs, **model), q)
    assert message == "INVALID_ARGUMENT: q: head_dim (shape[3]) must be a multiple of 8 from 8 to 512, got 100", message
    q = jnp.zeros((1, 128, 2, 64), BF16)
    out = jax.ShapeDtypeStruct(q.shape, q.dtype)
    wrong_type = host_check(lambda q: jax.ffi.ffi_call("warpattn_forward", out)(q, q, q, **dict(
        attrs, causal=np.int32(1)), **model), q)
    assert "Failed to decode" in wrong_type and "expected PRED" in wrong_type, wrong_type
    # forward_varlen's has_sinks: its last optional operand is the sinks (a wrong shape reported as
    # theirs), or without it seqused_k (the same float32 array then reported as seqused_k).
    packed, cu = jnp.zeros((128, 4, 128), BF16), jnp.array([0, 100, 128], jnp.int32)
    short_sinks = jnp.zeros(3, jnp.float32)
    varlen = dict(attrs, causal=False, max_seqlen_q=np.int64(100), max_seqlen_k=np.int64(100), **model)
    packed_out = jax.ShapeDtypeStruct(packed.shape, packed.dtype)

    def varlen_call(has_sinks, *optional):
        return host_check(lambda p, c, *o: jax.ffi.ffi_call("warpattn_forward_varlen", packed_out)(
            p, p, p, c, c, *o, has_sinks=np.bool_(has_sinks), **varlen), packed, cu, *optional)
    sinks_message = "INVALID_ARGUMENT: sinks: expected shape (4) (one logit per query head), got (3)"
    assert varlen_call(True, short_sinks) == sinks_message
    assert varlen_call(True, cu[1:], short_sinks) == sinks_message
    assert "seqused_k" in varlen_call(False, short_sinks)
    # A workspace one byte short of the library's need once aligned.
    lse = jnp.zeros((1, 2, 128), jnp.float32)
    need = _warpattn_jax.jax_ffi_workspace_bytes("warpattn_backward", ((1, 128, 2, 64), "bfloat16"), 0, {})
    results = [jax.ShapeDtypeStruct(q.shape, q.dtype)] * 3 + [jax.ShapeDtypeStruct((need - 256 - 1,), jnp.uint8)]
    short = host_check(lambda q, l: jax.ffi.ffi_call("warpattn_backward", results)(
        q, q, q, q, q, l, deterministic=False, **attrs, **model), q, lse)
    assert "workspace: expected at least" in short, short
    # The backward calls' sinks and dsinks: sinks without a dsinks result are the library's error;
    # backward_varlen's has_sinks places its optional operands as forward_varlen's does.
    need = _warpattn_jax.jax_ffi_workspace_bytes("warpattn_backward", ((1, 128, 2, 64), "bfloat16"), 0,
                                                 {"has_sinks": True})
    results = [jax.ShapeDtypeStruct(q.shape, q.dtype)] * 3 + [jax.ShapeDtypeStruct((need,), jnp.uint8)]
    no_dsinks = host_check(lambda q, l, s: jax.ffi.ffi_call("warpattn_backward", results)(
        q, q, q, q, q, l, s, deterministic=False, **attrs, **model), q, lse, jnp.zeros(2, jnp.float32))
    assert no_dsinks == "INVALID_ARGUMENT: dsinks: expected a (heads_q) float32 tensor for the sinks' gradient, " \
        "got none", no_dsinks
    packed_lse = jnp.zeros((4, 128), jnp.float32)
    need = _warpattn_jax.jax_ffi_workspace_bytes("warpattn_backward_varlen", (packed.shape, "bfloat16"), 2,
                                                 {"has_sinks": True})
    varlen_results = [packed_out] * 3 + [jax.ShapeDtypeStruct((need,), jnp.uint8),
                                         jax.ShapeDtypeStruct((4,), jnp.float32)]

    def varlen_backward(has_sinks, *optional):
        return host_check(lambda p, l, c, *o: jax.ffi.ffi_call("warpattn_backward_varlen", varlen_results)(
            p, p, p, p, p, l, c, c, *o, has_sinks=np.bool_(has_sinks), deterministic=False, **varlen), packed,
            packed_lse, cu, *optional)
    sinks_message = "INVALID_ARGUMENT: sinks: expected shape (4) (one per query head), got (3)"  # the backward's
    assert varlen_backward(True, short_sinks) == sinks_message
    assert varlen_backward(True, cu[1:], short_sinks) == sinks_message
    # Without has_sinks the operand is seqused_k, and the dsinks result then has no sinks.
    assert varlen_backward(False, short_sinks) == \
        "INVALID_ARGUMENT: dsinks: given without sinks (the forward call's sinks), expected none"


def test_trace_time_errors():
    q, k, v = qkv_specs()
    attn = jax.jit(jax_ffi.flash_attn, static_argnames=("causal",))
    cases = [
        ((SDS((2, 256, 8, 100), BF16), SDS((2, 256, 8, 100), BF16), SDS((2, 256, 8, 100), BF16)),
         ValueError, r"q: head_dim \(shape\[3\]\) must be a multiple of 8 from 8 to 512, got 100"),
        ((SDS(q.shape, jnp.float32), k, v), ValueError, "q: expected dtype float16 or bfloat16, got float32"),
        ((q, SDS(k.shape, jnp.float16), v), ValueError, r"k: expected dtype bfloat16 \(same as q\), got float16"),
        ((q, SDS((2, 256, 3, 64), BF16), SDS((2, 256, 3, 64), BF16)), ValueError, "multiple"),
        ((q, SDS((1, 256, 8, 64), BF16), v), ValueError, "k: "),
        ((SDS((256, 8, 64), BF16), k, v), ValueError, r"q: expected rank 4 \(batch, seqlen, heads, head_dim\), got rank 3"),
        ((q, SDS(k.shape, jnp.int32), v), ValueError, "k: expected dtype"),
    ]
    for args, error, match in cases:
        with pytest.raises(error, match=match):
            attn(*args)


def test_trace_time_errors_are_the_librarys_messages():
    # The same rule broken through the FFI path (shapes at trace time) and the NumPy path (the
    # library on host arrays) gives the same message.
    cases = [
        ((2, 256, 8, 100), (2, 256, 8, 100), np.float16),
        ((2, 256, 8, 520), (2, 256, 8, 520), np.float16),
        ((2, 256, 8, 64), (2, 256, 3, 64), np.float16),
        ((2, 256, 8, 64), (1, 256, 8, 64), np.float16),
        ((2, 256, 8, 64), (2, 256, 8, 128), np.float16),
        ((2, 256, 8, 64), (2, 256, 8, 64), np.float32),
    ]
    for q_shape, k_shape, dtype in cases:
        arrays = (np.zeros(q_shape, dtype), np.zeros(k_shape, dtype), np.zeros(k_shape, dtype))
        with pytest.raises(ValueError) as numpy_error:
            warpattn.flash_attn_func(*arrays)
        with pytest.raises(ValueError) as ffi_error:
            jax.jit(jax_ffi.flash_attn).trace(*(SDS(a.shape, a.dtype) for a in arrays))
        assert str(ffi_error.value) == str(numpy_error.value)


def test_varlen_trace_time_errors():
    q, k = SDS((1000, 8, 64), BF16), SDS((1200, 2, 64), BF16)
    cu = SDS((4,), jnp.int32)

    def trace(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs):
        jax.jit(lambda q, k, v, a, b: jax_ffi.flash_attn_varlen(q, k, v, a, b, max_q, max_k, **kwargs)).trace(
            q, k, v, cu_q, cu_k)
    with pytest.raises(ValueError, match="cu_seqlens_q: expected dtype int32, got float32"):
        trace(q, k, k, SDS((4,), jnp.float32), cu, 10, 10)
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        trace(q, k, k, cu, SDS((5,), jnp.int32), 10, 10)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        jax_ffi.flash_attn_varlen(q, k, k, cu, cu, -1, 10)
    with pytest.raises(ValueError, match=r"q: expected rank 3 \(total_q, heads, head_dim\), got rank 4"):
        trace(SDS((1, 1000, 8, 64), BF16), k, k, cu, cu, 10, 10)
    with pytest.raises(TypeError, match="max_seqlen_k: expected a Python int"):
        trace(q, k, k, cu, cu, 10, 1.5)
    with pytest.raises(TypeError, match="max_seqlen_q: expected a Python int .*, got a traced value"):
        jax.jit(lambda q, k, v, a, b, n: jax_ffi.flash_attn_varlen(q, k, v, a, b, n, 10)).trace(
            q, k, k, cu, cu, 10)


def test_kvcache_lowering():
    # The KV-cache call: its flags, its operands in their order, and with new keys and values the
    # grown caches as results aliased to the cache operands (in place where the caller donates).
    q, cache, new = SDS((2, 1, 8, 128), BF16), SDS((2, 4096, 2, 128), BF16), SDS((2, 1, 2, 128), BF16)
    lens, table, pages = SDS((2,), jnp.int32), SDS((2, 4), jnp.int32), SDS((9, 1024, 2, 128), BF16)
    text = lower_for_cuda(lambda q, c, l: jax_ffi.flash_attn_with_kvcache(q, c, c, cache_seqlens=l, causal=True),
                          q, cache, lens)
    [call] = custom_calls(text, "warpattn_forward_kvcache")
    assert "has_cache_seqlens = true" in call and "has_new_kv = false" in call and "has_lse = false" in call
    assert "output_operand_aliases" not in call
    paged = custom_calls(lower_for_cuda(lambda q, p, l, t: jax_ffi.flash_attn_with_kvcache(
        q, p, p, cache_seqlens=l, block_table=t, num_splits=5, return_lse=True), q, pages, lens, table),
        "warpattn_forward_kvcache")[0]
    assert "has_block_table = true" in paged and "num_splits = 5 : i32" in paged and "has_lse = true" in paged
    assert "-> (tensor<2x1x8x128xbf16>, tensor<2x8x1xf32>)" in paged

    def append(q, c, n, l):
        (out, lse), k_cache, v_cache = jax_ffi.flash_attn_with_kvcache(q, c, c, n, n, cache_seqlens=l,
                                                                        return_lse=True)
        return out, lse, k_cache, v_cache
    text = jax.jit(append, donate_argnums=1).trace(q, cache, new, lens).lower(lowering_platforms=("cuda",)).as_text()
    [call] = custom_calls(text, "warpattn_forward_kvcache")
    assert "has_new_kv = true" in call
    assert "output_operand_aliases = [#stablehlo.output_operand_alias<output_tuple_indices = [2], operand_index = 1" in call
    assert "output_tuple_indices = [3], operand_index = 2" in call
    assert "tf.aliasing_output" in text  # the donated cache is the grown one's buffer


def test_kvcache_trace_time_errors():
    q, cache, lens = jnp.zeros((2, 1, 8, 64), BF16), jnp.zeros((2, 64, 2, 64), BF16), jnp.zeros(2, jnp.int32)
    call = jax.jit(lambda q, c, v, l: jax_ffi.flash_attn_with_kvcache(q, c, v, cache_seqlens=l))
    with pytest.raises(ValueError, match=re.escape("v_cache: expected shape (2, 64, 3, 64) (same as k_cache)")):
        call.trace(q, jnp.zeros((2, 64, 3, 64), BF16), cache, lens)
    with pytest.raises(ValueError, match="cache_seqlens"):
        call.trace(q, cache, cache, jnp.zeros(2, jnp.float32))
    with pytest.raises(ValueError, match="k, v: give both"):
        jax.jit(lambda q, c: jax_ffi.flash_attn_with_kvcache(q, c, c, k=q)).trace(q, cache)
    with pytest.raises(ValueError, match="page_size"):
        jax.jit(lambda q, p, t: jax_ffi.flash_attn_with_kvcache(q, p, p, block_table=t)).trace(
            q, jnp.zeros((4, 0, 2, 64), BF16), jnp.zeros((2, 2), jnp.int32))


def test_arrays_off_the_gpu_are_refused():
    cpu = jax.devices("cpu")[0]
    q = jax.device_put(jnp.zeros((1, 128, 2, 64), BF16), cpu)
    with pytest.raises(TypeError, match="q: CUDA tensor required .* got a JAX array on cpu"):
        jax_ffi.flash_attn(q, q, q)
    packed, cu = jax.device_put(jnp.zeros((128, 2, 64), BF16), cpu), jnp.array([0, 128], jnp.int32)
    with pytest.raises(TypeError, match="q: CUDA tensor required"):
        jax_ffi.flash_attn_varlen(packed, packed, packed, cu, cu, 128, 128)


def test_gradient_of_lse_is_refused_when_traced():
    q, k, v = qkv_specs()

    def loss(q, k, v, use_lse):
        out, lse = jax_ffi.flash_attn(q, k, v, return_lse=True)
        total = out.astype(jnp.float32).sum()
        return total + lse.sum() if use_lse else total + jax.lax.stop_gradient(lse).sum()
    lower_for_cuda(jax.grad(lambda q, k, v: loss(q, k, v, False)), q, k, v)
    with pytest.raises(NotImplementedError, match="gradient of lse"):
        lower_for_cuda(jax.grad(lambda q, k, v: loss(q, k, v, True)), q, k, v)
    # Only lse used: dout is a zero, the backward still runs (and gives zero gradients).
    text = lower_for_cuda(jax.grad(lambda q, k, v: jax_ffi.flash_attn(q, k, v, return_lse=True)[0].sum()), q, k, v)
    assert custom_calls(text, "warpattn_backward")


def test_batch_invariant_is_an_attribute_of_every_call():
    q, k, v = qkv_specs(hkv=2)

    def loss(q, k, v):
        return jax_ffi.flash_attn(q, k, v, batch_invariant=True).astype(jnp.float32).sum()
    text = lower_for_cuda(jax.grad(loss, argnums=(0, 1, 2)), q, k, v)
    (forward,) = custom_calls(text, "warpattn_forward")
    (backward,) = custom_calls(text, "warpattn_backward")
    assert "batch_invariant = true" in forward and "batch_invariant = true" in backward
    text = lower_for_cuda(lambda q, k, v: jax_ffi.flash_attn(q, k, v), q, k, v)
    assert "batch_invariant = false" in custom_calls(text, "warpattn_forward")[0]
    packed, cu = SDS((1000, 8, 64), BF16), SDS((4,), jnp.int32)
    text = lower_for_cuda(jax.grad(lambda q, c: jax_ffi.flash_attn_varlen(
        q, q, q, c, c, 500, 500, batch_invariant=True).astype(jnp.float32).sum()), packed, cu)
    assert "batch_invariant = true" in custom_calls(text, "warpattn_forward_varlen")[0]
    assert "batch_invariant = true" in custom_calls(text, "warpattn_backward_varlen")[0]


# ------------------------------------------------- window_size, softcap and sinks, no GPU

def test_model_options_lowering():
    # window_size and softcap are attributes of the forward calls (defaults when not given); sinks
    # an operand after the others, float32 (heads,).
    q, k, v = qkv_specs(sk=300, hkv=2)
    sinks = SDS((8,), jnp.float32)
    text = lower_for_cuda(lambda q, k, v, s: jax_ffi.flash_attn(q, k, v, causal=True, window_size=(128, 0),
                                                                softcap=30.0, sinks=s), q, k, v, sinks)
    (call,) = custom_calls(text, "warpattn_forward")
    assert "window_left = 128 : i32" in call and "window_right = 0 : i32" in call
    assert "softcap = 3.000000e+01 : f32" in call and "causal = true" in call
    assert "tensor<2x300x2x64xbf16>, tensor<8xf32>) -> tensor<2x256x8x64xbf16>" in call
    (call,) = custom_calls(lower_for_cuda(lambda q, k, v: jax_ffi.flash_attn(q, k, v), q, k, v), "warpattn_forward")
    assert "window_left = -1 : i32" in call and "window_right = -1 : i32" in call
    assert "softcap = 0.000000e+00 : f32" in call and "xf32>) ->" not in call  # no sinks operand
    # Packed: has_sinks says which optional operand came (XLA decodes them by position).
    pq, pk, cu, used = SDS((1000, 8, 64), BF16), SDS((1200, 2, 64), BF16), SDS((4,), jnp.int32), SDS((3,), jnp.int32)
    text = lower_for_cuda(lambda q, k, a, b, s: jax_ffi.flash_attn_varlen(q, k, k, a, b, 600, 700, window_size=(64, 64),
                                                                          sinks=s), pq, pk, cu, cu, sinks)
    (call,) = custom_calls(text, "warpattn_forward_varlen")
    assert "has_sinks = true" in call and "window_left = 64 : i32" in call and "window_right = 64 : i32" in call
    assert "tensor<4xi32>, tensor<4xi32>, tensor<8xf32>) -> tensor<1000x8x64xbf16>" in call
    text = lower_for_cuda(lambda q, k, a, b, u, s: jax_ffi.flash_attn_varlen(q, k, k, a, b, 600, 700, softcap=5.0,
                                                                             seqused_k=u, sinks=s),
                          pq, pk, cu, cu, used, sinks)
    (call,) = custom_calls(text, "warpattn_forward_varlen")
    assert "has_sinks = true" in call and "softcap = 5.000000e+00 : f32" in call
    assert "tensor<4xi32>, tensor<4xi32>, tensor<3xi32>, tensor<8xf32>) ->" in call
    text = lower_for_cuda(lambda q, k, a, b, u: jax_ffi.flash_attn_varlen(q, k, k, a, b, 600, 700, seqused_k=u),
                          pq, pk, cu, cu, used)
    (call,) = custom_calls(text, "warpattn_forward_varlen")
    assert "has_sinks = false" in call and "tensor<4xi32>, tensor<4xi32>, tensor<3xi32>) ->" in call
    # FP8: a window and sinks (and softcap's attribute, which the library refuses unless 0).
    text = lower_for_cuda(lambda ops, s: jax_ffi.flash_attn_fp8(ops, causal=True, window_size=(256, 0), sinks=s),
                          fp8_specs(), sinks)
    (call,) = custom_calls(text, "warpattn_forward_fp8")
    assert "window_left = 256 : i32" in call and "window_right = 0 : i32" in call and "softcap = 0." in call
    assert "tensor<2x2x4xf32>, tensor<8xf32>) -> tensor<2x300x8x128xbf16>" in call


def test_model_options_under_vmap():
    # Without sinks the mapped axis is folded into the batch as ever; with sinks (which may be
    # mapped with the examples, and could then not be folded) the calls run one per example.
    q, k, v = (SDS((3,) + s.shape, s.dtype) for s in qkv_specs(hkv=2))
    text = lower_for_cuda(jax.vmap(lambda q, k, v: jax_ffi.flash_attn(q, k, v, window_size=(16, 16))), q, k, v)
    assert "(tensor<3x2x256x8x64xbf16>" in custom_calls(text, "warpattn_forward")[0]
    for in_axes, sinks in ((0, SDS((3, 8), jnp.float32)), ((0, 0, 0, None), SDS((8,), jnp.float32))):
        text = lower_for_cuda(jax.vmap(lambda q, k, v, s: jax_ffi.flash_attn(q, k, v, sinks=s), in_axes=in_axes),
                              q, k, v, sinks)
        (call,) = custom_calls(text, "warpattn_forward")
        assert "(tensor<2x256x8x64xbf16>, tensor<2x256x2x64xbf16>, tensor<2x256x2x64xbf16>, tensor<8xf32>)" in call


def first_line(error):
    """An error's message without what JAX appends to errors raised through traced user functions (a
    note on its traceback filtering)."""
    return str(error).splitlines()[0]


def test_model_option_errors_are_the_librarys_messages():
    # The same rule broken through the FFI path (at trace time) and through the library on NumPy
    # arrays gives the same message; FP8's refusal of softcap too.
    q, k = np.zeros((2, 256, 8, 64), np.float16), np.zeros((2, 300, 2, 64), np.float16)
    for options in [dict(window_size=(-2, 0)), dict(window_size=(3, -5)), dict(window_size=(0, 1), causal=True),
                    dict(softcap=-1.0), dict(softcap=np.inf), dict(sinks=np.zeros(4, np.float32)),
                    dict(sinks=np.zeros(8, np.float16)), dict(sinks=np.zeros((2, 8), np.float32))]:
        with pytest.raises(ValueError) as numpy_error:
            warpattn.flash_attn_func(q, k, k, **options)
        sinks = options.pop("sinks", None)
        with pytest.raises(ValueError) as ffi_error:
            jax.jit(lambda q, k, s: jax_ffi.flash_attn(q, k, k, sinks=s, **options)).trace(
                SDS(q.shape, q.dtype), SDS(k.shape, k.dtype), None if sinks is None else SDS(sinks.shape, sinks.dtype))
        assert first_line(ffi_error.value) == str(numpy_error.value), options
    specs = fp8_specs()
    arrays = [np.zeros(s.shape, np.uint8 if s.dtype == E4M3 else s.dtype) for s in specs]
    with pytest.raises(ValueError) as numpy_error:
        _warpattn.forward_fp8(*arrays, np.zeros(specs.q.shape, np.float16), None, None, False, 0, False, softcap=30.0)
    with pytest.raises(ValueError) as ffi_error:
        jax.jit(lambda ops: jax_ffi.flash_attn_fp8(ops, out_dtype="float16", softcap=30.0)).trace(specs)
    assert first_line(ffi_error.value) == str(numpy_error.value)
    assert str(numpy_error.value) == "options.softcap: forward_fp8 has no softcap (16-bit forward only), got 30"
    packed, cu = SDS((1000, 8, 64), BF16), SDS((4,), jnp.int32)
    with pytest.raises(ValueError) as ffi_error:
        jax.jit(lambda q, c, s: jax_ffi.flash_attn_varlen(q, q, q, c, c, 9, 9, sinks=s)).trace(
            packed, cu, SDS((3,), jnp.float32))
    assert first_line(ffi_error.value) == "sinks: expected shape (8) (one logit per query head), got (3)"
    with pytest.raises(TypeError, match="window_size: expected a pair of ints"):
        jax_ffi.flash_attn(*qkv_specs(), window_size=(0.5, 1))


def test_gradients_through_model_options_lowering():
    # The backward calls take window_size and softcap as attributes (as the forward's), the sinks as
    # an operand after the others and the sinks' gradient as a result after the workspace, which is
    # larger with sinks (their partial sums); jax.grad gives the sinks that gradient.
    q, k, v = qkv_specs(sq=300, sk=500, hkv=2, d=128)
    sinks = SDS((8,), jnp.float32)

    def loss(q, k, v, s):
        return jax_ffi.flash_attn(q, k, v, causal=True, window_size=(64, 0), softcap=20.0,
                                  sinks=s).astype(jnp.float32).sum()
    text = lower_for_cuda(jax.grad(loss, argnums=(0, 1, 2, 3)), q, k, v, sinks)
    (backward,) = custom_calls(text, "warpattn_backward")
    assert "window_left = 64 : i32" in backward and "window_right = 0 : i32" in backward
    assert "softcap = 2.000000e+01 : f32" in backward and "has_sinks" not in backward  # one optional: no need
    need = _warpattn.backward_workspace_bytes(np.empty((2, 300, 8, 128), np.float16), None, True, False,
                                              sinks=np.zeros(8, np.float32))
    assert need > _warpattn.backward_workspace_bytes(np.empty((2, 300, 8, 128), np.float16), None, True, False)
    assert "tensor<2x8x300xf32>, tensor<8xf32>) -> (tensor<2x300x8x128xbf16>, tensor<2x500x2x128xbf16>, " \
        "tensor<2x500x2x128xbf16>, tensor<%dxui8>, tensor<8xf32>)" % (need + 256) in backward
    grads = jax.eval_shape(jax.grad(loss, argnums=(0, 1, 2, 3)), q, k, v, sinks)
    assert grads[3].shape == (8,) and grads[3].dtype == jnp.float32
    # Without sinks: the defaults, neither operand nor result.
    text = lower_for_cuda(jax.grad(lambda q, k, v: jax_ffi.flash_attn(q, k, v).astype(jnp.float32).sum()), q, k, v)
    (backward,) = custom_calls(text, "warpattn_backward")
    assert "window_left = -1 : i32" in backward and "softcap = 0.000000e+00 : f32" in backward
    assert "tensor<2x8x300xf32>) -> (" in backward and "ui8>)" in backward
    # Packed: has_sinks places the optional operands, with seqused_k or without.
    packed, cu, used = SDS((1000, 8, 128), BF16), SDS((4,), jnp.int32), SDS((3,), jnp.int32)
    for with_used in (False, True):
        def packed_loss(q, c, u, s):
            return jax_ffi.flash_attn_varlen(q, q, q, c, c, 500, 500, window_size=(32, 32), softcap=3.0,
                                             seqused_k=u if with_used else None, sinks=s).astype(jnp.float32).sum()
        text = lower_for_cuda(jax.grad(packed_loss, argnums=(0, 3)), packed, cu, used, sinks)
        (backward,) = custom_calls(text, "warpattn_backward_varlen")
        assert "has_sinks = true" in backward and "window_left = 32 : i32" in backward and "softcap = 3." in backward
        operands = "tensor<4xi32>, tensor<4xi32>, %stensor<8xf32>) ->" % ("tensor<3xi32>, " if with_used else "")
        assert operands in backward and "ui8>, tensor<8xf32>)" in backward
    # vmap with sinks: one backward call per example (as the forward), folded without.
    mapped = [SDS((3,) + t.shape, t.dtype) for t in (q, k, v)]
    text = lower_for_cuda(jax.vmap(jax.grad(loss, argnums=(0, 3)), in_axes=(0, 0, 0, None)), *mapped, sinks)
    (backward,) = custom_calls(text, "warpattn_backward")
    assert "(tensor<2x300x8x128xbf16>" in backward  # per example, inside a loop


def test_model_option_gradient_errors_are_the_librarys_messages():
    # What the backward refuses is refused when the gradient is traced, with the library's message
    # (sinks of the wrong shape), as the NumPy path gives it; softcap at head_dim 64 is not refused
    # (the 128 kernel runs its backward there).
    q, k, v = qkv_specs(hkv=2)
    lse = SDS((2, 8, 256), jnp.float32)
    with pytest.raises(ValueError) as numpy_error:
        warpattn.flash_attn_backward(*(np.zeros(t.shape, np.float16) for t in (q, q, k, v, q)),
                                     np.zeros(lse.shape, np.float32), sinks=np.zeros(3, np.float32))
    assert str(numpy_error.value).startswith("sinks: expected shape (8)")
    with pytest.raises(ValueError) as ffi_error:
        lower_for_cuda(lambda q, k, v, l: jax_ffi.flash_attn_backward(q, q, k, v, q, l, sinks=jnp.zeros(3)), q, k, v,
                       lse)
    assert first_line(ffi_error.value) == str(numpy_error.value)
    text = lower_for_cuda(jax.grad(lambda q, k, v: jax_ffi.flash_attn(q, k, v, softcap=2.0).astype(jnp.float32).sum()),
                          q, k, v)
    assert "softcap = 2.000000e+00" in custom_calls(text, "warpattn_backward")[0]
    # The forward alone (no gradient through the call) runs at head_dim 64 with softcap.
    lower_for_cuda(lambda q, k, v: jax.vjp(lambda q: jax_ffi.flash_attn(q, k, v, softcap=5.0), q)[0], q, k, v)
    text = lower_for_cuda(jax.value_and_grad(lambda q, k, v: (
        jax_ffi.flash_attn(*map(jax.lax.stop_gradient, (q, k, v)), softcap=5.0).astype(jnp.float32).sum()
        + q.astype(jnp.float32).sum())), q, k, v)
    assert custom_calls(text, "warpattn_forward") and not custom_calls(text, "warpattn_backward")
    # The public functions: the explicit backward's fourth result with sinks.
    packed, cu = SDS((1000, 8, 128), BF16), SDS((4,), jnp.int32)
    grads = jax.eval_shape(lambda *a: jax_ffi.flash_attn_varlen_backward(*a[:8], 500, 500, sinks=a[8]),
                           packed, packed, packed, packed, packed, SDS((8, 1000), jnp.float32), cu, cu,
                           SDS((8,), jnp.float32))
    assert len(grads) == 4 and grads[3].shape == (8,)


# ---------------------------------------------------------------------------- FP8, no GPU

def test_fp8_lowering():
    q, k, v = qkv_specs(sq=300, sk=500, hkv=2, d=128)
    text = lower_for_cuda(lambda q, k, v: jax_ffi.flash_attn_fp8(jax_ffi.quantize_fp8(q, k, v, seed=7), causal=True,
                                                                 return_lse=True), q, k, v)
    (quantize,) = custom_calls(text, "warpattn_quantize_fp8")
    assert "rotate = true" in quantize and "per_tensor = false" in quantize and "seed = 7 : i64" in quantize
    assert ("(tensor<2x300x8x128xbf16>, tensor<2x500x2x128xbf16>, tensor<2x500x2x128xbf16>) -> "
            "(tensor<2x300x8x128xf8E4M3FN>, tensor<2x500x2x128xf8E4M3FN>, tensor<2x2x128x512xf8E4M3FN>, "
            "tensor<2x8x3xf32>, tensor<2x2x4xf32>, tensor<2x2x4xf32>)") in quantize
    (forward,) = custom_calls(text, "warpattn_forward_fp8")
    assert "causal = true" in forward and "has_scale = false" in forward and "batch_invariant = false" in forward
    assert ("tensor<2x2x4xf32>, tensor<2x2x4xf32>) -> (tensor<2x300x8x128xbf16>, tensor<2x8x300xf32>)") in forward
    # Issue 18's mode reaches the FP8 call as an attribute.
    text = lower_for_cuda(lambda q, k, v: jax_ffi.flash_attn_fp8(jax_ffi.quantize_fp8(q, k, v), batch_invariant=True),
                          q, k, v)
    (forward,) = custom_calls(text, "warpattn_forward_fp8")
    assert "batch_invariant = true" in forward
    # INT8 Q and K, per-tensor scales, float16 out, no lse.
    q, k, v = qkv_specs(dtype=jnp.float16)
    text = lower_for_cuda(lambda q, k, v: jax_ffi.flash_attn_fp8(jax_ffi.quantize_fp8(
        q, k, v, rotate=False, per_tensor=True, qk_dtype="int8"), softmax_scale=0.25, out_dtype=jnp.float16), q, k, v)
    (quantize,) = custom_calls(text, "warpattn_quantize_fp8")
    assert "rotate = false" in quantize and "per_tensor = true" in quantize and "seed = 0 : i64" in quantize
    assert "-> (tensor<2x256x8x64xi8>, tensor<2x256x8x64xi8>, tensor<2x8x64x256xf8E4M3FN>" in quantize
    (forward,) = custom_calls(text, "warpattn_forward_fp8")
    assert "has_scale = true" in forward and "softmax_scale = 2.500000e-01 : f32" in forward
    assert "-> tensor<2x256x8x64xf16>" in forward


def test_fp8_vmap_lowering():
    q, k, v = (SDS((3,) + s.shape, s.dtype) for s in qkv_specs(hkv=2))
    text = lower_for_cuda(jax.vmap(lambda q, k, v: jax_ffi.flash_attn_fp8(jax_ffi.quantize_fp8(q, k, v))), q, k, v)
    (quantize,) = custom_calls(text, "warpattn_quantize_fp8")
    (forward,) = custom_calls(text, "warpattn_forward_fp8")
    assert "(tensor<3x2x256x8x64xbf16>" in quantize and "(tensor<3x2x256x8x64xf8E4M3FN>" in forward  # folded
    # Per-tensor scales: one call per mapped example (one descale must not span the examples).
    text = lower_for_cuda(jax.vmap(lambda q, k, v: jax_ffi.quantize_fp8(q, k, v, per_tensor=True)), q, k, v)
    (quantize,) = custom_calls(text, "warpattn_quantize_fp8")
    assert "(tensor<2x256x8x64xbf16>, tensor<2x256x2x64xbf16>" in quantize


def test_fp8_trace_time_errors_are_the_librarys_messages():
    # The same rule broken through the FFI path (shapes at trace time) and through the library on
    # NumPy arrays (the module's functions, which check every rule before looking at the memory).
    def quantize_messages(q_shape, k_shape, v_shape, int8):
        q, k, v = np.zeros(q_shape, np.float16), np.zeros(k_shape, np.float16), np.zeros(v_shape, np.float16)
        b, sq, hq, d = q_shape
        bk, sk, hkv = k_shape[:3]
        codes = np.int8 if int8 else np.uint8  # the module's e4m3: its bytes
        out = (np.zeros((b, sq, hq, d), codes), np.zeros((bk, sk, hkv, d), codes),
               np.zeros((bk, hkv, d, (sk + 15) // 16 * 16), np.uint8), np.zeros((b, hq, blocks(sq)), np.float32),
               np.zeros((bk, hkv, blocks(sk)), np.float32), np.zeros((bk, hkv, blocks(sk)), np.float32))
        with pytest.raises(ValueError) as numpy_error:
            _warpattn.quantize_fp8(q, k, v, *out, True, 0, False, 0)
        with pytest.raises(ValueError) as ffi_error:
            jax.jit(lambda q, k, v: jax_ffi.quantize_fp8(q, k, v, qk_dtype="int8" if int8 else "e4m3")).trace(
                *(SDS(a.shape, a.dtype) for a in (q, k, v)))
        return str(ffi_error.value), str(numpy_error.value)
    for shapes in [((1, 128, 2, 96), (1, 128, 2, 96), (1, 128, 2, 96), False),
                   ((1, 128, 4, 64), (1, 200, 3, 64), (1, 200, 3, 64), True),
                   ((1, 128, 4, 64), (1, 200, 2, 64), (1, 100, 2, 64), False),
                   ((2, 128, 4, 64), (1, 200, 2, 64), (1, 200, 2, 64), False)]:
        ffi_message, numpy_message = quantize_messages(*shapes)
        assert ffi_message == numpy_message, shapes

    def forward_messages(specs):
        arrays = [np.zeros(s.shape, np.uint8 if s.dtype == E4M3 else s.dtype) for s in specs]  # e4m3: its bytes
        b, sq, hq, d = specs.q.shape
        with pytest.raises(ValueError) as numpy_error:
            _warpattn.forward_fp8(*arrays, np.zeros((b, sq, hq, d), np.float16), None, None, False, 0, False)
        with pytest.raises(ValueError) as ffi_error:
            jax.jit(lambda ops: jax_ffi.flash_attn_fp8(ops, out_dtype="float16")).trace(specs)
        return str(ffi_error.value), str(numpy_error.value)
    good = fp8_specs()
    for specs in [good._replace(k=SDS(good.k.shape, jnp.int8)),  # INT8 K with E4M3 Q
                  good._replace(vt=SDS((2, 2, 128, 500), E4M3)),  # keys not padded to 16
                  good._replace(q_descale=SDS((2, 8, 2), jnp.float32)),  # a block short
                  good._replace(vt=SDS(good.vt.shape, jnp.int8)),
                  fp8_specs(d=96)]:
        ffi_message, numpy_message = forward_messages(specs)
        assert ffi_message == numpy_message, specs


def test_fp8_argument_errors():
    q, k, v = qkv_specs()
    with pytest.raises(ValueError, match=r"q: head_dim \(shape\[3\]\) must be one of 64, 128, 256 for FP8, got 96"):
        jax.jit(jax_ffi.quantize_fp8).trace(*qkv_specs(d=96))
    with pytest.raises(ValueError, match="q, k: expected rank 4"):
        jax_ffi.quantize_fp8(SDS((256, 8, 64), BF16), k, v)
    with pytest.raises(TypeError, match="qk_dtype: expected one of"):
        jax_ffi.quantize_fp8(q, k, v, qk_dtype="uint8")
    with pytest.raises(ValueError, match=r"seed: expected an int in \[0, 2\^64\), got -1"):
        jax_ffi.quantize_fp8(q, k, v, seed=-1)
    with pytest.raises(TypeError, match="seed: expected a Python int, got builtins.float"):
        jax_ffi.quantize_fp8(q, k, v, seed=1.5)
    # The largest seeds: their bits as an int64 attribute.
    text = lower_for_cuda(lambda q, k, v: jax_ffi.quantize_fp8(q, k, v, seed=2 ** 64 - 1), q, k, v)
    assert "seed = -1 : i64" in custom_calls(text, "warpattn_quantize_fp8")[0]
    specs = fp8_specs()
    with pytest.raises(TypeError, match="out_dtype: expected one of bfloat16, float16, got 'float32'"):
        jax_ffi.flash_attn_fp8(specs, out_dtype="float32")
    with pytest.raises(ValueError, match=r"q: expected rank 4 \(batch, seqlen, heads, head_dim\), got rank 3"):
        jax_ffi.flash_attn_fp8(specs._replace(q=SDS((300, 8, 128), E4M3)))
    cpu_ops = jax.device_put(fp8_arrays(specs), jax.devices("cpu")[0])
    with pytest.raises(TypeError, match="q: CUDA tensor required .* got a JAX array on cpu"):
        jax_ffi.flash_attn_fp8(cpu_ops)


def test_fp8_refuses_gradients():
    q, k, v = qkv_specs()

    def loss(q, k, v):
        return jax_ffi.flash_attn_fp8(jax_ffi.quantize_fp8(q, k, v)).astype(jnp.float32).sum()
    with pytest.raises(NotImplementedError, match="FP8 attention has no backward"):
        lower_for_cuda(jax.grad(loss), q, k, v)
    # Inputs cut from the gradient: the FP8 forward runs inside a differentiated function.
    text = lower_for_cuda(jax.value_and_grad(lambda q, k, v: loss(*map(jax.lax.stop_gradient, (q, k, v))) +
                                             q.astype(jnp.float32).sum()), q, k, v)
    assert custom_calls(text, "warpattn_forward_fp8")


def test_eager_descale_check():
    # check_descales on concrete descales: the library's rule and message ("finite and > 0"),
    # before the call; k's and v's only where there are keys, and none when traced.
    ops = fp8_arrays(fp8_specs())
    jax_ffi._check_descales(ops)
    bad = ops._replace(k_descale=ops.k_descale.at[1, 0, 2].set(0.0))
    with pytest.raises(ValueError, match=r"^k_descale: every descale must be finite and > 0, got 0 at \[1, 0, 2\]$"):
        jax_ffi._check_descales(bad)
    with pytest.raises(ValueError, match=r"^q_descale: every descale must be finite and > 0, got nan at \[0, 7, 1\]$"):
        jax_ffi._check_descales(ops._replace(q_descale=ops.q_descale.at[0, 7, 1].set(jnp.nan)))
    no_keys = fp8_arrays(fp8_specs(sk=0))
    jax_ffi._check_descales(no_keys._replace(k_descale=-no_keys.k_descale))  # no keys: not read
    jax.jit(lambda ops: jax_ffi._check_descales(ops) or ops.q_descale).trace(bad)  # traced: no values to read


# ---------------------------------------------------------------------------- shard_map, no GPU

HEADS = jax.sharding.PartitionSpec(None, None, "x", None)
BATCH = jax.sharding.PartitionSpec("x")


def sharded(fn, mesh, spec, n_in, n_out=1):
    out = spec if n_out == 1 else (spec,) * n_out
    return jax.shard_map(fn, mesh=mesh, in_specs=(spec,) * n_in, out_specs=out)


def attention_and_gradients(q, k, v):
    """The forward and the backward calls in one function (out, then dq, dk, dv)."""
    out, pull = jax.vjp(lambda q, k, v: jax_ffi.flash_attn(q, k, v, causal=True), q, k, v)
    return (out,) + pull(out)


def test_shard_map_lowering_one_device():
    # Inside shard_map (one device: the manual computation at the full shapes), over heads and
    # over batch: the forward and backward calls, and FP8's pair.
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",))
    for spec in (HEADS, BATCH):
        text = lower_for_cuda(sharded(attention_and_gradients, mesh, spec, 3, 4), *qkv_specs(hkv=2))
        (forward,) = custom_calls(text, "warpattn_forward")
        (backward,) = custom_calls(text, "warpattn_backward")
        assert "(tensor<2x256x8x64xbf16>, tensor<2x256x2x64xbf16>, tensor<2x256x2x64xbf16>)" in forward
        assert "-> (tensor<2x256x8x64xbf16>, tensor<2x256x2x64xbf16>, tensor<2x256x2x64xbf16>" in backward
        text = lower_for_cuda(sharded(lambda q, k, v: jax_ffi.flash_attn_fp8(jax_ffi.quantize_fp8(q, k, v)), mesh,
                                      spec, 3), *qkv_specs(hkv=2))
        assert custom_calls(text, "warpattn_quantize_fp8") and custom_calls(text, "warpattn_forward_fp8")


SHARD_MAP_SCRIPT = textwrap.dedent("""
    import json, jax, numpy as np, jax.numpy as jnp
    from jax.sharding import PartitionSpec as P
    from warpattn import jax_ffi
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("x",))
    specs = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in ((2, 256, 8, 64), (2, 256, 2, 64), (2, 256, 2, 64))]

    def both(q, k, v):
        out, pull = jax.vjp(lambda q, k, v: jax_ffi.flash_attn(q, k, v, causal=True), q, k, v)
        return (out,) + pull(out)

    def fp8(q, k, v):
        return jax_ffi.flash_attn_fp8(jax_ffi.quantize_fp8(q, k, v))
    calls = {}
    for name, spec in (("heads", P(None, None, "x", None)), ("batch", P("x"))):
        for fn, n_out in ((both, 4), (fp8, 1)):
            out_specs = spec if n_out == 1 else (spec,) * n_out
            text = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(spec,) * 3, out_specs=out_specs)).trace(
                *specs).lower(lowering_platforms=("cuda",)).as_text()
            calls.setdefault(name, []).extend(line.strip() for line in text.splitlines() if "custom_call @warpattn" in line)
    print(json.dumps(calls))
""")


def test_shard_map_lowering_per_shard_shapes():
    # Two (forced) CPU devices, in a fresh interpreter (the device count is fixed when JAX
    # starts): each shard's custom calls get its own shapes, half the heads (GQA groups kept
    # whole: 8/2 -> 4/1) or half the batch.
    env = dict(__import__("os").environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", SHARD_MAP_SCRIPT], capture_output=True, text=True, timeout=300,
                          env=env, cwd="/")
    assert done.returncode == 0, done.stderr[-3000:]
    calls = __import__("json").loads(done.stdout.strip().splitlines()[-1])
    per_shard = {"heads": ("2x256x4x64", "2x256x1x64"), "batch": ("1x256x8x64", "1x256x2x64")}
    for name, (q, kv) in per_shard.items():
        text = "\n".join(calls[name])
        (forward,) = custom_calls(text, "warpattn_forward")
        (backward,) = custom_calls(text, "warpattn_backward")
        (quantize,) = custom_calls(text, "warpattn_quantize_fp8")
        (forward_fp8,) = custom_calls(text, "warpattn_forward_fp8")
        assert "(tensor<%sxbf16>, tensor<%sxbf16>, tensor<%sxbf16>)" % (q, kv, kv) in forward, forward
        assert "-> (tensor<%sxbf16>, tensor<%sxbf16>, tensor<%sxbf16>" % (q, kv, kv) in backward, backward
        assert "(tensor<%sxbf16>, tensor<%sxbf16>, tensor<%sxbf16>)" % (q, kv, kv) in quantize, quantize
        assert "-> tensor<%sxbf16>" % q in forward_fp8, forward_fp8


# ------------------------------------------------------- warpattn's public functions on JAX arrays

@contextlib.contextmanager
def dlpack_fallback():
    """warpattn's public functions take JAX arrays through the DLPack path meanwhile, as builds
    without the FFI handlers do."""
    api._PREFER_JAX_FFI = False
    try:
        yield
    finally:
        api._PREFER_JAX_FFI = True


def public_calls():
    """(function of JAX arrays through warpattn's public API, its arguments, the FFI target it must
    lower to)."""
    q, k, v = qkv_specs(hkv=2)
    lse = SDS((2, 8, 256), jnp.float32)
    packed, cu = SDS((1000, 8, 64), BF16), SDS((4,), jnp.int32)
    packed_lse = SDS((8, 1000), jnp.float32)
    sinks = SDS((8,), jnp.float32)

    def jax_loss(q, k, v):
        return warpattn.jax_flash_attn(q, k, v, causal=True).astype(jnp.float32).sum()
    return {
        "flash_attn_func": (lambda q, k, v: warpattn.flash_attn_func(q, k, v, causal=True, batch_invariant=True),
                            (q, k, v), "warpattn_forward"),
        "flash_attn_backward": (lambda q, k, v, l: warpattn.flash_attn_backward(q, q, k, v, q, l, causal=True),
                                (q, k, v, lse), "warpattn_backward"),
        "jax_flash_attn": (jax.grad(jax_loss, argnums=(0, 1, 2)), (q, k, v), "warpattn_backward"),
        "flash_attn_varlen_func": (lambda q, c: warpattn.flash_attn_varlen_func(q, q, q, c, c, 500, 500),
                                   (packed, cu), "warpattn_forward_varlen"),
        "flash_attn_varlen_backward": (lambda q, l, c: warpattn.flash_attn_varlen_backward(
            q, q, q, q, q, l, c, c, 500, 500), (packed, packed_lse, cu), "warpattn_backward_varlen"),
        "quantize_fp8": (lambda q, k, v: warpattn.quantize_fp8(q, k, v, qk_dtype="int8"), (q, k, v),
                         "warpattn_quantize_fp8"),
        "flash_attn_fp8_func": (lambda ops: warpattn.flash_attn_fp8_func(ops, causal=True, return_lse=True),
                                (fp8_specs(),), "warpattn_forward_fp8"),
        "flash_attn_func_model_options": (lambda q, k, v, s: warpattn.flash_attn_func(
            q, k, v, causal=True, window_size=(64, 0), softcap=30.0, sinks=s), (q, k, v, sinks), "warpattn_forward"),
        "flash_attn_varlen_func_model_options": (lambda q, c, s: warpattn.flash_attn_varlen_func(
            q, q, q, c, c, 500, 500, window_size=(32, 32), sinks=s), (packed, cu, sinks), "warpattn_forward_varlen"),
        "flash_attn_fp8_func_model_options": (lambda ops, s: warpattn.flash_attn_fp8_func(
            ops, window_size=(128, 128), sinks=s), (fp8_specs(), sinks), "warpattn_forward_fp8"),
        "jax_flash_attn_model_options": (lambda q, k, v: warpattn.jax_flash_attn(q, k, v, window_size=(16, 0),
                                                                                 causal=True),
                                         (q, k, v), "warpattn_forward"),
        "flash_attn_with_kvcache": (lambda q, c, l: warpattn.flash_attn_with_kvcache(q, c, c, cache_seqlens=l,
                                                                                     causal=True, return_lse=True),
                                    (q, k, SDS((k.shape[0],), jnp.int32)), "warpattn_forward_kvcache"),
    }


@pytest.mark.parametrize("name", sorted(public_calls()))
def test_public_functions_take_the_ffi_path(name):
    # Under jax.jit: the FFI call (the DLPack path refuses traced arrays); without the handlers,
    # the old refusal.
    fn, args, target = public_calls()[name]
    assert custom_calls(lower_for_cuda(fn, *args), target)
    with dlpack_fallback(), pytest.raises(TypeError, match="not traced ones under jax.jit"):
        lower_for_cuda(lambda *a: fn(*a), *args)  # a new function: jax.jit would reuse fn's trace


def test_public_functions_refuse_arrays_off_the_gpu():
    cpu = jax.devices("cpu")[0]
    q = jax.device_put(jnp.zeros((1, 128, 2, 64), BF16), cpu)
    for fn in (lambda: warpattn.flash_attn_func(q, q, q), lambda: warpattn.quantize_fp8(q, q, q),
               lambda: jax.grad(lambda q: warpattn.jax_flash_attn(q, q, q).astype(jnp.float32).sum())(q)):
        with pytest.raises(TypeError, match="q: CUDA tensor required .* got a JAX array on cpu"):
            fn()
    with pytest.raises(ValueError, match="out: JAX arrays are immutable"):
        warpattn.flash_attn_func(q, q, q, out=q)


def test_bench_jax_refuses_to_run_without_a_gpu(tmp_path):
    if any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("JAX sees a GPU: the benchmark would run")
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, "-m", "warpattn.bench_jax", "--out", str(out)], capture_output=True,
                          text=True, timeout=120, cwd="/")
    assert done.returncode == 1 and "runs on a GPU only" in done.stderr and "nothing was timed" in done.stderr, \
        done.stderr[-2000:]
    assert not out.exists()


# ====================================================================== on an sm_90 GPU

gpu = pytest.mark.skipif(_gpu_reason() is not None, reason=str(_gpu_reason()))
TOL = {BF16: 5e-3, jnp.float16: 1e-3}  # test_gpu.py's forward bounds
GRAD_TOL = {BF16: 3e-2, jnp.float16: 5e-3}  # and its backward bounds


def rel_l2(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def random_case(seed, dtype, b, sq, sk, hq, hkv, d):
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    q = jax.random.normal(keys[0], (b, sq, hq, d), jnp.float32).astype(dtype)
    k = jax.random.normal(keys[1], (b, sk, hkv, d), jnp.float32).astype(dtype)
    v = jax.random.normal(keys[2], (b, sk, hkv, d), jnp.float32).astype(dtype)
    dout = jax.random.normal(keys[3], (b, sq, hq, d), jnp.float32).astype(dtype)
    return q, k, v, dout


def xla_attention(q, k, v, causal, scale=None):
    """jax.nn.dot_product_attention in fp32 (XLA's implementation), causal aligned bottom-right
    by an explicit mask (its is_causal is top-left)."""
    sq, sk = q.shape[1], k.shape[1]
    mask = jnp.tril(jnp.ones((sq, sk), bool), sk - sq)[None, None] if causal else None
    return jax.nn.dot_product_attention(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32),
                                        mask=mask, scale=scale, implementation="xla")


def vjp(fn, q, k, v, dout):
    out, pull = jax.vjp(fn, q, k, v)
    return out, pull(dout.astype(out.dtype))


def xla_vjp(q, k, v, dout, causal, scale=None):
    """xla_attention's out and gradients, all in fp32 with full-precision products, jitted on
    XLA's CPU backend: eager on the GPU, every op of every new shape is compiled and autotuned
    there, and the per-sequence shapes of the packed tests stalled in that for minutes (jax
    0.11.2 on the H200 host, run 110)."""
    cpu = jax.devices("cpu")[0]
    f32 = [jax.device_put(np.asarray(t.astype(jnp.float32)), cpu) for t in (q, k, v, dout)]
    with jax.default_device(cpu), jax.default_matmul_precision("highest"):
        return jax.jit(lambda q, k, v, d: vjp(lambda q, k, v: xla_attention(q, k, v, causal, scale), q, k, v, d))(*f32)


@gpu
@pytest.mark.parametrize("dtype", [BF16, jnp.float16])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hkv", [8, 2])
def test_against_xla_attention(dtype, d, causal, hkv):
    q, k, v, dout = random_case(d + hkv + causal, dtype, 2, 300, 500, 8, hkv, d)
    fn = jax.jit(lambda q, k, v: jax_ffi.flash_attn(q, k, v, causal=causal))
    out, grads = vjp(fn, q, k, v, dout)
    want, want_grads = xla_vjp(q, k, v, dout, causal)
    assert out.dtype == dtype and out.shape == q.shape
    assert rel_l2(out, want) <= TOL[dtype]
    for name, got, expected, t in zip(("dq", "dk", "dv"), grads, want_grads, (q, k, v)):
        assert got.dtype == dtype and got.shape == t.shape, name
        assert rel_l2(got, expected) <= GRAD_TOL[dtype], (name, rel_l2(got, expected))


@gpu
def test_lse_and_scale():
    q, k, v, _ = random_case(1, BF16, 2, 257, 513, 4, 4, 128)
    out, lse = jax.jit(lambda q, k, v: jax_ffi.flash_attn(q, k, v, softmax_scale=0.1, return_lse=True))(q, k, v)
    assert lse.shape == (2, 4, 257) and lse.dtype == jnp.float32
    with jax.default_matmul_precision("highest"):
        scores = jnp.einsum("bqhd,bkhd->bhqk", q.astype(jnp.float32), k.astype(jnp.float32)) * 0.1
        want = xla_attention(q, k, v, False, 0.1)
    assert float(jnp.abs(lse - jax.nn.logsumexp(scores, axis=-1)).max()) <= 1e-4
    assert rel_l2(out, want) <= TOL[BF16]


@gpu
def test_jit_equals_eager_bitwise():
    q, k, v, dout = random_case(2, BF16, 2, 1000, 1000, 8, 2, 128)
    fn = lambda q, k, v: jax_ffi.flash_attn(q, k, v, causal=True, deterministic=True)  # noqa: E731
    eager = vjp(fn, q, k, v, dout)
    jitted = vjp(jax.jit(fn), q, k, v, dout)
    again = vjp(jax.jit(fn), q, k, v, dout)
    for a, b, c in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted), jax.tree.leaves(again)):
        assert np.array_equal(np.asarray(a), np.asarray(b)) and np.array_equal(np.asarray(b), np.asarray(c))


@gpu
def test_equals_the_dlpack_path_bitwise():
    # The DLPack path (memory from PyTorch or CuPy; what builds without the handlers run) runs the
    # same kernels; warpattn's public functions on JAX arrays take the FFI path.
    need_dlpack_memory()
    q, k, v, dout = random_case(3, BF16, 2, 700, 900, 8, 4, 64)
    out, lse = jax.jit(lambda q, k, v: jax_ffi.flash_attn(q, k, v, causal=True, return_lse=True))(q, k, v)
    with dlpack_fallback():
        want, want_lse = warpattn.flash_attn_func(q, k, v, causal=True, return_lse=True)
        want_grads = warpattn.flash_attn_backward(dout, q, k, v, want, want_lse, causal=True, deterministic=True)
    assert np.array_equal(np.asarray(out), np.asarray(want)) and np.array_equal(np.asarray(lse), np.asarray(want_lse))
    grads = jax.jit(jax_ffi.flash_attn_backward, static_argnames=("causal", "deterministic"))(
        dout, q, k, v, out, lse, causal=True, deterministic=True)
    for got, expected in zip(grads, want_grads):
        assert np.array_equal(np.asarray(got), np.asarray(expected))
    public, public_lse = warpattn.flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert np.array_equal(np.asarray(public), np.asarray(out)) and np.array_equal(np.asarray(public_lse), np.asarray(lse))
    # Packed batches, forward and backward.
    lengths = [300, 0, 517]
    pq, pk, pv, pdout, cu_q, cu_k = packed_case(3, BF16, lengths, lengths, 8, 2, 128)
    fn = jax.jit(lambda q, k, v: jax_ffi.flash_attn_varlen(q, k, v, cu_q, cu_k, 517, 517, causal=True,
                                                            return_lse=True))
    out, lse = fn(pq, pk, pv)
    grads = jax.jit(lambda *a: jax_ffi.flash_attn_varlen_backward(*a, cu_q, cu_k, 517, 517, causal=True,
                                                                   deterministic=True))(pdout, pq, pk, pv, out, lse)
    with dlpack_fallback():
        want, want_lse = warpattn.flash_attn_varlen_func(pq, pk, pv, cu_q, cu_k, 517, 517, causal=True,
                                                         return_lse=True)
        want_grads = warpattn.flash_attn_varlen_backward(pdout, pq, pk, pv, want, want_lse, cu_q, cu_k, 517, 517,
                                                         causal=True, deterministic=True)
    assert np.array_equal(np.asarray(out), np.asarray(want)) and np.array_equal(np.asarray(lse), np.asarray(want_lse))
    for got, expected in zip(grads, want_grads):
        assert np.array_equal(np.asarray(got), np.asarray(expected))


@gpu
def test_vmap_is_batch():
    q, k, v, dout = random_case(4, BF16, 6, 256, 384, 4, 2, 64)
    fold = lambda x: x.reshape((3, 2) + x.shape[1:])  # noqa: E731
    fn = lambda q, k, v: jax_ffi.flash_attn(q, k, v, causal=True, deterministic=True)  # noqa: E731
    out, grads = vjp(jax.jit(fn), q, k, v, dout)
    mapped, mapped_grads = vjp(jax.jit(jax.vmap(fn)), fold(q), fold(k), fold(v), fold(dout))
    assert np.array_equal(np.asarray(mapped).reshape(out.shape), np.asarray(out))
    for got, want in zip(mapped_grads, grads):
        assert np.array_equal(np.asarray(got).reshape(want.shape), np.asarray(want))
    # k and v shared by every mapped q (broadcast first), and a non-leading mapped axis.
    shared = jax.jit(jax.vmap(fn, in_axes=(0, None, None)))(fold(q), k[:2], v[:2])
    want = jax.jit(fn)(q, jnp.concatenate([k[:2]] * 3), jnp.concatenate([v[:2]] * 3))
    assert np.array_equal(np.asarray(shared).reshape(want.shape), np.asarray(want))
    moved = jax.jit(jax.vmap(fn, in_axes=1, out_axes=1))(*(jnp.moveaxis(fold(t), 0, 1) for t in (q, k, v)))
    assert np.array_equal(np.asarray(jnp.moveaxis(moved, 1, 0)).reshape(out.shape), np.asarray(out))


def packed_case(seed, dtype, lengths_q, lengths_k, hq, hkv, d, extra_rows=0):
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    total_q, total_k = sum(lengths_q) + extra_rows, sum(lengths_k) + extra_rows
    q = jax.random.normal(keys[0], (total_q, hq, d), jnp.float32).astype(dtype)
    k = jax.random.normal(keys[1], (total_k, hkv, d), jnp.float32).astype(dtype)
    v = jax.random.normal(keys[2], (total_k, hkv, d), jnp.float32).astype(dtype)
    dout = jax.random.normal(keys[3], (total_q, hq, d), jnp.float32).astype(dtype)
    cu_q = jnp.array(np.concatenate([[0], np.cumsum(lengths_q)]), jnp.int32)
    cu_k = jnp.array(np.concatenate([[0], np.cumsum(lengths_k)]), jnp.int32)
    return q, k, v, dout, cu_q, cu_k


@gpu
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_against_each_sequence(causal):
    lengths_q, lengths_k = [1, 0, 300, 129, 700], [5, 3, 300, 400, 700]
    q, k, v, dout, cu_q, cu_k = packed_case(5, BF16, lengths_q, lengths_k, 8, 2, 128, extra_rows=37)

    def fn(q, k, v):
        return jax_ffi.flash_attn_varlen(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal)
    out, (dq, dk, dv) = vjp(jax.jit(fn), q, k, v, dout)
    oq, ok = np.asarray(cu_q), np.asarray(cu_k)
    for b in range(len(lengths_q)):
        if lengths_q[b] == 0:
            continue
        sq_, sk_ = slice(oq[b], oq[b + 1]), slice(ok[b], ok[b + 1])
        want, (wq, wk, wv) = xla_vjp(q[None, sq_], k[None, sk_], v[None, sk_], dout[None, sq_], causal)
        want, wq, wk, wv = want[0], wq[0], wk[0], wv[0]
        assert rel_l2(out[sq_], want) <= TOL[BF16], b
        for name, got, expected in (("dq", dq[sq_], wq), ("dk", dk[sk_], wk), ("dv", dv[sk_], wv)):
            assert rel_l2(got, expected) <= GRAD_TOL[BF16], (b, name, rel_l2(got, expected))
    # Rows and keys no sequence covers: zero gradients (XLA's results start uninitialised).
    assert not np.asarray(dq[oq[-1]:]).any() and not np.asarray(dk[ok[-1]:]).any() and not np.asarray(dv[ok[-1]:]).any()


@gpu
def test_varlen_seqused_k_and_vmap():
    lengths = [200, 0, 333]
    q, k, v, dout, cu_q, cu_k = packed_case(6, BF16, lengths, lengths, 4, 4, 64)
    used = jnp.array([150, 0, 333], jnp.int32)
    fn = jax.jit(lambda q, k, v, cu_q, cu_k, used: jax_ffi.flash_attn_varlen(
        q, k, v, cu_q, cu_k, 333, 333, seqused_k=used, causal=True, deterministic=True))
    out, (dq, dk, dv) = vjp(lambda q, k, v: fn(q, k, v, cu_q, cu_k, used), q, k, v, dout)
    with jax.default_matmul_precision("highest"):
        want = xla_attention(q[None, :200], k[None, :150], v[None, :150], True)[0]
    # Causal, bottom-right against the 150 keys used: the first 50 rows see none (warpattn: 0).
    assert rel_l2(out[50:200], want[50:]) <= TOL[BF16] and not np.asarray(out[:50]).any()
    assert not np.asarray(dk[150:200]).any()  # keys past seqused_k: no gradient
    # vmap over packed batches: one call after the other, each as alone.
    stacked = [jnp.stack([t, t[::-1] if t.ndim > 1 else t]) for t in (q, k, v)]
    mapped = jax.jit(jax.vmap(lambda q, k, v: fn(q, k, v, cu_q, cu_k, used)))(*stacked)
    assert np.array_equal(np.asarray(mapped[0]), np.asarray(fn(q, k, v, cu_q, cu_k, used)))
    alone = fn(stacked[0][1], stacked[1][1], stacked[2][1], cu_q, cu_k, used)
    assert np.array_equal(np.asarray(mapped[1]), np.asarray(alone))


@gpu
@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_no_host_synchronisation_in_a_jitted_call(kind):
    # A host sync inside the call would make dispatch wait for the GPU: 20 calls of ~2 ms each
    # (FP8: ~1 ms, quantisation included) are queued in far less time than they take to run. For
    # FP8 this holds because the handler does not read the descales back.
    q, k, v, _ = random_case(7, BF16, 4, 8192, 8192, 16, 16, 128)
    if kind == "fp8":
        fn = jax.jit(lambda q, k, v: jax_ffi.flash_attn_fp8(jax_ffi.quantize_fp8(q, k, v), causal=True))
    else:
        fn = jax.jit(lambda q, k, v: jax_ffi.flash_attn(q, k, v, causal=True))
    fn(q, k, v).block_until_ready()
    start = time.perf_counter()
    outs = [fn(q, k, v) for _ in range(20)]
    queued = time.perf_counter() - start
    jax.block_until_ready(outs)
    total = time.perf_counter() - start
    assert queued < 0.5 * total, (queued, total)


@gpu
def test_the_second_gpu():
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if len(gpus) < 2:
        pytest.skip("needs two GPUs, found %d" % len(gpus))
    q, k, v, dout = (jax.device_put(t, gpus[1]) for t in random_case(8, BF16, 1, 512, 512, 4, 4, 64))
    out, grads = vjp(jax.jit(lambda q, k, v: jax_ffi.flash_attn(q, k, v, causal=True)), q, k, v, dout)
    assert out.devices() == {gpus[1]}
    want, want_grads = xla_vjp(q, k, v, dout, True)
    assert rel_l2(out, want) <= TOL[BF16]
    for got, expected in zip(grads, want_grads):
        assert rel_l2(got, expected) <= GRAD_TOL[BF16]


@gpu
def test_batch_invariant_through_the_ffi():
    # batch_invariant reaches the library: each sequence's out and gradients are the same bits
    # alone as in the batch (non-causal at a shape whose last wave the default mode may split).
    q, k, v, dout = random_case(10, BF16, 3, 1000, 1000, 16, 4, 128)
    fn = jax.jit(lambda q, k, v: jax_ffi.flash_attn(q, k, v, batch_invariant=True))
    out, grads = vjp(fn, q, k, v, dout)
    for b in (0, 2):
        alone, alone_grads = vjp(fn, q[b:b + 1], k[b:b + 1], v[b:b + 1], dout[b:b + 1])
        assert np.array_equal(np.asarray(out[b:b + 1]), np.asarray(alone)), b
        for got, want in zip(grads, alone_grads):
            assert np.array_equal(np.asarray(got[b:b + 1]), np.asarray(want)), b


# ------------------------------------------------ window_size, softcap and sinks on the GPU

JAX_MODEL_CASES = {
    "causal_window": dict(causal=True, window_size=(128, 0)),
    "window": dict(window_size=(100, 40)),
    "softcap": dict(softcap=2.0),
    "sinks": dict(sinks=True),
    "all_three": dict(window_size=(64, 256), softcap=20.0, sinks=True, softmax_scale=0.1),
}


def jax_model_options(case, heads):
    """The case's keyword arguments, its sinks (heads,) float32 from -2 to 8 (test_gpu.py's)."""
    options = dict(JAX_MODEL_CASES[case])
    if options.pop("sinks", False):
        options["sinks"] = jnp.linspace(-2.0, 8.0, heads, dtype=jnp.float32)
    return options


def check_against_fp64(q, k, v, out, lse, options, attention_reference):
    """test_gpu.py's check: rel L2 within TOL, lse within 1e-4 where finite and -inf exactly where
    the float64 reference's is, 0 on rows that see no key."""
    sinks = options.get("sinks")
    want, want_lse, seen = attention_reference(
        *(np.asarray(t.astype(jnp.float32), np.float64) for t in (q, k, v)), options.get("causal", False),
        options.get("window_size", (-1, -1)), options.get("softcap", 0.0),
        None if sinks is None else np.asarray(sinks), options.get("softmax_scale"))
    out, lse = np.asarray(out.astype(jnp.float32), np.float64), np.asarray(lse, np.float64)
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    bound = TOL[BF16 if str(q.dtype) == "bfloat16" else jnp.float16]
    assert rel_l2(out, want) <= bound, rel_l2(out, want)
    finite = np.isfinite(want_lse)
    assert np.array_equal(finite, np.isfinite(lse))
    if finite.any():
        assert np.abs(lse[finite] - want_lse[finite]).max() <= 1e-4
    assert not out[:, ~seen].any()


@gpu
@pytest.mark.parametrize("dtype", [BF16, jnp.float16])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("case", sorted(JAX_MODEL_CASES))
@pytest.mark.parametrize("sq,sk", [(300, 500), (500, 300)])
def test_model_options_against_fp64(dtype, d, case, sq, sk, attention_reference):
    q, k, v, _ = random_case(60 + d + sq + len(case), dtype, 2, sq, sk, 8, 2, d)
    options = jax_model_options(case, 8)
    sinks = options.pop("sinks", None)
    fn = jax.jit(lambda q, k, v, s: jax_ffi.flash_attn(q, k, v, sinks=s, return_lse=True, **options))
    out, lse = fn(q, k, v, sinks)
    check_against_fp64(q, k, v, out, lse, dict(options, sinks=sinks), attention_reference)
    # The public function on the same arrays (the FFI path, eagerly): the same bits.
    public, public_lse = warpattn.flash_attn_func(q, k, v, sinks=sinks, return_lse=True, **options)
    assert np.array_equal(np.asarray(public), np.asarray(out)) and np.array_equal(np.asarray(public_lse),
                                                                                  np.asarray(lse))


@gpu
def test_model_options_equal_the_dlpack_path_bitwise():
    need_dlpack_memory()
    q, k, v, _ = random_case(61, BF16, 2, 700, 900, 8, 4, 128)
    sinks = jnp.linspace(-2.0, 8.0, 8, dtype=jnp.float32)
    options = dict(causal=True, window_size=(200, 0), softcap=30.0)
    out, lse = jax.jit(lambda q, k, v, s: jax_ffi.flash_attn(q, k, v, sinks=s, return_lse=True, **options))(
        q, k, v, sinks)
    with dlpack_fallback():
        want, want_lse = warpattn.flash_attn_func(q, k, v, sinks=sinks, return_lse=True, **options)
    assert np.array_equal(np.asarray(out), np.asarray(want)) and np.array_equal(np.asarray(lse), np.asarray(want_lse))


@gpu
def test_model_options_varlen_against_fp64(attention_reference):
    lengths_q, lengths_k = [1, 0, 300, 129, 700, 50], [5, 3, 300, 400, 700, 0]
    q, k, v, _, cu_q, cu_k = packed_case(62, BF16, lengths_q, lengths_k, 8, 2, 128, extra_rows=37)
    sinks = jnp.linspace(-2.0, 8.0, 8, dtype=jnp.float32)
    options = dict(causal=True, window_size=(64, 0), softcap=10.0)
    out, lse = jax.jit(lambda q, k, v, s: jax_ffi.flash_attn_varlen(
        q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), sinks=s, return_lse=True, **options))(q, k, v, sinks)
    oq, ok = np.asarray(cu_q), np.asarray(cu_k)
    for b in range(len(lengths_q)):
        if lengths_q[b] == 0:
            continue
        rows, keys = slice(oq[b], oq[b + 1]), slice(ok[b], ok[b + 1])
        check_against_fp64(q[None, rows], k[None, keys], v[None, keys], out[None, rows], lse[None, :, rows],
                           dict(options, sinks=sinks), attention_reference)
    # With seqused_k too: the sinks then come after it (has_sinks).
    used = jnp.array([5, 3, 200, 400, 700, 0], jnp.int32)
    out, lse = jax.jit(lambda q, k, v, s, u: jax_ffi.flash_attn_varlen(
        q, k, v, cu_q, cu_k, 700, 700, sinks=s, seqused_k=u, return_lse=True, **options))(q, k, v, sinks, used)
    for b, n in enumerate(np.asarray(used)):
        if lengths_q[b] == 0:
            continue
        rows, keys = slice(oq[b], oq[b + 1]), slice(ok[b], ok[b] + n)
        check_against_fp64(q[None, rows], k[None, keys], v[None, keys], out[None, rows], lse[None, :, rows],
                           dict(options, sinks=sinks), attention_reference)


@gpu
def test_model_options_vmap_with_sinks_per_example():
    # With sinks, vmap runs one call per example (sinks mapped with the examples could not be
    # folded into the batch): each example's bits are those of the call on it alone, whether the
    # sinks are mapped or shared.
    q, k, v, _ = random_case(63, BF16, 6, 256, 384, 4, 2, 64)
    fold = lambda x: x.reshape((3, 2) + x.shape[1:])  # noqa: E731
    sinks = jnp.stack([jnp.linspace(-2.0, 8.0, 4, dtype=jnp.float32) + i for i in range(3)])
    fn = lambda q, k, v, s: jax_ffi.flash_attn(q, k, v, window_size=(32, 32), sinks=s)  # noqa: E731
    mapped = jax.jit(jax.vmap(fn))(fold(q), fold(k), fold(v), sinks)
    shared = jax.jit(jax.vmap(fn, in_axes=(0, 0, 0, None)))(fold(q), fold(k), fold(v), sinks[1])
    for i in range(3):
        alone = jax.jit(fn)(fold(q)[i], fold(k)[i], fold(v)[i], sinks[i])
        assert np.array_equal(np.asarray(mapped[i]), np.asarray(alone)), i
        alone = jax.jit(fn)(fold(q)[i], fold(k)[i], fold(v)[i], sinks[1])
        assert np.array_equal(np.asarray(shared[i]), np.asarray(alone)), i


# The gradients through them against the float64 reference (conftest.py): dq, dk, dv within
# GRAD_TOL (test_gpu.py's backward bounds, rel L2) and dsinks per head within 1e-2 of the sum of
# its terms' magnitudes, sum_i exp(sink - lse_i) |D_i| (test_gpu.py's DSINKS_TOL, which says why).
DSINKS_TOL = 1e-2


def model_vjp(fn, q, k, v, sinks, dout):
    """(dq, dk, dv, dsinks) of fn(q, k, v, sinks) against dout, jitted (dsinks None without sinks)."""
    def grads(q, k, v, sinks, dout):
        out, pull = jax.vjp(fn, q, k, v, sinks)
        return pull(dout.astype(out.dtype))
    return jax.jit(grads)(q, k, v, sinks, dout)


def check_model_grads(got, want, dtype):
    for name, g in zip(("dq", "dk", "dv"), got):
        assert not np.isnan(np.asarray(g.astype(jnp.float32))).any(), name
        err = rel_l2(g.astype(jnp.float32), want[name])
        assert err <= GRAD_TOL[dtype], (name, err)
    if want["dsinks"] is None:
        assert got[3] is None
        return
    assert got[3].dtype == jnp.float32
    err = np.abs(np.asarray(got[3], np.float64) - want["dsinks"])
    bound = DSINKS_TOL * want["sink_terms"] + 1e-6
    assert np.all(err <= bound), (err / bound).max()


def fp64(*arrays):
    return [np.asarray(t.astype(jnp.float32), np.float64) for t in arrays]


@gpu
@pytest.mark.parametrize("dtype", [BF16, jnp.float16])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("case", sorted(JAX_MODEL_CASES))
def test_model_options_gradients_against_fp64(dtype, d, case, attention_reference_grads):
    # jax.jit(jax.vjp) in q, k, v and the sinks, every case (softcap at head_dim 64 in the 128
    # kernel).
    q, k, v, dout = random_case(70 + d + len(case), dtype, 2, 300, 500, 8, 2, d)
    options = jax_model_options(case, 8)
    sinks = options.pop("sinks", None)

    def fn(q, k, v, s):
        return jax_ffi.flash_attn(q, k, v, sinks=s, **options)
    got = model_vjp(fn, q, k, v, sinks, dout)
    want = attention_reference_grads(*fp64(q, k, v, dout), options.get("causal", False),
                                     options.get("window_size", (-1, -1)), options.get("softcap", 0.0),
                                     None if sinks is None else np.asarray(sinks), options.get("softmax_scale"))
    check_model_grads(got, want, dtype)


@gpu
@pytest.mark.parametrize("dtype", [BF16, jnp.float16])
@pytest.mark.parametrize("d", [8, 40, 80, 200, 248])
@pytest.mark.parametrize("causal", [False, True])
def test_padded_head_dims_against_fp64(dtype, d, causal, attention_reference, attention_reference_grads):
    # Head dims between the kernels' (run padded in the d = 64, 128 or 256 kernel) through the FFI
    # handlers: the forward and, under jax.jit(jax.vjp), the gradients against the float64
    # references, whose default scale is 1/sqrt of the real head dim. Sq > Sk causal: rows with no key.
    q, k, v, dout = random_case(80 + d + causal, dtype, 2, 500, 300, 8, 2, d)
    out, lse = jax.jit(lambda q, k, v: jax_ffi.flash_attn(q, k, v, causal=causal, return_lse=True))(q, k, v)
    check_against_fp64(q, k, v, out, lse, dict(causal=causal), attention_reference)

    def fn(q, k, v, s):
        return jax_ffi.flash_attn(q, k, v, causal=causal)
    got = model_vjp(fn, q, k, v, None, dout)
    check_model_grads(got, attention_reference_grads(*fp64(q, k, v, dout), causal), dtype)


@gpu
def test_model_options_gradients_deterministic_and_the_dlpack_path():
    # Deterministic: the same bits twice, from jax_ffi.flash_attn_backward (dsinks fourth), and
    # from the DLPack path's custom VJP (warpattn.jax_flash_attn without the handlers).
    q, k, v, dout = random_case(71, BF16, 2, 700, 900, 8, 4, 128)
    sinks = jnp.linspace(-2.0, 8.0, 8, dtype=jnp.float32)
    options = dict(causal=True, window_size=(200, 0), softcap=30.0)

    def fn(q, k, v, s):
        return jax_ffi.flash_attn(q, k, v, sinks=s, deterministic=True, **options)
    first = model_vjp(fn, q, k, v, sinks, dout)
    second = model_vjp(fn, q, k, v, sinks, dout)
    for a, b in zip(first, second):
        assert np.array_equal(bits(a), bits(b))
    out, lse = jax_ffi.flash_attn(q, k, v, sinks=sinks, return_lse=True, **options)
    explicit = jax_ffi.flash_attn_backward(dout, q, k, v, out, lse, deterministic=True, sinks=sinks, **options)
    assert len(explicit) == 4
    for a, b in zip(explicit, first):
        assert np.array_equal(bits(a), bits(b))
    need_dlpack_memory()
    with dlpack_fallback():
        out, pull = jax.vjp(lambda q, k, v, s: warpattn.jax_flash_attn(q, k, v, sinks=s, deterministic=True,
                                                                        **options), q, k, v, sinks)
        fallback = pull(dout)
    for a, b in zip(fallback, first):
        assert np.array_equal(bits(a), bits(b))


@gpu
def test_model_options_varlen_gradients_against_fp64(attention_reference_grads):
    # Packed: sequences with rows that see only the sink, an empty one, rows no sequence covers;
    # with seqused_k too (the sinks then the second optional operand). dsinks sums over them all.
    lengths_q, lengths_k = [1, 0, 300, 129, 400, 50], [5, 3, 300, 400, 129, 0]
    q, k, v, dout, cu_q, cu_k = packed_case(72, BF16, lengths_q, lengths_k, 8, 2, 128, extra_rows=37)
    sinks = jnp.linspace(-2.0, 8.0, 8, dtype=jnp.float32)
    options = dict(causal=True, window_size=(64, 0), softcap=10.0)
    oq, ok = np.asarray(cu_q), np.asarray(cu_k)
    for used in (None, jnp.array([5, 3, 200, 400, 100, 0], jnp.int32)):
        def fn(q, k, v, s):
            return jax_ffi.flash_attn_varlen(q, k, v, cu_q, cu_k, 400, 400, sinks=s, seqused_k=used, **options)
        got = model_vjp(fn, q, k, v, sinks, dout)
        want = dict(dq=np.zeros(q.shape), dk=np.zeros(k.shape), dv=np.zeros(v.shape), dsinks=np.zeros(8),
                    sink_terms=np.zeros(8))
        for b in range(len(lengths_q)):
            n = lengths_k[b] if used is None else int(used[b])
            rows, keys = slice(oq[b], oq[b + 1]), slice(ok[b], ok[b] + n)
            if lengths_q[b] == 0:
                continue
            g = attention_reference_grads(*(t[None] for t in fp64(q[rows], k[keys], v[keys], dout[rows])),
                                          options["causal"], options["window_size"], options["softcap"],
                                          np.asarray(sinks))
            want["dq"][rows], want["dk"][keys], want["dv"][keys] = g["dq"][0], g["dk"][0], g["dv"][0]
            want["dsinks"] += g["dsinks"]
            want["sink_terms"] += g["sink_terms"]
        check_model_grads(got, want, BF16)
        assert not np.asarray(got[0][oq[-1]:].astype(jnp.float32)).any()  # rows no sequence covers


@gpu
@pytest.mark.parametrize("qk_dtype", ["e4m3", "int8"])
def test_fp8_model_options_against_fp64(qk_dtype, attention_reference):
    # A window and sinks under jax.jit on FP8 (softcap refused): within the FP8 bounds of the float64
    # reference on the unquantised inputs, and the same bits as the eager public function.
    q, k, v, _ = random_case(65, BF16, 2, 300, 500, 8, 2, 128)
    sinks = jnp.linspace(-2.0, 8.0, 8, dtype=jnp.float32)
    options = dict(causal=True, window_size=(128, 0))
    out, lse = jax.jit(lambda q, k, v, s: jax_ffi.flash_attn_fp8(jax_ffi.quantize_fp8(q, k, v, qk_dtype=qk_dtype),
                                                                 sinks=s, return_lse=True, **options))(q, k, v, sinks)
    want, want_lse, seen = attention_reference(*(np.asarray(t.astype(jnp.float32), np.float64) for t in (q, k, v)),
                                               True, (128, 0), 0.0, np.asarray(sinks))
    assert seen.all() and rel_l2(out, want) < FP8_TOL
    assert float(np.abs(np.asarray(lse, np.float64) - want_lse).max()) < FP8_LSE_TOL
    eager, eager_lse = warpattn.flash_attn_fp8_func(warpattn.quantize_fp8(q, k, v, qk_dtype=qk_dtype), sinks=sinks,
                                                    return_lse=True, **options)
    assert np.array_equal(bits(out), bits(eager)) and np.array_equal(bits(lse), bits(eager_lse))
    with pytest.raises(ValueError, match="options.softcap: forward_fp8 has no softcap"):
        jax_ffi.flash_attn_fp8(jax_ffi.quantize_fp8(q, k, v), softcap=5.0)


# ---------------------------------------------------------------------------- FP8 on the GPU

FP8_TOL = 6e-2  # test_gpu.py's FP8 bounds: out's relative L2 error against fp32 attention
FP8_LSE_TOL = 0.2  # and lse's largest absolute error (Q and K's E4M3 rounding, undiluted at small rows)


def need_dlpack_memory():
    """The DLPack path writes into memory from PyTorch or CuPy: skip without both."""
    for name in ("torch", "cupy"):
        try:
            __import__(name)
            return
        except ImportError:
            pass
    pytest.skip("the DLPack path needs PyTorch or CuPy for its memory; neither is installed")


def bits(x):
    """x's bits, as unsigned integers of its width: for bitwise comparisons (float8 too)."""
    a = np.asarray(x)
    return a.view(np.dtype("u%d" % a.dtype.itemsize))


def xla_forward(q, k, v, causal):
    """out and lse of attention in fp32 with full-precision products, on XLA's CPU backend (as
    xla_vjp, and for its reason); causal aligned bottom-right, GQA by repeating k and v."""
    cpu = jax.devices("cpu")[0]
    f32 = [jax.device_put(np.asarray(t.astype(jnp.float32)), cpu) for t in (q, k, v)]

    def reference(q, k, v):
        group = q.shape[2] // k.shape[2]
        k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
        if causal:
            sq, sk = q.shape[1], k.shape[1]
            scores = jnp.where(jnp.tril(jnp.ones((sq, sk), bool), sk - sq), scores, -jnp.inf)
        lse = jax.nn.logsumexp(scores, axis=-1)
        return jnp.einsum("bhqk,bkhd->bqhd", jnp.exp(scores - lse[..., None]), v), lse
    with jax.default_device(cpu), jax.default_matmul_precision("highest"):
        return jax.jit(reference)(*f32)


@gpu
@pytest.mark.parametrize("qk_dtype", ["e4m3", "int8"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_fp8_jitted_against_eager_and_xla(qk_dtype, d, causal):
    q, k, v, _ = random_case(20 + d + causal, BF16, 2, 300, 500, 8, 2, d)
    fn = jax.jit(lambda q, k, v: jax_ffi.flash_attn_fp8(jax_ffi.quantize_fp8(q, k, v, qk_dtype=qk_dtype),
                                                        causal=causal, return_lse=True))
    out, lse = fn(q, k, v)
    assert out.dtype == BF16 and out.shape == q.shape and lse.shape == (2, 8, 300) and lse.dtype == jnp.float32
    # The public functions on the same arrays, eagerly (descales checked on the host): the same bits.
    ops = warpattn.quantize_fp8(q, k, v, qk_dtype=qk_dtype)
    assert str(ops.q.dtype) == ("int8" if qk_dtype == "int8" else "float8_e4m3fn") and ops.vt.shape == (2, 2, d, 512)
    eager, eager_lse = warpattn.flash_attn_fp8_func(ops, causal=causal, return_lse=True)
    assert np.array_equal(bits(out), bits(eager)) and np.array_equal(bits(lse), bits(eager_lse))
    jitted_ops = jax.jit(lambda q, k, v: jax_ffi.quantize_fp8(q, k, v, qk_dtype=qk_dtype))(q, k, v)
    for name, a, b in zip(warpattn.Fp8Operands._fields, jitted_ops, ops):
        assert np.array_equal(bits(a), bits(b)), name
    # Within FP8's error of attention in fp32 on the unquantised inputs.
    want, want_lse = xla_forward(q, k, v, causal)
    assert rel_l2(out, want) < FP8_TOL, rel_l2(out, want)
    assert float(np.abs(np.asarray(lse) - np.asarray(want_lse)).max()) < FP8_LSE_TOL


@gpu
@pytest.mark.parametrize("qk_dtype", ["e4m3", "int8"])
@pytest.mark.parametrize("per_tensor", [False, True])
def test_fp8_equals_the_dlpack_path_bitwise(qk_dtype, per_tensor):
    # The DLPack path (quantize_fp8 and flash_attn_fp8_func before the FFI calls, kept for builds
    # without the handlers) on the same JAX arrays: the same operands and output, bit for bit.
    need_dlpack_memory()
    q, k, v, _ = random_case(30 + per_tensor, BF16, 2, 700, 900, 8, 4, 128)
    ops = jax.jit(lambda q, k, v: jax_ffi.quantize_fp8(q, k, v, seed=5, per_tensor=per_tensor,
                                                       qk_dtype=qk_dtype))(q, k, v)
    out, lse = jax.jit(lambda ops: jax_ffi.flash_attn_fp8(ops, causal=True, out_dtype="float16",
                                                          return_lse=True))(ops)
    with dlpack_fallback():
        want_ops = warpattn.quantize_fp8(q, k, v, seed=5, per_tensor=per_tensor, qk_dtype=qk_dtype)
        want, want_lse = warpattn.flash_attn_fp8_func(want_ops, causal=True, out_dtype="float16", return_lse=True)
    for name, a, b in zip(warpattn.Fp8Operands._fields, ops, want_ops):
        assert str(a.dtype) == str(b.dtype) and np.array_equal(bits(a), bits(b)), name
    assert out.dtype == jnp.float16 and np.array_equal(bits(out), bits(want))
    assert np.array_equal(bits(lse), bits(want_lse))


@gpu
def test_fp8_vmap():
    # Per-block scales: vmap folds the mapped axis into the batch (the same bits as the batch
    # unmapped). Per-tensor scales: one call per example, each as alone.
    q, k, v, _ = random_case(40, BF16, 6, 256, 384, 4, 2, 64)
    fold = lambda x: x.reshape((3, 2) + x.shape[1:])  # noqa: E731
    unfold = lambda x: np.asarray(x).reshape((6,) + x.shape[2:])  # noqa: E731

    def fn(q, k, v, per_tensor=False):
        return jax_ffi.flash_attn_fp8(jax_ffi.quantize_fp8(q, k, v, per_tensor=per_tensor), causal=True)
    mapped = jax.jit(jax.vmap(fn))(fold(q), fold(k), fold(v))
    assert np.array_equal(bits(unfold(mapped)), bits(jax.jit(fn)(q, k, v)))
    per_tensor = jax.jit(jax.vmap(lambda q, k, v: fn(q, k, v, True)))(fold(q), fold(k), fold(v))
    for i in range(3):
        alone = jax.jit(lambda q, k, v: fn(q, k, v, True))(fold(q)[i], fold(k)[i], fold(v)[i])
        assert np.array_equal(bits(per_tensor[i]), bits(alone)), i


@gpu
def test_fp8_descales_checked_eagerly():
    q, k, v, _ = random_case(41, BF16, 1, 256, 256, 2, 2, 128)
    ops = jax_ffi.quantize_fp8(q, k, v)
    bad = ops._replace(v_descale=ops.v_descale.at[0, 1, 1].set(-1.0))
    with pytest.raises(ValueError, match=r"v_descale: every descale must be finite and > 0, got -1 at \[0, 1, 1\]"):
        jax_ffi.flash_attn_fp8(bad)
    with pytest.raises(ValueError, match="v_descale: every descale must be finite and > 0"):
        warpattn.flash_attn_fp8_func(bad)
    jax_ffi.flash_attn_fp8(bad, check_descales=False).block_until_ready()  # unchecked: it runs
    jax.jit(jax_ffi.flash_attn_fp8)(bad).block_until_ready()  # traced descales: not read back


# ---------------------------------------------------------------------------- two GPUs

@gpu
def test_shard_map_over_heads_on_two_gpus():
    # Heads split over two GPUs (GQA groups kept whole): each GPU runs the calls on its heads,
    # and out and the gradients are the unsharded call's bits. Causal and deterministic: the
    # default non-causal forward may split its last wave by the whole problem's tile count, and
    # the default backward adds dQ's pieces in any order, so either would differ by rounding.
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if len(gpus) < 2:
        pytest.skip("needs two GPUs, found %d" % len(gpus))
    mesh = jax.sharding.Mesh(np.array(gpus[:2]), ("x",))
    q, k, v, dout = random_case(50, BF16, 2, 1024, 1024, 16, 4, 128)
    fn = lambda q, k, v: jax_ffi.flash_attn(q, k, v, causal=True, deterministic=True)  # noqa: E731
    want, want_grads = vjp(jax.jit(fn), q, k, v, dout)
    split = jax.sharding.NamedSharding(mesh, HEADS)
    args = [jax.device_put(t, split) for t in (q, k, v, dout)]
    out, grads = vjp(jax.jit(sharded(fn, mesh, HEADS, 3)), *args)
    assert out.sharding.device_set == set(gpus[:2])
    assert np.array_equal(np.asarray(out), np.asarray(want))
    for name, got, expected in zip(("dq", "dk", "dv"), grads, want_grads):
        assert np.array_equal(np.asarray(got), np.asarray(expected)), name
    # FP8 per block over heads: each block's scale is per head, so the split leaves the bits as well.
    fp8 = lambda q, k, v: jax_ffi.flash_attn_fp8(jax_ffi.quantize_fp8(q, k, v), causal=True)  # noqa: E731
    assert np.array_equal(bits(jax.jit(sharded(fp8, mesh, HEADS, 3))(*args[:3])), bits(jax.jit(fp8)(q, k, v)))


def kvcache_case(seed, paged, b=3, sq=2, hq=8, hkv=2, d=128, capacity=700, page=16):
    """q, the caches (dense, or the same keys in pages of `page` in a shuffled order), the block
    table or None, lengths below the capacity, and new keys and values of sq rows."""
    keys = jax.random.split(jax.random.PRNGKey(seed), 5)
    q = jax.random.normal(keys[0], (b, sq, hq, d), jnp.float32).astype(BF16)
    k = jax.random.normal(keys[1], (b, capacity, hkv, d), jnp.float32).astype(BF16)
    v = jax.random.normal(keys[2], (b, capacity, hkv, d), jnp.float32).astype(BF16)
    new_k, new_v = (jax.random.normal(x, (b, sq, hkv, d), jnp.float32).astype(BF16) for x in keys[3:5])
    lens = jnp.array([(seed * 37 + 101 * i) % (capacity - sq) for i in range(b)], jnp.int32)
    if not paged:
        return q, k, v, None, lens, new_k, new_v
    per = -(-capacity // page)
    order = np.random.default_rng(seed).permutation(b * per).astype(np.int32)
    pad = per * page - capacity
    k_pages = jnp.pad(k, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(b * per, page, hkv, d)
    v_pages = jnp.pad(v, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(b * per, page, hkv, d)
    inverse = np.argsort(order)
    return (q, k_pages[inverse], v_pages[inverse], jnp.asarray(order.reshape(b, per)), lens, new_k, new_v)


@gpu
@pytest.mark.parametrize("paged", [False, True])
def test_kvcache_equals_the_dlpack_path_bitwise(paged):
    need_dlpack_memory()
    q, kc, vc, table, lens, _, _ = kvcache_case(3 + paged, paged)
    call = lambda q, kc, vc, l, t: warpattn.flash_attn_with_kvcache(  # noqa: E731
        q, kc, vc, cache_seqlens=l, block_table=t, causal=True, return_lse=True)
    out, lse = jax.jit(call)(q, kc, vc, lens, table)
    with dlpack_fallback():
        want_out, want_lse = call(q, kc, vc, lens, table)
    assert np.array_equal(np.asarray(out), np.asarray(want_out)) and np.array_equal(np.asarray(lse), np.asarray(want_lse))


@gpu
@pytest.mark.parametrize("paged", [False, True])
def test_kvcache_append_under_jit(paged):
    # The grown caches: the new rows at each sequence's length, nothing else changed; the
    # attention over them that of a call without the append on those caches, bitwise.
    q, kc, vc, table, lens, new_k, new_v = kvcache_case(5 + paged, paged)
    before_k, before_v = np.array(kc), np.array(vc)  # copies: the call donates the caches

    def step(q, kc, vc, nk, nv, l, t):
        return jax_ffi.flash_attn_with_kvcache(q, kc, vc, nk, nv, cache_seqlens=l, block_table=t, causal=True)
    out, k_grown, v_grown = jax.jit(step, donate_argnums=(1, 2))(q, kc, vc, new_k, new_v, lens, table)
    again = jax_ffi.flash_attn_with_kvcache(q, k_grown, v_grown, cache_seqlens=lens + q.shape[1], block_table=table,
                                            causal=True)
    assert np.array_equal(np.asarray(out), np.asarray(again))
    grown = [np.array(k_grown), np.array(v_grown)]
    page = kc.shape[1]
    for b, n in enumerate(np.asarray(lens)):
        for r in range(q.shape[1]):
            key = int(n) + r
            where = (int(np.asarray(table)[b, key // page]), key % page) if paged else (b, key)
            for got, new in zip(grown, (new_k, new_v)):
                assert np.array_equal(got[where], np.asarray(new)[b, r]), (b, r)
                got[where] = 0
    for got, before in zip(grown, (before_k, before_v)):
        written = [(b, int(n) + r) for b, n in enumerate(np.asarray(lens)) for r in range(q.shape[1])]
        for b, key in written:
            where = (int(np.asarray(table)[b, key // page]), key % page) if paged else (b, key)
            before[where] = 0
        assert np.array_equal(got, before)
