"""Issue 19's head-dim points: d = 96 and MLA's 192/128 (q and k 192, v 128) beside the compiled
sizes that run them (d = 128 and 256) and beside cuDNN and FlashAttention-2 through SDPA on the
same tensors. BF16, 16384 tokens, H x d = 2048 (MLA: 16 heads), causal and not, N 4096 and
16384. TFLOP/s over the real dims (2 B H N^2 (d + dv), halved causal); the median of triton's
do_bench, PASSES interleaved passes; each ratio is the median of the passes' ratios. warpattn's
output is checked against cuDNN's (rel L2) so that a fast wrong answer cannot pass.

    python3 scripts/bench_head_dims.py [--json PATH]
"""
import json
import statistics
import sys
import warnings

import torch
import torch.nn.functional as F
import triton
import warpattn
from torch.nn.attention import SDPBackend, sdpa_kernel

TOKENS, PASSES = 16384, 3
# (label, d of q and k, dv, heads)
POINTS = [("d=96", 96, 96, 2048 // 96), ("d=128", 128, 128, 16), ("mla 192/128", 192, 128, 16),
          ("d=256", 256, 256, 8)]


def tflops(B, H, N, d, dv, causal, ms):
    return 2.0 * B * H * N * N * (d + dv) / (2 if causal else 1) / (ms * 1e-3) / 1e12


def sdpa(backend, q, k, v, causal):
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def run():
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = run()  # raises where the backend refuses the shape
    torch.cuda.synchronize()
    return run, out.transpose(1, 2)


def main():
    rows = []
    for N in (4096, 16384):
        for causal in (False, True):
            for label, d, dv, H in POINTS:
                B = TOKENS // N
                q = torch.randn(B, N, H, d, dtype=torch.bfloat16, device="cuda")
                k = torch.randn(B, N, H, d, dtype=torch.bfloat16, device="cuda")
                v = torch.randn(B, N, H, dv, dtype=torch.bfloat16, device="cuda")
                out = q.new_empty(B, N, H, dv)
                runs, notes = {"warpattn": lambda: warpattn.flash_attn_func(q, k, v, causal=causal, out=out)}, {}
                reference = None
                for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
                    try:
                        runs[name], ref = sdpa(backend, q, k, v, causal)
                        reference = ref if reference is None else reference
                    except RuntimeError as e:
                        notes[name] = str(e).splitlines()[0][:120]
                runs["warpattn"]()
                torch.cuda.synchronize()
                err = ((out.float() - reference.float()).norm() / reference.float().norm()).item() \
                    if reference is not None else None
                passes = {name: [] for name in runs}
                for _ in range(PASSES):
                    for name, fn in runs.items():
                        ms = triton.testing.do_bench(fn, warmup=25, rep=100)
                        passes[name].append(tflops(B, H, N, d, dv, causal, ms))
                row = dict(point=label, N=N, causal=causal, rel_l2_vs_sdpa=err, refused=notes,
                           tflops={name: statistics.median(ts) for name, ts in passes.items()})
                for peer in ("cudnn", "fa2"):
                    if peer in passes:
                        row["warpattn_over_" + peer] = statistics.median(
                            a / b for a, b in zip(passes["warpattn"], passes[peer]))
                rows.append(row)
                print("N=%d %-6s %-12s warpattn %6.1f  %s  rel L2 %s%s" % (
                    N, "causal" if causal else "full", label, row["tflops"]["warpattn"],
                    "  ".join("%s %6.1f (x%.3f)" % (p, row["tflops"][p], row["warpattn_over_" + p])
                              for p in ("cudnn", "fa2") if p in passes),
                    "%.1e" % err if err is not None else "-",
                    "" if not notes else "  refused: " + "; ".join("%s: %s" % kv for kv in notes.items())), flush=True)
    if "--json" in sys.argv:
        with open(sys.argv[sys.argv.index("--json") + 1], "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
