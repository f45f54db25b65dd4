#!/usr/bin/env python3
"""Side-by-side forward benchmark: warpattn beside cuDNN and FlashAttention-2, one process.

    python -m warpattn.bench [--out docs/perf]                  # the installed package
    python -m warpattn.bench --lib build/libwarpattn.so          # a CMake build, via its C ABI
    python -m warpattn.bench --plot-only docs/perf/bench-<date>.json   # redraw the plots
    python -m warpattn.bench --varlen [...]                      # ragged batches: bench_varlen.py

Why one process and the same tensors: the H200 is power-limited, so absolute TFLOP/s drift
from day to day and even within a run; only figures measured back to back on the same data
compare. For every point, q, k and v are made once (fresh torch.randn, never zeros: zeros draw
less power and flatter every kernel) in the (B, N, H, d) layout; warpattn reads them through
the Python extension (or the C ABI through ctypes with --lib), raw pointers, PyTorch's current
stream; cuDNN and FlashAttention-2 read
q.transpose(1, 2) views of the very same memory through scaled_dot_product_attention. The dense
GEMM rate (torch.matmul, 8192^3) is measured in the same run as the ceiling.

The sweep is the anchors' (docs/perf/anchors.md): 16384 tokens in total, H*d = 2048 (so H = 2048/d, B = 16384/N),
N in 512..16384, d in 64/128/256, causal and not, bf16 and fp16; the source article's
configuration (B=1, H=16, N=16384, d=128) is the sweep's d=128, N=16384 point.

Writes docs/perf/bench-<date>[-<tag>].json, .md and one PNG plot per dtype (TFLOP/s against
N, a panel per head dim and causal setting, a line per implementation), and prints the Markdown
table last.
"""

import argparse
import ctypes
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import warnings

TOTAL_TOKENS = 16384
HIDDEN = 2048  # H * d
SWEEP_N = (512, 1024, 2048, 4096, 8192, 16384)
SWEEP_D = (64, 128, 256)
ARTICLE = {"B": 1, "H": 16, "N": 16384, "d": 128}
# --quick: the article's configuration and one small, one middle and one large point.
QUICK_POINTS = ((64, 1024), (128, 4096), (256, 8192))
GEMM_SIZE = 8192
CHECK_LIMIT = 1e-2  # rel L2 of warpattn's output against cuDNN's: a guard, not the accuracy bar

# The goals, per (d, N): (cuDNN, FA3, goal) non-causal, then the same causal. goal = 1.05 x
# max(cuDNN, FA3), all measured on our H200 on 2026-11-29 (docs/perf/anchors.md).
# BF16: the anchors' table of that date.
GOALS_BF16 = {
    (64, 512): (391, 320, 411, 260, 223, 273),
    (64, 1024): (429, 370, 451, 336, 292, 353),
    (64, 2048): (444, 458, 480, 382, 396, 416),
    (64, 4096): (455, 476, 499, 415, 442, 464),
    (64, 8192): (451, 509, 535, 432, 489, 514),
    (64, 16384): (459, 521, 547, 442, 500, 525),
    (128, 512): (506, 506, 532, 336, 321, 353),
    (128, 1024): (562, 586, 615, 422, 460, 483),
    (128, 2048): (597, 625, 656, 481, 538, 565),
    (128, 4096): (602, 640, 672, 516, 592, 621),
    (128, 8192): (605, 654, 687, 543, 614, 644),
    (128, 16384): (617, 676, 710, 559, 637, 669),
    (256, 512): (517, 516, 543, 341, 334, 358),
    (256, 1024): (586, 625, 656, 446, 464, 488),
    (256, 2048): (634, 668, 702, 520, 568, 596),
    (256, 4096): (650, 673, 707, 559, 631, 662),
    (256, 8192): (660, 718, 754, 585, 671, 704),
    (256, 16384): (666, 721, 757, 597, 696, 731),
}
# FP16: the anchors tabulate BF16 only; these apply its rule (1.05 x max of cuDNN and FA3, the
# "cudnn_sdpa_same_run_as_fa3" and "flashattention3" float16 rows) to the same anchor file.
GOALS_FP16 = {
    (64, 512): (380, 320, 400, 259, 221, 272),
    (64, 1024): (416, 360, 436, 331, 289, 347),
    (64, 2048): (432, 449, 471, 375, 381, 400),
    (64, 4096): (439, 466, 490, 402, 428, 449),
    (64, 8192): (446, 492, 516, 421, 473, 497),
    (64, 16384): (442, 503, 528, 432, 488, 512),
    (128, 512): (492, 487, 516, 326, 315, 343),
    (128, 1024): (540, 568, 597, 406, 444, 467),
    (128, 2048): (572, 598, 627, 463, 520, 546),
    (128, 4096): (580, 620, 651, 501, 570, 599),
    (128, 8192): (586, 638, 670, 524, 589, 619),
    (128, 16384): (587, 645, 678, 534, 627, 659),
    (256, 512): (498, 502, 527, 335, 325, 352),
    (256, 1024): (570, 601, 631, 430, 451, 473),
    (256, 2048): (614, 644, 676, 500, 541, 568),
    (256, 4096): (618, 634, 665, 542, 604, 634),
    (256, 8192): (633, 676, 710, 564, 635, 667),
    (256, 16384): (636, 695, 730, 578, 673, 706),
}
GOALS = {"bfloat16": GOALS_BF16, "float16": GOALS_FP16}
DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
IMPLS = ("warpattn", "cudnn_sdpa", "fa2_sdpa")
INVARIANT = "warpattn_invariant"  # --batch-invariant: warpattn with batch_invariant=True
INVARIANT_PASSES = 3


def goal_for(dtype, d, n, causal):
    """(cuDNN anchor, FA3 anchor, goal) in TFLOP/s, or None off the sweep."""
    row = GOALS[dtype].get((d, n))
    if row is None:
        return None
    return row[3:6] if causal else row[0:3]


# ---------------------------------------------------------------------------------------------
# Command line and the list of points.

def parse_args(argv):
    p = argparse.ArgumentParser(
        description="warpattn vs cuDNN and FlashAttention-2 (PyTorch SDPA), same process, "
        "same tensors; writes bench-<date>.json/.md")
    p.add_argument("--lib", default=None,
                   help="path to a CMake build's libwarpattn.so, called through its C ABI "
                   "(default: the installed warpattn package)")
    p.add_argument("--plot-only", default=None, metavar="JSON",
                   help="only draw the PNG plots of an earlier run's JSON, next to it")
    p.add_argument("--out", default="docs/perf", help="output folder (default docs/perf)")
    p.add_argument("--dtypes", default="bf16,fp16",
                   help="comma-separated subset of bf16,fp16 (default both)")
    p.add_argument("--quick", action="store_true",
                   help="only the article configuration and 3 sweep points")
    p.add_argument("--points", nargs="*", default=[], metavar="KEY=V[,V...]",
                   help="keep only points matching every term; keys d, N, B, H, causal "
                   "(causal=0/1), e.g. --points d=128 N=4096,16384 causal=0")
    p.add_argument("--commit", default=None, help="git commit to record (default: git rev-parse)")
    p.add_argument("--tag", default=None,
                   help="file-name suffix: bench-<date>-<tag>.* (default: 'quick' for --quick, "
                   "'partial' when --points or --dtypes restrict the sweep, none otherwise)")
    p.add_argument("--warmup-ms", type=float, default=25.0, help="do_bench warm-up (default 25)")
    p.add_argument("--rep-ms", type=float, default=200.0, help="do_bench timed span (default 200)")
    p.add_argument("--batch-invariant", action="store_true",
                   help="also time warpattn's batch_invariant mode on the same tensors (issue 18's cost): "
                   "%d passes interleaved with the default's, the ratio their median" % INVARIANT_PASSES)
    p.add_argument("--decode", action="store_true",
                   help="run the KV-cache (decode) benchmark instead (bench_decode.py; --decode --help lists its options)")
    p.add_argument("--backward", action="store_true",
                   help="run the backward benchmark instead (bench_backward.py; --backward --help lists its options)")
    p.add_argument("--varlen", action="store_true",
                   help="run the ragged-batch benchmark instead (bench_varlen.py; the other options are its own: "
                   "--varlen --help lists them)")
    args = p.parse_args(argv)

    args.dtype_list = []
    for name in args.dtypes.split(","):
        name = name.strip()
        if name not in DTYPES:
            p.error("--dtypes: expected bf16 and/or fp16, got %r" % name)
        if DTYPES[name] not in args.dtype_list:
            args.dtype_list.append(DTYPES[name])

    args.filters = {}
    for term in args.points:
        key, sep, values = term.partition("=")
        if not sep or key not in ("d", "N", "B", "H", "causal") or not values:
            p.error("--points: expected KEY=V[,V...] with KEY in d, N, B, H, causal; got %r" % term)
        try:
            args.filters.setdefault(key, set()).update(int(v) for v in values.split(","))
        except ValueError:
            p.error("--points: values must be integers, got %r" % term)
    return args


def all_points(quick):
    """Every (B, H, N, d, causal), sweep order: by d, then N, then causal."""
    shapes = []
    for d in SWEEP_D:
        for n in SWEEP_N:
            if quick and (d, n) not in QUICK_POINTS and (d, n) != (ARTICLE["d"], ARTICLE["N"]):
                continue
            shapes.append({"B": TOTAL_TOKENS // n, "H": HIDDEN // d, "N": n, "d": d})
    # The article's configuration lies on the sweep (H = 2048/128, B = 16384/16384); keep the
    # explicit entry anyway in case either is ever changed.
    if not any(s == ARTICLE for s in shapes):
        shapes.append(dict(ARTICLE))
    return [dict(s, causal=c) for s in shapes for c in (False, True)]


def keep(point, filters):
    for key, values in filters.items():
        value = int(point[key]) if key == "causal" else point[key]
        if value not in values:
            return False
    return True


# ---------------------------------------------------------------------------------------------
# warpattn through its C ABI (include/warpattn/warpattn_c.h).

class WarpattnTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("rank", ctypes.c_int),
        ("shape", ctypes.c_int64 * 4),
        ("stride", ctypes.c_int64 * 4),
    ]


WARPATTN_DTYPE = {"float16": 0, "bfloat16": 1, "float32": 2, "int32": 5}


class WarpattnForwardOptions(ctypes.Structure):
    """include/warpattn/warpattn_c.h's warpattn_forward_options (checked against struct_size)."""
    _fields_ = [("struct_size", ctypes.c_size_t), ("has_scale", ctypes.c_int), ("softmax_scale", ctypes.c_float),
                ("causal", ctypes.c_int), ("batch_invariant", ctypes.c_int), ("window_left", ctypes.c_int),
                ("window_right", ctypes.c_int), ("softcap", ctypes.c_float), ("sinks", ctypes.c_void_p)]


def load_warpattn(path):
    lib = ctypes.CDLL(os.path.abspath(path))
    fn = lib.warpattn_forward
    ptr = ctypes.POINTER(WarpattnTensor)
    fn.argtypes = [ptr, ptr, ptr, ptr, ptr, ctypes.c_int, ctypes.c_float, ctypes.c_int,
                   ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    fn.restype = ctypes.c_int
    # A mismatched struct mirror would silently pass garbage shapes: check it once.
    if hasattr(lib, "warpattn_tensor_struct_size"):
        lib.warpattn_tensor_struct_size.restype = ctypes.c_size_t
        lib.warpattn_tensor_struct_size.argtypes = []
        native = lib.warpattn_tensor_struct_size()
        if native != ctypes.sizeof(WarpattnTensor):
            raise RuntimeError("warpattn_tensor is %d bytes in %s but %d in this script"
                               % (native, path, ctypes.sizeof(WarpattnTensor)))
    return lib


def describe(t, dtype_name):
    """A warpattn_tensor viewing a torch tensor in place (strides in elements)."""
    if t.dim() > 4:
        raise ValueError("rank %d > 4" % t.dim())
    desc = WarpattnTensor()
    desc.data = t.data_ptr()
    desc.dtype = WARPATTN_DTYPE[dtype_name]
    desc.rank = t.dim()
    for i in range(t.dim()):
        desc.shape[i] = t.shape[i]
        desc.stride[i] = t.stride(i)
    return desc


def warpattn_call(lib, torch, q, k, v, out, dtype, causal, batch_invariant=False):
    """A zero-argument launcher (descriptors built once, outside the timed loop)."""
    if lib is None:  # the installed Python extension
        from warpattn import _warpattn
        stream = torch.cuda.current_stream().cuda_stream

        def launch_ext():
            _warpattn.forward(q, k, v, out, None, None, causal, stream, batch_invariant)

        return launch_ext
    descs = [describe(t, dtype) for t in (q, k, v, out)]
    refs = [ctypes.byref(d) for d in descs]
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    err = ctypes.create_string_buffer(2048)
    if batch_invariant:  # warpattn_forward_ex with the options struct
        options = WarpattnForwardOptions()
        lib.warpattn_forward_options_init.argtypes = [ctypes.POINTER(WarpattnForwardOptions)]
        lib.warpattn_forward_options_init(ctypes.byref(options))
        if options.struct_size != ctypes.sizeof(WarpattnForwardOptions):
            raise RuntimeError("warpattn_forward_options is %d bytes in the library but %d in this script"
                               % (options.struct_size, ctypes.sizeof(WarpattnForwardOptions)))
        options.causal, options.batch_invariant = int(causal), 1
        fn_ex = lib.warpattn_forward_ex
        ptr = ctypes.POINTER(WarpattnTensor)
        fn_ex.argtypes = [ptr, ptr, ptr, ptr, ptr, ctypes.POINTER(WarpattnForwardOptions), ctypes.c_void_p,
                          ctypes.c_char_p, ctypes.c_size_t]
        fn_ex.restype = ctypes.c_int
        opts = ctypes.byref(options)

        def call():
            return fn_ex(refs[0], refs[1], refs[2], refs[3], None, opts, stream, err, len(err))
    else:
        fn = lib.warpattn_forward

        def call():
            return fn(refs[0], refs[1], refs[2], refs[3], None, 0, 0.0, 1 if causal else 0, stream, err, len(err))

    def launch():
        rc = call()
        if rc != 0:
            raise RuntimeError("warpattn_forward returned %d: %s"
                               % (rc, err.value.decode(errors="replace")))

    launch.keepalive = (descs, refs, stream, err, call)
    return launch


# ---------------------------------------------------------------------------------------------
# Timing.

def make_timer(torch, warmup_ms, rep_ms, clean_l2=False):
    """Median milliseconds of fn: triton's do_bench, or the same recipe with CUDA events.
    clean_l2: the events' recipe always, each call after a flush that leaves the L2 clean (the
    memset, then a read of another 256 MB): do_bench's memset leaves about an L2 of dirty lines,
    whose write-back a memory-bound call then shares (run 251: cuDNN's decode kernel 56.6 us at
    B = 8 4K after the memset, 46.2 after the read), where a model's decode step follows kernels
    that leave few."""
    if not clean_l2:
        try:
            from triton.testing import do_bench

            def timer(fn):
                return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))

            return timer, "triton.testing.do_bench(warmup=%g, rep=%g, return_mode='median')" % (
                warmup_ms, rep_ms)
        except ImportError:
            pass

    # Like do_bench: estimate, warm up for warmup_ms, then time each call with its own event
    # pair after clearing L2 (a 256 MB memset), so no call finds the previous one's data cached.
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    reread = torch.zeros_like(flush) if clean_l2 else None

    def clear():
        flush.zero_()
        if clean_l2:
            reread.amax()

    def timer(fn):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        fn()
        torch.cuda.synchronize()
        start.record()
        for _ in range(5):
            clear()
            fn()
        stop.record()
        torch.cuda.synchronize()
        estimate = max(start.elapsed_time(stop) / 5, 1e-3)
        for _ in range(max(1, int(warmup_ms / estimate))):
            fn()
        n = max(1, int(rep_ms / estimate))
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                 for _ in range(n)]
        for a, b in pairs:
            clear()
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize()
        times = sorted(a.elapsed_time(b) for a, b in pairs)
        return times[len(times) // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2])

    if clean_l2:
        return timer, "CUDA events, median, L2 flushed between calls and left clean (a 256 MB memset, then a 256 MB read)"
    return timer, "CUDA events, median, L2 flushed between calls (triton not importable)"


_NVML_DEVICES = {}  # CUDA device index -> (NVML library, device handle), or None: opened once


def _nvml_device(torch):
    """NVML (the driver's libnvidia-ml.so.1, by ctypes: no package needed) and the current CUDA
    device's handle in it, opened once per device; None where either cannot be reached."""
    try:
        index = torch.cuda.current_device()
    except (RuntimeError, AssertionError):
        return None
    if index not in _NVML_DEVICES:
        _NVML_DEVICES[index] = None
        try:
            nvml = ctypes.CDLL("libnvidia-ml.so.1")
            props = torch.cuda.get_device_properties(index)
            bus = ("%08x:%02x:%02x.0" % (props.pci_domain_id, props.pci_bus_id, props.pci_device_id)).encode()
            handle = ctypes.c_void_p()
            if (nvml.nvmlInit_v2() == 0 and
                    nvml.nvmlDeviceGetHandleByPciBusId_v2(ctypes.c_char_p(bus), ctypes.byref(handle)) == 0):
                _NVML_DEVICES[index] = (nvml, handle)
        except (OSError, AttributeError, RuntimeError, AssertionError):
            pass
    return _NVML_DEVICES[index]


class _NvmlFieldValue(ctypes.Structure):
    """nvml.h's nvmlFieldValue_t (its value a union of 8 bytes; an unsigned int for power)."""
    _fields_ = [("fieldId", ctypes.c_uint), ("scopeId", ctypes.c_uint), ("timestamp", ctypes.c_longlong),
                ("latencyUsec", ctypes.c_longlong), ("valueType", ctypes.c_int), ("nvmlReturn", ctypes.c_int),
                ("value", ctypes.c_ulonglong)]


_NVML_FI_DEV_POWER_INSTANT = 186  # nvml.h: the current power in mW


def _board_milliwatts(nvml, handle):
    """The board's power now (mW), or None. nvmlDeviceGetPowerUsage gives, on Ampere and later,
    the mean over the last second: a timing of ~0.1 s right after an idle second read ~130 W
    under a 700 W load (runs 286-287), so the instant field is asked for first."""
    field = _NvmlFieldValue(fieldId=_NVML_FI_DEV_POWER_INSTANT)
    if nvml.nvmlDeviceGetFieldValues(handle, 1, ctypes.byref(field)) == 0 and field.nvmlReturn == 0:
        return field.value & 0xFFFFFFFF
    milliwatts = ctypes.c_uint()
    if nvml.nvmlDeviceGetPowerUsage(handle, ctypes.byref(milliwatts)) == 0:
        return milliwatts.value
    return None


class ClockSampler:
    """The SM clock (MHz) and board power (W, the instant reading) of the current CUDA device while
    a block runs, as means of samples taken every `period` seconds by a thread through NVML
    (_nvml_device). The card is power-capped: a kernel that keeps more of it busy may run at a
    lower clock under a sustained timing than in a short trace, and these say so beside each
    timing. mhz and watts stay None where NVML or the device cannot be reached."""

    def __init__(self, torch, period=0.005):
        self.torch, self.period = torch, period
        self.mhz = self.watts = None
        self._thread = None

    def _run(self, nvml, handle):
        clock = ctypes.c_uint()
        while not self._stop.wait(self.period):
            if nvml.nvmlDeviceGetClockInfo(handle, 1, ctypes.byref(clock)) == 0:  # 1: NVML_CLOCK_SM
                milliwatts = _board_milliwatts(nvml, handle)
                if milliwatts is not None:
                    self._samples.append((clock.value, milliwatts / 1000.0))

    def __enter__(self):
        device = _nvml_device(self.torch)
        if device is not None:
            self._stop, self._samples = threading.Event(), []
            self._thread = threading.Thread(target=self._run, args=device, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            if self._samples:
                self.mhz = statistics.mean(c for c, _ in self._samples)
                self.watts = statistics.mean(w for _, w in self._samples)
        return False


def host_us_per_call(torch, fns, calls=2000, passes=5, summary=statistics.median):
    """Host cost: microseconds per call of each of fns (name -> callable) in a tight loop of
    `calls` calls with one synchronisation at the end, summary (default the median; None: the
    list) of `passes` passes, the callables interleaved within each pass (one pass alone moves by
    several us with the host's state: run 238's single pass gave 32.6 us where the median of five
    gave 19.9)."""
    per = {name: [] for name in fns}
    for fn in fns.values():
        for _ in range(200):
            fn()
    torch.cuda.synchronize()
    for _ in range(passes):
        for name, fn in fns.items():
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            per[name].append((time.perf_counter() - t) / calls * 1e6)
    return {name: v if summary is None else summary(v) for name, v in per.items()}


def kernel_trace(torch, fn, calls=20, clean=False, timeline=None):
    """Per kernel name (its first 60 characters): the median duration (us); and the median span
    of a call (first kernel's start to last kernel's end, us), from torch.profiler's CUDA events,
    the L2 flushed before each call by a bitwise-not of 256 MB, whose kernel marks where each call
    begins (no attention library launches one; SDPA's backward launches fills of its own).
    clean: then a read of another 256 MB (a max, whose reduce kernel marks the call instead; the
    bitwise-not and the max's memset are left out), so that the call finds the L2 full of clean
    lines rather than the ~L2 of dirty ones the bitwise-not (like do_bench's memset) leaves,
    whose write-back would share its DRAM time.
    timeline: a dict, filled per kernel name with the median (start, end) in us after the flush's
    last kernel ended (a kernel launched as a programmatic dependent may start before it)."""
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    reread = torch.zeros_like(flush) if clean else None
    marker, skipped = ("reduce_kernel", ("bitwise_not", "Memset")) if clean else ("bitwise_not", ())
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            flush.bitwise_not_()
            if clean:
                reread.amax()
            fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    events.sort(key=lambda e: e.time_range.start)
    # A call: the kernels after each flush, up to the next flush.
    calls_k, current, flush_ends = [], None, []
    for e in events:
        if any(m in e.name for m in skipped):
            continue
        if marker in e.name:
            current = []
            calls_k.append(current)
            flush_ends.append(e.time_range.end)
        elif current is not None:
            current.append(e)
    durations, spans, offsets = {}, [], {}
    for ks, flushed in zip(calls_k, flush_ends):
        if not ks:
            continue
        spans.append(ks[-1].time_range.end - ks[0].time_range.start)
        for e in ks:
            durations.setdefault(e.name[:60], []).append(e.time_range.end - e.time_range.start)
            offsets.setdefault(e.name[:60], []).append((e.time_range.start - flushed, e.time_range.end - flushed))
    if timeline is not None:
        for n, se in offsets.items():
            timeline[n] = (statistics.median(a for a, _ in se), statistics.median(b for _, b in se))
    return {n: statistics.median(t) for n, t in durations.items()}, statistics.median(spans) if spans else 0.0


def forward_flops(p):
    f = 4.0 * p["B"] * p["H"] * p["N"] * p["N"] * p["d"]
    return f / 2 if p["causal"] else f


# ---------------------------------------------------------------------------------------------
# One point: three implementations on the same tensors.

def sdpa_inputs(torch, backend, q, k, v, causal):
    """The (B, H, N, d) inputs one SDPA backend accepts: views of q, k, v if it can, else
    contiguous copies. Returns (inputs, first output, layout note); raises with the reasons
    PyTorch gave (its warnings) when the backend cannot run this point at all."""
    from torch.nn.attention import sdpa_kernel
    import torch.nn.functional as F

    views = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    attempts = [(views, "transposed views of (B,N,H,d)")]
    # If the backend refuses the strided views, fall back to contiguous (B,H,N,d) copies made
    # once outside the timing, and say so in the record rather than lose the comparison.
    attempts.append((tuple(t.contiguous() for t in views), "contiguous (B,H,N,d) copies"))
    reasons = []
    for inputs, note in attempts:
        with warnings.catch_warnings(record=True) as caught, sdpa_kernel([backend]):
            warnings.simplefilter("always")
            try:
                out = F.scaled_dot_product_attention(*inputs, is_causal=causal)
                torch.cuda.synchronize()
                return inputs, out, note
            except RuntimeError as e:
                why = "; ".join(str(w.message).splitlines()[0] for w in caught) or str(e)
                reasons.append("%s: %s" % (note, why.strip()[:300]))
    raise RuntimeError(" | ".join(reasons))


def time_sdpa(torch, timer, backend, inputs, causal):
    """Median ms of one backend; the backend is chosen once, outside the timed calls, so the
    context manager's Python cost is not in the figure."""
    from torch.nn.attention import sdpa_kernel
    import torch.nn.functional as F

    qx, kx, vx = inputs
    with sdpa_kernel([backend]):
        return timer(lambda: F.scaled_dot_product_attention(qx, kx, vx, is_causal=causal))


def same_bits_after_timing(torch, launch, out, first):
    """'same' when the timed calls computed what the first (checked) call did: the forward is
    deterministic, so the last timed call's output must equal the first's bit for bit, and so
    must one more call on a poisoned buffer (which catches a call that skips rows: they would
    keep an earlier call's values); else what differed."""
    torch.cuda.synchronize()
    if not torch.equal(out, first):
        return "last timed call differs from the first call"
    out.fill_(float("nan"))
    launch()
    torch.cuda.synchronize()
    return "same" if torch.equal(out, first) else "a call after the timed ones differs from the first call"


def rel_l2(torch, got, want):
    got, want = got.float(), want.float()
    return float(torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want))


def bench_point(torch, lib, timer, p, dtype, gemm_rate, batch_invariant=False):
    tdtype = getattr(torch, dtype)
    q, k, v = (torch.randn(p["B"], p["N"], p["H"], p["d"], dtype=tdtype, device="cuda")
               for _ in range(3))
    flops = forward_flops(p)
    rows = {}
    outs = {}

    def record(impl, ms=None, error=None, **extra):
        row = dict(impl=impl, dtype=dtype, B=p["B"], H=p["H"], N=p["N"], d=p["d"],
                   causal=p["causal"], **{"pass": "fwd"})
        row["ms"] = None if ms is None else round(ms, 5)
        row["tflops"] = None if ms is None else round(flops / (ms * 1e-3) / 1e12, 2)
        row["fraction_of_gemm"] = (None if row["tflops"] is None or not gemm_rate
                                   else round(row["tflops"] / gemm_rate, 4))
        if error:
            row["error"] = error
        row.update(extra)
        rows[impl] = row

    # warpattn: poison the output first, so a kernel that skips rows cannot pass the guard.
    out = torch.full_like(q, float("nan"))
    try:
        launch = warpattn_call(lib, torch, q, k, v, out, dtype, p["causal"])
        launch()
        torch.cuda.synchronize()
        outs["warpattn"] = out.clone()
        ms = timer(launch)
        record("warpattn", ms, timed_calls=same_bits_after_timing(torch, launch, out, outs["warpattn"]))
    except Exception as e:  # noqa: BLE001 - any failure becomes 'n/a' for this point
        record("warpattn", error=str(e)[:500])
    if batch_invariant and "warpattn" in outs:
        # The batch-invariant mode on the same tensors, timed in passes interleaved with the
        # default's (the card's clocks drift between passes): its cost is the median ratio.
        out_inv = torch.full_like(q, float("nan"))
        try:
            inv = warpattn_call(lib, torch, q, k, v, out_inv, dtype, p["causal"], batch_invariant=True)
            inv()
            torch.cuda.synchronize()
            first_inv = out_inv.clone()
            pairs = [(timer(launch), timer(inv)) for _ in range(INVARIANT_PASSES)]
            ms_inv = sorted(b for _, b in pairs)[len(pairs) // 2]
            slowdown = sorted(b / a for a, b in pairs)[len(pairs) // 2]
            err = rel_l2(torch, first_inv, outs["warpattn"])
            record(INVARIANT, ms_inv, timed_calls=same_bits_after_timing(torch, inv, out_inv, first_inv),
                   time_over_default=round(slowdown, 4), rel_l2_vs_default=float("%.3e" % err),
                   passes=[[round(a, 5), round(b, 5)] for a, b in pairs])
            del out_inv, first_inv
        except Exception as e:  # noqa: BLE001
            record(INVARIANT, error=str(e)[:500])

    from torch.nn.attention import SDPBackend
    for impl, backend in (("cudnn_sdpa", SDPBackend.CUDNN_ATTENTION),
                          ("fa2_sdpa", SDPBackend.FLASH_ATTENTION)):
        try:
            inputs, ref, note = sdpa_inputs(torch, backend, q, k, v, p["causal"])
            outs[impl] = ref.transpose(1, 2)  # back to (B, N, H, d)
            record(impl, time_sdpa(torch, timer, backend, inputs, p["causal"]), layout=note)
        except Exception as e:  # noqa: BLE001
            record(impl, error=str(e)[:500])

    # The guard: warpattn against cuDNN (FA2 where cuDNN could not run).
    w = rows["warpattn"]
    ref_impl = next((i for i in ("cudnn_sdpa", "fa2_sdpa") if i in outs), None)
    if "warpattn" in outs and ref_impl:
        finite = bool(torch.isfinite(outs["warpattn"]).all())
        err = rel_l2(torch, outs["warpattn"], outs[ref_impl])
        w["check_against"] = ref_impl
        w["rel_l2"] = None if math.isnan(err) else float("%.3e" % err)
        w["check"] = "PASS" if finite and err < CHECK_LIMIT and w.get("timed_calls") == "same" else "FAIL"
        if not finite:
            w["check_note"] = "NaN/Inf in warpattn's output"
        elif w.get("timed_calls") != "same":
            w["check_note"] = w.get("timed_calls")
        # For the record: the distance to the other anchor too (cuDNN and FA2 themselves
        # differ by about this much; a large gap to one only points at that backend).
        for other in ("cudnn_sdpa", "fa2_sdpa"):
            if other in outs:
                e = rel_l2(torch, outs["warpattn"], outs[other])
                w["rel_l2_vs_" + other.split("_")[0]] = None if math.isnan(e) else float(
                    "%.3e" % e)
    else:
        w["check"] = "n/a"

    cudnn_t = rows["cudnn_sdpa"]["tflops"]
    for row in rows.values():
        row["ratio_to_cudnn"] = (round(row["tflops"] / cudnn_t, 4)
                                 if row["tflops"] and cudnn_t else None)
    goal = goal_for(dtype, p["d"], p["N"], p["causal"])
    if goal:
        w["goal_tflops"] = goal[2]
        w["goal_over_cudnn_anchor"] = round(goal[2] / goal[0], 4)
        w["ratio_to_goal"] = round(w["tflops"] / goal[2], 4) if w["tflops"] else None
        # docs/perf/anchors.md: read the goal as a ratio to the in-run cuDNN.
        w["meets_goal_vs_inrun_cudnn"] = (w["ratio_to_cudnn"] >= w["goal_over_cudnn_anchor"]
                                          if w["ratio_to_cudnn"] else None)
    del q, k, v, out, outs
    return [rows[i] for i in IMPLS + ((INVARIANT,) if INVARIANT in rows else ())]


def gemm_rate(torch, timer, dtype):
    tdtype = getattr(torch, dtype)
    a = torch.randn(GEMM_SIZE, GEMM_SIZE, dtype=tdtype, device="cuda")
    b = torch.randn(GEMM_SIZE, GEMM_SIZE, dtype=tdtype, device="cuda")
    ms = timer(lambda: torch.matmul(a, b))
    return round(2.0 * GEMM_SIZE ** 3 / (ms * 1e-3) / 1e12, 2), round(ms, 5)


# ---------------------------------------------------------------------------------------------
# Environment record.

def run_quiet(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30,
                              check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def environment(torch, args):
    props = torch.cuda.get_device_properties(0)
    smi = run_quiet(["nvidia-smi", "--id=0", "--query-gpu=name,driver_version,power.limit,"
                     "clocks.max.sm,clocks.max.mem", "--format=csv,noheader"])
    fields = [f.strip() for f in smi.split(",")] if smi else []
    commit = args.commit
    if commit is None:
        here = os.path.dirname(os.path.abspath(__file__))
        commit = run_quiet(["git", "-C", here, "rev-parse", "HEAD"]) or "unknown"
        if commit != "unknown" and run_quiet(["git", "-C", here, "status", "--porcelain",
                                              "--untracked-files=no"]):
            commit += "-dirty"
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    now = datetime.datetime.now(datetime.timezone.utc)
    return {
        "card": props.name,
        "sms": props.multi_processor_count,
        "driver": fields[1] if len(fields) > 1 else None,
        "power_limit": fields[2] if len(fields) > 2 else None,
        "max_clocks_sm_mem": (fields[3] + ", " + fields[4]) if len(fields) > 4 else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": cudnn,
        "triton": triton_version,
        "python": platform.python_version(),
        "date": now.strftime("%Y-%m-%d"),
        "time_utc": now.strftime("%H:%M:%SZ"),
        "commit": commit,
        "lib": os.path.abspath(args.lib) if args.lib else "warpattn Python package",
        "argv": sys.argv[1:],
    }


# ---------------------------------------------------------------------------------------------
# Markdown.

def fmt(x, spec):
    return "n/a" if x is None else format(x, spec)


def markdown(env, ceilings, method, rows, dtypes):
    lines = [
        "# warpattn forward vs cuDNN and FlashAttention-2 — %s" % env["date"],
        "",
        "%s (%s SMs), driver %s, power limit %s; torch %s, CUDA %s, cuDNN %s; commit `%s`."
        % (env["card"], env["sms"], env["driver"] or "?", env["power_limit"] or "?",
           env["torch"], env["cuda"], env["cudnn"], env["commit"]),
        "",
        "TFLOP/s = 4·B·H·N²·d / time (halved for causal); %s; fresh torch.randn inputs; "
        "16384 tokens, H·d = 2048. cuDNN and FA2 through PyTorch SDPA on (B,H,N,d) views of "
        "the same tensors. GEMM ceiling (torch.matmul %d³): %s." % (
            method, GEMM_SIZE, ", ".join("%s %s TFLOP/s" % (k, fmt(v["tflops"], ".1f"))
                                        for k, v in ceilings.items())),
        "",
        "goal = 1.05 × max(cuDNN, FA3) measured on our H200 on 2026-11-29 (docs/perf/anchors.md; FP16 "
        "goals by the same rule). Since the card's clocks move "
        "between runs, the goal is read as a ratio to the in-run cuDNN: "
        "*needed* = goal ÷ cuDNN(anchor); *met* = warpattn/cuDNN ≥ needed. "
        "*check* = warpattn's output vs cuDNN's, rel L2 < %g, and every timed call repeats the first call's "
        "bits." % CHECK_LIMIT,
    ]
    by_key = {}
    for r in rows:
        by_key.setdefault((r["dtype"], r["d"], r["N"], r["causal"]), {})[r["impl"]] = r
    for dtype in dtypes:
        keys = sorted(k for k in by_key if k[0] == dtype)
        if not keys:
            continue
        lines += ["", "## %s forward, TFLOP/s" % dtype, "",
                  "| d | N | causal | warpattn | cuDNN | FA2 | warpattn/cuDNN | goal "
                  "| warpattn/goal | needed | met | check (rel L2) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for key in keys:
            _, d, n, causal = key
            r = by_key[key]
            w = r.get("warpattn", {})
            needed = w.get("goal_over_cudnn_anchor")
            met = w.get("meets_goal_vs_inrun_cudnn")
            article = " (article)" if (d, n) == (ARTICLE["d"], ARTICLE["N"]) else ""
            lines.append("| %d | %d%s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                d, n, article, "yes" if causal else "no",
                fmt(w.get("tflops"), ".1f"),
                fmt(r.get("cudnn_sdpa", {}).get("tflops"), ".1f"),
                fmt(r.get("fa2_sdpa", {}).get("tflops"), ".1f"),
                fmt(w.get("ratio_to_cudnn"), ".3f"),
                fmt(w.get("goal_tflops"), "d"),
                fmt(w.get("ratio_to_goal"), ".3f"),
                fmt(needed, ".3f"),
                "n/a" if met is None else ("yes" if met else "no"),
                "%s (%s)" % (w.get("check", "n/a"), fmt(w.get("rel_l2"), ".2e"))))
    invariant = [r for r in rows if r["impl"] == INVARIANT and r.get("tflops")]
    if invariant:
        lines += ["", "## The batch-invariant mode's cost (issue 18: at most 10% slower)", "",
                  "Time of batch_invariant=True over the default's on the same tensors, the median of %d "
                  "passes interleaved with it; *bits* = every timed call repeats its first call's bits." %
                  INVARIANT_PASSES, "",
                  "| dtype | d | N | causal | default TFLOP/s | invariant TFLOP/s | time ratio | bits | rel L2 vs default |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in invariant:
            w = by_key[(r["dtype"], r["d"], r["N"], r["causal"])].get("warpattn", {})
            lines.append("| %s | %d | %d | %s | %s | %s | %s | %s | %s |" % (
                r["dtype"], r["d"], r["N"], "yes" if r["causal"] else "no", fmt(w.get("tflops"), ".1f"),
                fmt(r["tflops"], ".1f"), fmt(r.get("time_over_default"), ".3f"), r.get("timed_calls"),
                fmt(r.get("rel_l2_vs_default"), ".1e")))
    errors = [r for r in rows if r.get("error")]
    if errors:
        lines += ["", "## Not measured", ""]
        for r in errors:
            lines.append("- %s %s d=%d N=%d causal=%s: %s" % (
                r["impl"], r["dtype"], r["d"], r["N"], r["causal"],
                r["error"].replace("\n", " ")[:300]))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------

LABELS = {"warpattn": "warpattn", "cudnn_sdpa": "cuDNN (SDPA)", "fa2_sdpa": "FlashAttention-2 (SDPA)",
          INVARIANT: "warpattn, batch_invariant"}
STYLES = {"warpattn": "o-", "cudnn_sdpa": "s--", "fa2_sdpa": "^:", INVARIANT: "o:"}


def plot(result, stem):
    """One PNG per dtype: TFLOP/s against N, a panel per (d, causal), a line per
    implementation, the in-run GEMM rate as a reference line. Returns the paths written
    (none when matplotlib is missing: the JSON and Markdown are the record)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return []
    rows = result["rows"]
    paths = []
    for dtype in sorted({r["dtype"] for r in rows}):
        fig, axes = plt.subplots(2, len(SWEEP_D), figsize=(5 * len(SWEEP_D), 8), squeeze=False)
        for col, d in enumerate(SWEEP_D):
            for line, causal in enumerate((False, True)):
                ax = axes[line][col]
                for impl in IMPLS + (INVARIANT,):
                    pts = sorted({(r["N"], r["tflops"]) for r in rows
                                  if r["dtype"] == dtype and r["d"] == d and r["causal"] == causal
                                  and r["impl"] == impl and r.get("tflops")})
                    if pts:
                        ax.plot([n for n, _ in pts], [t for _, t in pts], STYLES[impl], label=LABELS[impl])
                ceiling = result.get("ceilings", {}).get(dtype, {}).get("tflops")
                if ceiling:
                    ax.axhline(ceiling, color="gray", lw=0.8, ls="-.", label="GEMM (torch.matmul 8192³)")
                ax.set_xscale("log", base=2)
                ax.set_title("d=%d, %s" % (d, "causal" if causal else "non-causal"))
                ax.set_xlabel("sequence length N (16384 tokens, H·d = 2048)")
                ax.set_ylabel("TFLOP/s")
                ax.set_ylim(bottom=0)
                ax.grid(True, alpha=0.3)
        axes[0][0].legend(loc="lower right", fontsize=8)
        fig.suptitle("%s forward on %s, %s (commit %s)" % (
            dtype, result.get("card", result.get("gpu", "GPU")), result.get("date", ""),
            result.get("commit", "?")))
        fig.tight_layout()
        path = "%s-%s.png" % (stem, dtype)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--decode" in argv:  # hand over to the KV-cache benchmark (issue 16), with the rest of the arguments
        try:
            from warpattn.bench_decode import main as decode_main
        except ImportError:  # run as a script beside bench_decode.py
            from bench_decode import main as decode_main
        return decode_main([a for a in argv if a != "--decode"])
    if "--backward" in argv:  # hand over to the backward benchmark (issue 14), with the rest of the arguments
        try:
            from warpattn.bench_backward import main as backward_main
        except ImportError:  # run as a script beside bench_backward.py
            from bench_backward import main as backward_main
        return backward_main([a for a in argv if a != "--backward"])
    if "--varlen" in argv:  # hand over to the ragged-batch benchmark, with the rest of the arguments
        try:
            from warpattn.bench_varlen import main as varlen_main
        except ImportError:  # run as a script beside bench_varlen.py
            from bench_varlen import main as varlen_main
        return varlen_main([a for a in argv if a != "--varlen"])
    args = parse_args(argv)
    if args.plot_only:
        with open(args.plot_only) as f:
            result = json.load(f)
        for path in plot(result, os.path.splitext(args.plot_only)[0]):
            print("wrote %s" % path, file=sys.stderr)
        return 0
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench.py: no CUDA device visible to PyTorch")
    lib = load_warpattn(args.lib) if args.lib else None
    timer, method = make_timer(torch, args.warmup_ms, args.rep_ms)
    env = environment(torch, args)

    points = [p for p in all_points(args.quick) if keep(p, args.filters)]
    if not points:
        sys.exit("bench.py: --points matches no point of the sweep")
    tag = args.tag
    if tag is None:
        tag = "quick" if args.quick else (
            "partial" if args.filters or len(args.dtype_list) < len(DTYPES) else "")
    stem = "bench-%s%s" % (env["date"], "-" + tag if tag else "")

    ceilings = {}
    rows = []
    with torch.inference_mode():
        for dtype in args.dtype_list:
            tflops, ms = gemm_rate(torch, timer, dtype)
            ceilings[dtype] = {"tflops": tflops, "ms": ms, "size": GEMM_SIZE}
            print("torch.matmul %s %d^3: %.1f TFLOP/s" % (dtype, GEMM_SIZE, tflops),
                  file=sys.stderr, flush=True)
        for dtype in args.dtype_list:
            for p in points:
                point_rows = bench_point(torch, lib, timer, p, dtype, ceilings[dtype]["tflops"],
                                         args.batch_invariant)
                rows += point_rows
                w = point_rows[0]
                print("%s B=%d H=%d N=%d d=%d causal=%d: %s" % (
                    dtype, p["B"], p["H"], p["N"], p["d"], p["causal"], "  ".join(
                        "%s %s" % (r["impl"], fmt(r["tflops"], ".1f")) for r in point_rows))
                    + "  check %s" % w.get("check"), file=sys.stderr, flush=True)
                torch.cuda.empty_cache()

    result = dict(env, method=method, sweep={"total_tokens": TOTAL_TOKENS, "H_times_d": HIDDEN},
                  ceilings=ceilings, rows=rows)
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, stem + ".json")
    md_path = os.path.join(args.out, stem + ".md")
    with open(json_path, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    table = markdown(env, ceilings, method, rows, args.dtype_list)
    with open(md_path, "w") as f:
        f.write(table)
    print("wrote %s and %s" % (json_path, md_path), file=sys.stderr, flush=True)
    for path in plot(result, os.path.join(args.out, stem)):
        print("wrote %s" % path, file=sys.stderr, flush=True)
    sys.stdout.write(table)
    sys.stdout.flush()
    # Non-zero when warpattn failed its guard or could not run somewhere; the files are
    # written either way.
    bad = [r for r in rows
           if (r["impl"] == "warpattn" and (r.get("check") == "FAIL" or r.get("error")))
           or (r["impl"] == INVARIANT and (r.get("error") or r.get("timed_calls") != "same"))]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
