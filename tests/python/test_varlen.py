"""flash_attn_varlen_func (packed variable-length batches, issue 15).

On an sm_90 GPU: random ragged batches (empty, one-token, odd and long sequences, Sq != Sk,
GQA, causal or not, every head dim, fp16/bf16), each sequence against warpattn.flash_attn_func
on that sequence alone and against a float32 (a float64 one for a few) reference; the LSE layout,
strided views, seqused_k, rows no sequence covers, torch.compile, CUDA graph capture with new
offsets at replay, the gradients against the dense ones, CuPy and JAX. Skipped with the reason
elsewhere. Without a GPU: every argument error, on NumPy arrays (validated before the memory's
place is looked at), and the PyTorch ops on meta tensors."""
import math

import numpy as np
import pytest

import warpattn
from conftest import MODEL_OPTION_ERRORS, gpu_missing
from warpattn import _warpattn

try:
    import torch
except ImportError:
    torch = None


gpu = pytest.mark.skipif(gpu_missing() is not None, reason=str(gpu_missing()))
has_backward = pytest.mark.skipif(not hasattr(_warpattn, "backward_varlen"),
                                  reason="this build has no _warpattn.backward_varlen yet")


# ------------------------------------------------------------------------------- CPU: errors

def packed(total_q=40, total_k=50, hq=8, hkv=2, d=64, batch=3, dtype=np.float16):
    """A valid call's arguments on NumPy arrays: q, k, v, cu_seqlens_q, cu_seqlens_k."""
    q = np.zeros((total_q, hq, d), dtype)
    k = np.zeros((total_k, hkv, d), dtype)
    v = np.zeros((total_k, hkv, d), dtype)
    cu_q = np.linspace(0, total_q, batch + 1).astype(np.int32)
    cu_k = np.linspace(0, total_k, batch + 1).astype(np.int32)
    return q, k, v, cu_q, cu_k


def call(q, k, v, cu_q, cu_k, max_q=20, max_k=20, **kw):
    return warpattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, **kw)


def test_exported():
    assert "flash_attn_varlen_func" in warpattn.__all__ and "flash_attn_varlen_backward" in warpattn.__all__
    assert "cu_seqlens_q" in warpattn.flash_attn_varlen_func.__doc__
    assert "seqused_k" in warpattn.flash_attn_varlen_backward.__doc__


def test_valid_call_on_cpu_memory_is_refused():
    with pytest.raises(TypeError, match="q: CUDA tensor required"):
        call(*packed(), causal=True, return_lse=True)
    for d in (8, 80, 200):  # padded head dims are valid: refused only at the host memory
        with pytest.raises(TypeError, match="q: CUDA tensor required"):
            call(*packed(d=d))
    q, k, v, cu_q, cu_k = packed()
    with pytest.raises(TypeError, match="CUDA tensor required"):
        call(q, k, v, cu_q, cu_k, seqused_k=np.full(3, 5, np.int32), out=np.zeros_like(q))


def test_cu_seqlens_dtype():
    q, k, v, cu_q, cu_k = packed()
    with pytest.raises(TypeError, match="cu_seqlens_q: expected an int32"):
        call(q, k, v, cu_q.astype(np.int64), cu_k)
    with pytest.raises(TypeError, match="cu_seqlens_k: expected an int32"):
        call(q, k, v, cu_q, cu_k.astype(np.float32))
    with pytest.raises(TypeError, match="seqused_k: expected an int32"):
        call(q, k, v, cu_q, cu_k, seqused_k=np.zeros(3, np.int64))


def test_cu_seqlens_not_a_tensor():
    q, k, v, cu_q, cu_k = packed()
    with pytest.raises(TypeError, match=r"cu_seqlens_k: expected a DLPack tensor .* got builtins.list"):
        call(q, k, v, cu_q, [0, 10, 50])


@pytest.mark.parametrize("which", ["cu_seqlens_q", "cu_seqlens_k"])
def test_cu_seqlens_shape(which):
    q, k, v, cu_q, cu_k = packed()
    bad = {"cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k}
    bad[which] = bad[which][:-1]  # B + 1 entries in one, B in the other
    with pytest.raises(ValueError, match="cu_seqlens_[qk]"):
        call(q, k, v, bad["cu_seqlens_q"], bad["cu_seqlens_k"])
    bad[which] = np.zeros((2, 4), np.int32)  # rank 2
    with pytest.raises(ValueError, match=which):
        call(q, k, v, *(cu_q, bad[which]) if which == "cu_seqlens_k" else (bad[which], cu_k))
    bad[which] = np.zeros(8, np.int32)[::2]  # not contiguous
    with pytest.raises(ValueError, match=which):
        call(q, k, v, *(cu_q, bad[which]) if which == "cu_seqlens_k" else (bad[which], cu_k))


def test_seqused_k_shape():
    q, k, v, cu_q, cu_k = packed()
    with pytest.raises(ValueError, match="seqused_k"):
        call(q, k, v, cu_q, cu_k, seqused_k=np.zeros(4, np.int32))


def test_ranks():
    q, k, v, cu_q, cu_k = packed()
    with pytest.raises(ValueError, match=r"q: expected rank 3 \(total_q, heads, head_dim\), got rank 4"):
        call(q[None], k, v, cu_q, cu_k)
    with pytest.raises(ValueError, match="k: .*rank"):
        call(q, k[None], v, cu_q, cu_k)


def test_max_seqlen():
    args = packed()
    with pytest.raises(ValueError, match="max_seqlen_q"):
        call(*args, max_q=-1)
    with pytest.raises(ValueError, match="max_seqlen_k"):
        call(*args, max_k=-5)
    with pytest.raises(TypeError, match="max_seqlen_k: expected an int, got builtins.float"):
        call(*args, max_k=2.5)
    with pytest.raises(TypeError, match="max_seqlen_q: expected an int, got bool"):
        call(*args, max_q=True)


def test_tensor_rules_of_the_dense_forward_apply():
    q, k, v, cu_q, cu_k = packed()
    with pytest.raises(ValueError, match=r"query heads \(8\) must be a multiple of key/value heads \(3\)"):
        call(q, np.zeros((50, 3, 64), np.float16), np.zeros((50, 3, 64), np.float16), cu_q, cu_k)
    with pytest.raises(ValueError, match=r"^q: head_dim \(shape\[2\]\) must be a multiple of 8 from 8 to 512, got 100$"):
        call(*packed(d=100))
    with pytest.raises(ValueError, match=r"^q: head_dim \(shape\[2\]\) must be a multiple of 8 from 8 to 512, got 520$"):
        call(*packed(d=520))
    with pytest.raises(ValueError, match=r"k: expected dtype float16 \(same as q\)"):
        call(q, k.astype(np.float32), v, cu_q, cu_k)
    with pytest.raises(ValueError, match="out: must not overlap q"):
        call(q, k, v, cu_q, cu_k, out=q)
    with pytest.raises(ValueError, match="out: expected shape"):
        call(q, k, v, cu_q, cu_k, out=np.zeros((39, 8, 64), np.float16))
    with pytest.raises(ValueError, match="softmax_scale: expected a finite positive value"):
        call(q, k, v, cu_q, cu_k, softmax_scale=-1.0)
    with pytest.raises(ValueError, match="q: last dimension .* must be contiguous"):
        call(np.zeros((40, 8, 128), np.float16)[..., ::2], k, v, cu_q, cu_k)


def test_backward_arguments_without_a_gpu():
    q, k, v, cu_q, cu_k = packed()
    lse = np.zeros((8, 40), np.float32)
    with pytest.raises(ValueError, match="q: expected rank 3"):
        warpattn.flash_attn_varlen_backward(q[None], q[None], k, v, q[None], lse, cu_q, cu_k, 20, 20)
    with pytest.raises(TypeError, match="lse: expected a DLPack tensor"):
        warpattn.flash_attn_varlen_backward(q, q, k, v, q, [0.0], cu_q, cu_k, 20, 20)
    if hasattr(_warpattn, "backward_varlen"):
        with pytest.raises(TypeError, match="dout: CUDA tensor required"):
            warpattn.flash_attn_varlen_backward(q, q, k, v, np.zeros_like(q), lse, cu_q, cu_k, 20, 20, causal=True)
    else:
        with pytest.raises(NotImplementedError, match="backward_varlen"):
            warpattn.flash_attn_varlen_backward(q, q, k, v, np.zeros_like(q), lse, cu_q, cu_k, 20, 20)


def test_model_options_reach_the_library():
    # window_size, softcap and sinks (issue 19): the library's rules and messages, as for the dense call.
    args = packed()
    for options, error, message in MODEL_OPTION_ERRORS:
        with pytest.raises(error, match=message):
            call(*args, **options)
    with pytest.raises(TypeError, match="q: CUDA tensor required"):
        call(*args, causal=True, window_size=(10, 0), softcap=5.0, sinks=np.zeros(8, np.float32),
             seqused_k=np.full(3, 5, np.int32))
    # The backward takes them too (issue 19), with the library's rules (softcap at every head dim:
    # the 128 kernel runs it at 64 and below), the sinks' shape; a valid call is refused at the
    # host memory.
    q, k, v, cu_q, cu_k = args
    lse = np.zeros((8, 40), np.float32)
    if not hasattr(_warpattn, "backward_varlen"):
        return
    for d in (None, 32, 80):  # the args' own head dim, and two padded ones: all in the 128 kernel
        if d is not None:
            q, k, v, cu_q, cu_k = packed(d=d)
        with pytest.raises(TypeError, match="dout: CUDA tensor required"):
            warpattn.flash_attn_varlen_backward(q, q, k, v, q, lse, cu_q, cu_k, 20, 20, softcap=5.0)
    q, k, v, cu_q, cu_k = packed(d=128)
    with pytest.raises(TypeError, match="dout: CUDA tensor required"):
        warpattn.flash_attn_varlen_backward(q, q, k, v, q, lse, cu_q, cu_k, 20, 20, window_size=(10, 0), causal=True,
                                            softcap=5.0, sinks=np.zeros(8, np.float32),
                                            seqused_k=np.full(3, 5, np.int32))
    with pytest.raises(ValueError, match=r"^sinks: expected shape \(8\)"):
        warpattn.flash_attn_varlen_backward(q, q, k, v, q, lse, cu_q, cu_k, 20, 20, sinks=np.zeros(2, np.float32))


def test_backward_workspace_grows_with_sinks():
    # The sinks' gradient takes workspace of its own (its partial sums): sized with the sinks given.
    if not hasattr(_warpattn, "backward_varlen"):
        pytest.skip("this build has no backward_varlen")
    q = np.zeros((1000, 8, 128), np.float16)
    plain = _warpattn.backward_varlen_workspace_bytes(q, 3, None, True, False)
    assert _warpattn.backward_varlen_workspace_bytes(q, 3, None, True, False, window_left=64, window_right=0,
                                                     softcap=5.0) == plain
    assert _warpattn.backward_varlen_workspace_bytes(q, 3, None, True, False, sinks=np.zeros(8, np.float32)) > plain


# ---------------------------------------------------------------- PyTorch on meta tensors (CPU)

@pytest.fixture
def meta():
    if torch is None:
        pytest.skip("PyTorch is not installed")
    import warpattn.torch_op  # noqa: F401 (registers the custom ops, as the first call would)

    def make(total_q=100, total_k=80, hq=8, hkv=2, d=64, batch=4):
        def t(*shape):
            return torch.empty(shape, device="meta", dtype=torch.bfloat16, requires_grad=True)
        cu = torch.empty(batch + 1, device="meta", dtype=torch.int32)
        return t(total_q, hq, d), t(total_k, hkv, d), t(total_k, hkv, d), cu, cu.clone()
    return make


def test_torch_fake_implementations(meta):
    q, k, v, cu_q, cu_k = (t.detach() for t in meta())
    out, lse = torch.ops.warpattn.flash_attn_varlen_forward(q, k, v, cu_q, cu_k, None, 30, 30, None, True, False)
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
    assert lse.shape == (8, 100) and lse.dtype == torch.float32
    grads = torch.ops.warpattn.flash_attn_varlen_backward(out, q, k, v, out, lse, None, cu_q, cu_k, cu_k[:4], 30, 30,
                                                          0.1, True, True)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape, (0,)]  # no sinks: an empty dsinks


def test_torch_opcheck(meta):
    from warpattn.torch_op import flash_attn_varlen_backward, flash_attn_varlen_forward
    q, k, v, cu_q, cu_k = meta()
    torch.library.opcheck(flash_attn_varlen_forward, (q, k, v, cu_q, cu_k, None, 30, 30, None, True, False))
    out, lse = (t.detach() for t in flash_attn_varlen_forward(q, k, v, cu_q, cu_k, None, 30, 30, None, True, False))
    q, k, v = (t.detach() for t in (q, k, v))
    torch.library.opcheck(flash_attn_varlen_backward,
                          (out, q, k, v, out, lse, None, cu_q, cu_k, cu_k[:4], 30, 30, None, False, False))


def test_torch_autograd_and_compile_trace(meta, op_recording_backend):
    q, k, v, cu_q, cu_k = meta()
    backend, ops = op_recording_backend

    def loss(q, k, v, cu_q, cu_k):
        return warpattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 30, 30, causal=True).float().square().sum()
    torch.compile(loss, backend=backend, fullgraph=True)(q, k, v, cu_q, cu_k).backward()
    assert "warpattn.flash_attn_varlen_forward.default" in ops
    assert "warpattn.flash_attn_varlen_backward.default" in ops
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape


def test_torch_ops_take_the_model_options(meta):
    from warpattn.torch_op import flash_attn_varlen_forward
    q, k, v, cu_q, cu_k = meta()
    sinks = torch.zeros(8, device="meta")
    options = (False, 64, 0, 30.0, sinks)  # batch_invariant, window_left, window_right, softcap, sinks
    torch.library.opcheck(flash_attn_varlen_forward, (q, k, v, cu_q, cu_k, None, 30, 30, None, True, False) + options)
    q, k, v = (t.detach() for t in (q, k, v))
    out, lse = flash_attn_varlen_forward(q, k, v, cu_q, cu_k, None, 30, 30, None, True, False, *options)
    assert out.shape == q.shape and lse.shape == (8, 100)
    grads = torch.ops.warpattn.flash_attn_varlen_backward(out, q, k, v, out, lse, None, cu_q, cu_k, None, 30, 30,
                                                          None, True, False, 64, 0, 30.0, sinks)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape, (8,)]  # dsinks shaped as the sinks
    assert grads[3].dtype == torch.float32
    from warpattn.torch_op import flash_attn_varlen_backward
    torch.library.opcheck(flash_attn_varlen_backward, (out, q, k, v, out, lse, None, cu_q, cu_k, None, 30, 30, None,
                                                       True, False, 64, 0, 30.0, sinks))


def test_torch_gradients_flow_through_model_options(meta, op_recording_backend, monkeypatch):
    # forward_varlen and backward_varlen replaced by recorders on CPU tensors: the custom ops run
    # their real implementations, the backward gets the forward's options (and dsinks, which it
    # writes), and the sinks' gradient reaches the sinks, eagerly and compiled.
    seen, backward_seen = [], []
    monkeypatch.setattr(_warpattn, "forward_varlen", lambda *args, **options: seen.append(options))

    def backward_varlen(*args, **options):
        backward_seen.append(options)
        if options["dsinks"] is not None:
            options["dsinks"].fill_(7.0)
    monkeypatch.setattr(_warpattn, "backward_varlen", backward_varlen)
    q, k, v = (torch.zeros(n, 2, 64, dtype=torch.bfloat16, requires_grad=True) for n in (40, 50, 50))
    cu_q, cu_k = torch.tensor([0, 10, 40], dtype=torch.int32), torch.tensor([0, 20, 50], dtype=torch.int32)
    sinks = torch.zeros(2, requires_grad=True)
    out = warpattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 30, 30, window_size=(16, 16), softcap=3.0,
                                          sinks=sinks)
    assert seen[-1]["window_left"] == 16 and seen[-1]["softcap"] == 3.0 and seen[-1]["sinks"] is sinks
    out.float().sum().backward()
    got = backward_seen[-1]
    assert (got["window_left"], got["window_right"], got["softcap"]) == (16, 16, 3.0) and got["sinks"] is sinks
    assert got["dsinks"].shape == (2,) and got["dsinks"].dtype == torch.float32
    assert torch.equal(sinks.grad, torch.full((2,), 7.0)) and q.grad.shape == q.shape
    backend, ops = op_recording_backend
    sinks.grad = None

    def loss(q, k, v, sinks):
        return warpattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 30, 30, causal=True, window_size=(8, 0),
                                               sinks=sinks).float().square().sum()
    torch.compile(loss, backend=backend, fullgraph=True)(q, k, v, sinks).backward()
    assert "warpattn.flash_attn_varlen_backward.default" in ops
    assert backward_seen[-1]["window_left"] == 8 and torch.equal(sinks.grad, torch.full((2,), 7.0))
    # Without sinks no dsinks is passed, and the backward op's empty one goes nowhere.
    out = warpattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 30, 30, window_size=(4, 4))
    out.float().sum().backward()
    assert backward_seen[-1]["dsinks"] is None and backward_seen[-1]["sinks"] is None


def test_torch_out_argument_is_not_differentiable(meta):
    q, k, v, cu_q, cu_k = meta()
    with pytest.raises(RuntimeError, match=r"out: flash_attn_varlen_func\(..., out=...\) is not differentiable"):
        warpattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 30, 30, out=torch.empty_like(q))


# ------------------------------------------------------------------------------ GPU helpers

TOL = {"bfloat16": 5e-3, "float16": 1e-3}  # rel L2 against the fp32 reference (as test_gpu.py)


def tol(dtype):
    return TOL[str(dtype).split(".")[-1]]


def make_batch(lengths, hq, hkv, d, dtype, capacity=0, seed=0):
    """Packed q, k, v and int32 offsets for [(Sq, Sk), ...]; each sequence's keys get `capacity`
    extra rows after them (for seqused_k). Fresh normal data, seeded."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    sq = [a for a, _ in lengths]
    sk = [b + capacity for _, b in lengths]
    q = torch.randn(sum(sq), hq, d, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(sum(sk), hkv, d, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(sum(sk), hkv, d, device="cuda", dtype=dtype, generator=gen)
    cu_q = torch.tensor([0] + np.cumsum(sq).tolist(), device="cuda", dtype=torch.int32)
    cu_k = torch.tensor([0] + np.cumsum(sk).tolist(), device="cuda", dtype=torch.int32)
    return q, k, v, cu_q, cu_k


def reference(q, k, v, causal, scale=None, dtype=None):
    """(Sq, Hq, D) attention in `dtype` (default float32) with GQA and bottom-right causal
    alignment: out and lse (Hq, Sq); rows that see no key are 0 with lse -inf (warpattn's
    convention). No torch default in the signature: the module must import without torch."""
    dtype = torch.float32 if dtype is None else dtype
    sq, hq, d = q.shape
    sk, hkv = k.shape[:2]
    scale = 1 / math.sqrt(d) if scale is None else scale
    qf = q.to(dtype).transpose(0, 1)
    kf = k.to(dtype).repeat_interleave(hq // hkv, 1).transpose(0, 1)
    vf = v.to(dtype).repeat_interleave(hq // hkv, 1).transpose(0, 1)
    scores = qf @ kf.transpose(-1, -2) * scale
    if causal:
        keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq)
        scores = scores.masked_fill(~keep, -math.inf)
    lse = torch.logsumexp(scores, -1)
    p = torch.exp(scores - lse[..., None]).nan_to_num(0.0)
    return (p @ vf).transpose(0, 1), lse


def rel_l2(got, want):
    want = want.double()
    return ((got.double() - want).norm() / want.norm().clamp_min(1e-30)).item()


def dense(q, k, v, causal, scale=None):
    """warpattn's dense kernel on one sequence: (out (Sq, H, D), lse (H, Sq))."""
    out, lse = warpattn.flash_attn_func(q[None], k[None], v[None], softmax_scale=scale, causal=causal, return_lse=True)
    return out[0], lse[0]


def check_sequences(q, k, v, cu_q, cu_k, out, lse, causal, scale=None, seqused=None, against_reference=True):
    """Every sequence of a varlen result against the dense kernel on that sequence alone (a tight
    bound: the same kernel body, equal bits where both take the same tiles; where the dense launch
    splits its last wave the summation order differs and ~15% of the outputs move by one ulp,
    ~1e-3 rel L2 in bf16, run 103) and, unless told not to (long sequences), against the fp32
    reference; rows that see no key must be 0 with LSE -inf."""
    cq, ck = cu_q.tolist(), cu_k.tolist()
    used = None if seqused is None else seqused.tolist()
    for b in range(len(cq) - 1):
        rows = slice(cq[b], cq[b + 1])
        n = ck[b + 1] - ck[b] if used is None else used[b]
        keys = slice(ck[b], ck[b] + n)
        if cq[b + 1] == cq[b]:
            continue
        o, l = out[rows], lse[:, rows]
        what = "sequence %d (Sq %d, Sk %d)" % (b, cq[b + 1] - cq[b], n)
        assert not o.isnan().any(), what + ": NaN"
        if n == 0:
            assert torch.all(o == 0) and torch.all(l == -math.inf), what + ": no key: 0 and LSE -inf"
            continue
        do, dl = dense(q[rows], k[keys], v[keys], causal, scale)
        seen = dl.isfinite()  # (H, Sq): False where a causal row sees no key (Sq > Sk)
        assert torch.equal(seen, l.isfinite()), what + ": -inf LSE exactly where a row sees no key"
        assert torch.all(o[~seen.any(0)] == 0), what + ": rows without keys must be 0"
        if seen.any():
            err = rel_l2(o, do)
            # Two roundings of the same exact result where the tiles differ (tall or split on one
            # side only): up to ~sqrt(2) x the reference's own error (run 106: 3.1e-3 at d = 64).
            assert err <= tol(q.dtype), what + ": rel L2 %.2e against the dense kernel" % err
            assert (l[seen] - dl[seen]).abs().max().item() <= 1e-4, what + ": LSE against the dense kernel"
        if against_reference:
            want, want_lse = reference(q[rows], k[keys], v[keys], causal, scale)
            assert torch.equal(want_lse.isfinite(), seen), what + ": reference and dense disagree on empty rows"
            if seen.any():
                err = rel_l2(o, want)
                assert err <= tol(q.dtype), what + ": rel L2 %.2e against fp32" % err
                assert (l[seen] - want_lse[seen]).abs().max().item() <= 1e-4, what + ": LSE against fp32"


RAGGED = [(0, 0), (1, 1), (0, 37), (37, 0), (1, 700), (700, 1), (129, 129), (333, 1027), (1027, 333), (2049, 2049),
          (3001, 2500), (64, 64)]


# ---------------------------------------------------------------------------- GPU: forward

@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hkv", [8, 2, 1])
def test_ragged_batch(dtype, d, causal, hkv):
    rng = np.random.default_rng(d * 7 + causal * 3 + hkv)
    lengths = [RAGGED[i] for i in rng.permutation(len(RAGGED))]  # a different order per case
    q, k, v, cu_q, cu_k = make_batch(lengths, 8, hkv, d, getattr(torch, dtype), seed=d + hkv)
    max_q, max_k = max(a for a, _ in lengths), max(b for _, b in lengths)
    out, lse = warpattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, return_lse=True)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (8, q.shape[0]) and lse.dtype == torch.float32
    check_sequences(q, k, v, cu_q, cu_k, out, lse, causal)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_random_lengths_scale_and_batch_of_many(causal):
    # 300 sequences of random lengths (a third of them empty on one side), a custom scale.
    rng = np.random.default_rng(5 + causal)
    lengths = [(int(a) * (rng.random() > 0.15), int(b) * (rng.random() > 0.15))
               for a, b in rng.integers(1, 300, (300, 2))]
    q, k, v, cu_q, cu_k = make_batch(lengths, 4, 4, 128, torch.bfloat16, seed=3)
    out, lse = warpattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 300, 300, softmax_scale=0.05, causal=causal,
                                               return_lse=True)
    check_sequences(q, k, v, cu_q, cu_k, out, lse, causal, scale=0.05)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_long_sequences_against_the_dense_kernel(causal):
    lengths = [(1, 1), (32768, 32768), (7, 7), (0, 5), (4097, 16384), (16384, 4097)]
    q, k, v, cu_q, cu_k = make_batch(lengths, 4, 2, 128, torch.bfloat16, seed=11)
    out, lse = warpattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 32768, 32768, causal=causal, return_lse=True)
    check_sequences(q, k, v, cu_q, cu_k, out, lse, causal, against_reference=False)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_equal_lengths_equal_the_dense_batch(causal):
    b, s, h, d = 6, 1000, 8, 128
    q, k, v, cu_q, cu_k = make_batch([(s, s)] * b, h, 2, d, torch.float16, seed=4)
    out, lse = warpattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, s, s, causal=causal, return_lse=True)
    want, want_lse = warpattn.flash_attn_func(q.view(b, s, h, d), k.view(b, s, 2, d), v.view(b, s, 2, d),
                                              causal=causal, return_lse=True)
    assert rel_l2(out, want.view(-1, h, d).float()) <= tol(q.dtype) / 2
    # (B, H, S) dense against (H, B*S) packed: the varlen LSE layout
    assert (lse - want_lse.permute(1, 0, 2).reshape(h, b * s)).abs().max().item() <= 1e-4


@gpu
@pytest.mark.gpu
def test_float64_reference():
    lengths = [(1, 1), (17, 300), (300, 17), (513, 513), (1, 2048)]
    for causal in (False, True):
        q, k, v, cu_q, cu_k = make_batch(lengths, 4, 2, 64, torch.bfloat16, seed=21 + causal)
        out = warpattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 513, 2048, causal=causal)
        cq, ck = cu_q.tolist(), cu_k.tolist()
        for b in range(len(lengths)):
            rows, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
            want, _ = reference(q[rows], k[keys], v[keys], causal, dtype=torch.float64)
            mine = rel_l2(out[rows], want)
            theirs = rel_l2(dense(q[rows], k[keys], v[keys], causal)[0], want)
            # no worse than the dense kernel on the same sequence (both round O to bf16 at ~2e-3)
            assert mine <= 1.1 * theirs + 1e-4 and mine < 5e-3, (b, causal, mine, theirs)


@gpu
@pytest.mark.gpu
def test_strided_views_of_a_packed_qkv():
    lengths = [(100, 100), (1, 1), (513, 513), (0, 0), (77, 77)]
    total, h, d = sum(a for a, _ in lengths), 4, 128
    qkv = torch.randn(total, 3, h, d, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    assert not q.is_contiguous()
    cu = torch.tensor([0] + np.cumsum([a for a, _ in lengths]).tolist(), device="cuda", dtype=torch.int32)
    out, lse = warpattn.flash_attn_varlen_func(q, k, v, cu, cu, 513, 513, causal=True, return_lse=True)
    contiguous = warpattn.flash_attn_varlen_func(q.contiguous(), k.contiguous(), v.contiguous(), cu, cu, 513, 513,
                                                 causal=True)
    assert torch.equal(out, contiguous)
    check_sequences(q, k, v, cu, cu, out, lse, True)
    # heads padded apart (a view into a wider buffer), an odd row stride in elements
    wide = torch.randn(total, h, d + 8, device="cuda", dtype=torch.bfloat16)[..., :d]
    assert torch.equal(warpattn.flash_attn_varlen_func(wide, k, v, cu, cu, 513, 513),
                       warpattn.flash_attn_varlen_func(wide.contiguous(), k, v, cu, cu, 513, 513))


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_seqused_k(causal):
    # Each sequence's keys are followed by 64 unused rows (a KV cache's free slots).
    lengths = [(1, 300), (50, 50), (20, 0), (129, 1000), (1, 1)]
    q, k, v, cu_q, cu_k = make_batch(lengths, 8, 2, 64, torch.bfloat16, capacity=64, seed=8)
    used = torch.tensor([b for _, b in lengths], device="cuda", dtype=torch.int32)
    out, lse = warpattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 129, 1064, causal=causal, return_lse=True,
                                               seqused_k=used)
    check_sequences(q, k, v, cu_q, cu_k, out, lse, causal, seqused=used)
    # a sequence using no key: zeros, -inf (transformers' padding sequences rely on this)
    assert torch.all(out[51:71] == 0) and torch.all(lse[:, 51:71] == -math.inf)


@gpu
@pytest.mark.gpu
def test_rows_outside_every_sequence_are_left_alone_and_side_stream():
    q, k, v, cu_q, cu_k = make_batch([(100, 100), (30, 60)], 4, 4, 64, torch.float16, seed=9)
    cu_q_short = cu_q.clone()
    cu_q_short[-1] = 120  # the last 10 query rows belong to no sequence
    out = torch.full_like(q, float("nan"))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        result = warpattn.flash_attn_varlen_func(q, k, v, cu_q_short, cu_k, 100, 100, out=out)
    side.synchronize()
    assert result is out
    assert out[120:].isnan().all() and not out[:120].isnan().any()
    want, _ = reference(q[100:120], k[100:160], v[100:160], False)
    assert rel_l2(out[100:120], want) <= tol(q.dtype)


@gpu
@pytest.mark.gpu
def test_torch_compile_fullgraph():
    q, k, v, cu_q, cu_k = make_batch([(300, 300), (1, 1), (700, 900)], 8, 2, 128, torch.bfloat16, seed=12)

    def fn(q, k, v, cu_q, cu_k):
        return warpattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 700, 900, causal=True) * 2
    compiled = torch.compile(fn, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, cu_q, cu_k), fn(q, k, v, cu_q, cu_k), rtol=0, atol=0)


@gpu
@pytest.mark.gpu
def test_cuda_graph_replay_with_new_offsets():
    # The offsets are read on the device: a captured graph replays with new lengths (same B).
    q, k, v, cu_q, cu_k = make_batch([(300, 300), (200, 100), (500, 600)], 8, 2, 64, torch.bfloat16, seed=13)
    warpattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 500, 600, causal=True)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = warpattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 1000, 1000, causal=True)
    cu_q.copy_(torch.tensor([0, 1, 600, 1000], dtype=torch.int32))
    cu_k.copy_(torch.tensor([0, 500, 501, 1000], dtype=torch.int32))
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    _, lse = warpattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 1000, 1000, causal=True, return_lse=True)
    check_sequences(q, k, v, cu_q, cu_k, out, lse, True)


@gpu
@pytest.mark.gpu
def test_argument_errors_on_cuda_tensors():
    q, k, v, cu_q, cu_k = make_batch([(10, 10), (20, 20)], 4, 4, 64, torch.float16)
    with pytest.raises(TypeError, match="cu_seqlens_q: expected an int32"):
        warpattn.flash_attn_varlen_func(q, k, v, cu_q.long(), cu_k, 20, 20)
    with pytest.raises(TypeError, match="cu_seqlens_k: CUDA tensor required"):
        warpattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k.cpu(), 20, 20)
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        warpattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k[:2], 20, 20)


@gpu
@pytest.mark.gpu
def test_cupy_inputs():
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
    q, k, v, cu_q, cu_k = make_batch([(100, 130), (1, 1), (333, 200)], 4, 2, 128, torch.float16, seed=14)
    args = [cupy.from_dlpack(t) for t in (q, k, v, cu_q, cu_k)]
    out, lse = warpattn.flash_attn_varlen_func(*args, 333, 200, causal=True, return_lse=True)
    assert isinstance(out, cupy.ndarray) and lse.shape == (4, q.shape[0])
    cupy.cuda.get_current_stream().synchronize()
    check_sequences(q, k, v, cu_q, cu_k, torch.from_dlpack(out), torch.from_dlpack(lse), True)


@gpu
@pytest.mark.gpu
def test_jax_inputs():
    jax = pytest.importorskip("jax", reason="JAX is not installed")
    if not any(dev.platform == "gpu" for dev in jax.devices()):
        pytest.skip("JAX sees no GPU")
    q, k, v, cu_q, cu_k = make_batch([(100, 130), (0, 4), (333, 200)], 4, 2, 64, torch.bfloat16, seed=15)
    torch.cuda.synchronize()
    args = [jax.dlpack.from_dlpack(t) for t in (q, k, v, cu_q, cu_k)]
    out, lse = warpattn.flash_attn_varlen_func(*args, 333, 200, return_lse=True)
    assert isinstance(out, jax.Array)
    check_sequences(q, k, v, cu_q, cu_k, torch.from_dlpack(out), torch.from_dlpack(lse), False)


# ------------------------------------------------ GPU: window_size, softcap and sinks (issue 19)

# Each case's options; sinks=True: one logit per query head from -2 to 8 (test_gpu.py's).
VARLEN_MODEL_CASES = {
    "causal_window": dict(causal=True, window_size=(100, 0)),
    "window": dict(window_size=(64, 200)),
    "softcap": dict(softcap=2.0),
    "sinks": dict(sinks=True),
    "all_three": dict(causal=True, window_size=(256, -1), softcap=20.0, sinks=True),
}
MODEL_RAGGED = [(0, 0), (1, 1), (0, 37), (37, 0), (1, 700), (700, 1), (129, 129), (333, 1027), (1027, 333),
                (2049, 2049), (64, 64)]


def model_options(case, heads):
    options = dict(VARLEN_MODEL_CASES[case])
    if options.pop("sinks", False):
        options["sinks"] = torch.linspace(-2.0, 8.0, heads, device="cuda", dtype=torch.float32)
    return options


def check_model_sequences(q, k, v, cu_q, cu_k, out, lse, options, attention_reference, seqused=None):
    """Each sequence of a varlen result with model options against the float64 reference on that
    sequence alone (the forward's bounds: rel L2 within tol, lse within 1e-4 where finite, -inf
    exactly where the reference's is) and against the dense kernel with the same options on it
    (the same bounds, as check_sequences); rows that see no key are 0, with lse their sink."""
    sinks = options.get("sinks")
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cq) - 1):
        n = ck[b + 1] - ck[b] if seqused is None else int(seqused[b])
        rows, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b] + n)
        if cq[b + 1] == cq[b]:
            continue
        o, l = out[rows].cpu(), lse[:, rows].cpu()
        what = "sequence %d (Sq %d, Sk %d)" % (b, cq[b + 1] - cq[b], n)
        want, want_lse, seen = attention_reference(
            *(t[None].double().cpu().numpy() for t in (q[rows], k[keys], v[keys])), options.get("causal", False),
            options.get("window_size", (-1, -1)), options.get("softcap", 0.0),
            None if sinks is None else sinks.cpu().numpy())
        want, want_lse, seen = torch.from_numpy(want[0]), torch.from_numpy(want_lse[0]), torch.from_numpy(seen)
        assert not o.isnan().any(), what + ": NaN"
        assert torch.equal(want_lse.isfinite(), l.isfinite()), what + ": -inf lse exactly where the reference's is"
        assert torch.all(o[~seen] == 0), what + ": rows without keys must be 0"
        finite = want_lse.isfinite()
        if finite.any():
            assert (l.double()[finite] - want_lse[finite]).abs().max().item() <= 1e-4, what + ": lse against fp64"
        if seen.any():
            err = rel_l2(o, want)
            assert err <= tol(q.dtype), what + ": rel L2 %.2e against fp64" % err
        if n == 0:
            continue
        do, dl = warpattn.flash_attn_func(q[None, rows], k[None, keys], v[None, keys], return_lse=True, **options)
        if seen.any():
            err = rel_l2(o, do[0].cpu())
            assert err <= tol(q.dtype), what + ": rel L2 %.2e against the dense kernel" % err
        assert torch.equal(dl[0].cpu().isfinite(), l.isfinite()), what + ": dense and varlen agree on -inf rows"


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("case", sorted(VARLEN_MODEL_CASES))
def test_model_options_against_fp64(dtype, d, case, attention_reference):
    q, k, v, cu_q, cu_k = make_batch(MODEL_RAGGED, 8, 2, d, getattr(torch, dtype), seed=d + len(case))
    options = model_options(case, 8)
    out, lse = warpattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 2049, 2049, return_lse=True, **options)
    check_model_sequences(q, k, v, cu_q, cu_k, out, lse, options, attention_reference)


@gpu
@pytest.mark.gpu
def test_model_options_with_seqused_k(attention_reference):
    # A window and sinks over the keys each sequence uses, past them 64 unused rows (a KV cache).
    lengths = [(1, 300), (50, 50), (20, 0), (129, 1000), (1, 1)]
    q, k, v, cu_q, cu_k = make_batch(lengths, 8, 2, 128, torch.bfloat16, capacity=64, seed=51)
    used = torch.tensor([b for _, b in lengths], device="cuda", dtype=torch.int32)
    options = dict(causal=True, window_size=(32, 0), sinks=torch.linspace(-2.0, 8.0, 8, device="cuda"))
    out, lse = warpattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 129, 1064, return_lse=True, seqused_k=used,
                                               **options)
    check_model_sequences(q, k, v, cu_q, cu_k, out, lse, options, attention_reference, seqused=used)
    # The sequence using no key: 0, and lse each head's sink.
    assert torch.all(out[51:71] == 0)
    assert torch.allclose(lse[:, 51:71], options["sinks"][:, None].expand(8, 20), rtol=0, atol=1e-4)


@gpu
@pytest.mark.gpu
def test_model_options_torch_compile_fullgraph():
    q, k, v, cu_q, cu_k = make_batch([(300, 300), (1, 1), (700, 900)], 8, 2, 128, torch.bfloat16, seed=52)
    sinks = torch.linspace(-2.0, 8.0, 8, device="cuda")

    def fn(q, k, v, cu_q, cu_k, sinks):
        return warpattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 700, 900, causal=True, window_size=(128, 0),
                                               softcap=30.0, sinks=sinks) * 2
    compiled = torch.compile(fn, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, cu_q, cu_k, sinks), fn(q, k, v, cu_q, cu_k, sinks), rtol=0, atol=0)


# The gradients through window_size, softcap and sinks against the float64 reference on each
# sequence alone: test_gpu.py's backward bounds (rel L2 of dq, dk, dv against float64) and its
# dsinks bound (1e-2 of the sum of the terms' magnitudes per head, there explained), the sinks'
# gradient and its terms summed over the sequences.
FP64_GRAD_TOL = {"bfloat16": 3e-2, "float16": 5e-3}


def model_reference_grads(q, k, v, cu_q, cu_k, dout, options, reference_grads, seqused=None):
    """dq, dk, dv (packed, zero where no sequence reaches) and dsinks, sink_terms (summed over the
    sequences; None without sinks) from the float64 reference on each sequence alone."""
    sinks = options.get("sinks")
    sinks = None if sinks is None else sinks.detach().cpu().numpy()
    dq, dk, dv = (np.zeros(t.shape) for t in (q, k, v))
    dsinks = sink_terms = None
    if sinks is not None:  # two arrays (one shared by both names summed each sequence's terms into dsinks)
        dsinks, sink_terms = np.zeros(q.shape[1]), np.zeros(q.shape[1])
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cq) - 1):
        n = ck[b + 1] - ck[b] if seqused is None else int(seqused[b])
        rows, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b] + n)
        if cq[b + 1] == cq[b]:
            continue
        g = reference_grads(*(t[None].double().cpu().numpy() for t in (q[rows], k[keys], v[keys], dout[rows])),
                            options.get("causal", False), options.get("window_size", (-1, -1)),
                            options.get("softcap", 0.0), sinks, options.get("softmax_scale"))
        dq[rows], dk[keys], dv[keys] = g["dq"][0], g["dk"][0], g["dv"][0]
        if sinks is not None:
            dsinks += g["dsinks"]
            sink_terms += g["sink_terms"]
    return dq, dk, dv, dsinks, sink_terms


def model_varlen_grads(q, k, v, cu_q, cu_k, dout, lengths, options, deterministic=False, seqused=None, fn=None):
    """dq, dk, dv and the sinks' gradient (None without) of flash_attn_varlen_func through autograd,
    the sinks a leaf that requires grad; fn: a (torch.compile'd) loss of (q, k, v, sinks)."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    sinks = options.get("sinks")
    sinks = None if sinks is None else sinks.detach().clone().requires_grad_()
    rest = {name: value for name, value in options.items() if name != "sinks"}
    if fn is None:
        def fn(q, k, v, sinks):
            out = warpattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, *lengths, sinks=sinks, seqused_k=seqused,
                                                  deterministic=deterministic, **rest)
            return (out.float() * dout.float()).sum()
    fn(*leaves, sinks).backward()
    return tuple(t.grad for t in leaves) + (None if sinks is None else sinks.grad,)


def check_model_grads(got, want, dtype):
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert not g.isnan().any(), name
        err = rel_l2(g.cpu(), torch.from_numpy(w))
        assert err <= FP64_GRAD_TOL[dtype], (name, err)
    if want[3] is None:
        assert got[3] is None
        return
    err = (got[3].detach().cpu().double() - torch.from_numpy(want[3])).abs()
    bound = 1e-2 * torch.from_numpy(want[4]) + 1e-6
    assert torch.all(err <= bound), (err / bound).max().item()


VARLEN_MODEL_GRAD_CASES = {
    "causal_window": (64, dict(causal=True, window_size=(64, 0))),
    "window_and_sinks": (64, dict(window_size=(100, 30), sinks=True)),
    "causal_all_three": (128, dict(causal=True, window_size=(96, -1), softcap=30.0, sinks=True)),
    "softcap_and_sinks": (256, dict(softcap=5.0, sinks=True, softmax_scale=0.1)),
}


@gpu
@has_backward
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", sorted(VARLEN_MODEL_GRAD_CASES))
def test_model_options_gradients_against_fp64(dtype, case, attention_reference_grads):
    # Sequences with rows that see no key (in the window, or Sq > Sk causal: the sink alone) and
    # an empty one; softcap at head_dims 128 and 256 (64 has no softcap backward yet).
    lengths = [(300, 300), (1, 1), (0, 30), (400, 129), (129, 700)]
    d, options = VARLEN_MODEL_GRAD_CASES[case]
    options = dict(options)
    if options.pop("sinks", False):
        options["sinks"] = torch.linspace(-2.0, 8.0, 8, device="cuda")
    q, k, v, cu_q, cu_k = make_batch(lengths, 8, 2, d, getattr(torch, dtype), seed=len(case) + d)
    dout = torch.randn_like(q)
    got = model_varlen_grads(q, k, v, cu_q, cu_k, dout, (400, 700), options)
    check_model_grads(got, model_reference_grads(q, k, v, cu_q, cu_k, dout, options, attention_reference_grads),
                      dtype)


@gpu
@has_backward
@pytest.mark.gpu
def test_model_options_gradients_seqused_k_compiled_and_explicit(attention_reference_grads):
    # With seqused_k (the sinks then come after it), deterministic: the same bits twice, under
    # torch.compile(fullgraph), and from warpattn.flash_attn_varlen_backward (dsinks fourth); softcap
    # at head_dim 64 refused by the library's ValueError when the backward runs.
    lengths = [(50, 300), (1, 1), (20, 0), (129, 1000)]
    q, k, v, cu_q, cu_k = make_batch(lengths, 8, 2, 128, torch.bfloat16, capacity=32, seed=54)
    used = torch.tensor([b for _, b in lengths], device="cuda", dtype=torch.int32)
    dout = torch.randn_like(q)
    options = dict(causal=True, window_size=(64, 0), softcap=10.0, sinks=torch.linspace(-2.0, 8.0, 8, device="cuda"))
    first = model_varlen_grads(q, k, v, cu_q, cu_k, dout, (129, 1032), options, True, used)
    second = model_varlen_grads(q, k, v, cu_q, cu_k, dout, (129, 1032), options, True, used)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    check_model_grads(first, model_reference_grads(q, k, v, cu_q, cu_k, dout, options, attention_reference_grads,
                                                   seqused=used), "bfloat16")
    rest = {name: value for name, value in options.items() if name != "sinks"}

    def loss(q, k, v, sinks):
        out = warpattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 129, 1032, sinks=sinks, seqused_k=used,
                                              deterministic=True, **rest)
        return (out.float() * dout.float()).sum()
    compiled = model_varlen_grads(q, k, v, cu_q, cu_k, dout, None, options, fn=torch.compile(loss, fullgraph=True))
    for name, a, b in zip(("dq", "dk", "dv", "dsinks"), compiled, first):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    out, lse = warpattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 129, 1032, seqused_k=used, return_lse=True,
                                               **options)
    explicit = warpattn.flash_attn_varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, 129, 1032,
                                                   seqused_k=used, deterministic=True, **options)
    assert len(explicit) == 4
    for name, a, b in zip(("dq", "dk", "dv", "dsinks"), explicit, first):
        assert torch.equal(a, b), name
    q64, k64, v64 = (t[..., :64].contiguous() for t in (q, k, v))
    grads64 = model_varlen_grads(q64, k64, v64, cu_q, cu_k, dout[..., :64].contiguous(), (129, 1032), options,
                                 seqused=used)  # softcap at head_dim 64: the 128 kernel
    assert all(g is None or bool(torch.isfinite(g).all()) for g in grads64)


# rel L2, varlen against dense gradients (run 104: bitwise in the deterministic mode, within 2e-3
# in the default one, whose dQ sums run in any order); a wrong sequence or mask moves them by O(1).
BWD_TOL = {"bfloat16": 1e-2, "float16": 5e-3}


def dense_gradients(q, k, v, cu_q, cu_k, dout, causal, seqused=None):
    """dq, dk, dv from warpattn.flash_attn_func on each sequence alone, packed back."""
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cq) - 1):
        n = ck[b + 1] - ck[b] if seqused is None else int(seqused[b])
        rows, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b] + n)
        if cq[b + 1] == cq[b] or n == 0:
            continue
        leaves = [t[None].detach().requires_grad_() for t in (q[rows], k[keys], v[keys])]
        out = warpattn.flash_attn_func(*leaves, causal=causal)
        g = torch.autograd.grad(out, leaves, dout[rows][None])
        dq[rows], dk[keys], dv[keys] = (x[0] for x in g)
    return dq, dk, dv


@gpu
@has_backward
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hkv", [4, 1])
def test_gradients_against_the_dense_backward(dtype, d, causal, hkv):
    lengths = [(1, 1), (0, 30), (30, 0), (129, 129), (333, 1027), (1027, 333), (2049, 2049), (64, 64)]
    q, k, v, cu_q, cu_k = make_batch(lengths, 4, hkv, d, getattr(torch, dtype), seed=d + causal)
    dout = torch.randn_like(q)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = warpattn.flash_attn_varlen_func(*leaves, cu_q, cu_k, 2049, 2049, causal=causal)
    grads = torch.autograd.grad(out, leaves, dout)
    want = dense_gradients(q, k, v, cu_q, cu_k, dout, causal)
    for name, g, w in zip(("dq", "dk", "dv"), grads, want):
        assert not g.isnan().any(), name
        assert rel_l2(g, w) <= BWD_TOL[dtype], (name, rel_l2(g, w))
    # query rows that see no key (sequence 2) and keys no query sees (sequence 1) get zero gradients
    assert torch.all(grads[0][1:31] == 0)
    assert torch.all(grads[1][1:31] == 0) and torch.all(grads[2][1:31] == 0)


@gpu
@has_backward
@pytest.mark.gpu
def test_gradients_with_seqused_k_and_deterministic():
    lengths = [(50, 300), (1, 1), (20, 0), (129, 1000)]
    q, k, v, cu_q, cu_k = make_batch(lengths, 8, 2, 128, torch.bfloat16, capacity=32, seed=31)
    used = torch.tensor([b for _, b in lengths], device="cuda", dtype=torch.int32)
    dout = torch.randn_like(q)

    def grads(deterministic):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = warpattn.flash_attn_varlen_func(*leaves, cu_q, cu_k, 129, 1032, causal=True, seqused_k=used,
                                              deterministic=deterministic)
        return torch.autograd.grad(out, leaves, dout)
    got = grads(True)
    assert all(torch.equal(a, b) for a, b in zip(got, grads(True)))
    want = dense_gradients(q, k, v, cu_q, cu_k, dout, True, seqused=used)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert rel_l2(g, w) <= BWD_TOL["bfloat16"], (name, rel_l2(g, w))
    unused = torch.ones(k.shape[0], dtype=torch.bool, device="cuda")
    ck = cu_k.tolist()
    for b, n in enumerate(used.tolist()):
        unused[ck[b]:ck[b] + n] = False
    assert torch.all(got[1][unused] == 0) and torch.all(got[2][unused] == 0)


@gpu
@has_backward
@pytest.mark.gpu
def test_training_step_under_compile_and_graph_capture():
    q, k, v, cu_q, cu_k = make_batch([(300, 300), (1, 1), (700, 900)], 8, 2, 64, torch.bfloat16, seed=41)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]

    def loss(q, k, v):
        return warpattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 700, 900, causal=True).float().square().sum()
    torch.compile(loss, fullgraph=True)(*leaves).backward()
    eager = [t.detach().requires_grad_() for t in (q, k, v)]
    loss(*eager).backward()
    for a, b in zip(leaves, eager):
        assert rel_l2(a.grad, b.grad.float()) <= 1e-2
    # the backward captured in a CUDA graph (its workspace from PyTorch's allocator)
    static = [t.detach().requires_grad_() for t in (q, k, v)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        loss(*static).backward()  # warm-up
    torch.cuda.current_stream().wait_stream(side)
    for t in static:
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss(*static).backward()
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(static, eager):
        assert rel_l2(a.grad, b.grad.float()) <= 1e-2


# ------------------------------------------------------------------- padded head dims

# Any multiple of 8 from 8 to 512 runs packed as dense: in the d = 64, 128, 256 or 512 kernel with
# the missing columns zero-filled (192: MLA's kernel). The smallest, one in each kernel's range,
# the largest below 256, and above it (forward only) 264 and 512.
PADDED_HEAD_DIMS = [8, 80, 96, 192, 248, 264, 512]
# MODEL_RAGGED without its 2049-token sequence: the float64 references run on the host.
PADDED_RAGGED = [(0, 0), (1, 1), (0, 37), (37, 0), (1, 700), (700, 1), (129, 129), (333, 1027), (1027, 333), (64, 64)]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("d", PADDED_HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
def test_padded_head_dims_ragged_batch(dtype, d, causal):
    # Against the dense kernel per sequence (the same padded kernel) and the fp32 reference, whose
    # scale is 1/sqrt of the real head dim.
    rng = np.random.default_rng(d * 5 + causal)
    lengths = [RAGGED[i] for i in rng.permutation(len(RAGGED))]
    q, k, v, cu_q, cu_k = make_batch(lengths, 8, 2, d, getattr(torch, dtype), seed=d + causal)
    max_q, max_k = max(a for a, _ in lengths), max(b for _, b in lengths)
    out, lse = warpattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, return_lse=True)
    assert out.shape == q.shape
    check_sequences(q, k, v, cu_q, cu_k, out, lse, causal)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("d", [40, 80, 200])
@pytest.mark.parametrize("case", sorted(VARLEN_MODEL_CASES))
def test_padded_head_dims_model_options_against_fp64(d, case, attention_reference):
    q, k, v, cu_q, cu_k = make_batch(PADDED_RAGGED, 8, 2, d, torch.bfloat16, seed=d + len(case))
    options = model_options(case, 8)
    out, lse = warpattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 1027, 1027, return_lse=True, **options)
    check_model_sequences(q, k, v, cu_q, cu_k, out, lse, options, attention_reference)


@gpu
@has_backward
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("d", [8, 80, 200, 248])
@pytest.mark.parametrize("causal", [False, True])
def test_padded_head_dims_gradients_against_the_dense_backward(dtype, d, causal):
    lengths = [(1, 1), (0, 30), (30, 0), (129, 129), (333, 1027), (1027, 333), (64, 64)]
    q, k, v, cu_q, cu_k = make_batch(lengths, 4, 2, d, getattr(torch, dtype), seed=d + causal)
    dout = torch.randn_like(q)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = warpattn.flash_attn_varlen_func(*leaves, cu_q, cu_k, 1027, 1027, causal=causal)
    grads = torch.autograd.grad(out, leaves, dout)
    want = dense_gradients(q, k, v, cu_q, cu_k, dout, causal)
    for name, g, w in zip(("dq", "dk", "dv"), grads, want):
        assert g.shape == w.shape and not g.isnan().any(), name
        assert rel_l2(g, w) <= BWD_TOL[dtype], (name, rel_l2(g, w))
    assert torch.all(grads[0][1:31] == 0)  # sequence 2's rows see no key
    assert torch.all(grads[1][1:31] == 0) and torch.all(grads[2][1:31] == 0)  # sequence 1's keys no query


# A padded head dim in each kernel's range with options its backward has: no softcap at 40.
PADDED_GRAD_CASES = {
    40: dict(causal=True, window_size=(64, 0), sinks=True),
    80: dict(causal=True, window_size=(96, -1), softcap=30.0, sinks=True),
    200: dict(softcap=5.0, sinks=True, softmax_scale=0.1),
}


@gpu
@has_backward
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("d", sorted(PADDED_GRAD_CASES))
@pytest.mark.parametrize("deterministic", [False, True])
def test_padded_head_dims_gradients_against_fp64(dtype, d, deterministic, attention_reference_grads):
    lengths = [(300, 300), (1, 1), (0, 30), (400, 129), (129, 700)]
    options = dict(PADDED_GRAD_CASES[d])
    if options.pop("sinks", False):
        options["sinks"] = torch.linspace(-2.0, 8.0, 8, device="cuda")
    q, k, v, cu_q, cu_k = make_batch(lengths, 8, 2, d, getattr(torch, dtype), seed=d + deterministic)
    dout = torch.randn_like(q)
    got = model_varlen_grads(q, k, v, cu_q, cu_k, dout, (400, 700), options, deterministic=deterministic)
    if deterministic:
        again = model_varlen_grads(q, k, v, cu_q, cu_k, dout, (400, 700), options, deterministic=True)
        for name, a, b in zip(("dq", "dk", "dv", "dsinks"), got, again):
            assert torch.equal(a, b), name
    check_model_grads(got, model_reference_grads(q, k, v, cu_q, cu_k, dout, options, attention_reference_grads),
                      dtype)



@gpu
@has_backward
@pytest.mark.gpu
@pytest.mark.parametrize("d,dv", [(192, 128), (160, 96), (128, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_value_head_dim_against_fp64(d, dv, causal, attention_reference, attention_reference_grads):
    # v's head dim apart from q and k's (MLA's prefill 192/128) on a packed batch: out and the
    # gradients per sequence against the float64 reference (and the dense kernel's forward).
    lengths = [(300, 300), (1, 1), (0, 30), (400, 129), (129, 700)]
    q, k, _, cu_q, cu_k = make_batch(lengths, 8, 2, d, torch.bfloat16, seed=d + dv + causal)
    v = torch.randn(k.shape[0], 2, dv, device="cuda", dtype=torch.bfloat16)
    options = dict(causal=causal)
    out, lse = warpattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 400, 700, return_lse=True, **options)
    assert out.shape == (q.shape[0], 8, dv)
    check_model_sequences(q, k, v, cu_q, cu_k, out, lse, options, attention_reference)
    dout = torch.randn(q.shape[0], 8, dv, device="cuda", dtype=torch.bfloat16)
    got = model_varlen_grads(q, k, v, cu_q, cu_k, dout, (400, 700), options)
    check_model_grads(got, model_reference_grads(q, k, v, cu_q, cu_k, dout, options, attention_reference_grads),
                      "bfloat16")

# ------------------------------------------------------------------- FP8 on packed batches

@gpu
@pytest.mark.parametrize("qk_dtype", ["e4m3", "int8"])
@pytest.mark.parametrize("causal", [False, True])
def test_fp8_varlen_equals_fp8_per_sequence(qk_dtype, causal):
    """quantize_fp8_varlen + flash_attn_fp8_varlen_func against quantize_fp8 + flash_attn_fp8_func
    on each sequence alone: the same operands (blocks start at each sequence's first row in
    both), so the outputs agree to the dense kernel's own tile-shape differences (rel L2 within
    the bf16 tolerance; bitwise where the tiles coincide, checked by the C++ suite)."""
    torch.manual_seed(3)
    lengths = [(300, 300), (1, 200), (129, 1000), (0, 50), (700, 0), (1000, 1000)]
    sq, sk = [a for a, _ in lengths], [b for _, b in lengths]
    h, hkv, d = 8, 2, 128
    q = torch.randn(sum(sq), h, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(sk), hkv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    cu_q = torch.tensor([0] + np.cumsum(sq).tolist(), device="cuda", dtype=torch.int32)
    cu_k = torch.tensor([0] + np.cumsum(sk).tolist(), device="cuda", dtype=torch.int32)
    ops = warpattn.quantize_fp8_varlen(q, k, v, cu_q, cu_k, qk_dtype=qk_dtype, seed=5)
    assert ops.vt.shape == (hkv, d, warpattn.fp8_varlen_rows(sum(sk), len(lengths)))
    out = warpattn.flash_attn_fp8_varlen_func(ops, cu_q, cu_k, max(sq), max(sk), causal=causal)
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b, (lq, lk) in enumerate(lengths):
        if lq == 0:
            continue
        rows = slice(cq[b], cq[b + 1])
        if lk == 0:
            assert torch.all(out[rows] == 0), "a sequence without keys gives 0"
            continue
        dense = warpattn.quantize_fp8(q[None, rows], k[None, ck[b]:ck[b + 1]], v[None, ck[b]:ck[b + 1]],
                                      qk_dtype=qk_dtype, seed=5)
        assert torch.equal(dense.q[0].view(torch.uint8), ops.q[rows].view(torch.uint8)), "Q codes per sequence"
        want = warpattn.flash_attn_fp8_func(dense, causal=causal)[0]
        err = rel_l2(out[rows], want)
        assert err <= tol(q.dtype), "sequence %d: rel L2 %.2e against the dense FP8 kernel" % (b, err)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("qk_dtype", ["e4m3", "int8"])
def test_fp8_varlen_model_options_equal_fp8_per_sequence(qk_dtype):
    """A window and sinks on packed FP8 (softcap is refused): each sequence against the dense FP8
    kernel with the same options on that sequence alone, as test_fp8_varlen_equals_fp8_per_sequence."""
    torch.manual_seed(4)
    lengths = [(300, 300), (1, 200), (129, 1000), (700, 0), (1000, 1000)]
    sq, sk = [a for a, _ in lengths], [b for _, b in lengths]
    h, hkv, d = 8, 2, 128
    q = torch.randn(sum(sq), h, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(sk), hkv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    cu_q = torch.tensor([0] + np.cumsum(sq).tolist(), device="cuda", dtype=torch.int32)
    cu_k = torch.tensor([0] + np.cumsum(sk).tolist(), device="cuda", dtype=torch.int32)
    sinks = torch.linspace(-2.0, 8.0, h, device="cuda")
    options = dict(causal=True, window_size=(200, 0), sinks=sinks)
    ops = warpattn.quantize_fp8_varlen(q, k, v, cu_q, cu_k, qk_dtype=qk_dtype, seed=5)
    out, lse = warpattn.flash_attn_fp8_varlen_func(ops, cu_q, cu_k, max(sq), max(sk), return_lse=True, **options)
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b, (lq, lk) in enumerate(lengths):
        rows = slice(cq[b], cq[b + 1])
        if lk == 0:  # no key: 0, and lse each head's sink
            assert torch.all(out[rows] == 0)
            assert torch.allclose(lse[:, rows], sinks[:, None].expand(h, lq), rtol=0, atol=1e-4)
            continue
        dense = warpattn.quantize_fp8(q[None, rows], k[None, ck[b]:ck[b + 1]], v[None, ck[b]:ck[b + 1]],
                                      qk_dtype=qk_dtype, seed=5)
        want, want_lse = warpattn.flash_attn_fp8_func(dense, return_lse=True, **options)
        err = rel_l2(out[rows], want[0])
        assert err <= tol(q.dtype), "sequence %d: rel L2 %.2e against the dense FP8 kernel" % (b, err)
        assert (lse[:, rows] - want_lse[0]).abs().max().item() <= 1e-4, b
    with pytest.raises(ValueError, match="options.softcap: forward_fp8 has no softcap"):
        warpattn.flash_attn_fp8_varlen_func(ops, cu_q, cu_k, max(sq), max(sk), softcap=5.0)
