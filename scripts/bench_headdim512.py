"""Head dim 512's forward (issue 19) beside warpattn's d = 256 at the same FLOPs and tokens.

No peer runs d = 512 on Hopper (cuDNN through SDPA and FlashAttention-3 stop at 256), so the
anchor is warpattn's own d = 256 kernel on tensors of the same hidden size (H x d = 2048) and the
same tokens: the same GEMM FLOPs, half the heads. BF16, 16384 tokens, causal and not, N 4096
and 16384; TFLOP/s (4 B H N^2 d, halved causal), the median of triton's do_bench, PASSES
interleaved passes, the ratio as the median of the passes' ratios.

    python3 scripts/bench_headdim512.py [--json PATH]
"""
import json
import statistics
import sys

import torch
import triton
import warpattn

TOKENS, HIDDEN, PASSES = 16384, 2048, 3


def tflops(B, H, N, d, causal, ms):
    return 4.0 * B * H * N * N * d / (2 if causal else 1) / (ms * 1e-3) / 1e12


def main():
    rows = []
    for N in (4096, 16384):
        for causal in (False, True):
            B = TOKENS // N
            runs = {}
            for d in (256, 512):
                H = HIDDEN // d
                q, k, v = (torch.randn(B, N, H, d, dtype=torch.bfloat16, device="cuda") for _ in range(3))
                out = torch.empty_like(q)
                runs[d] = (H, lambda q=q, k=k, v=v, out=out: warpattn.flash_attn_func(q, k, v, causal=causal, out=out))
            passes = {256: [], 512: []}
            for _ in range(PASSES):
                for d, (H, fn) in runs.items():
                    passes[d].append(tflops(B, H, N, d, causal, triton.testing.do_bench(fn, warmup=25, rep=200)))
            ratio = statistics.median(a / b for a, b in zip(passes[512], passes[256]))
            row = dict(N=N, causal=causal, d512_tflops=statistics.median(passes[512]),
                       d256_tflops=statistics.median(passes[256]), d512_over_d256=ratio)
            rows.append(row)
            print("N=%d %s: d=512 %.1f TFLOP/s, d=256 %.1f, ratio %.3f" % (
                N, "causal" if causal else "full", row["d512_tflops"], row["d256_tflops"], ratio), flush=True)
    if "--json" in sys.argv:
        with open(sys.argv[sys.argv.index("--json") + 1], "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
