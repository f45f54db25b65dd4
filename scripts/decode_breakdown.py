"""Where a decode step's time goes (issue 16): each kernel of flash_attn_with_kvcache (the Q
quantisation, the attention, the splits' combine) and the gaps between them, from the CUDA
trace of torch.profiler, for the BF16 and the E4M3 cache at a few of bench_decode's points;
and optionally, with forced split counts beside the default's, a call's GPU span (the trace) and
its do_bench time (bench.make_timer, L2 flushed before each call; host-bound at small steps).
Run on the GPU host after `pip install .`:
    python3 scripts/decode_breakdown.py [--points b8_4k b1_64k ...] [--splits 1 2 4 8 16 32] [--cudnn]
--cudnn traces cuDNN through SDPA on the same tensors too (bench_decode's sdpa_runner): its
kernels and span beside ours, to see where its lead comes from. --loop times 200 calls back to
back (no flush between them, one synchronisation: a decode loop's steady state, where a call's
launch can overlap the previous call's tail), per call, for each traced library. --clean-flush
traces each a second time after a flush that leaves the L2 full of clean lines (and the forced
splits after it only). --launch-config prints each traced kernel's launch (grid, block, registers,
shared memory, blocks a SM) from the profiler's exported trace: cuDNN's among them.
--calls-only N calls each N times and nothing else, for ncu (its replays flush and invalidate the
L2: each kernel alone from a clean one).
"""
import argparse

import torch
import warpattn
from warpattn.bench import host_us_per_call, kernel_trace, make_timer
from warpattn.bench_decode import sdpa_runner

POINTS = {"b8_4k": dict(B=8, S=4096), "b1_64k": dict(B=1, S=65536), "b64_4k": dict(B=64, S=4096),
          "b2_16k": dict(B=2, S=16384), "b8_16k_q16": dict(B=8, S=16384, Sq=16)}


def caches(B, S, Hkv=8, d=128):
    k = torch.randn(B, S, Hkv, d, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(B, S, Hkv, d, dtype=torch.bfloat16, device="cuda")
    return k, v


def step(q, cache, lens, num_splits, out):
    k, v, f8 = cache
    if f8 is None:
        return lambda: warpattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, num_splits=num_splits, out=out)
    return lambda: warpattn.flash_attn_with_kvcache(q, f8.k_cache, f8.v_cache, cache_seqlens=lens,
                                                    k_descale=f8.k_descale, v_descale=f8.v_descale,
                                                    num_splits=num_splits, out=out)


def launch_configs(fn):
    """Each kernel of one call of fn (its first 60 characters): the launch as the profiler's
    chrome trace records it (its args, less the bookkeeping ones)."""
    import json
    import os
    import tempfile
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f).get("traceEvents", [])
    finally:
        os.remove(path)
    skip = {"device", "stream", "correlation", "external id", "context", "queued", "cbid"}
    return {e["name"][:60]: {k: v for k, v in e.get("args", {}).items() if k not in skip}
            for e in events if e.get("cat") == "kernel"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", nargs="+", default=list(POINTS))
    # (bench.make_timer times each call alone: at the small points it can be bound by the host's
    # ~40 us a call, not the GPU's; the traces above are the GPU's own)
    ap.add_argument("--splits", nargs="*", type=int, default=[])
    ap.add_argument("--cudnn", action="store_true", help="trace cuDNN through SDPA on the same tensors too")
    ap.add_argument("--loop", action="store_true", help="also time 200 back-to-back calls of each, per call")
    ap.add_argument("--launch-config", action="store_true", help="print each traced kernel's launch")
    ap.add_argument("--clean-flush", action="store_true",
                    help="also trace each after a flush that leaves the L2 clean (bench.kernel_trace's clean)")
    ap.add_argument("--kinds", nargs="+", default=["bf16", "e4m3"], help="the caches to trace: bf16, e4m3")
    ap.add_argument("--calls-only", type=int, default=0, metavar="N",
                    help="only call each traced implementation N times, nothing else (under ncu)")
    args = ap.parse_args()
    timer, _ = make_timer(torch, 25, 100, clean_l2=args.clean_flush)
    torch.manual_seed(0)
    for name in args.points:
        p = POINTS[name]
        B, S = p["B"], p["S"]
        k, v = caches(B, S)
        q = torch.randn(B, p.get("Sq", 1), 32, 128, dtype=torch.bfloat16, device="cuda")
        lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
        out = torch.empty_like(q)
        kinds = {}
        if "bf16" in args.kinds:
            kinds["bf16"] = (k, v, None)
        if "e4m3" in args.kinds:
            kinds["e4m3"] = (k, v, warpattn.quantize_kvcache_fp8(k, v))
        traced = {kind: step(q, cache, lens, 0, out) for kind, cache in kinds.items()}
        if args.cudnn:
            from torch.nn.attention import SDPBackend
            traced["cudnn"] = sdpa_runner(torch, SDPBackend.CUDNN_ATTENTION, q, k, v)[0]
        if args.calls_only:
            for kind, fn in traced.items():
                for _ in range(args.calls_only):
                    fn()
            torch.cuda.synchronize()
            continue
        for kind, fn in traced.items():
            for clean in (False, True) if args.clean_flush else (False,):
                timeline = {}
                per_kernel, span = kernel_trace(torch, fn, clean=clean, timeline=timeline)
                print("%s %s%s: a call's kernels span %.1f us (median of 20)" % (
                    name, kind, " (clean L2)" if clean else "", span))
                for n, t in sorted(per_kernel.items(), key=lambda x: -x[1]):
                    # (from / to: us after the flush's last kernel ended; a programmatic
                    # dependent may start before it)
                    print("    %7.1f us  from %6.1f to %6.1f  %s" % (t, *timeline[n], n))
            if args.launch_config:
                for n, launch in launch_configs(fn).items():
                    print("    launch %s: %s" % (n, launch))
        if args.loop:  # (bench.host_us_per_call: at these shapes the GPU, not the host, sets the pace)
            per_call = host_us_per_call(torch, traced, calls=200)
            print("%s back to back, us a call (200 calls, median of 5 passes): %s" % (
                name, "  ".join("%s %.1f" % kv for kv in per_call.items())))
        for kind, cache in kinds.items() if args.splits else ():
            # The GPU's span of a call (the trace), and do_bench's time (host-bound where small).
            row, bench = [], []
            for n in [0] + args.splits:
                label = "default" if n == 0 else "s%d" % n
                per_kernel, span = kernel_trace(torch, step(q, cache, lens, n, out), clean=args.clean_flush)
                attention = max((t for name_, t in per_kernel.items() if "attention" in name_), default=0.0)
                row.append("%s %.1f (attention %.1f)" % (label, span, attention))
                bench.append("%s %.1f" % (label, 1e3 * timer(step(q, cache, lens, n, out))))
            print("%s %s GPU span us by num_splits: %s" % (name, kind, "  ".join(row)))
            print("%s %s do_bench us by num_splits: %s" % (name, kind, "  ".join(bench)))
        del k, v, kinds
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
