"""FlashAttention-3's own accuracy rule as an outside judge of warpattn (issue 19).

FA3's hopper/test_flash_attn.py (test_flash_attn_output) checks each output against its
reference, `test_util.attention_ref`, computed in fp32 from the same 16-bit inputs, and allows
at most rtol times the error of the same attention computed in the inputs' dtype by PyTorch
(rtol 2, or 3 with a softcap), plus twice the rounding of the output's own magnitude; the same
for dQ, dK and dV (plus 3e-4 with a softcap). This file applies that rule, with FA3's reference
and shapes (its seqlen pairs, batch 9 or 2, 6 heads, MHA/GQA/MQA, random windows drawn as FA3
draws them, softcap 15 with q scaled by softcap / 4), to warpattn's flash_attn_func and its
gradients. FA3's features warpattn does not have (qv, attention_chunk, FP8 descales per head,
value head dims 256/512 beside d <= 64) are left out.

It runs where WARPATTN_FA3_TESTS names FA3's hopper/ folder (the benchmark's bundle: .fa3/hopper;
its test_util needs einops) and a CUDA device is there; skipped with the reason otherwise. FA3's
files are imported, not copied.
"""
import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

FA3_TESTS = os.environ.get("WARPATTN_FA3_TESTS")


def _attention_ref():
    if not FA3_TESTS:
        pytest.skip("WARPATTN_FA3_TESTS is not set (FA3's hopper/ folder, e.g. .fa3/hopper)")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if FA3_TESTS not in sys.path:
        sys.path.insert(0, FA3_TESTS)
    try:
        from test_util import attention_ref
    except ImportError as e:
        pytest.skip("FA3's test_util does not import (%s)" % e)
    return attention_ref


# FA3's test_flash_attn_output seqlen pairs.
SEQLENS = [(1, 1), (64, 128), (128, 192), (256, 256), (239, 1), (799, 3), (113, 203), (113, 128), (128, 217),
           (113, 211), (108, 256), (256, 512), (384, 256), (640, 128), (512, 256), (1024, 1024), (1023, 1024),
           (1024, 1023), (4096, 4096), (4224, 4224)]
# FA3's compiled head dims, with its value head dims where warpattn has them (192/128: MLA's).
HEAD_DIMS = [(64, 64), (96, 96), (128, 128), (192, 192), (192, 128), (256, 256)]


def _max_err(a, b):
    return (a.float() - b.float()).abs().max().item()


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("mha_type", ["mha", "mqa", "gqa"])
@pytest.mark.parametrize("softcap", [0.0, 15.0])
@pytest.mark.parametrize("local", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d,dv", HEAD_DIMS)
@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS)
def test_fa3_output_rule(seqlen_q, seqlen_k, d, dv, causal, local, softcap, mha_type, dtype):
    attention_ref = _attention_ref()
    import warpattn

    dt = torch.bfloat16 if dtype == "bf16" else torch.float16
    device = "cuda"
    torch.random.manual_seed(0)
    batch_size = 9 if seqlen_k <= 2048 else 2
    nheads = 6
    nheads_kv = nheads if mha_type == "mha" else (2 if mha_type == "gqa" else 1)
    q_ref = torch.randn(batch_size, seqlen_q, nheads, d, device=device, dtype=dt)
    if softcap > 0.0:
        q_ref = q_ref * softcap / 4  # (FA3: scores within the softcap's range)
    q_ref = q_ref.requires_grad_()
    k_ref = torch.randn(batch_size, seqlen_k, nheads_kv, d, device=device, dtype=dt).requires_grad_()
    v_ref = torch.randn(batch_size, seqlen_k, nheads_kv, dv, device=device, dtype=dt).requires_grad_()
    window_size = (-1, -1) if not local else tuple(torch.randint(0, seqlen_k, (2,)).tolist())
    if causal and local:
        window_size = (window_size[0], 0)  # FA3's flash_attn_func: causal sets the right side to 0
    out_ref, _ = attention_ref(q_ref, k_ref, v_ref, None, None, causal=causal, window_size=window_size,
                               softcap=softcap)
    out_pt, _ = attention_ref(q_ref, k_ref, v_ref, None, None, causal=causal, window_size=window_size,
                              softcap=softcap, upcast=False, reorder_ops=True)
    fwd_atol = 2 * (out_ref + 0.3 - 0.3 - out_ref).abs().max().item()
    rtol = 2 if softcap == 0.0 else 3

    q, k, v = [x.detach().clone().requires_grad_() for x in (q_ref, k_ref, v_ref)]
    out = warpattn.flash_attn_func(q, k, v, causal=causal, window_size=window_size, softcap=softcap)
    assert not torch.isnan(out).any(), "NaN in the output"
    err, err_pt = _max_err(out, out_ref), _max_err(out_pt, out_ref)
    assert err <= rtol * err_pt + fwd_atol, (
        "out: max error %.3e against FA3's reference, above %g x PyTorch's %.3e + %.3e" % (err, rtol, err_pt, fwd_atol))

    if d not in warpattn.backward_head_dims:
        return
    g = torch.randn_like(out)
    dq, dk, dvv = torch.autograd.grad(out, (q, k, v), g)
    dq_ref, dk_ref, dv_ref = torch.autograd.grad(out_ref, (q_ref, k_ref, v_ref), g, retain_graph=True)
    dq_pt, dk_pt, dv_pt = torch.autograd.grad(out_pt, (q_ref, k_ref, v_ref), g)
    for name, got, ref, pt in (("dq", dq, dq_ref, dq_pt), ("dk", dk, dk_ref, dk_pt), ("dv", dvv, dv_ref, dv_pt)):
        assert not torch.isnan(got).any(), "NaN in " + name
        atol = 2 * (ref + 0.3 - 0.3 - ref).abs().max().item() + (0 if softcap == 0 else 3e-4)
        e, e_pt = _max_err(got, ref), _max_err(pt, ref)
        assert e <= rtol * e_pt + atol, (
            "%s: max error %.3e against FA3's reference, above %g x PyTorch's %.3e + %.3e" % (name, e, rtol, e_pt, atol))
