"""The Python package without a GPU: import, metadata, and every argument error, checked on
NumPy (CPU) arrays: warpattn validates arguments before it looks at where memory lives, so each
rule gives the same message here as on the GPU, and a valid call on CPU memory is refused with
"CUDA tensor required". Where PyTorch is installed, its custom ops are checked on meta tensors
(fake implementations, autograd, torch.compile's tracing); where JAX is, its refusals."""
import math
import subprocess
import sys

import numpy as np
import pytest

import warpattn
from warpattn import _warpattn


def qkv(b=2, sq=128, sk=128, hq=8, hkv=8, d=64, dtype=np.float16):
    q = np.zeros((b, sq, hq, d), dtype)
    k = np.zeros((b, sk, hkv, d), dtype)
    v = np.zeros((b, sk, hkv, d), dtype)
    return q, k, v


def test_import_and_metadata():
    # Every multiple of 8 up to 256 (run padded in the 64, 128 and 256 kernels); the dense
    # forward and the backward to 512 (the 512 kernels above 256); FP8 keeps its three.
    assert warpattn.supported_head_dims == tuple(range(8, 257, 8))
    assert warpattn.backward_head_dims == tuple(range(8, 513, 8))
    assert warpattn.forward_head_dims == tuple(range(8, 513, 8))
    assert getattr(warpattn, "fp8_head_dims", warpattn._warpattn.fp8_head_dims) == (64, 128, 256)
    assert warpattn.__version__
    for name in ("flash_attn_func", "flash_attn_backward", "jax_flash_attn", "flash_attn_with_kvcache"):
        assert name in warpattn.__all__
    assert "softmax_scale" in warpattn.flash_attn_func.__doc__
    assert "deterministic" in warpattn.flash_attn_backward.__doc__


def test_import_needs_no_framework():
    # Each framework is imported by the first call that takes its tensors.
    code = "import sys, warpattn; print(sorted({'torch', 'jax', 'cupy'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"


def test_valid_call_on_cpu_memory_is_refused():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="q: CUDA tensor required"):
        warpattn.flash_attn_func(q, k, v)


def test_not_a_tensor():
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"k: expected a DLPack tensor \(PyTorch, JAX, CuPy or NumPy\), got builtins.list"):
        warpattn.flash_attn_func(q, [1, 2], v)


def test_unknown_dtype():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="q: expected a float16, bfloat16 or float32 tensor"):
        warpattn.flash_attn_func(q.astype(np.int16), k, v)


def test_float32_inputs():
    q, k, v = qkv(dtype=np.float32)
    with pytest.raises(ValueError, match="q: expected dtype float16 or bfloat16, got float32"):
        warpattn.flash_attn_func(q, k, v)


def test_mixed_dtypes():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"k: expected dtype float16 \(same as q\), got float32"):
        warpattn.flash_attn_func(q, k.astype(np.float32), v)


def test_rank():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"q: expected rank 4 \(batch, seqlen, heads, head_dim\), got rank 3"):
        warpattn.flash_attn_func(q[0], k, v)


@pytest.mark.parametrize("d", [4, 12, 100, 520])
def test_unsupported_head_dim(d):
    q, k, v = qkv(d=d)
    with pytest.raises(ValueError, match=rf"^q: head_dim \(shape\[3\]\) must be a multiple of 8 from 8 to 512, got {d}$"):
        warpattn.flash_attn_func(q, k, v)


@pytest.mark.parametrize("d", [8, 40, 80, 96, 200, 248])
def test_padded_head_dim_passes_validation(d):
    # Between the kernels' sizes the call is valid: it is refused only at the host memory.
    q, k, v = qkv(d=d)
    with pytest.raises(TypeError, match="q: CUDA tensor required"):
        warpattn.flash_attn_func(q, k, v)
    with pytest.raises(TypeError, match="dout: CUDA tensor required"):
        warpattn.flash_attn_backward(*backward_args(d=d))


def test_batch_mismatch():
    q, _, _ = qkv()
    _, k, v = qkv(b=3)
    with pytest.raises(ValueError, match=r"k: expected batch 2 \(same as q\), got 3"):
        warpattn.flash_attn_func(q, k, v)


def test_kv_heads_must_divide_query_heads():
    q, k, v = qkv(hq=8, hkv=3)
    with pytest.raises(ValueError, match=r"query heads \(8\) must be a multiple of key/value heads \(3\)"):
        warpattn.flash_attn_func(q, k, v)


def test_last_dim_not_contiguous():
    q, k, v = qkv(d=128)
    q2 = np.zeros((2, 128, 8, 128 * 2), np.float16)[..., ::2]
    with pytest.raises(ValueError, match=r"q: last dimension \(head_dim\) must be contiguous"):
        warpattn.flash_attn_func(q2, k, v)


def test_stride_not_multiple_of_16_bytes():
    q, k, v = qkv(d=64)
    # Heads 68 elements (136 bytes) apart: not a multiple of 16 bytes.
    padded = np.zeros((2, 128, 8, 68), np.float16)[..., :64]
    with pytest.raises(ValueError, match="q: stride.* must be a multiple of 16 bytes"):
        warpattn.flash_attn_func(padded, k, v)


def test_out_overlapping_an_input():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="out: must not overlap q"):
        warpattn.flash_attn_func(q, k, v, out=q)


@pytest.mark.parametrize("scale", [0.0, -0.5, math.nan, math.inf])
def test_bad_softmax_scale(scale):
    q, k, v = qkv()
    with pytest.raises(ValueError, match="softmax_scale: expected a finite positive value"):
        warpattn.flash_attn_func(q, k, v, softmax_scale=scale)


def test_out_of_another_framework():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="out: expected a DLPack tensor"):
        warpattn.flash_attn_func(q, k, v, out=memoryview(b"x"))


def test_kvcache_framework_errors_name_the_argument():
    # flash_attn_with_kvcache checks its tensors' frameworks positionally (the host cost's fast
    # path) and names the argument only on a mismatch: each name must still be the right one.
    q, k, v = qkv(b=1, sq=1, d=128)
    bad = memoryview(b"x")
    with pytest.raises(TypeError, match="^v_cache: expected a DLPack tensor"):
        warpattn.flash_attn_with_kvcache(q, k, bad)
    with pytest.raises(TypeError, match="^k: expected a DLPack tensor"):
        warpattn.flash_attn_with_kvcache(q, k, v, k=bad, v=v)
    for name in ("block_table", "out", "sinks", "k_descale", "v_descale"):
        with pytest.raises(TypeError, match="^%s: expected a DLPack tensor" % name):
            warpattn.flash_attn_with_kvcache(q, k, v, **{name: bad})
    with pytest.raises(TypeError, match="^cache_seqlens: expected an int32 tensor"):
        warpattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=1.5)


def test_kvcache_framework_mismatch_names_the_argument():
    torch = pytest.importorskip("torch")
    q, k, v = qkv(b=1, sq=1, d=128)
    tq = torch.zeros(q.shape, dtype=torch.float16)
    with pytest.raises(TypeError, match=r"^k_cache: expected a torch tensor like q, got numpy.ndarray$"):
        warpattn.flash_attn_with_kvcache(tq, k, v)
    with pytest.raises(TypeError, match=r"^cache_seqlens: expected a torch tensor like q, got numpy.ndarray$"):
        warpattn.flash_attn_with_kvcache(tq, torch.zeros(k.shape, dtype=torch.float16),
                                         torch.zeros(v.shape, dtype=torch.float16),
                                         cache_seqlens=np.zeros(1, np.int32))


def test_lse_is_validated_too():
    q, k, v = qkv()
    # return_lse allocates a correct lse; a wrong out shape is still reported first by name.
    with pytest.raises(ValueError, match=r"out: expected shape"):
        warpattn.flash_attn_func(q, k, v, out=np.zeros((2, 127, 8, 64), np.float16), return_lse=True)


def test_fp8_arguments_without_a_gpu():
    q, k, v = qkv()
    assert warpattn.FP8_BLOCK_ROWS == 128 and len(warpattn.FP8_KEY_ORDER) == 16
    with pytest.raises(TypeError, match="qk_dtype: expected one of e4m3, float8_e4m3fn, int8, got 'uint8'"):
        warpattn.quantize_fp8(q, k, v, qk_dtype="uint8")
    with pytest.raises(TypeError, match="q: FP8 needs a CUDA tensor"):
        warpattn.quantize_fp8(q, k, v, qk_dtype=np.int8)
    with pytest.raises(TypeError, match="k: expected a DLPack tensor"):
        warpattn.quantize_fp8(q, [1], v)


# ------------------------------------------------- window_size, softcap and sinks (issue 19)

# Every rule is the library's: each case reaches it through the binding's keywords and comes
# back with its message (window_size's conversion to two ints is Python's alone).
MODEL_OPTION_ERRORS = [
    (dict(window_size=(-2, 0)), ValueError,
     r"^options\.window_left: expected -1 \(unbounded\) or a key count >= 0, got -2$"),
    (dict(window_size=(0, -7)), ValueError, r"^options\.window_right: expected -1 \(unbounded\) .* got -7$"),
    (dict(window_size=(4, 1), causal=True), ValueError,
     r"^options\.window_right: causal attention sees no key right of the diagonal, expected -1 or 0 with causal, "
     r"got 1$"),
    (dict(softcap=-1.0), ValueError, r"^options\.softcap: expected 0 \(off\) or a finite value > 0, got -1$"),
    (dict(softcap=math.inf), ValueError, r"^options\.softcap: expected 0 \(off\) or a finite value > 0, got inf$"),
    (dict(sinks=np.zeros(2, np.float32)), ValueError,
     r"^sinks: expected shape \(8\) \(one logit per query head\), got \(2\)$"),
    (dict(sinks=np.zeros(8, np.float16)), ValueError, r"^sinks: expected dtype float32, got float16$"),
    (dict(sinks=np.zeros((1, 8), np.float32)), ValueError, r"^sinks: expected rank 1 \(heads_q\), got rank 2$"),
    (dict(sinks=np.zeros(8)), TypeError, r"^sinks: expected a float32 tensor, got DLPack dtype code 2 with 64 bits$"),
    (dict(sinks=[0.0] * 8), TypeError, r"^sinks: expected a DLPack tensor"),
    (dict(window_size=(1, 2, 3)), ValueError, r"^window_size: expected a pair of ints \(left, right\), got 3 values$"),
    (dict(window_size=5), TypeError, r"^window_size: expected a pair of ints \(left, right\), got builtins\.int$"),
    (dict(window_size=(1.5, 2)), TypeError, r"^window_size: expected a pair of ints, got builtins\.float for left$"),
    (dict(window_size=(0, True)), TypeError, r"^window_size: expected a pair of ints, got bool for right$"),
]


@pytest.mark.parametrize("options,error,message", MODEL_OPTION_ERRORS)
def test_model_option_errors(options, error, message):
    q, k, v = qkv(sq=128, sk=96, hq=8, hkv=2)
    with pytest.raises(error, match=message):
        warpattn.flash_attn_func(q, k, v, **options)


@pytest.mark.parametrize("options", [
    dict(window_size=(16, 0), causal=True, softcap=30.0, sinks=np.zeros(8, np.float32)),
    dict(window_size=(0, 0)),  # one key per row: a valid window
    dict(window_size=[np.int64(3), -1], softcap=1),  # any pair of integers; an int softcap
    dict(window_size=(2 ** 40, 0)),  # wider than any sequence: clamped to the library's int
])
def test_model_options_valid_until_the_memory(options):
    q, k, v = qkv(sq=128, sk=96, hq=8, hkv=2)
    with pytest.raises(TypeError, match="q: CUDA tensor required"):
        warpattn.flash_attn_func(q, k, v, **options)


def test_window_beyond_int32_is_clamped():
    # A side that negative is as invalid clamped as given, and the library says so.
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"^options\.window_right: .* got -2147483648$"):
        warpattn.flash_attn_func(q, k, v, window_size=(2 ** 40, -(2 ** 40)))


def test_model_options_rule_order():
    # The window and softcap are reported after the tensors' own rules (rule p comes last).
    q, k, v = qkv(d=100)  # not a multiple of 8: 96 became a head dim the library takes
    with pytest.raises(ValueError, match="q: head_dim"):
        warpattn.flash_attn_func(q, k, v, window_size=(-5, -5), sinks=np.zeros(3, np.float32))


def fp8_operands(b=1, sq=128, sk=200, hq=4, hkv=2, d=64):
    """FP8 operands on NumPy arrays (e4m3 as its bytes, as the module takes them) and an out."""
    blocks = lambda n: (n + 127) // 128  # noqa: E731
    ops = (np.zeros((b, sq, hq, d), np.uint8), np.zeros((b, sk, hkv, d), np.uint8),
           np.zeros((b, hkv, d, (sk + 15) // 16 * 16), np.uint8), np.ones((b, hq, blocks(sq)), np.float32),
           np.ones((b, hkv, blocks(sk)), np.float32), np.ones((b, hkv, blocks(sk)), np.float32))
    return ops, np.zeros((b, sq, hq, d), np.float16)


def test_fp8_model_options_reach_the_library():
    ops, out = fp8_operands()

    def call(**options):
        _warpattn.forward_fp8(*ops, out, None, None, False, 0, False, **options)
    with pytest.raises(ValueError, match=r"^options\.softcap: forward_fp8 has no softcap \(16-bit forward only\), "
                                         r"got 30$"):
        call(softcap=30.0)
    with pytest.raises(ValueError, match=r"^options\.window_left: .* got -3$"):
        call(window_left=-3)
    with pytest.raises(ValueError, match=r"^sinks: expected shape \(4\)"):
        call(sinks=np.zeros(2, np.float32))
    with pytest.raises(TypeError, match="q: CUDA tensor required"):  # a window and sinks: FP8 takes both
        call(window_left=64, window_right=0, sinks=np.zeros(4, np.float32))
    # The packed FP8 forward too.
    tq, tk, n = 128, 200, 2
    rows_q, rows_k = warpattn.fp8_varlen_rows(tq, n), warpattn.fp8_varlen_rows(tk, n)
    packed = (np.zeros((tq, 4, 64), np.uint8), np.zeros((tk, 2, 64), np.uint8), np.zeros((2, 64, rows_k), np.uint8),
              np.ones((4, rows_q // 128), np.float32), np.ones((2, rows_k // 128), np.float32),
              np.ones((2, rows_k // 128), np.float32))
    cu_q, cu_k = np.array([0, 100, tq], np.int32), np.array([0, 50, tk], np.int32)

    def call_packed(**options):
        _warpattn.forward_fp8_varlen(*packed, np.zeros((tq, 4, 64), np.float16), None, cu_q, cu_k, None, 100, 150,
                                     None, False, 0, False, **options)
    with pytest.raises(ValueError, match=r"^options\.softcap: forward_fp8 has no softcap"):
        call_packed(softcap=1.0)
    with pytest.raises(ValueError, match=r"^sinks: expected dtype float32, got float16$"):
        call_packed(sinks=np.zeros(4, np.float16))
    with pytest.raises(TypeError, match="q: CUDA tensor required"):
        call_packed(window_left=16, window_right=16, sinks=np.zeros(4, np.float32))
    # Issue 18's mode is a keyword of both FP8 calls (every rule passes; only the device is missing).
    with pytest.raises(TypeError, match="q: CUDA tensor required"):
        call(batch_invariant=True)
    with pytest.raises(TypeError, match="q: CUDA tensor required"):
        call_packed(batch_invariant=True)


def test_backward_takes_model_options(monkeypatch):
    # The explicit backward takes the forward's options (issue 19) with the library's rules and
    # messages, softcap at every head dim (at 64 and below the 128 kernel runs it); a valid call is
    # refused at the host memory.
    args = backward_args(d=128)
    sinks = np.zeros(8, np.float32)
    with pytest.raises(TypeError, match="dout: CUDA tensor required"):
        warpattn.flash_attn_backward(*args, causal=True, window_size=(8, 0), softcap=2.5, sinks=sinks)
    cases = [(dict(window_size=(-4, 0)), r"^options\.window_left: .* got -4$"),
             (dict(window_size=(0, 2), causal=True), r"^options\.window_right: causal attention"),
             (dict(softcap=math.inf), r"^options\.softcap: expected 0 \(off\) or a finite value > 0"),
             (dict(sinks=np.zeros(2, np.float32)), r"^sinks: expected shape \(8\)")]
    for options, message in cases:
        with pytest.raises(ValueError, match=message):
            warpattn.flash_attn_backward(*args, **options)
    for d in (32, 64, 80):  # 32 and 64 in the 128 kernel (backward_kernel_dim), 80 padded into it
        with pytest.raises(TypeError, match="dout: CUDA tensor required"):
            warpattn.flash_attn_backward(*backward_args(d=d), softcap=30.0)
    with pytest.raises(TypeError, match="sinks: expected a DLPack tensor"):
        warpattn.flash_attn_backward(*args, sinks=[0.0] * 8)
    # What reaches the module: the options as keywords, and with sinks a dsinks to write (float32,
    # shaped as the sinks), returned fourth.
    seen = []

    def backward(*call, **options):
        seen.append(options)
    monkeypatch.setattr(_warpattn, "backward", backward)
    grads = warpattn.flash_attn_backward(*args, window_size=(16, 4), softcap=7.0, sinks=sinks)
    assert len(grads) == 4 and grads[3] is seen[-1]["dsinks"] and grads[3].shape == (8,)
    assert grads[3].dtype == np.float32 and seen[-1]["sinks"] is sinks
    assert (seen[-1]["window_left"], seen[-1]["window_right"], seen[-1]["softcap"]) == (16, 4, 7.0)
    assert len(warpattn.flash_attn_backward(*args, window_size=(16, 4))) == 3 and seen[-1]["dsinks"] is None


def test_backward_workspace_grows_with_sinks():
    # The sinks' gradient takes workspace of its own (its partial sums): sized with the sinks given;
    # the window and softcap change nothing of it.
    q = np.zeros((2, 1000, 8, 128), np.float16)
    plain = _warpattn.backward_workspace_bytes(q, None, True, False)
    assert _warpattn.backward_workspace_bytes(q, None, True, False, window_left=64, window_right=0,
                                              softcap=5.0) == plain
    assert _warpattn.backward_workspace_bytes(q, None, True, False, sinks=np.zeros(8, np.float32)) > plain
    assert _warpattn.backward_workspace_bytes(q, None, True, True, sinks=np.zeros(8, np.float32)) > \
        _warpattn.backward_workspace_bytes(q, None, True, True)


def test_reference_gradients_against_central_differences(attention_reference, attention_reference_grads):
    # The float64 gradient reference of the GPU tests (conftest.py: the chain rule written out)
    # against central differences of the float64 forward reference, with every option at once and
    # rows that see no key (Sq > Sk, causal: the sink alone) and a GQA group.
    rng = np.random.default_rng(0)
    b, sq, sk, hq, hkv, d = 2, 6, 4, 4, 2, 3
    q, dout = rng.standard_normal((b, sq, hq, d)), rng.standard_normal((b, sq, hq, d))
    k, v = rng.standard_normal((b, sk, hkv, d)), rng.standard_normal((b, sk, hkv, d))
    sinks = rng.standard_normal(hq)
    for options in (dict(causal=True, window_size=(1, 0), softcap=1.5, sinks=sinks, softmax_scale=0.8),
                    dict(window_size=(1, 2), sinks=sinks), dict(softcap=0.7), dict()):
        got = attention_reference_grads(q, k, v, dout, **options)

        def loss(**change):
            call = dict(dict(q=q, k=k, v=v), **{n: t for n, t in change.items() if n != "sinks"})
            with np.errstate(all="ignore"):
                out = attention_reference(call["q"], call["k"], call["v"], **dict(options, **(
                    {"sinks": change["sinks"]} if "sinks" in change else {})))[0]
            return (out * dout).sum()
        inputs = dict(q=q, k=k, v=v, **({"sinks": sinks} if "sinks" in options else {}))
        for name, t in inputs.items():
            numeric = np.zeros_like(t)
            for i in np.ndindex(t.shape):
                up, down = t.copy(), t.copy()
                up[i] += 1e-6
                down[i] -= 1e-6
                numeric[i] = (loss(**{name: up}) - loss(**{name: down})) / 2e-6
            assert np.abs(numeric - got["d" + name]).max() <= 1e-7, (options, name)
        if "sinks" not in options:
            assert got["dsinks"] is None


# ------------------------------------------------------------------------- backward

def backward_args(b=2, sq=128, sk=96, hq=8, hkv=2, d=64):
    """dout, q, k, v, out, lse of a valid backward call (GQA, seqlen_q != seqlen_k)."""
    q, k, v = qkv(b, sq, sk, hq, hkv, d)
    return np.zeros_like(q), q, k, v, np.zeros_like(q), np.zeros((b, hq, sq), np.float32)


def test_backward_valid_call_on_cpu_memory_is_refused():
    with pytest.raises(TypeError, match="dout: CUDA tensor required"):
        warpattn.flash_attn_backward(*backward_args(), causal=True, deterministic=True)


@pytest.mark.parametrize("change,message", [
    (dict(dq=np.zeros((2, 128, 8, 128), np.float16)), r"dq: expected head_dim 64 \(same as q\), got 128"),
    (dict(dk=np.zeros((2, 96, 2, 64), np.float32)), r"dk: expected dtype float16 \(same as q\), got float32"),
    (dict(dv=np.zeros((2, 96, 8, 64), np.float16)), r"dv: expected shape \(2, 96, 2, 64\) \(same as k\)"),
    (dict(softmax_scale=0.0), "softmax_scale: expected a finite positive value"),
])
def test_backward_argument_errors(change, message):
    with pytest.raises(ValueError, match=message):
        warpattn.flash_attn_backward(*backward_args(), **change)


def test_backward_head_dim_without_a_kernel():
    # The forward's rule and the backward's are the same sizes: either may answer first.
    with pytest.raises(ValueError, match=r"head_dim \(shape\[3\]\) must be a multiple of 8 from 8 to 512( for the backward)?, got 100$"):
        warpattn.flash_attn_backward(*backward_args(d=100))


def test_backward_tensor_errors():
    dout, q, k, v, out, lse = backward_args()
    with pytest.raises(ValueError, match=r"lse: expected shape \(batch, heads_q, seqlen_q\) = \(2, 8, 128\)"):
        warpattn.flash_attn_backward(dout, q, k, v, out, lse.transpose(0, 2, 1))
    with pytest.raises(ValueError, match="lse: expected dtype float32, got float16"):
        warpattn.flash_attn_backward(dout, q, k, v, out, lse.astype(np.float16))
    with pytest.raises(ValueError, match=r"dout: expected shape \(2, 128, 8, 64\) \(same as q\)"):
        warpattn.flash_attn_backward(dout[:, :64], q, k, v, out, lse)
    with pytest.raises(ValueError, match="dq: must not overlap q"):
        warpattn.flash_attn_backward(dout, q, k, v, out, lse, dq=q)
    grad = np.zeros_like(k)
    with pytest.raises(ValueError, match="dk: must not overlap dv"):
        warpattn.flash_attn_backward(dout, q, k, v, out, lse, dk=grad, dv=grad)
    with pytest.raises(ValueError, match=r"q: expected rank 4 .* got rank 3"):
        warpattn.flash_attn_backward(dout, q[0], k, v, out, lse)
    with pytest.raises(TypeError, match="lse: expected a DLPack tensor"):
        warpattn.flash_attn_backward(dout, q, k, v, out, [0.0])


def aligned_bytes(n):
    """n bytes of host memory at a 256-byte aligned address (as the workspace must be)."""
    buffer = np.zeros(n + 256, np.uint8)
    start = -buffer.ctypes.data % 256
    return buffer[start:start + n]


def test_backward_workspace():
    dout, q, k, v, out, lse = backward_args()
    need = _warpattn.backward_workspace_bytes(q)
    assert need >= q.size * 4  # dQ's fp32 accumulator at least
    assert _warpattn.backward_workspace_bytes(q, None, True, True) >= need
    grads = (np.zeros_like(q), np.zeros_like(k), np.zeros_like(v))

    def call(workspace):
        _warpattn.backward(dout, q, k, v, out, lse, *grads, None, False, False, workspace, 0)
    with pytest.raises(ValueError, match="workspace: expected at least %d bytes" % need):
        call(aligned_bytes(need - 256))
    with pytest.raises(ValueError, match="workspace: data pointer 0x[0-9a-f]+ must be 256-byte aligned"):
        call(aligned_bytes(need + 1)[1:])
    with pytest.raises(ValueError, match="workspace: expected a contiguous array"):
        call(aligned_bytes(2 * need)[::2])
    with pytest.raises(TypeError, match="dout: CUDA tensor required"):
        call(aligned_bytes(need))
    with pytest.raises(ValueError, match="q: expected rank 4"):
        _warpattn.backward_workspace_bytes(q[0])


# ---------------------------------------------------------------- PyTorch, no GPU

@pytest.fixture
def torch():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    import warpattn.torch_op  # noqa: F401 (registers the custom ops, as the first call would)
    return torch


def meta_qkv(torch, b=2, sq=128, sk=96, hq=8, hkv=2, d=64):
    """Meta tensors (shapes, no memory): the custom ops run their fake implementations on them."""
    def make(*shape):
        return torch.empty(shape, device="meta", dtype=torch.bfloat16, requires_grad=True)
    return make(b, sq, hq, d), make(b, sk, hkv, d), make(b, sk, hkv, d)


def test_torch_fake_implementations(torch):
    q, k, v = (t.detach() for t in meta_qkv(torch))
    out, lse = torch.ops.warpattn.flash_attn_forward(q, k, v, None, True, False)
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
    assert lse.shape == (2, 8, 128) and lse.dtype == torch.float32
    grads = torch.ops.warpattn.flash_attn_backward(out, q, k, v, out, lse, None, 0.1, True, True)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape, (0,)]  # no sinks: an empty dsinks
    assert all(g.dtype == q.dtype and g.is_contiguous() for g in grads[:3]) and grads[3].dtype == torch.float32


def test_torch_opcheck(torch):
    from warpattn.torch_op import flash_attn_backward, flash_attn_forward
    q, k, v = meta_qkv(torch)
    torch.library.opcheck(flash_attn_forward, (q, k, v, None, True, False))
    out, lse = (t.detach() for t in flash_attn_forward(q, k, v, None, True, False))
    q, k, v = (t.detach() for t in (q, k, v))
    torch.library.opcheck(flash_attn_backward, (out, q, k, v, out, lse, None, None, True, False))


def test_torch_autograd_shapes(torch):
    q, k, v = meta_qkv(torch)
    out = warpattn.flash_attn_func(q, k, v, causal=True, deterministic=True)
    out.sum().backward()  # a stride-0 gradient, made contiguous for the kernel
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape


def test_torch_calls_keep_the_dispatcher_where_it_is_needed(torch):
    # torch_op._call runs an op's body directly only for eager calls on plain CUDA tensors that
    # want no gradient from it; everything else meets the op (fake implementations, autograd
    # formulas or refusals, subclasses, modes, tracing, the profiler).
    from torch._subclasses.fake_tensor import FakeTensorMode
    from warpattn.torch_op import _may_skip_dispatcher
    cpu = torch.zeros(2, 3)
    assert not _may_skip_dispatcher((cpu, None, 1.0, True))  # host memory: the op refuses it by name
    assert not _may_skip_dispatcher((torch.zeros(2, 3, device="meta"),))  # the fake implementation
    assert _may_skip_dispatcher((None, 1.0, False))  # no tensor, no mode: nothing needs the op
    with FakeTensorMode():
        assert not _may_skip_dispatcher((None,))  # a dispatch mode
    with torch.autograd.profiler.profile():
        assert not _may_skip_dispatcher((None,))  # the profiler records the op
    traced = []
    torch.jit.trace(lambda x: traced.append(_may_skip_dispatcher((None,))) or x * 2, (cpu,), check_trace=False)
    assert traced == [False]
    assert not torch.compile(lambda: _may_skip_dispatcher((None,)), backend="eager", fullgraph=True)()


def test_torch_compile_traces_forward_and_backward(torch, op_recording_backend):
    q, k, v = meta_qkv(torch)
    backend, ops = op_recording_backend

    def loss(q, k, v):
        return warpattn.flash_attn_func(q, k, v, causal=True).float().square().sum()
    torch.compile(loss, backend=backend, fullgraph=True)(q, k, v).backward()
    assert "warpattn.flash_attn_forward.default" in ops and "warpattn.flash_attn_backward.default" in ops
    assert k.grad.shape == k.shape


def test_torch_lse_gradient_is_refused_unless_zero(torch):
    q = torch.zeros(1, 128, 2, 64, dtype=torch.float16)
    lse = torch.zeros(1, 2, 128)
    with pytest.raises(NotImplementedError, match="gradient of lse"):
        torch.ops.warpattn.flash_attn_backward(q, q, q, q, q, lse, lse + 1, None, False, False)
    with pytest.raises(TypeError, match="dout: CUDA tensor required"):  # a zero one passes
        torch.ops.warpattn.flash_attn_backward(q, q, q, q, q, lse, lse, None, False, False)


def test_torch_out_argument_is_not_differentiable(torch):
    q = torch.zeros(1, 128, 2, 64, dtype=torch.float16)
    k = q.clone().requires_grad_()
    with pytest.raises(RuntimeError, match=r"out: flash_attn_func\(..., out=...\) is not differentiable"):
        warpattn.flash_attn_func(q, k, q, out=torch.empty_like(q))
    with torch.no_grad(), pytest.raises(TypeError, match="q: CUDA tensor required"):
        warpattn.flash_attn_func(q, k, q, out=torch.empty_like(q))


def test_torch_backward_on_cpu_tensors(torch):
    dout, q, k, v, out, lse = (torch.from_numpy(a) for a in backward_args())
    with pytest.raises(ValueError, match="dq: must not overlap q"):
        warpattn.flash_attn_backward(dout, q, k, v, out, lse, dq=q)
    with pytest.raises(TypeError, match="dout: CUDA tensor required"):
        warpattn.flash_attn_backward(dout, q, k, v, out, lse)


def test_torch_ops_take_the_model_options(torch):
    # The forward and backward ops take the options with schema types (ints, a float, an optional
    # tensor); their fake implementations give the same shapes as without them, and the autograd
    # registration passes opcheck with sinks that require grad too.
    from warpattn.torch_op import flash_attn_backward, flash_attn_forward
    q, k, v = meta_qkv(torch)
    sinks = torch.zeros(8, device="meta")
    torch.library.opcheck(flash_attn_forward, (q, k, v, None, True, False, False, 32, 0, 30.0, sinks))
    torch.library.opcheck(flash_attn_forward, (q, k, v, None, True, False, False, 32, 0, 30.0,
                                               sinks.clone().requires_grad_()))
    q, k, v = (t.detach() for t in (q, k, v))
    out, lse = torch.ops.warpattn.flash_attn_forward(q, k, v, None, False, False, False, 32, 8, 30.0, sinks)
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == (2, 8, 128) and lse.dtype == torch.float32
    grads = torch.ops.warpattn.flash_attn_backward(out, q, k, v, out, lse, None, None, False, False, 32, 8, 30.0, sinks)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape, (8,)]  # meta tensors: the fake
    assert grads[3].dtype == torch.float32
    grads = torch.ops.warpattn.flash_attn_backward(out, q, k, v, out, lse, None, None, False, False)
    assert grads[3].shape == (0,) and grads[3].dtype == torch.float32  # no sinks: an empty dsinks
    torch.library.opcheck(flash_attn_backward, (out, q, k, v, out, lse, None, None, False, False, 32, 8, 30.0, sinks))


def test_torch_backward_op_takes_model_options(torch):
    # The real implementation hands them to the library: a valid call (softcap at head_dim 64 too)
    # is refused at the host memory, and the lse gradient's refusal comes first, as without them.
    q = torch.zeros(1, 128, 2, 64, dtype=torch.float16)
    lse = torch.zeros(1, 2, 128)
    backward = torch.ops.warpattn.flash_attn_backward
    with pytest.raises(NotImplementedError, match="gradient of lse"):
        backward(q, q, q, q, q, lse, lse + 1, None, False, False, 16, -1, 0.0, torch.zeros(2))
    for causal, model in ((True, (16, 0, 0.0, None)), (False, (-1, 4, 0.0, None)),
                          (False, (-1, -1, 0.0, torch.zeros(2))), (True, (-1, 0, 0.0, None))):
        with pytest.raises(TypeError, match="dout: CUDA tensor required"):
            backward(q, q, q, q, q, lse, None, None, causal, False, *model)
    with pytest.raises(TypeError, match="dout: CUDA tensor required"):
        backward(q, q, q, q, q, lse, None, None, False, False, -1, -1, 30.0, None)
    q = torch.zeros(1, 128, 2, 128, dtype=torch.float16)
    with pytest.raises(TypeError, match="dout: CUDA tensor required"):
        backward(q, q, q, q, q, lse, None, None, False, False, 0, 0, 1.5, torch.zeros(2))


@pytest.fixture
def host_forward(torch, monkeypatch):
    """_warpattn's 16-bit forwards replaced by no-ops that record the keyword arguments they get:
    on CPU tensors the custom ops then run their real implementations around them, so autograd's
    wiring (what reaches the backward op) is tested without a GPU. The backward stays the module's
    own, which refuses host memory after every argument rule."""
    seen = []

    def forward(*args, **options):
        seen.append(options)
    monkeypatch.setattr(_warpattn, "forward", forward)
    monkeypatch.setattr(_warpattn, "forward_varlen", forward)
    return seen


def host_qkv(torch, requires_grad=True):
    return [torch.zeros(1, 128, 2, 64, dtype=torch.bfloat16, requires_grad=requires_grad) for _ in range(3)]


@pytest.fixture
def host_backward(torch, monkeypatch):
    """_warpattn.backward replaced by a recorder of its keyword arguments that writes 5 into
    dsinks (when given): with host_forward, autograd's whole wiring on CPU tensors."""
    seen = []

    def backward(*args, **options):
        seen.append(options)
        if options["dsinks"] is not None:
            options["dsinks"].fill_(5.0)
    monkeypatch.setattr(_warpattn, "backward", backward)
    return seen


def test_torch_gradients_flow_through_model_options(torch, host_forward, host_backward):
    # The backward gets the forward's options (and dsinks to write), and the sinks' gradient goes
    # to the sinks: learned sinks (requires_grad, gpt-oss style) train.
    q, k, v = host_qkv(torch)
    cases = [(dict(window_size=(32, 0), causal=True), dict(window_left=32, window_right=0, softcap=0.0)),
             (dict(softcap=50), dict(window_left=-1, window_right=-1, softcap=50.0)),
             (dict(sinks=torch.zeros(2), window_size=(7, 7)), dict(window_left=7, window_right=7, softcap=0.0))]
    for options, reached in cases:
        out = warpattn.flash_attn_func(q, k, v, **options)
        got = dict(host_forward[-1])
        assert got.pop("sinks") is options.get("sinks") and got == reached
        out.float().sum().backward()
        got = dict(host_backward[-1])
        assert got.pop("sinks") is options.get("sinks")
        dsinks = got.pop("dsinks")
        assert (dsinks is None) == ("sinks" not in options) and got == reached
    learned = torch.zeros(2, requires_grad=True)
    out = warpattn.flash_attn_func(*host_qkv(torch, False), sinks=learned)
    out.float().sum().backward()
    assert torch.equal(learned.grad, torch.full((2,), 5.0))
    assert host_backward[-1]["dsinks"].shape == (2,) and host_backward[-1]["dsinks"].dtype == torch.float32


def test_torch_softcap_at_head_dim_64_reaches_the_backward(torch, host_forward):
    # The forward runs, and so does the backward's every argument rule (at head_dim 64 the 128
    # kernel runs the softcap): the call stops only at the host memory.
    q, k, v = host_qkv(torch)
    out = warpattn.flash_attn_func(q, k, v, softcap=30.0)
    with pytest.raises(TypeError, match="dout: CUDA tensor required"):
        out.float().sum().backward()


def test_torch_compile_traces_model_options_forward_and_backward(torch, host_forward, host_backward,
                                                                 op_recording_backend):
    # torch.compile(fullgraph) traces the backward with the forward's options and the sinks'
    # gradient (no graph break, no host synchronisation), and the compiled backward hands them on.
    q, k, v = host_qkv(torch)
    sinks = torch.zeros(2, requires_grad=True)
    backend, ops = op_recording_backend

    def loss(q, k, v, sinks):
        return warpattn.flash_attn_func(q, k, v, window_size=(32, 8), softcap=20.0, sinks=sinks).float().square().sum()
    torch.compile(loss, backend=backend, fullgraph=True)(q, k, v, sinks).backward()
    assert "warpattn.flash_attn_forward.default" in ops and "warpattn.flash_attn_backward.default" in ops
    got = dict(host_backward[-1])
    assert got.pop("sinks").shape == (2,) and got.pop("dsinks").shape == (2,)
    assert got == dict(window_left=32, window_right=8, softcap=20.0)
    assert torch.equal(sinks.grad, torch.full((2,), 5.0)) and q.grad.shape == q.shape


# -------------------------------------------------------------------- JAX, no GPU

def test_jax_refusals():
    jax = pytest.importorskip("jax", reason="JAX is not installed")
    import jax.numpy as jnp
    q = jnp.zeros((1, 128, 2, 64), jnp.bfloat16)
    lse = jnp.zeros((1, 2, 128), jnp.float32)

    def loss(q):
        return warpattn.jax_flash_attn(q, q, q).astype(jnp.float32).sum()
    if not any(dev.platform == "gpu" for dev in jax.devices()):
        with pytest.raises(TypeError, match="q: CUDA tensor required .* got a JAX array on cpu"):
            jax.grad(loss)(q)
    from warpattn import jax_ffi
    if jax_ffi.available():
        # Under jax.jit the call is an XLA custom call, which has a handler for CUDA alone: compiled
        # for the CPU (q's platform here), XLA finds none (or, after test_jax_ffi.py registered its
        # host check for the CPU in this process, that check stops at the library's device check).
        with pytest.raises(jax.errors.JaxRuntimeError,
                           match="No FFI handler registered for warpattn_forward|device memory|no CUDA device"):
            jax.block_until_ready(jax.jit(jax.grad(loss))(jax.device_put(q, jax.devices("cpu")[0])))
    else:
        with pytest.raises(TypeError, match="not traced ones under jax.jit"):
            jax.jit(jax.grad(loss))(q)
    with pytest.raises(ValueError, match="dq, dk, dv: JAX arrays are immutable"):
        warpattn.flash_attn_backward(q, q, q, q, q, lse, dq=q)
    with pytest.raises(ValueError, match="q: expected rank 4"):
        warpattn.jax_flash_attn(q[0], q, q)


# ---------------------------------------------------------------- how PyTorch tensors are read
# The binding reads a plain torch.Tensor's address, dtype, shape and strides from its attributes
# (array_arg.hpp: DLPack's export was the largest host cost of a small call); anything else goes
# through DLPack. The facts must be the same either way.

class _ThroughDlpack:
    """The tensor behind the DLPack protocol alone, so that the binding must take that path."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, *args, **kwargs):
        return self.t.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


def _torch_tensors(torch):
    base = torch.arange(2 * 6 * 3 * 8, dtype=torch.float32).reshape(2, 6, 3, 8)
    yield base
    yield base.to(torch.bfloat16).transpose(1, 2)           # strided view
    yield base.to(torch.float16)[:, 1:5, :, 2:6]           # storage offset, non-contiguous
    yield base[0, 0, 0]                                     # rank 1
    yield base.sum()                                        # rank 0
    yield base.new_empty((0, 3, 0, 8))                      # empty
    yield base.to(torch.int32)[1]
    yield base.to(torch.uint8).expand(2, 6, 3, 8)          # stride 0 nowhere here, but a view
    yield base[:, :1].expand(2, 6, 3, 8)                   # stride 0
    yield torch.nn.Parameter(base.to(torch.bfloat16), requires_grad=False)
    yield base.to(torch.int8).flip(0).contiguous()
    yield base.to(torch.float64)
    yield base[:, 1:2]                                      # size-1 axes (whose strides nothing steps over)
    yield torch.zeros(1, 128, 4, 64, dtype=torch.bfloat16).transpose(0, 1)


def _facts_that_matter(facts):
    """_array_facts without the strides of size-1 axes, which no access steps over (the library
    and its tensor maps ignore them) and which DLPack exporters may normalise."""
    address, code, bits, shape, strides, device, _ = facts
    return address, code, bits, shape, tuple(st for n, st in zip(shape, strides) if n != 1), device


def test_torch_tensors_read_as_dlpack_reads_them():
    torch = pytest.importorskip("torch")
    for t in _torch_tensors(torch):
        fast = _warpattn._array_facts(t)
        slow = _warpattn._array_facts(_ThroughDlpack(t))
        assert fast[-1] is False and slow[-1] is True, (t.dtype, t.shape)
        assert _facts_that_matter(fast) == _facts_that_matter(slow), (t.dtype, t.shape, fast, slow)
        assert fast[0] == t.data_ptr() and fast[3] == tuple(t.shape) and fast[4] == t.stride()


def test_torch_tensors_the_fast_path_does_not_know_take_dlpack():
    torch = pytest.importorskip("torch")
    x = torch.zeros(2, 3, dtype=torch.bfloat16)
    assert _warpattn._array_facts(torch.zeros(2, 3, dtype=torch.bool))[-1] is True  # a dtype outside its table

    class Sub(torch.Tensor):
        pass
    assert _warpattn._array_facts(x.as_subclass(Sub))[-1] is True  # a subclass (FakeTensor's kind)
    if hasattr(torch, "_neg_view"):  # a lazily negated view: whatever DLPack makes of it
        assert _warpattn._array_facts(torch._neg_view(x))[-1] is True
    for t in (x.clone().requires_grad_(), torch.nn.Parameter(x.clone())):  # as nanobind's DLPack import reads them
        assert (_facts_that_matter(_warpattn._array_facts(t))
                == _facts_that_matter(_warpattn._array_facts(_ThroughDlpack(t.detach()))))
    meta = torch.zeros(2, 3, device="meta")
    with pytest.raises((TypeError, RuntimeError, BufferError)):  # neither CUDA nor the CPU: DLPack's answer
        _warpattn._array_facts(meta)


def test_bench_varlen_mixes():
    # The ragged benchmark's mixes: fixed by their seed, the token budget met, and the short mix
    # below d = 64's tall-tile threshold (2048 rows), where the batch-invariant mode's cost shows.
    from warpattn.bench_varlen import MIXES, TOTAL_TOKENS, mix_lengths
    for name in MIXES:
        lengths = mix_lengths(name)
        assert lengths == mix_lengths(name) and min(lengths) >= 1
        if name != "onelong":
            assert sum(lengths) == TOTAL_TOKENS
    short = mix_lengths("short")
    assert max(short) < 2048 and len(short) > 32


def _bench_backward_record():
    env = {"date": "2026-12-06", "card": "H", "sms": 132, "power_limit": "700 W", "commit": "abc", "torch": "2",
           "cudnn": 91900}
    rows = [{"d": 128, "N": 4096, "causal": False,
             "tflops": {"warpattn": 550.0, "warpattn_det": 460.0, "cudnn": 500.0, "fa2": 300.0},
             "tflops_fwd_bwd": {"warpattn": 560.0, "cudnn": 400.0, "fa2": 290.0}},
            {"d": 256, "N": 1024, "causal": True, "tflops": {"warpattn": 200.0, "warpattn_det": 150.0},
             "tflops_fwd_bwd": {"warpattn": 210.0}}]
    return env, rows


def test_bench_backward_table():
    # The backward benchmark's table from a record (no GPU): each point's row with the
    # deterministic figure in brackets, the ratio to cuDNN of the backward and of forward +
    # backward, "n/a" where a library did not run, the GEMM ceiling in the header.
    import argparse
    from warpattn.bench_backward import markdown
    env, rows = _bench_backward_record()
    args = argparse.Namespace(deterministic=True, dtype="bfloat16", passes=3)
    table = markdown(env, 700.0, "do_bench", rows, args).splitlines()
    assert "| 128 | 4096 | no | 550.0 (460.0) | 500.0 | 300.0 | 1.100 | 560.0 | 400.0 | 290.0 | 1.400 |" in table
    assert "| 256 | 1024 | yes | 200.0 (150.0) | n/a | n/a | n/a | 210.0 | n/a | n/a | n/a |" in table
    assert any("700.0 TFLOP/s" in line for line in table)


def test_bench_backward_plot():
    # The plot of the same record (matplotlib is the GPU host's; skipped without it).
    pytest.importorskip("matplotlib")
    import os
    import tempfile
    from warpattn.bench_backward import plot
    env, rows = _bench_backward_record()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "b.png")
        result = dict(env, dtype="bfloat16", gemm_tflops=700.0, rows=rows)
        assert plot(result, path) and os.path.getsize(path) > 1000


def test_sustained_loop_clocks_from_its_middle():
    # bench_clocks.attach_clocks (bench_clocks and bench_backward --sustained): a loop's clock,
    # power and reasons are the medians of the nvidia-smi samples in its middle 80%, so the ramp
    # at its start and the idle after it are not read, and TFLOP/s per GHz follows from them.
    from warpattn.bench_clocks import attach_clocks
    rows = [{"workload": "w", "tflops": 500.0, "t0": 10.0, "t1": 20.0}]
    samples = [(10.5, 1000, 300, 50, "0x0"), (12.0, 1800, 690, 61, "0x4"), (15.0, 1750, 700, 62, "0x4"),
               (16.0, 1760, 700, 62, "0x4"), (19.5, 1000, 300, 50, "0x0")]
    attach_clocks(rows, samples)
    r = rows[0]
    assert r["samples"] == 3 and r["sm_mhz"] == 1760 and r["power_w"] == 700 and r["throttle"] == "0x4"
    assert r["tflops_per_ghz"] == round(500.0 / 1.76, 1)


def test_clock_sampler_without_a_device():
    # The benchmarks' clock sampler on a host without NVML or a CUDA device: it neither raises nor
    # reports a clock (the timings go on without one).
    from warpattn.bench import ClockSampler

    class NoCuda:
        class cuda:
            @staticmethod
            def current_device():
                raise RuntimeError("no CUDA device")

            @staticmethod
            def get_device_properties(i):
                raise RuntimeError("no CUDA device")

    with ClockSampler(NoCuda) as sampler:
        sum(range(1000))
    assert sampler.mhz is None and sampler.watts is None


def test_board_power_is_the_instant_reading():
    # The clock sampler's power (bench._board_milliwatts) asks NVML for the instant field (186)
    # through nvmlFieldValue_t, whose layout (40 bytes) ctypes must match; the last second's mean
    # (nvmlDeviceGetPowerUsage) only where the field is refused, and None where both are.
    import ctypes
    from warpattn import bench
    assert ctypes.sizeof(bench._NvmlFieldValue) == 40 and bench._NvmlFieldValue.value.offset == 32

    class Nvml:
        def __init__(self, field_status, mean_status):
            self.field_status, self.mean_status = field_status, mean_status

        def nvmlDeviceGetFieldValues(self, handle, count, values):
            field = values._obj
            assert count == 1 and field.fieldId == 186
            field.nvmlReturn, field.value = self.field_status, 654321
            return 0

        def nvmlDeviceGetPowerUsage(self, handle, milliwatts):
            milliwatts._obj.value = 1234
            return self.mean_status

    assert bench._board_milliwatts(Nvml(0, 0), None) == 654321
    assert bench._board_milliwatts(Nvml(3, 0), None) == 1234  # 3: NVML_ERROR_NOT_SUPPORTED
    assert bench._board_milliwatts(Nvml(3, 3), None) is None
