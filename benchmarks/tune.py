#!/usr/bin/env python3
"""Tile-shape and grid experiments: warpattn variants (WARPATTN_TUNE, read by the library on
every call) beside cuDNN, on the same tensors, in one process. Prints one line per point.

    python3 benchmarks/tune.py --lib build/libwarpattn.so --variants "" "tiles" "bn=176" ...
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--variants", nargs="+", default=[""])
    ap.add_argument("--points", default="64:1024,64:16384,128:4096,128:16384,256:2048,256:8192")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--rep-ms", type=float, default=150)
    args = ap.parse_args()
    import torch
    from torch.nn.attention import SDPBackend

    lib = bench.load_warpattn(args.lib)
    timer, _ = bench.make_timer(torch, 25, args.rep_ms)
    dtype = getattr(torch, args.dtype)
    print("%-22s %8s %s" % ("point", "cuDNN", " ".join("%14s" % (v or "default") for v in args.variants)))
    for spec in args.points.split(","):
        d, n = (int(x) for x in spec.split(":"))
        for causal in (False, True):
            p = {"B": 16384 // n, "H": 2048 // d, "N": n, "d": d, "causal": causal}
            q, k, v = (torch.randn(p["B"], n, p["H"], d, device="cuda", dtype=dtype) for _ in range(3))
            out = torch.empty_like(q)
            flops = bench.forward_flops(p)
            inputs, ref, _ = bench.sdpa_inputs(torch, SDPBackend.CUDNN_ATTENTION, q, k, v, causal)
            cudnn = flops / bench.time_sdpa(torch, timer, SDPBackend.CUDNN_ATTENTION, inputs, causal) / 1e9
            cells = []
            for var in args.variants:
                os.environ["WARPATTN_TUNE"] = var
                launch = bench.warpattn_call(lib, torch, q, k, v, out, args.dtype, causal)
                out.fill_(float("nan"))
                launch()
                err = bench.rel_l2(torch, out.transpose(1, 2), ref)
                t = flops / timer(launch) / 1e9
                cells.append("%6.1f (%5.3f)%s" % (t, t / cudnn, "" if err < 1e-2 else " BAD"))
            os.environ.pop("WARPATTN_TUNE", None)
            print("d=%-3d N=%-5d %-7s %8.1f %s" % (d, n, "causal" if causal else "full", cudnn, " ".join(cells)),
                  flush=True)


if __name__ == "__main__":
    main()
