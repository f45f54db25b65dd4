#!/usr/bin/env python3
"""Side-by-side backward benchmark: warpattn's backward beside cuDNN's and FlashAttention-2's
(through PyTorch SDPA), one process, the same tensors.

    python3 python/warpattn/bench_backward.py --lib build/libwarpattn.so [--passes 3] [--json PATH]

What is timed: for the SDPA backends, torch.autograd.grad of the output (their pre- and
post-processing kernels count); for warpattn, one backward() call (its preprocess, main kernel
and dQ conversion), with the workspace allocated once outside the timing, as PyTorch's caching
allocator gives it in training. FLOPs: 2.5x the forward's (4·B·H·N²·d, halved for causal).
The sweep is the anchors' (docs/perf/anchors.md): 16384 tokens, H·d = 2048. Each point is
timed in `--passes` interleaved passes (warpattn, cuDNN, FA2, warpattn, ...) and the median is
reported, since the power-capped H200 moves ±5% between passes. warpattn's gradients are
compared with cuDNN's (relative L2) as a sanity check; accuracy proper is the tests' job.
"""
import argparse
import ctypes
import json
import statistics
import sys

try:  # as a module of the installed package, or as a script beside bench.py (--lib builds)
    from warpattn.bench import WarpattnTensor, describe, kernel_trace, load_warpattn, make_timer, sdpa_inputs
except ImportError:
    from bench import WarpattnTensor, describe, kernel_trace, load_warpattn, make_timer, sdpa_inputs

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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", required=True, help="libwarpattn.so of a CMake build (C ABI)")
    p.add_argument("--d", type=int, nargs="+", default=[64, 128])
    p.add_argument("--n", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--causal", type=int, nargs="+", default=[0, 1])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--deterministic", action="store_true", help="also time warpattn's deterministic mode")
    p.add_argument("--json", default=None)
    p.add_argument("--breakdown", action="store_true",
                   help="also each library's kernels at each point (torch.profiler's CUDA trace, L2 flushed)")
    p.add_argument("--warpattn-only", action="store_true",
                   help="run warpattn's backward alone, a few times, untimed (for ncu / compute-sanitizer)")
    args = p.parse_args(argv)

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    lib = load_warpattn(args.lib)
    timer, method = make_timer(torch, 25, 100)
    dt = getattr(torch, args.dtype)
    rows = []
    for d in args.d:
        for n in args.n:
            for causal in map(bool, args.causal):
                B, H = TOTAL_TOKENS // n, HIDDEN // d
                flops = 2.5 * 4.0 * B * H * n * n * d / (2 if causal else 1)
                torch.manual_seed(0)
                q, k, v, dout = (torch.randn(B, n, H, d, device="cuda", dtype=dt) for _ in range(4))
                out = torch.empty_like(q)
                lse = torch.empty(B, H, n, device="cuda", dtype=torch.float32)
                dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                fwd = lib.warpattn_forward
                err = ctypes.create_string_buffer(1024)
                descs = [describe(t, args.dtype) for t in (q, k, v, out)] + [describe(lse, "float32")]
                if fwd(*[ctypes.byref(x) for x in descs], 0, 0.0, int(causal),
                       ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), err, len(err)) != 0:
                    raise RuntimeError(err.value.decode())
                launches = {"warpattn": warpattn_backward_call(lib, torch, args.dtype,
                                                               (dout, q, k, v, out, lse, dq, dk, dv), causal, False)}
                if args.deterministic:
                    launches["warpattn_det"] = warpattn_backward_call(
                        lib, torch, args.dtype, (dout, q, k, v, out, lse, dq, dk, dv), causal, True)
                if args.warpattn_only:
                    for _ in range(3):
                        launches["warpattn"]()
                    torch.cuda.synchronize()
                    continue
                grads = {}
                for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
                    try:
                        inputs, _, _ = sdpa_inputs(torch, backend, q, k, v, causal)
                        leaves = [x.detach().requires_grad_() for x in inputs]
                        with sdpa_kernel([backend]):
                            o = F.scaled_dot_product_attention(*leaves, is_causal=causal)
                        g = dout.transpose(1, 2)
                        grads[name] = torch.autograd.grad(o, leaves, g, retain_graph=True)

                        def run(o=o, leaves=leaves, g=g):
                            torch.autograd.grad(o, leaves, g, retain_graph=True)

                        launches[name] = run
                    except RuntimeError as e:
                        print("  %s unavailable at d=%d N=%d: %s" % (name, d, n, str(e)[:200]), file=sys.stderr)
                if args.breakdown:
                    for name, fn in launches.items():
                        per_kernel, span = kernel_trace(torch, fn)
                        print("  %s: a call's kernels span %.1f us: %s" % (name, span, "; ".join(
                            "%.1f %s" % (t, k_) for k_, t in sorted(per_kernel.items(), key=lambda kv: -kv[1]))),
                              flush=True)
                times = {name: [] for name in launches}
                for _ in range(args.passes):
                    for name, fn in launches.items():
                        times[name].append(timer(fn))
                launches["warpattn"]()
                torch.cuda.synchronize()
                check = ""
                if "cudnn" in grads:
                    ref = [x.transpose(1, 2).float() for x in grads["cudnn"]]
                    rel = [((a.float() - b).norm() / b.norm()).item() for a, b in zip((dq, dk, dv), ref)]
                    check = "vs cuDNN rel L2 dq %.1e dk %.1e dv %.1e" % tuple(rel)
                row = {"d": d, "N": n, "B": B, "H": H, "causal": causal,
                       "tflops": {k_: flops / (statistics.median(t) * 1e-3) / 1e12 for k_, t in times.items()},
                       "check": check}
                rows.append(row)
                cells = "  ".join("%s %6.1f" % (k_, v_) for k_, v_ in row["tflops"].items())
                ratio = row["tflops"]["warpattn"] / max(row["tflops"].get("cudnn", float("nan")), 1e-9)
                print("d=%-3d N=%-5d %-6s %s  warpattn/cuDNN %.3f  %s" % (d, n, "causal" if causal else "full", cells,
                                                                          ratio, check), flush=True)
                del launches, grads
    print("timer:", method)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"method": method, "dtype": args.dtype, "passes": args.passes, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
