"""Clocks and power beside throughput: each workload runs back to back for a few seconds while
nvidia-smi samples the card, so a kernel's TFLOP/s can be read per GHz of the clock it really
ran at. On a power-capped card a kernel that draws more gets a lower clock; TFLOP/s per GHz
separates that from scheduling losses.

    python -m warpattn.bench_clocks [--seconds 3] [--d 256] [--N 16384] [--out DIR]

Workloads: the FP8 and BF16 GEMM ceilings (8192³), warpattn's FP8 forward (E4M3 and INT8 Q/K),
its BF16 forward, and cuDNN's BF16 forward, at one (d, N) point with 16384 tokens, H·d = 2048.
"""
import argparse
import json
import os
import subprocess
import sys
import time

try:
    from warpattn.bench import TOTAL_TOKENS, HIDDEN
except ImportError:  # run from the source tree without the package (bench_backward.py --sustained)
    from bench import TOTAL_TOKENS, HIDDEN

GEMM_SIZE = 8192
QUERY = "timestamp,clocks.sm,power.draw,temperature.gpu"
REASONS = "clocks_event_reasons.active"  # the clock limiters as a bit mask (0x4: power cap)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=3.0, help="measured time per workload")
    p.add_argument("--d", type=int, default=256)
    p.add_argument("--N", type=int, default=16384)
    p.add_argument("--causal", type=int, default=0)
    p.add_argument("--out", default=None)
    p.add_argument("--only", default=None, help="comma-separated workload names (e.g. for ncu)")
    return p.parse_args(argv)


def workloads(torch, d, n, causal):
    """(name, FLOP per call, fn) for each workload, on one set of tensors."""
    import warpattn
    from warpattn import _warpattn
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    a8 = torch.randn(GEMM_SIZE, GEMM_SIZE, device="cuda").to(torch.float8_e4m3fn)
    b8 = torch.randn(GEMM_SIZE, GEMM_SIZE, device="cuda").to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    a16 = torch.randn(GEMM_SIZE, GEMM_SIZE, device="cuda", dtype=torch.bfloat16)
    b16 = torch.randn(GEMM_SIZE, GEMM_SIZE, device="cuda", dtype=torch.bfloat16)
    gemm_flop = 2.0 * GEMM_SIZE ** 3

    b, h = TOTAL_TOKENS // n, HIDDEN // d
    q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    attn_flop = 4.0 * b * h * n * n * d / (2 if causal else 1)
    stream = torch.cuda.current_stream().cuda_stream
    ops = warpattn.quantize_fp8(q, k, v)
    ops8 = warpattn.quantize_fp8(q, k, v, qk_dtype=torch.int8)
    out, out8 = torch.empty_like(q), torch.empty_like(q)
    qb, kb, vtb = (t.view(torch.uint8) for t in (ops.q, ops.k, ops.vt))
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))

    def e4m3():
        _warpattn.forward_fp8(qb, kb, vtb, ops.q_descale, ops.k_descale, ops.v_descale, out, None, None,
                              bool(causal), stream, False)

    def int8qk():
        _warpattn.forward_fp8(ops8.q, ops8.k, ops8.vt.view(torch.uint8), ops8.q_descale, ops8.k_descale,
                              ops8.v_descale, out8, None, None, bool(causal), stream, False)

    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal))

    return [
        ("fp8_gemm", gemm_flop, lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)),
        ("bf16_gemm", gemm_flop, lambda: torch.mm(a16, b16)),
        ("fp8_e4m3", attn_flop, e4m3),
        ("fp8_int8qk", attn_flop, int8qk),
        ("bf16_warpattn", attn_flop, lambda: warpattn.flash_attn_func(q, k, v, causal=bool(causal))),
        ("bf16_cudnn", attn_flop, cudnn),
    ]


def run_for(torch, fn, seconds):
    """Calls fn back to back for about `seconds`; returns (calls, milliseconds by CUDA events, t0, t1)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t_probe = time.time()
    fn()
    torch.cuda.synchronize()
    per_call = max(time.time() - t_probe, 1e-5)
    calls = max(int(seconds / per_call), 5)
    t0 = time.time()
    start.record()
    for _ in range(calls):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return calls, start.elapsed_time(stop), t0, time.time()


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")


class SmiLog:
    """nvidia-smi sampling the card every 50 ms into a file while the block runs; samples() then
    gives (time, SM MHz, W, temperature C, clock-event reasons) of each sample."""

    def __init__(self, path="/tmp/bench_clocks_smi.csv"):
        self.path = path

    def __enter__(self):
        query = QUERY + "," + REASONS
        if subprocess.run(["nvidia-smi", "--query-gpu=" + query, "--format=csv"], capture_output=True).returncode:
            query = QUERY + ",clocks_throttle_reasons.active"  # older drivers' name
        self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=" + query, "--format=csv,noheader,nounits",
                                      "-lms", "50"], stdout=open(self.path, "w"), stderr=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc):
        time.sleep(0.2)
        self.proc.terminate()
        self.proc.wait()
        return False

    def samples(self):
        out = []
        for line in open(self.path):
            parts = [x.strip() for x in line.split(",")]
            try:
                ts = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S")) + float(
                    "0." + parts[0].split(".")[1])
                out.append((ts, float(parts[1]), float(parts[2]), float(parts[3]), parts[4]))
            except (ValueError, IndexError):
                continue
        return out


def attach_clocks(rows, samples):
    """Each row's (t0, t1) loop gets the medians of the samples in its middle (its first and last
    10% skipped): sm_mhz, power_w, temp_c, throttle, and tflops_per_ghz."""
    for r in rows:
        span = r["t1"] - r["t0"]
        inside = [s for s in samples if r["t0"] + 0.1 * span <= s[0] <= r["t1"] - 0.1 * span]
        r["sm_mhz"] = median([s[1] for s in inside])
        r["power_w"] = median([s[2] for s in inside])
        r["temp_c"] = median([s[3] for s in inside])
        r["throttle"] = median([s[4] for s in inside]) if inside else ""
        r["samples"] = len(inside)
        r["tflops_per_ghz"] = round(r["tflops"] / (r["sm_mhz"] / 1000.0), 1) if r["sm_mhz"] > 0 else float("nan")


def sustained(torch, fns, seconds, rounds=1, pause=1.0):
    """Each of fns (name -> (FLOP per call, callable)) back to back for `seconds`, the names
    interleaved `rounds` times, a `pause` before each loop for the clock to recover: one row a
    loop with its TFLOP/s and the card's clock and power in it (attach_clocks)."""
    rows = []
    with SmiLog() as smi:
        for _ in range(rounds):
            for name, (flop, fn) in fns.items():
                time.sleep(pause)
                calls, ms, t0, t1 = run_for(torch, fn, seconds)
                rows.append({"workload": name, "tflops": round(flop * calls / (ms * 1e-3) / 1e12, 1),
                             "t0": t0, "t1": t1})
    attach_clocks(rows, smi.samples())
    return rows


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench_clocks: no CUDA device visible to PyTorch")
    with torch.inference_mode():
        fns = {name: (flop, fn) for name, flop, fn in workloads(torch, args.d, args.N, args.causal)
               if not args.only or name in args.only.split(",")}
        rows = sustained(torch, fns, args.seconds)
    for r in rows:
        print(r["workload"], r["tflops"], file=sys.stderr, flush=True)
    if args.only:
        print(json.dumps(rows))
        return 0
    fp8 = next(r for r in rows if r["workload"] == "fp8_gemm")
    bf16 = next(r for r in rows if r["workload"] == "bf16_gemm")
    lines = ["d=%d N=%d causal=%d, %g s per workload; clocks and power: medians of nvidia-smi samples every 50 ms"
             % (args.d, args.N, args.causal, args.seconds), "",
             "| workload | TFLOP/s | SM MHz | power W | temp C | throttle | TFLOP/s per GHz | per GHz / its GEMM's |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ref = bf16 if "bf16" in r["workload"] else fp8
        lines.append("| %s | %.1f | %.0f | %.0f | %.0f | %s | %.1f | %.3f |" % (
            r["workload"], r["tflops"], r["sm_mhz"], r["power_w"], r["temp_c"], r["throttle"],
            r["tflops_per_ghz"], r["tflops_per_ghz"] / ref["tflops_per_ghz"]))
    table = "\n".join(lines) + "\n"
    sys.stdout.write(table)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "clocks-d%d-n%d-c%d.md" % (args.d, args.N, args.causal)), "w") as f:
            f.write(table)
        with open(os.path.join(args.out, "clocks-d%d-n%d-c%d.json" % (args.d, args.N, args.causal)), "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
