"""Issue 19's quick speed check (a probe, not the benchmark): warpattn's causal forward with a
sliding window, softcap and sinks beside its own plain causal forward on the same tensors,
TFLOP/s over the work inside the band (4 · keys seen · d per row and head). 16384 tokens,
H · d = 2048, BF16, median of triton's do_bench."""
import torch
import triton
import warpattn

N = 16384
for d in (64, 128, 256):
    h = 2048 // d
    q, k, v = (torch.randn(1, N, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    sinks = torch.randn(h, device="cuda")
    rows = torch.arange(N, device="cuda", dtype=torch.float64)
    for label, opts in [("causal", {}), ("window 4096", dict(window_size=(4095, 0))),
                        ("window 1024", dict(window_size=(1023, 0))), ("window 256", dict(window_size=(255, 0))),
                        ("softcap 30", dict(softcap=30.0)), ("sinks", dict(sinks=sinks))]:
        left = opts.get("window_size", (N, 0))[0]
        keys = torch.minimum(rows + 1, torch.full_like(rows, left + 1)).sum().item()
        ms = triton.testing.do_bench(lambda: warpattn.flash_attn_func(q, k, v, causal=True, **opts),
                                     warmup=25, rep=100, return_mode="median")
        print(f"d={d:3d} {label:12s} {4 * keys * d * h / ms / 1e9:7.1f} TFLOP/s  {ms * 1e3:8.1f} us", flush=True)
