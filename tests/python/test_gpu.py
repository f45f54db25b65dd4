"""The Python package on an sm_90 GPU, against scaled_dot_product_attention in fp32 on the
same inputs (the forward) and in fp64 (the backward, whose error is also held against cuDNN's);
skipped with the reason elsewhere."""
import math
import zlib

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
if torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("needs an sm_90 GPU, found sm_%d%d" % torch.cuda.get_device_capability(), allow_module_level=True)

import warpattn  # noqa: E402

TOL = {torch.bfloat16: 5e-3, torch.float16: 1e-3}


def reference(q, k, v, causal, scale=None):
    """fp32 attention in (B, S, H, D) layout with GQA and bottom-right causal alignment;
    rows that see no key are 0 and their LSE -inf (warpattn's convention)."""
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
    group = qf.shape[1] // kf.shape[1]
    kf, vf = kf.repeat_interleave(group, 1), vf.repeat_interleave(group, 1)
    sq, sk = qf.shape[2], kf.shape[2]
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    mask = None
    if causal:
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(diagonal=sk - sq)
    scores = (qf @ kf.transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    bias = None if mask is None else torch.zeros(sq, sk, device=q.device).masked_fill(~mask, float("-inf"))
    out = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, attn_mask=bias, scale=scale)
    return out.nan_to_num(0.0).transpose(1, 2), lse


def rel_l2(got, want):
    return ((got.float() - want).norm() / want.norm().clamp_min(1e-30)).item()


def check(q, k, v, causal, scale=None):
    out, lse = warpattn.flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, return_lse=True)
    want, want_lse = reference(q, k, v, causal, scale)
    assert not out.isnan().any()
    err = rel_l2(out, want)
    assert err <= TOL[q.dtype], err
    finite = want_lse.isfinite()
    assert torch.equal(finite, lse.isfinite())  # -inf exactly where a row sees no key
    if finite.any():
        assert (lse[finite] - want_lse[finite]).abs().max().item() <= 1e-4
    # Without return_lse an eager call allocates no lse (torch_op.flash_attn_torch): the same bound.
    alone = warpattn.flash_attn_func(q, k, v, softmax_scale=scale, causal=causal)
    assert not alone.isnan().any() and rel_l2(alone, want) <= TOL[q.dtype], rel_l2(alone, want)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads_kv", [8, 2, 1])
@pytest.mark.parametrize("sq,sk", [(1, 1), (17, 17), (1000, 1000), (300, 777), (777, 300)])
def test_against_sdpa(dtype, d, causal, heads_kv, sq, sk):
    q = torch.randn(2, sq, 8, d, device="cuda", dtype=dtype)
    k = torch.randn(2, sk, heads_kv, d, device="cuda", dtype=dtype)
    v = torch.randn(2, sk, heads_kv, d, device="cuda", dtype=dtype)
    check(q, k, v, causal)


@pytest.mark.gpu
def test_non_contiguous_views_of_a_packed_qkv():
    qkv = torch.randn(2, 513, 3, 4, 128, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    assert not q.is_contiguous()
    check(q, k, v, causal=True, scale=0.1)


@pytest.mark.gpu
def test_out_argument_and_side_stream():
    q, k, v = (torch.randn(1, 1024, 4, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    out = torch.full_like(q, float("nan"))
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        result = warpattn.flash_attn_func(q, k, v, out=out)
    side.synchronize()
    assert result is out
    assert rel_l2(out, reference(q, k, v, False)[0]) <= 1e-3


@pytest.mark.gpu
def test_torch_compile():
    q, k, v = (torch.randn(2, 512, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    fn = torch.compile(lambda a, b, c: warpattn.flash_attn_func(a, b, c, causal=True) * 2, fullgraph=True)
    torch.testing.assert_close(fn(q, k, v), warpattn.flash_attn_func(q, k, v, causal=True) * 2, rtol=0, atol=0)


@pytest.mark.gpu
def test_cuda_graph_capture():
    q, k, v = (torch.randn(2, 700, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    warpattn.flash_attn_func(q, k, v)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = warpattn.flash_attn_func(q, k, v)
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    assert rel_l2(out, reference(q, k, v, False)[0]) <= 5e-3


@pytest.mark.gpu
def test_eager_calls_skip_the_dispatcher_and_give_the_ops_bits(monkeypatch):
    # Eager calls on plain CUDA tensors run the ops' bodies directly (torch_op._call: the
    # dispatcher's host cost); under the profiler they go through the op. The bits are the same.
    from torch.profiler import ProfilerActivity, profile
    from warpattn import torch_op
    q, k, v = (torch.randn(1, 300, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    bodies = []
    key = id(torch_op.flash_attn_forward)
    body = torch_op._BODIES[key]
    monkeypatch.setitem(torch_op._BODIES, key, lambda *a: bodies.append(1) or body(*a))
    # Neither a gradient nor lse wanted: not even the body (the binding, into a new out, no lse).
    direct = warpattn.flash_attn_func(q, k, v, causal=True)
    assert bodies == []
    with_lse, lse = warpattn.flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert bodies == [1] and torch.isfinite(lse).all()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        through_op = warpattn.flash_attn_func(q, k, v, causal=True, return_lse=True)[0]
    assert bodies == [1] and any("warpattn::flash_attn_forward" in e.key for e in prof.key_averages())
    assert torch.equal(direct, through_op) and torch.equal(with_lse, through_op)
    qg = q.clone().requires_grad_()
    warpattn.flash_attn_func(qg, k, v).sum().backward()  # the autograd.Function's forward: directly
    assert bodies == [1, 1] and qg.grad is not None and torch.isfinite(qg.grad).all()


@pytest.mark.gpu
def test_argument_errors_on_cuda_tensors():
    q, k, v = (torch.randn(1, 128, 4, 100, device="cuda", dtype=torch.float16) for _ in range(3))
    with pytest.raises(ValueError, match="must be a multiple of 8 from 8 to 512, got 100"):
        warpattn.flash_attn_func(q, k, v)
    with pytest.raises(TypeError, match="CUDA tensor required"):
        q, k, v = (torch.randn(1, 128, 4, 64, dtype=torch.float16) for _ in range(3))
        warpattn.flash_attn_func(q, k, v)


@pytest.mark.gpu
def test_cupy_inputs():
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
    q, k, v = (torch.randn(2, 333, 4, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    cq, ck, cv = (cupy.from_dlpack(t) for t in (q, k, v))
    out = warpattn.flash_attn_func(cq, ck, cv, causal=True)
    assert isinstance(out, cupy.ndarray)
    cupy.cuda.get_current_stream().synchronize()
    assert rel_l2(torch.from_dlpack(out), reference(q, k, v, True)[0]) <= 1e-3


@pytest.mark.gpu
def test_jax_inputs():
    jax = pytest.importorskip("jax", reason="JAX is not installed")
    if not any(dev.platform == "gpu" for dev in jax.devices()):
        pytest.skip("JAX sees no GPU")
    q, k, v = (torch.randn(1, 256, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    torch.cuda.synchronize()
    jq, jk, jv = (jax.dlpack.from_dlpack(t) for t in (q, k, v))
    out = warpattn.flash_attn_func(jq, jk, jv)
    assert isinstance(out, jax.Array)
    assert rel_l2(torch.from_dlpack(out), reference(q, k, v, False)[0]) <= 5e-3


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_fp8_against_sdpa(d, causal, out_dtype):
    torch.manual_seed(d + causal)
    q, k, v = (torch.randn(2, 300, 4, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ops = warpattn.quantize_fp8(q, k, v)
    assert ops.q.dtype == torch.float8_e4m3fn and ops.vt.shape == (2, 4, d, 304)
    out, lse = warpattn.flash_attn_fp8_func(ops, causal=causal, out_dtype=out_dtype, return_lse=True)
    want, want_lse = reference(q, k, v, causal)
    assert out.dtype == out_dtype and not out.isnan().any()
    # E4M3 operands and P: a few percent (run 21: 1.3-2.6e-2 against the dequantised operands)
    assert rel_l2(out, want) < 6e-2
    # LSE carries Q and K's E4M3 rounding undiluted where a causal row sees few keys (run 22:
    # up to 0.08 at row 0); a wrong scale or layout would be off by O(1).
    assert (lse - want_lse).abs().max().item() < 0.2


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_fp8_int8_qk_against_sdpa(d, causal):
    torch.manual_seed(100 + d + causal)
    q, k, v = (torch.randn(2, 300, 4, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ops = warpattn.quantize_fp8(q, k, v, qk_dtype=torch.int8)
    assert ops.q.dtype == torch.int8 and ops.k.dtype == torch.int8 and ops.vt.dtype == torch.float8_e4m3fn
    assert ops.q.abs().max().item() <= 127
    out, lse = warpattn.flash_attn_fp8_func(ops, causal=causal, return_lse=True)
    want, want_lse = reference(q, k, v, causal)
    assert not out.isnan().any()
    e8 = rel_l2(out, want)
    e4 = rel_l2(warpattn.flash_attn_fp8_func(warpattn.quantize_fp8(q, k, v), causal=causal), want)
    # INT8 scores after the rotation carry less error than E4M3's; what is left is V and P.
    assert e8 < 6e-2 and e8 < e4
    assert (lse - want_lse).abs().max().item() < 0.2


@pytest.mark.gpu
@pytest.mark.parametrize("qk_dtype", ["e4m3", "int8"])
def test_fp8_cupy_inputs(qk_dtype):
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
    torch.manual_seed(7)
    q, k, v = (torch.randn(2, 300, 4, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    cq, ck, cv = (cupy.from_dlpack(t) for t in (q, k, v))
    ops = warpattn.quantize_fp8(cq, ck, cv, qk_dtype=qk_dtype)
    assert isinstance(ops.q, cupy.ndarray) and str(ops.q.dtype) == ("int8" if qk_dtype == "int8" else "uint8")
    assert str(ops.vt.dtype) == "uint8" and ops.vt.shape == (2, 4, 128, 304)
    out, lse = warpattn.flash_attn_fp8_func(ops, causal=True, out_dtype="float16", return_lse=True)
    assert isinstance(out, cupy.ndarray) and str(out.dtype) == "float16"
    cupy.cuda.get_current_stream().synchronize()
    want, want_lse = reference(q, k, v, True)
    assert rel_l2(torch.from_dlpack(out), want) < 6e-2
    assert (torch.from_dlpack(lse) - want_lse).abs().max().item() < 0.2
    # the same bytes through PyTorch give the same output
    tops = warpattn.quantize_fp8(q, k, v, qk_dtype=qk_dtype)
    assert torch.equal(torch.from_dlpack(ops.vt), tops.vt.view(torch.uint8))
    with pytest.raises(ValueError, match="CuPy has no bfloat16"):
        warpattn.flash_attn_fp8_func(ops)


@pytest.mark.gpu
@pytest.mark.parametrize("qk_dtype", ["e4m3", "int8"])
def test_fp8_jax_inputs(qk_dtype):
    jax = pytest.importorskip("jax", reason="JAX is not installed")
    if not any(dev.platform == "gpu" for dev in jax.devices()):
        pytest.skip("JAX sees no GPU")
    torch.manual_seed(8)
    q, k, v = (torch.randn(1, 256, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    torch.cuda.synchronize()
    jq, jk, jv = (jax.dlpack.from_dlpack(t) for t in (q, k, v))
    ops = warpattn.quantize_fp8(jq, jk, jv, qk_dtype=qk_dtype)
    assert isinstance(ops.q, jax.Array) and str(ops.vt.dtype) == "float8_e4m3fn"
    assert str(ops.q.dtype) == ("int8" if qk_dtype == "int8" else "float8_e4m3fn")
    out, lse = warpattn.flash_attn_fp8_func(ops, return_lse=True)
    assert isinstance(out, jax.Array) and str(out.dtype) == "bfloat16"
    want, want_lse = reference(q, k, v, False)
    assert rel_l2(torch.from_dlpack(out), want) < 6e-2
    assert (torch.from_dlpack(lse) - want_lse).abs().max().item() < 0.2


@pytest.mark.gpu
def test_fp8_errors():
    q = torch.randn(1, 128, 2, 128, device="cuda", dtype=torch.bfloat16)
    ops = warpattn.quantize_fp8(q, q, q)
    with pytest.raises(ValueError, match="q: head_dim"):
        x = torch.randn(1, 128, 2, 96, device="cuda", dtype=torch.bfloat16)
        warpattn.quantize_fp8(x, x, x)
    bad = ops._replace(k_descale=ops.k_descale.clone().fill_(0.0))
    with pytest.raises(ValueError, match="k_descale: every descale must be finite and > 0"):
        warpattn.flash_attn_fp8_func(bad)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        warpattn.flash_attn_fp8_func(ops._replace(q=ops.q.view(torch.uint8)))
    with pytest.raises(TypeError, match="qk_dtype"):
        warpattn.quantize_fp8(q, q, q, qk_dtype=torch.uint8)
    # INT8 Q with E4M3 K: refused by the library before any launch
    ops8 = warpattn.quantize_fp8(q, q, q, qk_dtype=torch.int8)
    with pytest.raises(ValueError, match="k: expected dtype int8"):
        warpattn.flash_attn_fp8_func(ops8._replace(k=ops.k))


@pytest.mark.gpu
def test_fp8_descales_on_the_host_are_refused():
    q = torch.randn(1, 128, 2, 128, device="cuda", dtype=torch.bfloat16)
    ops = warpattn.quantize_fp8(q, q, q)
    for check in (True, False):  # unchecked descales are read by the kernel itself: never from the host
        with pytest.raises(TypeError, match="k_descale: CUDA tensor required"):
            warpattn.flash_attn_fp8_func(ops._replace(k_descale=ops.k_descale.cpu()), check_descales=check)


# ---------------------------------------------------------------- backward

# A sanity bound on each gradient's relative L2 error against fp64; the bar is cuDNN's error
# (test_gradients_against_cudnn).
GRAD_TOL = {torch.bfloat16: 3e-2, torch.float16: 5e-3}
GRAD_NAMES = ("dq", "dk", "dv")


def reference_grads(q, k, v, dout, causal, scale=None):
    """dq, dk, dv in fp64 through the math SDPA, in (B, S, H, D) layout: GQA by repeating k and v
    (autograd sums their gradients over each group), the causal mask aligned bottom-right by an
    explicit mask (SDPA's is_causal is top-left). A row that sees no key is warpattn's zero row,
    which passes no gradient on: here it sees every key and gets no output gradient, to the same
    effect without SDPA's NaN."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    group = q.shape[2] // k.shape[2]
    qh = leaves[0].transpose(1, 2)
    kh, vh = (t.repeat_interleave(group, 2).transpose(1, 2) for t in leaves[1:])
    sq, sk = q.shape[1], k.shape[1]
    mask, dout = None, dout.double()
    if causal:
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(diagonal=sk - sq)
        blind = ~mask.any(1)
        mask[blind] = True
        dout = dout.masked_fill(blind[None, :, None, None], 0.0)
    with sdpa_kernel(SDPBackend.MATH):
        out = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
    out.transpose(1, 2).backward(dout)
    return tuple(t.grad for t in leaves)


def warpattn_grads(q, k, v, dout, causal, scale=None, deterministic=False):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = warpattn.flash_attn_func(*leaves, softmax_scale=scale, causal=causal, deterministic=deterministic)
    out.backward(dout)
    return tuple(t.grad for t in leaves)


def sdpa_grads(q, k, v, dout, causal, scale=None):
    """(backend, (dq, dk, dv)) from SDPA's cuDNN backward on the same inputs, else from its FLASH
    one; (the reasons, None) where neither takes the shape or both give non-finite gradients."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right
    sq, sk = q.shape[1], k.shape[1]
    # Bottom-right causal: is_causal where it is the same as SDPA's top-left (square), else
    # SDPA's own lower-right bias.
    mask = causal_lower_right(sq, sk) if causal and sq != sk else None
    reasons = []
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        try:
            with sdpa_kernel(backend):
                out = torch.nn.functional.scaled_dot_product_attention(
                    *(t.transpose(1, 2) for t in leaves), attn_mask=mask, is_causal=causal and mask is None,
                    scale=scale, enable_gqa=q.shape[2] != k.shape[2])
                out.transpose(1, 2).backward(dout)
        except RuntimeError as e:
            reasons.append("%s: %s" % (backend.name, str(e).strip().splitlines()[0]))
            continue
        grads = tuple(t.grad for t in leaves)
        if all(g.isfinite().all() for g in grads):
            return backend.name, grads
        reasons.append("%s: non-finite gradients" % backend.name)
    return "; ".join(reasons), None


BACKWARD_SHAPES = [(17, 17), (300, 777), (777, 300), (1024, 1024)]


def captured(step):
    """A CUDA graph of step() (which clears the gradients it makes), after one warm-up call on a
    side stream, as PyTorch asks before a capture; and what the captured call returned."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = step()
    return graph, result


def backward_case(dtype, d, causal, heads_kv, sq, sk):
    """Inputs (q, k, v, dout) of one case, the same on every run of it."""
    torch.manual_seed(zlib.crc32(repr((dtype, d, causal, heads_kv, sq, sk)).encode()))
    q = torch.randn(2, sq, 8, d, device="cuda", dtype=dtype)
    k = torch.randn(2, sk, heads_kv, d, device="cuda", dtype=dtype)
    v = torch.randn(2, sk, heads_kv, d, device="cuda", dtype=dtype)
    return q, k, v, torch.randn_like(q)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads_kv", [8, 2])
@pytest.mark.parametrize("sq,sk", BACKWARD_SHAPES)
def test_gradients_against_fp64(dtype, d, causal, heads_kv, sq, sk):
    q, k, v, dout = backward_case(dtype, d, causal, heads_kv, sq, sk)
    got = warpattn_grads(q, k, v, dout, causal)
    for name, g, t, want in zip(GRAD_NAMES, got, (q, k, v), reference_grads(q, k, v, dout, causal)):
        assert g.shape == t.shape and g.dtype == dtype and not g.isnan().any(), name
        assert rel_l2(g, want) <= GRAD_TOL[dtype], (name, rel_l2(g, want))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads_kv", [8, 2])
@pytest.mark.parametrize("sq,sk", BACKWARD_SHAPES)
def test_gradients_against_cudnn(dtype, d, causal, heads_kv, sq, sk):
    """Issue 14's bar: each gradient's relative L2 error against fp64 at most 1.25x that of
    cuDNN's backward on the same inputs (FlashAttention-2's where cuDNN refuses the shape)."""
    q, k, v, dout = backward_case(dtype, d, causal, heads_kv, sq, sk)
    backend, theirs = sdpa_grads(q, k, v, dout, causal)
    if theirs is None:
        pytest.skip("no SDPA backward to compare with: " + backend)
    ours = warpattn_grads(q, k, v, dout, causal)
    errors = {}
    for name, g, t, want in zip(GRAD_NAMES, ours, theirs, reference_grads(q, k, v, dout, causal)):
        errors[name] = (rel_l2(g, want), rel_l2(t, want))
    print(backend, errors)
    for name, (e_ours, e_theirs) in errors.items():
        assert e_ours <= 1.25 * e_theirs, (name, backend, errors)


@pytest.mark.gpu
def test_gradients_of_strided_views_and_a_scale():
    qkv = torch.randn(2, 513, 3, 4, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dout = torch.randn(2, 513, 4, 128, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    assert not q.is_contiguous()
    warpattn.flash_attn_func(q, k, v, softmax_scale=0.1, causal=True).backward(dout)
    for name, got, want in zip(GRAD_NAMES, qkv.grad.unbind(2), reference_grads(q, k, v, dout, True, scale=0.1)):
        assert rel_l2(got, want) <= GRAD_TOL[torch.bfloat16], (name, rel_l2(got, want))


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_deterministic_backward_is_bitwise_repeatable(d, causal):
    # Many key blocks add into every dq row, and four query heads into every dk, dv row.
    q, k, v, dout = backward_case(torch.bfloat16, d, causal, 2, 2048, 2048)
    first = warpattn_grads(q, k, v, dout, causal, deterministic=True)
    second = warpattn_grads(q, k, v, dout, causal, deterministic=True)
    for name, a, b in zip(GRAD_NAMES, first, second):
        assert torch.equal(a, b), name
    for name, g, want in zip(GRAD_NAMES, first, reference_grads(q, k, v, dout, causal)):
        assert rel_l2(g, want) <= GRAD_TOL[torch.bfloat16], name


@pytest.mark.gpu
def test_torch_compile_backward():
    q, k, v, _ = backward_case(torch.bfloat16, 128, True, 2, 512, 512)
    weights = torch.randn(q.shape, device="cuda")

    def loss(q, k, v):
        return (warpattn.flash_attn_func(q, k, v, causal=True, deterministic=True).float() * weights).sum()

    def grads(fn):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        fn(*leaves).backward()
        return [t.grad for t in leaves]
    compiled = grads(torch.compile(loss, fullgraph=True))
    for name, got, want in zip(GRAD_NAMES, compiled, grads(loss)):
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=name)


@pytest.mark.gpu
def test_cuda_graph_capture_of_forward_and_backward():
    q, k, v, dout = backward_case(torch.bfloat16, 64, True, 2, 700, 900)
    for t in (q, k, v):
        t.requires_grad_()

    def step():
        for t in (q, k, v):
            t.grad = None
        out = warpattn.flash_attn_func(q, k, v, causal=True, deterministic=True)
        out.backward(dout)
        return out

    graph, out = captured(step)
    with torch.no_grad():  # new data into the captured inputs
        for t in (q, k, v, dout):
            t.copy_(torch.randn_like(t))
    graph.replay()
    torch.cuda.synchronize()
    want = warpattn_grads(q, k, v, dout, True, deterministic=True)
    for name, got, expected in zip(GRAD_NAMES, (q.grad, k.grad, v.grad), want):
        assert torch.equal(got, expected), name
    assert rel_l2(out, reference(q, k, v, True)[0]) <= TOL[torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128, 256])
def test_tail_split_under_cuda_graph_replay(monkeypatch, d):
    """The backward's tail split (WARPATTN_BWD_TAIL_SPLIT forces it at a small shape: the last
    tiles' query steps cut into parts whose partial dK and dV the last part adds up) captured in
    a CUDA graph and replayed twice with new data: its counters are zeroed again on each replay
    (by the row terms kernel) and its scratch outlives the capture."""
    monkeypatch.setenv("WARPATTN_BWD_TAIL_SPLIT", "5,3")
    q, k, v, dout = backward_case(torch.bfloat16, d, False, 2, 700, 900)
    for t in (q, k, v):
        t.requires_grad_()

    def step():
        for t in (q, k, v):
            t.grad = None
        warpattn.flash_attn_func(q, k, v).backward(dout)

    graph, _ = captured(step)
    for _ in range(2):
        with torch.no_grad():
            for t in (q, k, v, dout):
                t.copy_(torch.randn_like(t))
        graph.replay()
        torch.cuda.synchronize()
        for name, g, want in zip(GRAD_NAMES, (q.grad, k.grad, v.grad), reference_grads(q, k, v, dout, False)):
            assert not g.isnan().any() and rel_l2(g, want) <= GRAD_TOL[torch.bfloat16], (name, rel_l2(g, want))


@pytest.mark.gpu
def test_gradient_of_lse_is_refused_unless_zero():
    q, k, v, _ = backward_case(torch.bfloat16, 64, False, 2, 256, 256)
    for t in (q, k, v):
        t.requires_grad_()
    out, lse = warpattn.flash_attn_func(q, k, v, return_lse=True)
    out.float().sum().backward()  # lse unused: no gradient reaches it
    out, lse = warpattn.flash_attn_func(q, k, v, return_lse=True)
    (out.float().sum() + 0 * lse.sum()).backward()  # a zero gradient: nothing dropped
    out, lse = warpattn.flash_attn_func(q, k, v, return_lse=True)
    with pytest.raises(NotImplementedError, match="gradient of lse"):
        (out.float().sum() + lse.sum()).backward()
    out, lse = warpattn.flash_attn_func(q, k, v, return_lse=True)
    (out.float().sum() + lse.detach().sum()).backward()


@pytest.mark.gpu
def test_backward_errors():
    q = torch.randn(1, 128, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(RuntimeError, match="not differentiable"):
        warpattn.flash_attn_func(q, q, q, out=torch.empty_like(q))


@pytest.mark.gpu
def test_cupy_backward():
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
    q, k, v, dout = backward_case(torch.float16, 128, True, 2, 333, 400)
    cq, ck, cv, cdout = (cupy.from_dlpack(t) for t in (q, k, v, dout))
    out, lse = warpattn.flash_attn_func(cq, ck, cv, causal=True, return_lse=True)
    dq, dk, dv = warpattn.flash_attn_backward(cdout, cq, ck, cv, out, lse, causal=True)
    assert isinstance(dq, cupy.ndarray) and dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    given = tuple(cupy.full(t.shape, cupy.nan, dtype=t.dtype) for t in (cq, ck, cv))
    written = warpattn.flash_attn_backward(cdout, cq, ck, cv, out, lse, causal=True, deterministic=True,
                                           dq=given[0], dk=given[1], dv=given[2])
    assert all(a is b for a, b in zip(written, given))
    cupy.cuda.get_current_stream().synchronize()
    for name, got, again, want in zip(GRAD_NAMES, (dq, dk, dv), written, reference_grads(q, k, v, dout, True)):
        assert rel_l2(torch.from_dlpack(got), want) <= GRAD_TOL[torch.float16], name
        assert rel_l2(torch.from_dlpack(again), want) <= GRAD_TOL[torch.float16], name


@pytest.mark.gpu
def test_jax_custom_vjp():
    jax = pytest.importorskip("jax", reason="JAX is not installed")
    if not any(dev.platform == "gpu" for dev in jax.devices()):
        pytest.skip("JAX sees no GPU")
    import jax.numpy as jnp
    q, k, v, dout = backward_case(torch.bfloat16, 64, True, 2, 256, 300)
    torch.cuda.synchronize()
    jq, jk, jv, jdout = (jax.dlpack.from_dlpack(t) for t in (q, k, v, dout))

    def loss(q, k, v):
        out = warpattn.jax_flash_attn(q, k, v, causal=True, deterministic=True)
        return (out.astype(jnp.float32) * jdout.astype(jnp.float32)).sum()  # d loss / d out = dout
    out = warpattn.jax_flash_attn(jq, jk, jv, causal=True)
    assert isinstance(out, jax.Array) and rel_l2(torch.from_dlpack(out), reference(q, k, v, True)[0]) <= 5e-3
    grads = jax.grad(loss, argnums=(0, 1, 2))(jq, jk, jv)
    for name, got, t, want in zip(GRAD_NAMES, grads, (q, k, v), reference_grads(q, k, v, dout, True)):
        assert isinstance(got, jax.Array) and got.shape == t.shape and str(got.dtype) == "bfloat16", name
        assert rel_l2(torch.from_dlpack(got), want) <= GRAD_TOL[torch.bfloat16], name
    from warpattn import jax_ffi
    if jax_ffi.available():  # the FFI path: under jax.jit too, the same bits (deterministic)
        jitted = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(jq, jk, jv)
        for name, got, want in zip(GRAD_NAMES, jitted, grads):
            assert torch.equal(torch.from_dlpack(got), torch.from_dlpack(want)), name
    else:  # the DLPack path reads concrete arrays only
        with pytest.raises(TypeError, match="jax.jit"):
            jax.jit(jax.grad(loss))(jq, jk, jv)


# ---------------------------------------------------- window_size, softcap and sinks (issue 19)

# Each case's options; sinks=True: one logit per query head, from -2 (a sink the keys outweigh)
# to 8 (one that outweighs them), so that the denominator's sink term matters in most heads.
MODEL_CASES = {
    "window": dict(window_size=(128, 64)),
    "window_of_one_key": dict(window_size=(0, 0)),
    "window_left_only": dict(window_size=(300, -1)),
    "window_right_only": dict(window_size=(-1, 50)),
    "causal_window": dict(causal=True, window_size=(200, 0)),
    "softcap": dict(softcap=2.0),
    "sinks": dict(sinks=True),
    "causal_all_three": dict(causal=True, window_size=(96, -1), softcap=30.0, sinks=True),
    "all_three_and_a_scale": dict(window_size=(50, 300), softcap=5.0, sinks=True, softmax_scale=0.2),
}
MODEL_SHAPES = [(1000, 1000), (300, 777), (777, 300), (1, 1000)]


def head_sinks(heads, device="cuda"):
    return torch.linspace(-2.0, 8.0, heads, device=device, dtype=torch.float32)


def model_options(case, heads):
    """The case's keyword arguments, its sinks made (heads,) float32 on the GPU."""
    options = dict(MODEL_CASES[case])
    if options.pop("sinks", False):
        options["sinks"] = head_sinks(heads)
    return options


def check_against_fp64(q, k, v, reference, out, lse, options):
    """out and lse of a call with these options against the float64 reference: rel L2 within the
    forward's bound (TOL), lse within 1e-4 where finite and -inf exactly where the reference's is
    (rows with no key and no sink), out exactly 0 on rows that see no key."""
    sinks = options.get("sinks")
    want, want_lse, seen = reference(*(t.double().cpu().numpy() for t in (q, k, v)), options.get("causal", False),
                                     options.get("window_size", (-1, -1)), options.get("softcap", 0.0),
                                     None if sinks is None else sinks.cpu().numpy(), options.get("softmax_scale"))
    want, want_lse, seen = torch.from_numpy(want), torch.from_numpy(want_lse), torch.from_numpy(seen)
    out, lse = out.cpu(), lse.cpu()
    assert not out.isnan().any() and not lse.isnan().any()
    err = rel_l2(out, want)
    assert err <= TOL[q.dtype], err
    finite = want_lse.isfinite()
    assert torch.equal(finite, lse.isfinite())  # -inf exactly where a row sees neither key nor sink
    if finite.any():
        assert (lse.double()[finite] - want_lse[finite]).abs().max().item() <= 1e-4
    assert torch.all(out[:, ~seen] == 0)  # no key seen: 0 (and lse the sink, checked above)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("case", sorted(MODEL_CASES))
@pytest.mark.parametrize("sq,sk", MODEL_SHAPES)
def test_model_options_against_fp64(dtype, d, case, sq, sk, attention_reference):
    # GQA 8/2 in most cases, MHA and MQA in one each; Sq != Sk both ways leaves rows with no key
    # in a window (and under causal).
    heads_kv = {"window": 8, "softcap": 1}.get(case, 2)
    torch.manual_seed(zlib.crc32(repr((dtype, d, case, sq, sk)).encode()))
    q = torch.randn(2, sq, 8, d, device="cuda", dtype=dtype)
    k = torch.randn(2, sk, heads_kv, d, device="cuda", dtype=dtype)
    v = torch.randn(2, sk, heads_kv, d, device="cuda", dtype=dtype)
    options = model_options(case, 8)
    out, lse = warpattn.flash_attn_func(q, k, v, return_lse=True, **options)
    check_against_fp64(q, k, v, attention_reference, out, lse, options)


@pytest.mark.gpu
def test_model_options_strided_views_and_the_out_argument(attention_reference):
    # Views of a packed qkv, sinks a strided view, out given and written on a side stream.
    qkv = torch.randn(2, 513, 3, 4, 128, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    sinks = torch.randn(8, device="cuda")[::2]
    options = dict(causal=True, window_size=(77, 0), softcap=10.0, sinks=sinks)
    out = torch.full_like(q, float("nan"))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        result, lse = warpattn.flash_attn_func(q, k, v, out=out, return_lse=True, **options)
    side.synchronize()
    assert result is out
    check_against_fp64(q, k, v, attention_reference, out, lse, options)


@pytest.mark.gpu
def test_model_options_torch_compile_fullgraph():
    q, k, v = (torch.randn(2, 1000, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    sinks = head_sinks(8)

    def fn(q, k, v, sinks):
        return warpattn.flash_attn_func(q, k, v, causal=True, window_size=(256, 0), softcap=30.0, sinks=sinks) * 2
    compiled = torch.compile(fn, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, sinks), fn(q, k, v, sinks), rtol=0, atol=0)
    # Inputs that require grad: the forward compiles with its backward (the gradients are held
    # against eager ones in test_model_options_gradients_deterministic_compiled_and_explicit).
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    torch.testing.assert_close(compiled(*leaves, sinks).detach(), fn(q, k, v, sinks), rtol=0, atol=0)


@pytest.mark.gpu
def test_model_options_cuda_graph_capture(attention_reference):
    q, k, v = (torch.randn(2, 700, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    sinks = head_sinks(8)
    options = dict(window_size=(100, 100), softcap=3.0, sinks=sinks)
    warpattn.flash_attn_func(q, k, v, **options)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = warpattn.flash_attn_func(q, k, v, return_lse=True, **options)
    q.copy_(torch.randn_like(q))
    sinks.copy_(head_sinks(8).flip(0))  # the sinks are read at replay too
    graph.replay()
    torch.cuda.synchronize()
    check_against_fp64(q, k, v, attention_reference, out, lse, options)


# ------------------------------------------- gradients through window_size, softcap and sinks

# dsinks' bound, per head: 1e-2 of the sum of its terms' magnitudes, sum_i exp(sink - lse_i) |D_i|
# (D_i = rowsum(dout_i * out_i)), plus 1e-6 for heads whose sink the keys outweigh to nothing. The
# kernel forms D_i from the 16-bit out (rounded at 2^-9, bf16, relative to each product) and the
# forward's own error (TOL, 5e-3 at most in rel L2): each term is off by well under 1e-2 of its
# magnitude, while a bound relative to dsinks itself would fail where the terms cancel.
DSINKS_TOL = 1e-2



def model_grads(q, k, v, dout, options, deterministic=False, fn=None):
    """dq, dk, dv and the sinks' gradient (None without sinks) through autograd, the sinks a leaf
    that requires grad (learned sinks, as gpt-oss's). fn: the loss function to use (torch.compile'd
    or not) taking (q, k, v, sinks), default flash_attn_func's out against dout."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    sinks = options.get("sinks")
    sinks = None if sinks is None else sinks.detach().clone().requires_grad_()
    rest = {name: value for name, value in options.items() if name != "sinks"}
    if fn is None:
        def fn(q, k, v, sinks):
            out = warpattn.flash_attn_func(q, k, v, sinks=sinks, deterministic=deterministic, **rest)
            return (out.float() * dout.float()).sum()
    fn(*leaves, sinks).backward()
    return tuple(t.grad for t in leaves) + (None if sinks is None else sinks.grad,)


def check_model_grads(q, k, v, dout, options, reference_grads):
    """The gradients against the float64 reference (softcap at head dims 64 and below included:
    the 128 kernel runs it there)."""
    check_grads_against_fp64(q, k, v, dout, options, model_grads(q, k, v, dout, options), reference_grads)


def check_grads_against_fp64(q, k, v, dout, options, got, reference_grads):
    """got = (dq, dk, dv, dsinks) against the float64 reference: dq, dk, dv within the backward's
    bound (GRAD_TOL, rel L2, as test_gradients_against_fp64), dsinks within DSINKS_TOL per head."""
    sinks = options.get("sinks")
    want = reference_grads(*(t.double().cpu().numpy() for t in (q, k, v, dout)), options.get("causal", False),
                           options.get("window_size", (-1, -1)), options.get("softcap", 0.0),
                           None if sinks is None else sinks.detach().cpu().numpy(), options.get("softmax_scale"))
    for name, g, t in zip(GRAD_NAMES, got, (q, k, v)):
        assert g.shape == t.shape and g.dtype == t.dtype and not g.isnan().any(), name
        w = torch.from_numpy(want[name])
        if w.norm() <= 1e-9 * torch.from_numpy(want["dv"]).norm():
            # Zero in exact arithmetic (a window of one key: each row's softmax is the constant 1,
            # so dS = 0 and dq = dk = 0), the reference's 1e-17 no scale to be relative to (run
            # 117: 4e25 "relative"). The kernel's dS is rounding noise there: held on dv's scale.
            err = g.cpu().double().norm().item() / torch.from_numpy(want["dv"]).norm().item()
        else:
            err = rel_l2(g.cpu(), w)
        assert err <= GRAD_TOL[q.dtype], (name, err)
    if sinks is None:
        assert got[3] is None
        return
    dsinks = got[3].detach().cpu().double()
    assert got[3].shape == sinks.shape and got[3].dtype == torch.float32
    bound = DSINKS_TOL * torch.from_numpy(want["sink_terms"]) + 1e-6
    err = (dsinks - torch.from_numpy(want["dsinks"])).abs()
    assert torch.all(err <= bound), (err / bound).max().item()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("case", sorted(MODEL_CASES))
@pytest.mark.parametrize("sq,sk", [(300, 777), (777, 300)])
def test_model_options_gradients_against_fp64(dtype, d, case, sq, sk, attention_reference_grads):
    # dq, dk, dv and the sinks' gradient of every MODEL_CASES case against the float64 reference;
    # softcap at head_dim 64 (no backward kernel yet) is the library's ValueError when the backward
    # runs, after a forward that ran.
    heads_kv = {"window": 8, "softcap": 1}.get(case, 2)
    torch.manual_seed(zlib.crc32(repr(("grad", dtype, d, case, sq, sk)).encode()))
    q = torch.randn(2, sq, 8, d, device="cuda", dtype=dtype)
    k = torch.randn(2, sk, heads_kv, d, device="cuda", dtype=dtype)
    v = torch.randn(2, sk, heads_kv, d, device="cuda", dtype=dtype)
    dout = torch.randn_like(q)
    options = model_options(case, 8)
    check_model_grads(q, k, v, dout, options, attention_reference_grads)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [128, 256, 512])
def test_model_options_gradients_deterministic_compiled_and_explicit(d, attention_reference_grads):
    # The deterministic backward with all three: the same bits on every run (dsinks included),
    # under torch.compile(fullgraph) as eagerly, and from warpattn.flash_attn_backward (which
    # returns dsinks fourth); within the float64 bounds.
    torch.manual_seed(d)
    q = torch.randn(2, 700, 8, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 900, 2, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    dout = torch.randn_like(q)
    options = dict(causal=True, window_size=(200, 0), softcap=30.0, sinks=head_sinks(8))
    first = model_grads(q, k, v, dout, options, deterministic=True)
    second = model_grads(q, k, v, dout, options, deterministic=True)
    for name, a, b in zip(GRAD_NAMES + ("dsinks",), first, second):
        assert torch.equal(a, b), name
    check_grads_against_fp64(q, k, v, dout, options, first, attention_reference_grads)
    rest = {name: value for name, value in options.items() if name != "sinks"}

    def loss(q, k, v, sinks):
        return (warpattn.flash_attn_func(q, k, v, sinks=sinks, deterministic=True, **rest).float() * dout).sum()
    compiled = model_grads(q, k, v, dout, options, fn=torch.compile(loss, fullgraph=True))
    for name, a, b in zip(GRAD_NAMES + ("dsinks",), compiled, first):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    out, lse = warpattn.flash_attn_func(q, k, v, return_lse=True, **options)
    explicit = warpattn.flash_attn_backward(dout, q, k, v, out, lse, deterministic=True, **options)
    assert len(explicit) == 4
    for name, a, b in zip(GRAD_NAMES + ("dsinks",), explicit, first):
        assert torch.equal(a, b), name
    assert len(warpattn.flash_attn_backward(dout, q, k, v, out, lse, causal=True, window_size=(200, 0))) == 3


@pytest.mark.gpu
def test_model_options_cuda_graph_capture_of_forward_and_backward():
    # Forward and backward with a window, softcap and learned sinks captured in a CUDA graph (no
    # host synchronisation anywhere: the workspace is PyTorch's), replayed on new data: the bits
    # of the eager deterministic call.
    q, k, v, dout = backward_case(torch.bfloat16, 128, True, 2, 700, 900)
    sinks = head_sinks(8)
    for t in (q, k, v, sinks):
        t.requires_grad_()
    options = dict(causal=True, window_size=(128, 0), softcap=20.0)

    def step():
        for t in (q, k, v, sinks):
            t.grad = None
        out = warpattn.flash_attn_func(q, k, v, sinks=sinks, deterministic=True, **options)
        out.backward(dout)
        return out

    graph, _ = captured(step)
    with torch.no_grad():
        for t in (q, k, v, dout):
            t.copy_(torch.randn_like(t))
        sinks.copy_(head_sinks(8).flip(0))
    graph.replay()
    torch.cuda.synchronize()
    want = model_grads(q, k, v, dout, dict(options, sinks=sinks), deterministic=True)
    for name, got, expected in zip(GRAD_NAMES + ("dsinks",), (q.grad, k.grad, v.grad, sinks.grad), want):
        assert torch.equal(got, expected), name


@pytest.mark.gpu
def test_model_options_argument_errors_on_cuda_tensors():
    q, k, v = (torch.randn(1, 128, 4, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    with pytest.raises(TypeError, match="sinks: CUDA tensor required"):
        warpattn.flash_attn_func(q, k, v, sinks=torch.zeros(4))
    with pytest.raises(ValueError, match=r"sinks: expected shape \(4\)"):
        warpattn.flash_attn_func(q, k, v, sinks=torch.zeros(2, device="cuda"))
    with pytest.raises(ValueError, match="options.window_right: causal attention sees no key right of the diagonal"):
        warpattn.flash_attn_func(q, k, v, causal=True, window_size=(10, 10))
    ops = warpattn.quantize_fp8(q, k, v)
    with pytest.raises(ValueError, match=r"options\.softcap: forward_fp8 has no softcap \(16-bit forward only\)"):
        warpattn.flash_attn_fp8_func(ops, softcap=30.0)
    with pytest.raises(TypeError, match="sinks: CUDA tensor required"):
        warpattn.flash_attn_fp8_func(ops, sinks=torch.zeros(4))


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("case", ["causal_window", "window", "sinks", "causal_window_and_sinks"])
def test_fp8_model_options_against_fp64(d, case, attention_reference):
    # FP8 takes a window and sinks (not softcap): within test_fp8_against_sdpa's bounds of the
    # float64 reference on the unquantised inputs.
    torch.manual_seed(zlib.crc32(repr((d, case)).encode()))
    q, k, v = (torch.randn(2, 300, 8, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    options = {"causal_window": dict(causal=True, window_size=(128, 0)), "window": dict(window_size=(100, 30)),
               "sinks": dict(sinks=head_sinks(8)),
               "causal_window_and_sinks": dict(causal=True, window_size=(64, -1), sinks=head_sinks(8))}[case]
    out, lse = warpattn.flash_attn_fp8_func(warpattn.quantize_fp8(q, k, v), return_lse=True, **options)
    sinks = options.get("sinks")
    want, want_lse, seen = attention_reference(*(t.double().cpu().numpy() for t in (q, k, v)),
                                               options.get("causal", False), options.get("window_size", (-1, -1)),
                                               0.0, None if sinks is None else sinks.cpu().numpy())
    assert not out.isnan().any()
    assert rel_l2(out.cpu(), torch.from_numpy(want)) < 6e-2
    assert (lse.cpu().double() - torch.from_numpy(want_lse)).abs().max().item() < 0.2
    assert seen.all()  # every row sees a key in these cases


@pytest.mark.gpu
def test_model_options_cupy_inputs(attention_reference):
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
    q, k, v = (torch.randn(2, 333, 4, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    sinks = head_sinks(4)
    options = dict(causal=True, window_size=(64, 0), softcap=4.0)
    out, lse = warpattn.flash_attn_func(*(cupy.from_dlpack(t) for t in (q, k, v)), sinks=cupy.from_dlpack(sinks),
                                        return_lse=True, **options)
    assert isinstance(out, cupy.ndarray)
    cupy.cuda.get_current_stream().synchronize()
    check_against_fp64(q, k, v, attention_reference, torch.from_dlpack(out), torch.from_dlpack(lse),
                       dict(options, sinks=sinks))
    # The explicit backward on CuPy arrays: dsinks fourth, a CuPy array, the autograd's bits
    # (deterministic), and softcap at head_dim 64 there too.
    dout = torch.randn_like(q)
    grads = warpattn.flash_attn_backward(*(cupy.from_dlpack(t) for t in (dout, q, k, v)), out, lse,
                                         sinks=cupy.from_dlpack(sinks), deterministic=True, **options)
    assert len(grads) == 4 and all(isinstance(g, cupy.ndarray) for g in grads)
    cupy.cuda.get_current_stream().synchronize()
    want = model_grads(q, k, v, dout, dict(options, sinks=sinks), deterministic=True)
    for name, got, expected in zip(GRAD_NAMES + ("dsinks",), grads, want):
        assert torch.equal(torch.from_dlpack(got), expected), name
    q64, k64, v64 = (cupy.from_dlpack(t[..., :64].contiguous()) for t in (q, k, v))
    out64, lse64 = warpattn.flash_attn_func(q64, k64, v64, return_lse=True, **options)
    grads64 = warpattn.flash_attn_backward(q64, q64, k64, v64, out64, lse64, **options)
    cupy.cuda.get_current_stream().synchronize()
    assert all(bool(cupy.isfinite(g).all()) for g in grads64)


# ---------------------------------------------------------------- padded head dims

# Any multiple of 8 from 8 to 256 runs, in the d = 64, 128 or 256 kernel with the missing columns
# zero-filled: the smallest, one in each kernel's range, and the largest below 256. The float64
# reference takes the real head dim (its default scale 1/sqrt(d), as warpattn's must be).
PADDED_HEAD_DIMS = [8, 80, 96, 192, 248]
# Above 256, to 512: the 512 kernels, the forward's warpgroups each holding half of the head dim,
# the backward's two CTAs per key block each half of dK, dV and dQ's columns
# (test_wide_head_dims_gradients_against_fp64).
WIDE_HEAD_DIMS = [264, 384, 512]
PADDED_SHAPES = [(77, 77), (300, 513), (513, 300)]


def padded_case(tag, dtype, d, causal, sq, sk, heads_kv=2):
    """q, k, v, dout of a padded-head-dim case (GQA 8/2 unless told), the same on every run."""
    torch.manual_seed(zlib.crc32(repr((tag, dtype, d, causal, sq, sk, heads_kv)).encode()))
    q = torch.randn(2, sq, 8, d, device="cuda", dtype=dtype)
    k = torch.randn(2, sk, heads_kv, d, device="cuda", dtype=dtype)
    v = torch.randn(2, sk, heads_kv, d, device="cuda", dtype=dtype)
    return q, k, v, torch.randn_like(q)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", PADDED_HEAD_DIMS + WIDE_HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", PADDED_SHAPES)
def test_padded_head_dims_against_fp64(dtype, d, causal, sq, sk, attention_reference):
    # Sq > Sk causal leaves rows with no key (out 0, lse -inf); MHA on the square shape.
    q, k, v, _ = padded_case("forward", dtype, d, causal, sq, sk, heads_kv=8 if sq == sk else 2)
    out, lse = warpattn.flash_attn_func(q, k, v, causal=causal, return_lse=True)
    assert out.shape == q.shape
    check_against_fp64(q, k, v, attention_reference, out, lse, dict(causal=causal))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", PADDED_HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", PADDED_SHAPES[1:])
def test_padded_head_dims_gradients_against_fp64(dtype, d, causal, sq, sk, attention_reference_grads):
    q, k, v, dout = padded_case("grad", dtype, d, causal, sq, sk)
    options = dict(causal=causal)
    check_grads_against_fp64(q, k, v, dout, options, model_grads(q, k, v, dout, options), attention_reference_grads)


# Above 256 the gradients come from the 512 backward kernel (built without a GPU; its first run is
# here and in test_gpu_backward's d512 tests): against float64 with the bounds of every other
# head dim, GQA 8/2 (MHA on the square shape), Sq > Sk causal leaving rows with no key.
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", WIDE_HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", PADDED_SHAPES)
def test_wide_head_dims_gradients_against_fp64(dtype, d, causal, sq, sk, attention_reference_grads):
    assert d in warpattn.backward_head_dims
    q, k, v, dout = padded_case("wide-grad", dtype, d, causal, sq, sk, heads_kv=8 if sq == sk else 2)
    options = dict(causal=causal)
    check_grads_against_fp64(q, k, v, dout, options, model_grads(q, k, v, dout, options), attention_reference_grads)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [40, 80, 200])
@pytest.mark.parametrize("case", sorted(MODEL_CASES))
def test_padded_head_dims_model_options_against_fp64(d, case, attention_reference, attention_reference_grads):
    # The window, softcap and sinks at a padded head dim in each kernel's range, forward and
    # gradients; softcap's backward at 40 runs in the 128 kernel.
    q, k, v, dout = padded_case(case, torch.bfloat16, d, False, 300, 777)
    options = model_options(case, 8)
    out, lse = warpattn.flash_attn_func(q, k, v, return_lse=True, **options)
    check_against_fp64(q, k, v, attention_reference, out, lse, options)
    check_model_grads(q, k, v, dout, options, attention_reference_grads)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [40, 200])
def test_padded_head_dims_strided_views_deterministic(d, attention_reference_grads):
    # Views of a packed qkv (head stride d, row stride 12 d: still multiples of 16 bytes) as the
    # autograd leaves' gradients too, the deterministic backward twice to the same bits, and
    # within the float64 bounds.
    torch.manual_seed(d)
    dout = torch.randn(2, 513, 4, d, device="cuda", dtype=torch.bfloat16)
    qkv = torch.randn(2, 513, 3, 4, d, device="cuda", dtype=torch.bfloat16)

    def grads():
        leaf = qkv.detach().clone().requires_grad_()
        q, k, v = leaf[:, :, 0], leaf[:, :, 1], leaf[:, :, 2]
        assert not q.is_contiguous()
        warpattn.flash_attn_func(q, k, v, causal=True, deterministic=True).backward(dout)
        return tuple(leaf.grad.unbind(2))
    first, second = grads(), grads()
    for name, a, b in zip(GRAD_NAMES, first, second):
        assert torch.equal(a, b), name
    q, k, v = qkv.unbind(2)
    check_grads_against_fp64(q, k, v, dout, dict(causal=True), first + (None,), attention_reference_grads)


# v's head dim apart from q and k's: MLA's prefill (192/128) and others within q's compiled head
# dim (v's columns past its own are zero-filled in the kernel; out, dout and dv have v's). The
# forward runs 192/128, 160/96 and 136/128 in the D = 192 kernel (v 128), the rest padded.
VALUE_HEAD_DIMS = [(192, 128), (160, 96), (136, 128), (128, 64), (96, 64), (256, 200), (64, 32), (80, 128)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d,dv", VALUE_HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
def test_value_head_dim_against_fp64(dtype, d, dv, causal, attention_reference, attention_reference_grads):
    torch.manual_seed(zlib.crc32(repr(("dv", dtype, d, dv, causal)).encode()))
    q = torch.randn(2, 300, 8, d, device="cuda", dtype=dtype)
    k = torch.randn(2, 777, 2, d, device="cuda", dtype=dtype)
    v = torch.randn(2, 777, 2, dv, device="cuda", dtype=dtype)
    dout = torch.randn(2, 300, 8, dv, device="cuda", dtype=dtype)
    out, lse = warpattn.flash_attn_func(q, k, v, causal=causal, return_lse=True)
    assert out.shape == (2, 300, 8, dv)
    check_against_fp64(q, k, v, attention_reference, out, lse, dict(causal=causal))
    grads = model_grads(q, k, v, dout, dict(causal=causal))
    assert [tuple(g.shape) for g in grads[:3]] == [tuple(q.shape), tuple(k.shape), tuple(v.shape)]
    check_grads_against_fp64(q, k, v, dout, dict(causal=causal), grads, attention_reference_grads)


@pytest.mark.gpu
def test_value_head_dim_compiled_and_refused():
    # torch.compile's fake op gives out v's head dim (fullgraph: no graph break); v's head dim
    # past q's compiled one is the library's ValueError, naming v.
    q, k = (torch.randn(1, 256, 4, 192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(1, 256, 4, 128, device="cuda", dtype=torch.bfloat16)
    fn = torch.compile(lambda q, k, v: warpattn.flash_attn_func(q, k, v, causal=True), fullgraph=True)
    torch.testing.assert_close(fn(q, k, v), warpattn.flash_attn_func(q, k, v, causal=True), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"^v: head_dim \(shape\[3\]\) must be at most 128 \(q's head_dim 96"):
        warpattn.flash_attn_func(q[..., :96], k[..., :96], torch.randn(1, 256, 4, 192, device="cuda",
                                                                      dtype=torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.parametrize("d", [32, 64])
@pytest.mark.parametrize("causal", [False, True])
def test_softcap_backward_at_head_dim_64_and_below(d, causal, attention_reference_grads):
    # The backward's d = 64 kernel has no softcap: at 8 to 64 the 128 kernel runs it, its columns
    # past d zero-filled. The explicit backward and autograd, against the float64 reference.
    q, k, v, dout = padded_case("softcap", torch.bfloat16, d, causal, 300, 500)
    options = dict(softcap=30.0, causal=causal)
    out, lse = warpattn.flash_attn_func(q, k, v, return_lse=True, **options)
    explicit = warpattn.flash_attn_backward(dout, q, k, v, out, lse, **options)
    check_grads_against_fp64(q, k, v, dout, options, tuple(explicit) + (None,), attention_reference_grads)
    check_model_grads(q, k, v, dout, options, attention_reference_grads)


# ---------------------------------------------------------------- two GPUs

def _second_gpu():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs, found %d" % torch.cuda.device_count())
    if torch.cuda.get_device_capability(1) != (9, 0):
        pytest.skip("cuda:1 is not an sm_90 GPU")
    return torch.device("cuda", 1)


@pytest.mark.gpu
def test_tensors_on_the_second_gpu_while_the_first_is_current():
    dev = _second_gpu()
    torch.cuda.set_device(0)
    q, k, v = (torch.randn(2, 3000, 8, 128, device=dev, dtype=torch.bfloat16) for _ in range(3))
    with torch.cuda.device(dev):
        want_out, want_lse = warpattn.flash_attn_func(q, k, v, causal=True, return_lse=True)
    for _ in range(2):  # the second call too: a wrong device once left the next call faulting
        out, lse = warpattn.flash_attn_func(q, k, v, causal=True, return_lse=True)
        assert out.device == dev and torch.cuda.current_device() == 0
        torch.cuda.synchronize(0), torch.cuda.synchronize(1)
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    assert rel_l2(out, reference(q, k, v, True)[0]) <= 5e-3
    ops = warpattn.quantize_fp8(q, k, v, qk_dtype="int8")
    fp8 = warpattn.flash_attn_fp8_func(ops, causal=True)
    torch.cuda.synchronize(1)
    with torch.cuda.device(dev):
        same = warpattn.flash_attn_fp8_func(warpattn.quantize_fp8(q, k, v, qk_dtype="int8"), causal=True)
    assert fp8.device == dev and torch.equal(fp8, same)
    assert rel_l2(fp8, want_out) < 6e-2


@pytest.mark.gpu
def test_tensors_on_two_gpus_are_refused():
    dev = _second_gpu()
    q = torch.randn(1, 256, 2, 64, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, 256, 2, 64, device="cuda:0", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="k: on device 0, but q is on device 1"):
        warpattn.flash_attn_func(q, k, q)
    out = torch.empty(1, 256, 2, 64, device="cuda:0", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="out: on device 0, but q is on device 1"):
        warpattn.flash_attn_func(q, q, q, out=out)


@pytest.mark.gpu
def test_sinks_on_another_gpu_are_refused():
    dev = _second_gpu()
    q = torch.randn(1, 256, 2, 64, device=dev, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="sinks: on device 0, but q is on device 1"):
        warpattn.flash_attn_func(q, q, q, sinks=torch.zeros(2, device="cuda:0"))
    with pytest.raises(ValueError, match="sinks: on device 0, but q is on device 1"):
        warpattn.flash_attn_fp8_func(warpattn.quantize_fp8(q, q, q), sinks=torch.zeros(2, device="cuda:0"))


@pytest.mark.gpu
def test_cupy_and_jax_on_the_second_gpu():
    dev = _second_gpu()
    torch.cuda.set_device(0)
    q, k, v = (torch.randn(1, 700, 4, 64, device=dev, dtype=torch.float16) for _ in range(3))
    want = reference(q, k, v, False)[0]
    try:
        import cupy
    except ImportError:
        cupy = None
    if cupy is not None:
        cq, ck, cv = (cupy.from_dlpack(t) for t in (q, k, v))
        with cupy.cuda.Device(0):
            out = warpattn.flash_attn_func(cq, ck, cv)
            ops = warpattn.quantize_fp8(cq, ck, cv)
            out8 = warpattn.flash_attn_fp8_func(ops, out_dtype="float16")
        assert out.device.id == 1 and out8.device.id == 1
        cupy.cuda.Device(1).synchronize()
        assert rel_l2(torch.from_dlpack(out), want) <= 1e-3
        assert rel_l2(torch.from_dlpack(out8), want) < 6e-2
    jax = pytest.importorskip("jax", reason="JAX is not installed")
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if len(gpus) < 2:
        pytest.skip("JAX sees fewer than two GPUs")
    torch.cuda.synchronize(1)
    with torch.cuda.device(dev):  # PyTorch exports through DLPack only from the tensor's device
        jq, jk, jv = (jax.dlpack.from_dlpack(t) for t in (q, k, v))
    out = warpattn.flash_attn_func(jq, jk, jv)
    assert out.devices().pop().id == 1
    assert rel_l2(torch.from_dlpack(out), want) <= 1e-3
    ops = warpattn.quantize_fp8(jq, jk, jv, qk_dtype="int8")
    out8 = warpattn.flash_attn_fp8_func(ops)
    assert out8.devices().pop().id == 1
    assert rel_l2(torch.from_dlpack(out8), want) < 6e-2
