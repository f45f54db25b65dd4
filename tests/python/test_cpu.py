"""The Python package without a GPU: import, metadata, and every argument error, checked on
NumPy (CPU) arrays: warpattn validates arguments before it looks at where memory lives, so each
rule gives the same message here as on the GPU, and a valid call on CPU memory is refused with
"CUDA tensor required"."""
import math

import numpy as np
import pytest

import warpattn


def qkv(b=2, sq=128, sk=128, hq=8, hkv=8, d=64, dtype=np.float16):
    q = np.zeros((b, sq, hq, d), dtype)
    k = np.zeros((b, sk, hkv, d), dtype)
    v = np.zeros((b, sk, hkv, d), dtype)
    return q, k, v


def test_import_and_metadata():
    assert warpattn.supported_head_dims == (64, 128, 256)
    assert warpattn.__version__
    assert "flash_attn_func" in warpattn.__all__
    assert "softmax_scale" in warpattn.flash_attn_func.__doc__


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


@pytest.mark.parametrize("d", [32, 96, 192])
def test_unsupported_head_dim(d):
    q, k, v = qkv(d=d)
    with pytest.raises(ValueError, match=f"q: head_dim .* must be one of 64, 128, 256, got {d}"):
        warpattn.flash_attn_func(q, k, v)


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

