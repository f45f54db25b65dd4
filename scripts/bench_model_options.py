"""Issue 19's speed check: warpattn's causal forward with a sliding window, softcap and sinks beside
its own plain causal forward on the same tensors, and beside FlashAttention-3 where its bundle is
built (.fa3/hopper, FA3_PROFILE=model: scripts/fa3_profiles.sh) on the same tensors and
options (FA3 has no sinks), and beside cuDNN's causal attention with its sliding window through
the cuDNN frontend where that wheel is installed (scripts/cudnn_band.py; causal and windows:
cuDNN has no softcap or sinks there). TFLOP/s over the work inside the band (4 · keys seen · d
per row and head). 16384 tokens (--n: more lengths; above 16384 only the causal and window rows,
issue 19's windows at 16K-128K), H · d = 2048, BF16, median of triton's do_bench; with a peer, 3
passes alternating them and each ratio as the median of the passes' ratios.

    python3 scripts/bench_model_options.py [--n 16384 65536 131072] [--d 64 256] [--options window256 causal]
                                           [--json PATH]
"""
import argparse
import json
import os
import statistics
import sys

import torch
import triton
import warpattn

PASSES = 3


def fa3_module():
    root = os.path.join(os.getcwd(), ".fa3", "hopper")
    if not os.path.isdir(root):
        root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".fa3", "hopper")
    if not os.path.isdir(root):
        return None
    sys.path.insert(0, os.path.abspath(root))
    try:
        import flash_attn_interface
        return flash_attn_interface
    except Exception as e:  # not built, or built without this profile
        print("FlashAttention-3 not importable (%s: %s): warpattn alone" % (type(e).__name__, e), flush=True)
        return None


def cudnn_runner(q, k, v, opts):
    """cuDNN's run of this point and its output, or None (with the reason printed once)."""
    if "softcap" in opts or "sinks" in opts:
        return None
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        from cudnn_band import cudnn_causal_band
        return cudnn_causal_band(q, k, v, opts.get("window_size", (None, 0))[0])
    except Exception as e:  # the frontend not installed, or cuDNN refusing the graph
        if not getattr(cudnn_runner, "said", False):
            print("cuDNN's sliding window not available (%s: %s)" % (type(e).__name__, str(e)[:200]), flush=True)
            cudnn_runner.said = True
        return None


def rel_l2(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[16384], help="sequence lengths (one sequence each)")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128, 256], help="head dims (default 64 128 256)")
    ap.add_argument("--options", nargs="+", default=None, metavar="LABEL",
                    help="only these points, by label's first word and number (e.g. causal window256 softcap30)")
    args = ap.parse_args()
    fa3 = fa3_module()
    rows_out = []
    for N, d in ((n, d) for n in args.n for d in args.d):
        h = 2048 // d
        q, k, v = (torch.randn(1, N, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        sinks = torch.randn(h, device="cuda")
        rows = torch.arange(N, device="cuda", dtype=torch.float64)
        points = [("causal", {}), ("window 4096", dict(window_size=(4095, 0))),
                  ("window 1024", dict(window_size=(1023, 0))), ("window 256", dict(window_size=(255, 0)))]
        if N <= 16384:
            points += [("softcap 30", dict(softcap=30.0)), ("sinks", dict(sinks=sinks))]
        if args.options is not None:
            points = [(label, opts) for label, opts in points if label.replace(" ", "") in args.options]
        for label, opts in points:
            left = opts.get("window_size", (N, 0))[0]
            keys = torch.minimum(rows + 1, torch.full_like(rows, left + 1)).sum().item()
            flop = 4 * keys * d * h
            ours = lambda: warpattn.flash_attn_func(q, k, v, causal=True, **opts)  # noqa: E731
            theirs = None
            if fa3 is not None and "sinks" not in opts:
                fa3_opts = {key: val for key, val in opts.items()}
                theirs = lambda: fa3.flash_attn_func(q, k, v, causal=True, **fa3_opts)  # noqa: E731
            cudnn_run = cudnn_runner(q, k, v, opts)
            ms_ours, ms_theirs, ms_cudnn = [], [], []
            for _ in range(PASSES if theirs is not None or cudnn_run is not None else 1):
                ms_ours.append(bench(ours))
                if theirs is not None:
                    ms_theirs.append(bench(theirs))
                if cudnn_run is not None:
                    ms_cudnn.append(bench(cudnn_run[0]))
            row = {"n": N, "d": d, "option": label, "warpattn_tflops": flop / statistics.median(ms_ours) / 1e9,
                   "warpattn_us": statistics.median(ms_ours) * 1e3}
            text = f"N={N:6d} d={d:3d} {label:12s} warpattn {row['warpattn_tflops']:7.1f} TFLOP/s {row['warpattn_us']:8.1f} us"
            if theirs is not None:
                ratio = statistics.median(t / o for o, t in zip(ms_ours, ms_theirs))
                row.update(fa3_tflops=flop / statistics.median(ms_theirs) / 1e9, warpattn_over_fa3=ratio)
                text += f"   FA3 {row['fa3_tflops']:7.1f} TFLOP/s   warpattn/FA3 {ratio:.3f}"
            if cudnn_run is not None:
                ratio = statistics.median(t / o for o, t in zip(ms_ours, ms_cudnn))
                # the same band? (a sanity check of the window's convention, not the accuracy test)
                err = rel_l2(cudnn_run[1], ours())
                row.update(cudnn_tflops=flop / statistics.median(ms_cudnn) / 1e9, warpattn_over_cudnn=ratio,
                           cudnn_rel_l2_to_warpattn=err)
                text += f"   cuDNN {row['cudnn_tflops']:7.1f} TFLOP/s   warpattn/cuDNN {ratio:.3f} (rel L2 {err:.1e})"
            print(text, flush=True)
            rows_out.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tokens": args.n, "passes": PASSES, "rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()
