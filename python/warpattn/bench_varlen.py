#!/usr/bin/env python3
"""Ragged-batch benchmark (issue 15): warpattn's varlen forward beside its dense kernel,
FlashAttention-2 and cuDNN, one process, the same tensors.

    python -m warpattn.bench --varlen [--passes 3] [--out bench-varlen.json]
    python3 python/warpattn/bench_varlen.py --lib build/libwarpattn.so     # a CMake build (C ABI)

The mixes (self-attention, Sq = Sk per sequence, about 64K tokens each, drawn with a fixed seed):
  uniform   lengths uniform in [1, 8192] up to 65536 tokens;
  longtail  log-normal lengths, median 1024 (sigma 1.5), capped at 32768, up to 65536 tokens;
  onelong   one 32768-token sequence and 256 short ones (uniform in [1, 255]);
  short     lengths uniform in [1, 2047] up to 65536 tokens: none reaches d = 64's tall tiles,
            which the batch-invariant mode takes whatever the lengths (its cost shows here).
Heads: H = 2048 / d (the sweep's H*d), K/V heads as many (--hkv for GQA); BF16 by default.

What each figure is:
  warpattn         flash_attn_varlen_func on the packed (total, H, d) tensors.
  fa2_njt          FlashAttention-2 on the same packed tensors: PyTorch SDPA (flash backend) on
                   nested jagged tensors made from them (offsets and max length given, so no
                   host read in the timed call).
  cudnn_njt        cuDNN on the same nested jagged tensors (SDPA's CUDNN_ATTENTION backend),
                   where this PyTorch supports it.
  cudnn_padded     cuDNN (SDPA's CUDNN_ATTENTION backend) on the dense batch padded to the
                   longest sequence, without a mask: what padding costs (its output is not the
                   ragged one; skipped when the padded batch would not fit, --max-padded-gb).
  warpattn_invariant  with --batch-invariant: the same call with batch_invariant=True (issue 18).
  dense_equiv      warpattn's dense kernel on the dense-equivalent batch: B' = round(T^2 / sum S^2)
                   sequences of T / B' tokens, the same T tokens and (to rounding) the same
                   attention work as the ragged batch.
TFLOP/s are counted over the real tokens only: per sequence 4 * d * H * (query, key) pairs a
query sees (all Sq*Sk, or exactly those under the bottom-right causal mask); the dense batch's
over its own pairs. ragged efficiency = warpattn's varlen TFLOP/s / dense_equiv's TFLOP/s (the
issue's bar: >= 0.9 on every mix).

Timing: bench.make_timer (triton's do_bench, else CUDA events with L2 flushed, warm-up, median
of the repetitions); each point is timed in --passes interleaved passes (warpattn, dense_equiv,
fa2_njt, cudnn_njt, cudnn_padded, warpattn, ...) and the median over passes is reported, since the
power-capped H200 moves +-5% between passes. warpattn's output is compared with FA2's and
cuDNN's on the packed tensors (rel L2) as a sanity check; accuracy proper is the tests' job.
"""
import argparse
import ctypes
import json
import math
import statistics
import sys

try:  # as a module of the installed package, or as a script beside bench.py (--lib builds)
    from warpattn.bench import WarpattnTensor, describe, load_warpattn, make_timer, sdpa_inputs, warpattn_call
except ImportError:
    from bench import WarpattnTensor, describe, load_warpattn, make_timer, sdpa_inputs, warpattn_call

TOTAL_TOKENS, HIDDEN = 65536, 2048
MIXES = ("uniform", "longtail", "onelong", "short")
INVARIANT = "warpattn_invariant"  # --batch-invariant: flash_attn_varlen_func with batch_invariant=True


def mix_lengths(name, seed=0, total=TOTAL_TOKENS):
    """The sequence lengths of a mix (a list of ints, summing to `total` or, for onelong, near it)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    if name == "onelong":
        return [32768] + [int(x) for x in rng.integers(1, 256, 256)]
    lengths, used = [], 0
    while used < total:
        if name == "uniform":
            n = int(rng.integers(1, 8193))
        elif name == "short":
            n = int(rng.integers(1, 2048))
        elif name == "longtail":
            n = int(min(max(round(rng.lognormal(math.log(1024), 1.5)), 1), 32768))
        else:
            raise ValueError("unknown mix %r (expected one of %s)" % (name, ", ".join(MIXES)))
        n = min(n, total - used)  # the last one is cut so that the mix holds exactly `total` tokens
        lengths.append(n)
        used += n
    return lengths


def visible_pairs(sq, sk, causal):
    """(query, key) pairs a query sees: all, or those under the bottom-right causal mask, where
    query i sees keys 0 .. i + sk - sq (so the counts run from sk - sq + 1 up to sk, those <= 0
    counting nothing): sum of j for j = max(sk - sq, 0) + 1 .. sk."""
    if not causal:
        return sq * sk
    a = max(sk - sq, 0)
    return sk * (sk + 1) // 2 - a * (a + 1) // 2


def flops(lengths, h, d, causal):
    return 4.0 * h * d * sum(visible_pairs(n, n, causal) for n in lengths)


def dense_equivalent(lengths):
    """(B', N'): B' = round(T^2 / sum S^2) sequences of N' = T // B' tokens (same T, same work)."""
    t = sum(lengths)
    b = max(1, round(t * t / sum(n * n for n in lengths)))
    return b, t // b


# ---------------------------------------------------------------------------- the launchers

def varlen_call(lib, torch, q, k, v, out, cu, max_len, dtype, causal, batch_invariant=False):
    """A zero-argument launcher of warpattn's varlen forward: the Python extension, or the C
    ABI's warpattn_forward_varlen through ctypes (--lib; the default mode only)."""
    stream = torch.cuda.current_stream().cuda_stream
    if lib is None:
        from warpattn import _warpattn

        def launch_ext():
            _warpattn.forward_varlen(q, k, v, out, None, cu, cu, None, max_len, max_len, None, causal, stream,
                                     batch_invariant)
        return launch_ext
    if batch_invariant:
        raise ValueError("--batch-invariant: through the Python extension only (leave out --lib)")
    fn = lib.warpattn_forward_varlen
    ptr = ctypes.POINTER(WarpattnTensor)
    fn.argtypes = [ptr] * 8 + [ctypes.c_int64, ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_int,
                               ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    fn.restype = ctypes.c_int
    descs = [describe(t, dtype) for t in (q, k, v, out)]
    offsets = describe(cu, "int32")
    refs = [ctypes.byref(x) for x in descs] + [None, ctypes.byref(offsets), ctypes.byref(offsets), None]
    err = ctypes.create_string_buffer(2048)
    c_stream = ctypes.c_void_p(stream)

    def launch():
        rc = fn(*refs, max_len, max_len, 0, 0.0, int(causal), c_stream, err, len(err))
        if rc != 0:
            raise RuntimeError("warpattn_forward_varlen returned %d: %s" % (rc, err.value.decode(errors="replace")))
    launch.keepalive = (descs, offsets, refs, err, c_stream)
    return launch


def njt_call(torch, backend, q, k, v, cu, lengths, causal):
    """(launcher, output as (T, H, d)) of an SDPA backend on nested jagged views of the packed q,
    k, v (the offsets and the longest length given, so that the timed call reads nothing back)."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel
    offsets = cu.to(torch.int64)

    def jagged(t):  # (T, H, d) -> (B, H, j, d), a view of the same values
        return torch.nested.nested_tensor_from_jagged(t, offsets, min_seqlen=min(lengths),
                                                      max_seqlen=max(lengths)).transpose(1, 2)
    nq, nk, nv = jagged(q), jagged(k), jagged(v)

    def run():
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(nq, nk, nv, is_causal=causal)
    out = run().transpose(1, 2).values()
    torch.cuda.synchronize()
    return run, out


def cudnn_padded_call(torch, q, k, v, lengths, causal):
    """Launcher of SDPA's cuDNN backend on the batch padded to the longest sequence (no mask)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    b, s, d = len(lengths), max(lengths), q.shape[2]
    padded = [torch.zeros(b, s, t.shape[1], d, device="cuda", dtype=t.dtype) for t in (q, k, v)]
    start = 0
    for i, n in enumerate(lengths):
        for dst, src in zip(padded, (q, k, v)):
            dst[i, :n] = src[start:start + n]
        start += n
    inputs, _, note = sdpa_inputs(torch, SDPBackend.CUDNN_ATTENTION, *padded, causal)

    def run():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            F.scaled_dot_product_attention(*inputs, is_causal=causal)
    return run, note


# ------------------------------------------------------------------------------------ main

def main(argv=None):
    p = argparse.ArgumentParser(prog="bench_varlen", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", default=None, help="libwarpattn.so of a CMake build (C ABI; default: the package)")
    p.add_argument("--mix", nargs="+", default=list(MIXES), choices=MIXES)
    p.add_argument("--d", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--causal", type=int, nargs="+", default=[0, 1])
    p.add_argument("--hkv", type=int, default=0, help="K/V heads (default: as many as query heads)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--seed", type=int, default=0, help="seed of the mixes' lengths")
    p.add_argument("--max-padded-gb", type=float, default=24.0,
                   help="skip cuDNN's padded batch when its q, k, v and output would take more (default 24)")
    p.add_argument("--warmup-ms", type=float, default=25.0)
    p.add_argument("--rep-ms", type=float, default=200.0)
    p.add_argument("--batch-invariant", action="store_true",
                   help="also time flash_attn_varlen_func's batch_invariant mode on the same tensors (issue 18's "
                        "cost: at most 10%% slower), and check that its timed calls repeat their first call's bits")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    if args.batch_invariant and args.lib:
        p.error("--batch-invariant: through the Python extension only (leave out --lib)")

    import torch
    if not torch.cuda.is_available():
        sys.exit("bench_varlen: no CUDA device visible to PyTorch")
    lib = load_warpattn(args.lib) if args.lib else None
    timer, method = make_timer(torch, args.warmup_ms, args.rep_ms)
    dt = getattr(torch, args.dtype)
    rows = []
    for mix in args.mix:
        lengths = mix_lengths(mix, args.seed)
        total, longest = sum(lengths), max(lengths)
        print("mix %s: %d sequences, %d tokens, longest %d, median %d" % (
            mix, len(lengths), total, longest, int(statistics.median(lengths))), flush=True)
        for d in args.d:
            for causal in map(bool, args.causal):
                h = HIDDEN // d
                hkv = args.hkv or h
                work = flops(lengths, h, d, causal)
                torch.manual_seed(0)
                q = torch.randn(total, h, d, device="cuda", dtype=dt)
                k, v = (torch.randn(total, hkv, d, device="cuda", dtype=dt) for _ in range(2))
                out = torch.empty_like(q)
                cu = torch.tensor([0] + [sum(lengths[:i + 1]) for i in range(len(lengths))], device="cuda",
                                  dtype=torch.int32)
                launches, notes, check = {}, {}, ""
                launches["warpattn"] = varlen_call(lib, torch, q, k, v, out, cu, longest, args.dtype, causal)
                launches["warpattn"]()
                torch.cuda.synchronize()
                if args.batch_invariant:
                    out_inv = torch.empty_like(q)
                    launches[INVARIANT] = varlen_call(lib, torch, q, k, v, out_inv, cu, longest, args.dtype, causal,
                                                      batch_invariant=True)
                    launches[INVARIANT]()
                    torch.cuda.synchronize()
                    first_inv = out_inv.clone()
                b_eq, n_eq = dense_equivalent(lengths)
                dq_, dk_, dv_ = (torch.randn(b_eq, n_eq, x, d, device="cuda", dtype=dt) for x in (h, hkv, hkv))
                d_out = torch.empty_like(dq_)
                launches["dense_equiv"] = warpattn_call(lib, torch, dq_, dk_, dv_, d_out, args.dtype, causal)
                work_eq = 4.0 * h * d * b_eq * visible_pairs(n_eq, n_eq, causal)
                from torch.nn.attention import SDPBackend
                for name, backend in (("fa2_njt", SDPBackend.FLASH_ATTENTION),
                                      ("cudnn_njt", SDPBackend.CUDNN_ATTENTION)):
                    try:
                        launches[name], peer_out = njt_call(torch, backend, q, k, v, cu, lengths, causal)
                        rel = ((out.float() - peer_out.float()).norm() / peer_out.float().norm()).item()
                        check += "vs %s rel L2 %.1e " % (name, rel)
                        del peer_out
                    except (RuntimeError, NotImplementedError) as e:
                        notes[name] = "unavailable: %s" % str(e).strip().splitlines()[0][:200]
                padded_gb = len(lengths) * longest * (2 * h + 2 * hkv) * d * q.element_size() / 2 ** 30
                if padded_gb > args.max_padded_gb:
                    notes["cudnn_padded"] = "skipped: the padded batch takes %.0f GB" % padded_gb
                else:
                    try:
                        launches["cudnn_padded"], notes["cudnn_padded"] = cudnn_padded_call(torch, q, k, v, lengths,
                                                                                            causal)
                    except (RuntimeError, torch.OutOfMemoryError) as e:
                        notes["cudnn_padded"] = "unavailable: %s" % str(e)[:200]
                times = {name: [] for name in launches}
                for _ in range(args.passes):
                    for name, fn in launches.items():
                        times[name].append(timer(fn))
                ms = {name: statistics.median(t) for name, t in times.items()}
                tflops = {name: (work_eq if name == "dense_equiv" else work) / (t * 1e-3) / 1e12
                          for name, t in ms.items()}
                invariant = None
                if args.batch_invariant:
                    # The time ratio as the median of the per-pass ratios (the passes interleave them).
                    ratio = statistics.median(a / b for a, b in zip(times[INVARIANT], times["warpattn"]))
                    invariant = {"time_ratio": ratio, "bits_repeat": bool(torch.equal(out_inv, first_inv)),
                                 "rel_l2_vs_default": ((out_inv.float() - out.float()).norm()
                                                       / out.float().norm()).item()}
                    del out_inv, first_inv
                row = {"mix": mix, "d": d, "H": h, "Hkv": hkv, "causal": causal, "B": len(lengths),
                       "total_tokens": total, "longest": longest, "flops": work,
                       "dense_equiv": {"B": b_eq, "N": n_eq, "flops": work_eq}, "ms": ms, "ms_per_pass": times,
                       "tflops": tflops, "ragged_efficiency": tflops["warpattn"] / tflops["dense_equiv"],
                       "notes": notes, "check": check}
                if invariant is not None:
                    row["batch_invariant"] = invariant
                rows.append(row)
                peers = [n for n in ("fa2_njt", "cudnn_njt", "cudnn_padded") if n in tflops]
                print("  d=%-3d %-6s %s  ragged eff %.3f  (dense-equiv %dx%d)  %s%s" % (
                    d, "causal" if causal else "full",
                    "  ".join("%s %6.1f" % (n, t) for n, t in tflops.items()), row["ragged_efficiency"], b_eq, n_eq,
                    check, "".join("  [%s: %s]" % kv for kv in notes.items() if not kv[1].startswith("transposed"))),
                    flush=True)
                if invariant is not None:
                    print("    batch_invariant: time ratio %.3f over the default, bits %s, rel L2 vs default %.1e" % (
                        invariant["time_ratio"], "repeat" if invariant["bits_repeat"] else "DIFFER",
                        invariant["rel_l2_vs_default"]), flush=True)
                if peers and any(tflops["warpattn"] <= tflops[n] for n in peers):
                    print("    warpattn is not the fastest here", flush=True)
                del launches, q, k, v, out, dq_, dk_, dv_, d_out
                torch.cuda.empty_cache()
    print("timer:", method)
    print("ragged efficiency = warpattn varlen TFLOP/s / warpattn dense TFLOP/s on B' = round(T^2/sum S^2) "
          "sequences of T/B' tokens (same tokens, same work); TFLOP/s over real tokens only")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"method": method, "dtype": args.dtype, "passes": args.passes, "seed": args.seed,
                       "mixes": {m: mix_lengths(m, args.seed) for m in args.mix}, "rows": rows}, f, indent=1)
            f.write("\n")
        print("wrote %s" % args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
