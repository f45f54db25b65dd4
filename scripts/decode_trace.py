"""A decode step's timeline from inside its kernels (issue 16): built with WARPATTN_TRACE_KV=1
(decode/kv_trace.cuh; scripts/ab_local.sh builds it as a package: VARIANTS="trace=-DWARPATTN_TRACE_KV=1"),
each CTA of the attention kernel and of the splits' combine stamps the global timer at a few
points; this script hands the kernels a buffer ($WARPATTN_KV_TRACE_PTR), calls after a flush
(the usual bitwise-not, then the clean one: a read of another 256 MB) and prints, in us after
the first CTA's first instruction, each stamp's earliest / median / latest over the CTAs
(the median of --calls calls):
    PYTHONPATH=<trace package> python3 scripts/decode_trace.py [--points b8_4k b1_64k]
What it separates: the prologue before the first load and before Q arrives, the stream, the
CTAs' spread at the end (the slowest SM's share), the combine's wait and its own time.
"""
import argparse
import os
import statistics

import torch
from decode_breakdown import POINTS, caches, step

import warpattn

SLOTS, CTAS, COMBINE_CTAS = 16, 256, 1024
STAMPS = [("entry", 0), ("ready (waited)", 1), ("first tile known", 10), ("first K issued", 2),
          ("next tile published", 3),
          ("Q arrived", 5), ("last V issued", 4), ("consumer 0 done", 6), ("consumer 1 done", 7)]


def one_call(fn, trace, flush, reread):
    trace.zero_()
    flush.bitwise_not_()
    if reread is not None:
        reread.amax()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    torch.cuda.synchronize()
    t = trace.cpu().tolist()
    ctas = [t[c * SLOTS:(c + 1) * SLOTS] for c in range(CTAS) if t[c * SLOTS] != 0]
    base = CTAS * SLOTS
    combine = [t[base + c * 4:base + c * 4 + 4] for c in range(COMBINE_CTAS) if t[base + c * 4] != 0]
    t0 = min(c[0] for c in ctas)
    row = {}
    for name, s in STAMPS:
        v = sorted((c[s] - t0) / 1e3 for c in ctas if c[s] != 0)
        if v:
            row[name] = (v[0], v[len(v) // 2], v[-1])
    for name, s in (("combine entry", 0), ("combine ready", 1), ("combine loaded", 3), ("combine done", 2)):
        v = sorted((c[s] - t0) / 1e3 for c in combine if c[s] != 0)
        if v:
            row[name] = (v[0], v[len(v) // 2], v[-1])
    row["ctas"] = (len(ctas), len({c[9] for c in ctas}), len(combine))
    row["call (events)"] = (a.elapsed_time(b) * 1e3,) * 3
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", nargs="+", default=["b8_4k", "b1_64k"])
    ap.add_argument("--calls", type=int, default=9)
    ap.add_argument("--fp8", action="store_true", help="the E4M3 cache too")
    args = ap.parse_args()
    trace = torch.zeros(CTAS * SLOTS + COMBINE_CTAS * 4, dtype=torch.int64, device="cuda")
    os.environ["WARPATTN_KV_TRACE_PTR"] = str(trace.data_ptr())
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    reread = torch.zeros_like(flush)
    torch.manual_seed(0)
    for name in args.points:
        p = POINTS[name]
        k, v = caches(p["B"], p["S"])
        q = torch.randn(p["B"], p.get("Sq", 1), 32, 128, dtype=torch.bfloat16, device="cuda")
        lens = torch.full((p["B"],), p["S"], dtype=torch.int32, device="cuda")
        out = torch.empty_like(q)
        kinds = {"bf16": (k, v, None)}
        if args.fp8:
            kinds["e4m3"] = (k, v, warpattn.quantize_kvcache_fp8(k, v))
        for kind, cache in kinds.items():
            fn = step(q, cache, lens, 0, out)
            for _ in range(3):
                fn()
            for flush_name, rr in (("usual flush", None), ("clean flush", reread)):
                rows = [one_call(fn, trace, flush, rr) for _ in range(args.calls)]
                n, sms, nc = rows[0]["ctas"]
                print("%s %s, %s: %d CTAs on %d SMs, %d combine CTAs; us after the first CTA's entry, "
                      "earliest / median / latest CTA (median of %d calls)" % (name, kind, flush_name, n, sms, nc,
                                                                              args.calls))
                for label in [s for s, _ in STAMPS] + ["combine entry", "combine ready", "combine loaded", "combine done",
                                                          "call (events)"]:
                    vals = [r[label] for r in rows if label in r]
                    if vals:
                        print("    %-22s %7.2f %7.2f %7.2f" % (label, *(statistics.median(x[i] for x in vals)
                                                                     for i in range(3))))
        del k, v, kinds
        torch.cuda.empty_cache()
    os.environ.pop("WARPATTN_KV_TRACE_PTR")


if __name__ == "__main__":
    main()
