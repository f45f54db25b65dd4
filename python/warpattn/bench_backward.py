#!/usr/bin/env python3
"""Side-by-side backward benchmark: warpattn's backward beside cuDNN's and FlashAttention-2's
(through PyTorch SDPA), one process, the same tensors.

    python -m warpattn.bench --backward --out docs/perf [--deterministic]   # the installed package
    python3 python/warpattn/bench_backward.py --lib build/libwarpattn.so [--passes 3] [--json PATH]

What is timed: for the SDPA backends, torch.autograd.grad of the output (their pre- and
post-processing kernels count); for warpattn, one backward() call (its preprocess, main kernel
and dQ conversion), with the workspace allocated once outside the timing, as PyTorch's caching
allocator gives it in training. Then forward + backward (unless --backward-only): SDPA's forward
on leaves that require grad and torch.autograd.grad of it; warpattn's forward (out and lse)
then its backward. FLOPs: 2.5x the forward's (4·B·H·N²·d, halved for causal) for the backward,
3.5x for forward + backward. The GEMM ceiling of the same run (torch.matmul 8192³) is printed,
recorded and drawn; the SM clock and board power while each library's backward was timed are
printed and recorded (NVML's means; the card is power-capped). The sweep is the anchors'
(docs/perf/anchors.md): 16384 tokens, H·d = 2048, d 64 / 128 / 256, N 1024 / 4096 / 16384,
causal and not; --out writes bench-backward-<date>.json, .md (a table) and .png (TFLOP/s
against N). Each point is
timed in `--passes` interleaved passes (warpattn, cuDNN, FA2, warpattn, ...) and the median is
reported, since the power-capped H200 moves ±5% between passes. warpattn's gradients are
compared with cuDNN's (relative L2) as a sanity check; accuracy proper is the tests' job.
--fa3 DIR adds FlashAttention-3 (its flash_attn_interface in DIR, e.g. .fa3/hopper built by
../shared/fa3's build.sh with FA3_PROFILE=backward, scripts/fa3_profiles.sh) beside them, timed
as SDPA's backends are (torch.autograd.grad of its flash_attn_func's output). --untimed NAME runs
one library's backward a few times untimed (warpattn or fa3: for ncu or compute-sanitizer).
"""
import argparse
import ctypes
import json
import statistics
import sys

try:  # as a module of the installed package, or as a script beside bench.py (--lib builds)
    from warpattn.bench import (ClockSampler, WarpattnTensor, describe, gemm_rate, kernel_trace, load_warpattn,
                                make_timer, sdpa_inputs)
except ImportError:
    from bench import (ClockSampler, WarpattnTensor, describe, gemm_rate, kernel_trace, load_warpattn, make_timer,
                       sdpa_inputs)

TOTAL_TOKENS, HIDDEN = 16384, 2048


def load_backward(lib):
    ptr = ctypes.POINTER(WarpattnTensor)
    fn = lib.warpattn_backward
    fn.argtypes = [ptr] * 9 + [ctypes.c_int, ctypes.c_float, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                               ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    fn.restype = ctypes.c_int
    ws = lib.warpattn_backward_workspace_bytes
    ws.argtypes = [ptr, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_size_t), ctypes.c_char_p, ctypes.c_size_t]
    ws.restype = ctypes.c_int
    return fn, ws


def warpattn_backward_call(lib, torch, dtype, tensors, causal, deterministic):
    """A zero-argument launcher of warpattn_backward on (dout, q, k, v, out, lse, dq, dk, dv)."""
    fn, ws_fn = load_backward(lib)
    descs = [describe(t, "float32" if t.dtype == torch.float32 else dtype) for t in tensors]
    refs = [ctypes.byref(d) for d in descs]
    err = ctypes.create_string_buffer(2048)
    size = ctypes.c_size_t(0)
    if ws_fn(refs[1], int(causal), int(deterministic), ctypes.byref(size), err, len(err)) != 0:
        raise RuntimeError(err.value.decode())
    workspace = torch.empty(max(size.value, 1), dtype=torch.uint8, device="cuda")
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    def launch():
        rc = fn(*refs, 0, 0.0, int(causal), int(deterministic), ctypes.c_void_p(workspace.data_ptr()),
                size.value, stream, err, len(err))
        if rc != 0:
            raise RuntimeError("warpattn_backward returned %d: %s" % (rc, err.value.decode(errors="replace")))

    launch.keepalive = (descs, refs, workspace, stream, err)
    return launch


def fa3_backward(torch, fa3, q, k, v, dout, causal, deterministic):
    """FlashAttention-3's backward on q, k, v (B, N, H, d): (the backward alone, forward +
    backward, its gradients), through torch.autograd.grad of flash_attn_func's output, as SDPA's
    backends are timed."""
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]

    def forward():
        o = fa3.flash_attn_func(*leaves, causal=causal, deterministic=deterministic)
        return o[0] if isinstance(o, tuple) else o

    o = forward()
    grads = torch.autograd.grad(o, leaves, dout, retain_graph=True)

    def run():
        torch.autograd.grad(o, leaves, dout, retain_graph=True)

    def run_both():
        torch.autograd.grad(forward(), leaves, dout)

    return run, run_both, grads  # (B, N, H, d): q's layout


def default_lib():
    """The installed package's libwarpattn.so (what `python -m warpattn.bench --backward` times)."""
    import os
    import warpattn
    return os.path.join(os.path.dirname(warpattn.__file__), "libwarpattn.so")


def markdown(env, gemm, method, rows, args):
    """The record as a table: backward TFLOP/s (deterministic in brackets) and forward + backward."""
    det = "deterministic" if args.deterministic else None
    fa3 = any("fa3" in r["tflops"] for r in rows)
    lines = ["# warpattn backward vs cuDNN, FlashAttention-2%s — %s" % (" and FlashAttention-3" if fa3 else "", env["date"]),
             "",
             "%s on %s (%s SMs, power limit %s), commit %s, torch %s, cuDNN %s. %s, %d tokens a point, "
             "H·d = %d; %d interleaved passes, medians (%s). TFLOP/s: the backward 2.5x the forward's FLOPs, "
             "forward + backward 3.5x. GEMM ceiling of the same run: torch.matmul %s 8192³ %.1f TFLOP/s."
             % (args.dtype, env["card"], env["sms"], env["power_limit"], env["commit"], env["torch"], env["cudnn"],
                "SDPA's backends%s through torch.autograd.grad; warpattn's backward() through the C ABI"
                % (" and FlashAttention-3's flash_attn_func" if fa3 else ""),
                TOTAL_TOKENS, HIDDEN, args.passes, method, args.dtype, gemm), ""]
    head = "| d | N | causal | warpattn%s | cuDNN | FA2 |%s warpattn/cuDNN |" % (" (%s)" % det if det else "",
                                                                           " FA3 | warpattn/FA3 |" if fa3 else "")
    rule = "|---|---|---|---|---|---|---|" + ("---|---|" if fa3 else "")
    if rows and rows[0].get("tflops_fwd_bwd"):
        head += " fwd+bwd: warpattn | cuDNN | FA2 | warpattn/cuDNN |"
        rule += "---|---|---|---|"
    lines += [head, rule]
    cell = lambda t, k: "%.1f" % t[k] if k in t else "n/a"
    for r in rows:
        t, f = r["tflops"], r.get("tflops_fwd_bwd") or {}
        w = cell(t, "warpattn") + (" (%s)" % cell(t, "warpattn_det") if det else "")
        line = "| %d | %d | %s | %s | %s | %s |%s %s |" % (
            r["d"], r["N"], "yes" if r["causal"] else "no", w, cell(t, "cudnn"), cell(t, "fa2"),
            " %s | %s |" % (cell(t, "fa3"), ratio_text(t, "fa3")) if fa3 else "", ratio_text(t))
        if f:
            line += " %s | %s | %s | %s |" % (cell(f, "warpattn"), cell(f, "cudnn"), cell(f, "fa2"), ratio_text(f))
        lines.append(line)
    return "\n".join(lines) + "\n"


def ratio_text(t, peer="cudnn"):
    return "%.3f" % (t["warpattn"] / t[peer]) if t.get(peer) and "warpattn" in t else "n/a"


def plot(result, path):
    """TFLOP/s against N, a panel per (d, causal), a line per library (solid: backward; dotted:
    forward + backward), the in-run GEMM rate as a reference line. False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return False
    rows = result["rows"]
    ds = sorted({r["d"] for r in rows})
    fig, axes = plt.subplots(2, len(ds), figsize=(5 * len(ds), 8), squeeze=False)
    styles = {"warpattn": "o", "warpattn_det": "x", "cudnn": "s", "fa2": "^", "fa3": "D", "fa3_det": "+"}
    for col, d in enumerate(ds):
        for line, causal in enumerate((False, True)):
            ax = axes[line][col]
            pts = sorted((r for r in rows if r["d"] == d and r["causal"] == causal), key=lambda r: r["N"])
            for key, ls in (("tflops", "-"), ("tflops_fwd_bwd", ":")):
                for impl, marker in styles.items():
                    xy = [(r["N"], r[key][impl]) for r in pts if impl in (r.get(key) or {})]
                    if xy:
                        ax.plot([x for x, _ in xy], [y for _, y in xy], marker + ls,
                                label=impl + (" fwd+bwd" if key != "tflops" else ""))
            ax.axhline(result["gemm_tflops"], color="gray", lw=0.8, ls="-.", label="GEMM (torch.matmul 8192³)")
            ax.set_xscale("log", base=2)
            ax.set_title("d=%d, %s" % (d, "causal" if causal else "non-causal"))
            ax.set_xlabel("sequence length N (%d tokens, H·d = %d)" % (TOTAL_TOKENS, HIDDEN))
            ax.set_ylabel("TFLOP/s")
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
    axes[0][0].legend(loc="lower right", fontsize=7)
    fig.suptitle("%s backward on %s, %s (commit %s)" % (result["dtype"], result["card"], result["date"],
                                                        result["commit"]))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", default=None, help="libwarpattn.so of a CMake build (C ABI; default: the installed package's)")
    p.add_argument("--d", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--n", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--causal", type=int, nargs="+", default=[0, 1])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--deterministic", action="store_true", help="also time warpattn's deterministic mode")
    p.add_argument("--backward-only", action="store_true", help="skip the forward + backward columns")
    p.add_argument("--peers", nargs="*", default=["cudnn", "fa2"], choices=["cudnn", "fa2"],
                   help="SDPA's backends to time beside warpattn (an A/B of warpattn's variants: cudnn alone, "
                        "whose gradients the check compares against)")
    p.add_argument("--json", default=None, help="write the record here (default: with --out only)")
    p.add_argument("--out", default=None, help="folder for bench-backward-<date>.json, .md and .png")
    p.add_argument("--commit", default=None, help="git commit to record (default: git rev-parse)")
    p.add_argument("--breakdown", action="store_true",
                   help="also each library's kernels at each point (torch.profiler's CUDA trace, L2 flushed)")
    p.add_argument("--warpattn-only", action="store_true", help="the same as --untimed warpattn")
    p.add_argument("--untimed", default=None, choices=["warpattn", "fa3"],
                   help="run this library's backward alone, a few times, untimed (for ncu / compute-sanitizer)")
    p.add_argument("--fa3", default=None, metavar="DIR",
                   help="also FlashAttention-3: the folder holding its flash_attn_interface (e.g. .fa3/hopper)")
    p.add_argument("--sustained", type=float, default=0.0, metavar="SECONDS",
                   help="also each library's backward back to back for SECONDS (no L2 flush), twice, interleaved, "
                        "with the card's clock and power from nvidia-smi: TFLOP/s per GHz tells a slower clock "
                        "under the power cap from less work a cycle (bench_clocks.sustained)")
    args = p.parse_args(argv)
    if args.lib is None:
        args.lib = default_lib()
    if args.warpattn_only:
        args.untimed = "warpattn"
    fa3 = None
    if args.fa3:
        import os
        sys.path.insert(0, os.path.abspath(args.fa3))
        import flash_attn_interface as fa3  # an error here is the caller's: --fa3 was asked for
    if args.untimed == "fa3" and fa3 is None:
        p.error("--untimed fa3 needs --fa3 DIR")

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    lib = load_warpattn(args.lib)
    timer, method = make_timer(torch, 25, 100)
    dt = getattr(torch, args.dtype)
    gemm = None if args.untimed else gemm_rate(torch, timer, args.dtype)[0]
    if gemm is not None:
        print("torch.matmul %s 8192^3: %.1f TFLOP/s" % (args.dtype, gemm), flush=True)
    rows = []
    for d in args.d:
        for n in args.n:
            for causal in map(bool, args.causal):
                B, H = TOTAL_TOKENS // n, HIDDEN // d
                forward_flops = 4.0 * B * H * n * n * d / (2 if causal else 1)
                flops = 2.5 * forward_flops
                torch.manual_seed(0)
                q, k, v, dout = (torch.randn(B, n, H, d, device="cuda", dtype=dt) for _ in range(4))
                out = torch.empty_like(q)
                lse = torch.empty(B, H, n, device="cuda", dtype=torch.float32)
                dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                fwd = lib.warpattn_forward
                err = ctypes.create_string_buffer(1024)
                descs = [describe(t, args.dtype) for t in (q, k, v, out)] + [describe(lse, "float32")]

                def forward(descs=descs, causal=causal, err=err):
                    if fwd(*[ctypes.byref(x) for x in descs], 0, 0.0, int(causal),
                           ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), err, len(err)) != 0:
                        raise RuntimeError(err.value.decode())

                forward()
                launches = {"warpattn": warpattn_backward_call(lib, torch, args.dtype,
                                                               (dout, q, k, v, out, lse, dq, dk, dv), causal, False)}
                if args.deterministic:
                    launches["warpattn_det"] = warpattn_backward_call(
                        lib, torch, args.dtype, (dout, q, k, v, out, lse, dq, dk, dv), causal, True)
                both = {}  # forward + backward
                if not args.backward_only:
                    both["warpattn"] = lambda bwd=launches["warpattn"], forward=forward: (forward(), bwd())
                grads = {}
                if fa3 is not None:
                    for name, det in (("fa3", False), ("fa3_det", True)):
                        if det and not args.deterministic:
                            continue
                        try:
                            run, run_both, grads[name] = fa3_backward(torch, fa3, q, k, v, dout, causal, det)
                        except RuntimeError as e:  # (e.g. no deterministic mode at d = 256)
                            print("  %s unavailable at d=%d N=%d: %s" % (name, d, n, str(e)[:200]), file=sys.stderr)
                            continue
                        launches[name] = run
                        if not args.backward_only:
                            both[name] = run_both
                if args.untimed:
                    for _ in range(3):
                        launches[args.untimed]()
                    torch.cuda.synchronize()
                    continue
                for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
                    if name not in args.peers:
                        continue
                    try:
                        inputs, _, _ = sdpa_inputs(torch, backend, q, k, v, causal)
                        leaves = [x.detach().requires_grad_() for x in inputs]
                        with sdpa_kernel([backend]):
                            o = F.scaled_dot_product_attention(*leaves, is_causal=causal)
                        g = dout.transpose(1, 2)
                        grads[name] = torch.autograd.grad(o, leaves, g, retain_graph=True)

                        def run(o=o, leaves=leaves, g=g):
                            torch.autograd.grad(o, leaves, g, retain_graph=True)

                        def run_both(leaves=leaves, g=g, backend=backend):
                            with sdpa_kernel([backend]):
                                o_ = F.scaled_dot_product_attention(*leaves, is_causal=causal)
                            torch.autograd.grad(o_, leaves, g)

                        launches[name] = run
                        if not args.backward_only:
                            both[name] = run_both
                    except RuntimeError as e:
                        print("  %s unavailable at d=%d N=%d: %s" % (name, d, n, str(e)[:200]), file=sys.stderr)
                if args.breakdown:
                    for name, fn in launches.items():
                        per_kernel, span = kernel_trace(torch, fn)
                        print("  %s: a call's kernels span %.1f us: %s" % (name, span, "; ".join(
                            "%.1f %s" % (t, k_) for k_, t in sorted(per_kernel.items(), key=lambda kv: -kv[1]))),
                              flush=True)
                if args.sustained > 0:
                    try:
                        from warpattn.bench_clocks import sustained
                    except ImportError:
                        from bench_clocks import sustained
                    loops = sustained(torch, {name: (flops, fn) for name, fn in launches.items()}, args.sustained,
                                      rounds=2)
                    for r in loops:
                        print("      sustained %s %6.1f TFLOP/s at %4.0f MHz %3.0f W: %5.1f TFLOP/s per GHz (reasons %s)"
                              % (r["workload"], r["tflops"], r["sm_mhz"], r["power_w"], r["tflops_per_ghz"],
                                 r["throttle"]), flush=True)
                    sustained_rows = loops
                times = {name: [] for name in launches}
                times_both = {name: [] for name in both}
                clocks = {name: [] for name in launches}  # (MHz, W) while each backward was timed
                for _ in range(args.passes):
                    for name, fn in launches.items():
                        with ClockSampler(torch) as sampler:
                            times[name].append(timer(fn))
                        if sampler.mhz is not None:
                            clocks[name].append((sampler.mhz, sampler.watts))
                    for name, fn in both.items():
                        times_both[name].append(timer(fn))
                launches["warpattn"]()
                torch.cuda.synchronize()
                check = ""
                if "cudnn" in grads:
                    ref = [x.transpose(1, 2).float() for x in grads["cudnn"]]
                    rel = [((a.float() - b).norm() / b.norm()).item() for a, b in zip((dq, dk, dv), ref)]
                    check = "vs cuDNN rel L2 dq %.1e dk %.1e dv %.1e" % tuple(rel)
                    if "fa3" in grads:  # the peer's own sanity check
                        rel = [((a.float() - b).norm() / b.norm()).item() for a, b in zip(grads["fa3"], ref)]  # (B, N, H, d)
                        check += " (fa3 %.1e %.1e %.1e)" % tuple(rel)
                row = {"d": d, "N": n, "B": B, "H": H, "causal": causal,
                       "tflops": {k_: flops / (statistics.median(t) * 1e-3) / 1e12 for k_, t in times.items()},
                       "check": check}
                if all(clocks.values()):
                    row["clock_mhz"] = {k_: statistics.median(c for c, _ in v) for k_, v in clocks.items()}
                    row["power_w"] = {k_: statistics.median(w for _, w in v) for k_, v in clocks.items()}
                if args.sustained > 0:
                    row["sustained"] = sustained_rows
                if times_both:
                    row["tflops_fwd_bwd"] = {k_: 3.5 * forward_flops / (statistics.median(t) * 1e-3) / 1e12
                                             for k_, t in times_both.items()}
                rows.append(row)
                cells = "  ".join("%s %6.1f" % (k_, v_) for k_, v_ in row["tflops"].items())
                print("d=%-3d N=%-5d %-6s %s  warpattn/cuDNN %s  %s" % (d, n, "causal" if causal else "full", cells,
                                                                        ratio_text(row["tflops"]), check), flush=True)
                if "clock_mhz" in row:
                    print("      while timed: %s" % "  ".join(
                        "%s %.0f MHz %.0f W" % (k_, row["clock_mhz"][k_], row["power_w"][k_]) for k_ in row["clock_mhz"]),
                          flush=True)
                if times_both:
                    print("      forward + backward: %s  warpattn/cuDNN %s" % ("  ".join(
                        "%s %6.1f" % kv for kv in row["tflops_fwd_bwd"].items()), ratio_text(row["tflops_fwd_bwd"])),
                          flush=True)
                del launches, grads, both
    print("timer:", method)
    if args.untimed:
        return 0
    try:
        from warpattn.bench import environment
    except ImportError:
        from bench import environment
    env = environment(torch, args)
    result = dict(env, method=method, dtype=args.dtype, passes=args.passes, gemm_tflops=gemm,
                  sweep={"total_tokens": TOTAL_TOKENS, "H_times_d": HIDDEN}, rows=rows)
    paths = []
    if args.out:
        import os
        os.makedirs(args.out, exist_ok=True)
        stem = os.path.join(args.out, "bench-backward-%s" % env["date"])
        with open(stem + ".md", "w") as f:
            f.write(markdown(env, gemm, method, rows, args))
        paths.append(stem + ".md")
        if plot(result, stem + ".png"):
            paths.append(stem + ".png")
        args.json = args.json or stem + ".json"
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        paths.append(args.json)
    for path in paths:
        print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
