#!/usr/bin/env python3
"""warpattn inside jax.jit (warpattn.jax_ffi, XLA FFI calls on XLA's stream) beside cuDNN's
attention through jax.nn.dot_product_attention(implementation="cudnn"), on the same arrays, in
one process. GPU only.

    python -m warpattn.bench_jax --out bench-jax.json [--passes 5] [--n 512 2048 8192] [--d 64 128 256]

The sweep: BF16, B*N = 16384 tokens, N in --n, d in --d, causal and not, 16 query and key/value
heads, and a GQA point (--gqa, 32 query heads over 8 key/value heads, at --gqa-at's N and d).
Two modes per point: "fwd", the jitted forward; "fwd+bwd", the jitted forward and backward of
q, k, v (jax.vjp with a fixed cotangent: what jax.grad runs, without a loss's own ops, which at
the small shapes would be timed too).

Timing: a pass of one jitted function is a warm-up (--warmup calls, waited for), then a loop of
calls with one block_until_ready at the end; its time per call is the loop's wall time over the
calls (so XLA's dispatch of each call counts, the same for both sides; the loop is long enough,
about --loop-ms, for the GPU never to wait on it but at the smallest shapes). Passes of every
function of a point are interleaved (warpattn fwd, cuDNN fwd, warpattn fwd+bwd, ..., again),
--passes times, and the median is reported, since the power-capped H200 moves a few percent
between passes. TFLOP/s: 4*N*N*d*H*B FLOPs per forward (halved for causal), times 2.5 for
forward+backward. Each point also gives warpattn's relative L2 difference from cuDNN's out (a
sanity check; accuracy is the tests' job).
"""
import argparse
import json
import math
import statistics
import sys
import time

TOTAL_TOKENS = 16384
HEADS = 16
FWD_BWD_FACTOR = 2.5


def gpu_or_exit():
    """JAX and warpattn.jax_ffi on a GPU, or an exit with the reason: the benchmark times GPU
    kernels and means nothing elsewhere."""
    try:
        import jax
    except ImportError:
        sys.exit("bench_jax: JAX is not installed (pip install jax[cuda12] or the host's build)")
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        sys.exit("bench_jax: runs on a GPU only, and JAX sees none (its devices: %s); nothing was timed"
                 % ", ".join(sorted({d.platform for d in jax.devices()})))
    from warpattn import jax_ffi
    if not jax_ffi.available():
        sys.exit("bench_jax: this build of warpattn has no XLA FFI handlers (warpattn.jax_ffi.available() is "
                 "False): reinstall it with jax importable at build time (pip install --no-build-isolation .)")
    capability = str(getattr(gpus[0], "compute_capability", "9.0"))
    if capability not in ("9.0", "90"):
        sys.exit("bench_jax: warpattn needs an sm_90 GPU, found compute capability %s" % capability)
    return jax, jax_ffi, gpus[0]


def points(args):
    """(N, d, heads_q, heads_kv, causal) of the sweep, GQA points last."""
    out = []
    for n in args.n:
        for d in args.d:
            for causal in args.causal:
                out.append((n, d, HEADS, HEADS, bool(causal)))
    if args.gqa:
        hq, hkv = (int(x) for x in args.gqa.split("/"))
        n, d = args.gqa_at
        for causal in args.causal:
            out.append((n, d, hq, hkv, bool(causal)))
    return out


def functions(jax, jax_ffi, causal):
    """{(implementation, mode): f(q, k, v, dout)}, each to be jitted. The same layout on both sides
    (batch, seqlen, heads, head_dim); cuDNN's is_causal is top-left, which for N = N is ours."""
    def warpattn(q, k, v):
        return jax_ffi.flash_attn(q, k, v, causal=causal)

    def cudnn(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn")

    def forward(attn):
        return lambda q, k, v, dout: attn(q, k, v)

    def forward_backward(attn):
        def run(q, k, v, dout):
            out, pull = jax.vjp(attn, q, k, v)
            return pull(dout.astype(out.dtype))
        return run
    return {("warpattn", "fwd"): forward(warpattn), ("cudnn", "fwd"): forward(cudnn),
            ("warpattn", "fwd+bwd"): forward_backward(warpattn), ("cudnn", "fwd+bwd"): forward_backward(cudnn)}


def timed_pass(jax, fn, args, warmup, calls):
    """Seconds per call: warm-up calls (waited for), then `calls` calls and one wait."""
    for _ in range(warmup):
        out = fn(*args)
    jax.block_until_ready(out)
    start = time.perf_counter()
    for _ in range(calls):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / calls


def calls_for(jax, fn, args, loop_ms):
    """Calls in a timed loop of about loop_ms, from one call waited for (at least 5)."""
    jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    once = time.perf_counter() - start
    return max(5, min(2000, int(math.ceil(loop_ms * 1e-3 / max(once, 1e-6)))))


def rel_l2(a, b):
    import numpy as np
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def run_point(jax, jax_ffi, point, args):
    import jax.numpy as jnp
    n, d, hq, hkv, causal = point
    b = TOTAL_TOKENS // n
    keys = jax.random.split(jax.random.PRNGKey(n + d + hq + causal), 4)
    q = jax.random.normal(keys[0], (b, n, hq, d), jnp.float32).astype(jnp.bfloat16)
    k = jax.random.normal(keys[1], (b, n, hkv, d), jnp.float32).astype(jnp.bfloat16)
    v = jax.random.normal(keys[2], (b, n, hkv, d), jnp.float32).astype(jnp.bfloat16)
    dout = jax.random.normal(keys[3], (b, n, hq, d), jnp.float32).astype(jnp.bfloat16)
    inputs = (q, k, v, dout)
    forward_flops = 4.0 * n * n * d * hq * b / (2 if causal else 1)
    jitted, calls, errors = {}, {}, {}
    for key, fn in functions(jax, jax_ffi, causal).items():
        try:
            jitted[key] = jax.jit(fn)
            calls[key] = calls_for(jax, jitted[key], inputs, args.loop_ms)  # compiles, and sizes the loop
        except Exception as e:  # cuDNN may not take a shape (its head dims, its version): reported, not fatal
            errors[key] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:300] if str(e) else "")
            jitted.pop(key, None)
    times = {key: [] for key in jitted}
    for _ in range(args.passes):
        for key, fn in jitted.items():
            times[key].append(timed_pass(jax, fn, inputs, args.warmup, calls[key]))
    check = None
    if ("warpattn", "fwd") in jitted and ("cudnn", "fwd") in jitted:
        check = rel_l2(jitted[("warpattn", "fwd")](*inputs), jitted[("cudnn", "fwd")](*inputs))
    rows = []
    for mode in ("fwd", "fwd+bwd"):
        flops = forward_flops * (FWD_BWD_FACTOR if mode == "fwd+bwd" else 1.0)
        row = {"N": n, "d": d, "B": b, "heads_q": hq, "heads_kv": hkv, "causal": causal, "mode": mode,
               "flops": flops, "out_rel_l2_vs_cudnn": check}
        for impl in ("warpattn", "cudnn"):
            key = (impl, mode)
            if key in times:
                median = statistics.median(times[key])
                row[impl] = {"ms": median * 1e3, "tflops": flops / median / 1e12, "calls_per_pass": calls[key],
                             "ms_per_pass": [t * 1e3 for t in times[key]]}
            else:
                row[impl] = {"error": errors.get(key, "not run")}
        rows.append(row)
    return rows


def format_row(row):
    def cell(r):
        return "%8.3f %7.1f" % (r["ms"], r["tflops"]) if "ms" in r else "%16s" % "n/a"
    w, c = row["warpattn"], row["cudnn"]
    ratio = "%6.3f" % (w["tflops"] / c["tflops"]) if "ms" in w and "ms" in c else "   n/a"
    heads = "%d/%d" % (row["heads_q"], row["heads_kv"])
    check = "%.1e" % row["out_rel_l2_vs_cudnn"] if row["out_rel_l2_vs_cudnn"] is not None else "n/a"
    return "%5d %4d %3d %6s %-6s %-7s %s %s  %s  %s" % (row["N"], row["d"], row["B"], heads,
                                                      "causal" if row["causal"] else "full", row["mode"], cell(w),
                                                      cell(c), ratio, check)


HEADER = ("    N    d   B  heads mask   mode    warpattn ms  TF/s  cuDNN ms   TF/s  ratio  out vs cuDNN\n" +
          "-" * 94)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the JSON file to write")
    p.add_argument("--n", type=int, nargs="+", default=[512, 2048, 8192], help="sequence lengths (B = 16384 / N)")
    p.add_argument("--d", type=int, nargs="+", default=[64, 128, 256], help="head dims")
    p.add_argument("--causal", type=int, nargs="+", default=[0, 1], choices=[0, 1])
    p.add_argument("--gqa", default="32/8", help="query/key-value heads of the GQA point ('' for none)")
    p.add_argument("--gqa-at", type=int, nargs=2, default=[2048, 128], metavar=("N", "D"))
    p.add_argument("--passes", type=int, default=5, help="interleaved timed passes; the median is reported")
    p.add_argument("--warmup", type=int, default=3, help="calls before each timed loop")
    p.add_argument("--loop-ms", type=float, default=100.0, help="about how long each timed loop runs")
    args = p.parse_args(argv)
    if any(TOTAL_TOKENS % n for n in args.n):
        p.error("--n: each N must divide %d" % TOTAL_TOKENS)

    jax, jax_ffi, gpu = gpu_or_exit()
    print("bench_jax: jax %s on %s; BF16, %d tokens; median of %d passes" % (
        jax.__version__, gpu.device_kind, TOTAL_TOKENS, args.passes), flush=True)
    print(HEADER, flush=True)
    rows = []
    for point in points(args):
        for row in run_point(jax, jax_ffi, point, args):
            rows.append(row)
            print(format_row(row), flush=True)
            for impl in ("warpattn", "cudnn"):
                if "error" in row[impl] and row["mode"] == "fwd":
                    print("      %s unavailable: %s" % (impl, row[impl]["error"]), flush=True)
    result = {"jax": jax.__version__, "device": gpu.device_kind, "dtype": "bfloat16", "total_tokens": TOTAL_TOKENS,
              "passes": args.passes, "warmup": args.warmup, "loop_ms": args.loop_ms,
              "flops": "4*N*N*d*heads_q*B per forward, halved for causal; x%.1f for fwd+bwd" % FWD_BWD_FACTOR,
              "timing": "per call: a loop of jitted calls with one block_until_ready, over the calls",
              "rows": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print("bench_jax: wrote %s" % args.out, flush=True)


if __name__ == "__main__":
    main()
