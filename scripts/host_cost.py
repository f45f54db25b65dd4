"""Host cost per call at tiny shapes, through the Python API and below it, beside cuDNN through
SDPA (issue 16's bar: 20 us a call through Python). The shapes are small enough that the GPU
finishes each call long before the host has issued the next, so wall time per call is the host's
cost. The rows peel the layers off one at a time: the public call, the binding alone (tensors
allocated, the stream known), the C ABI through ctypes (the library alone, plus ctypes' ~1 us),
and what a call cannot avoid (two allocations, one kernel launch).

    python3 scripts/host_cost.py            # after pip install . (or with the package on PYTHONPATH)
"""
import ctypes
import os
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import warpattn
from warpattn import _warpattn
from warpattn.bench import describe, host_us_per_call, load_warpattn


def c_abi_forward(q, k, v, out):
    """warpattn_forward of the package's libwarpattn.so through ctypes, descriptors built once."""
    lib = load_warpattn(os.path.join(os.path.dirname(warpattn.__file__), "libwarpattn.so"))
    refs = [ctypes.byref(describe(t, "bfloat16")) for t in (q, k, v, out)]
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    err = ctypes.create_string_buffer(1024)
    fn = lib.warpattn_forward

    def call():
        if fn(refs[0], refs[1], refs[2], refs[3], None, 0, 0.0, 0, stream, err, len(err)) != 0:
            raise RuntimeError(err.value.decode())
    return call


def c_abi_kvcache(q, k_cache, v_cache, lens, out):
    """warpattn_forward_kvcache through ctypes, descriptors built once (dense caches, lengths)."""
    from warpattn.bench import WarpattnForwardOptions, WarpattnTensor
    lib = load_warpattn(os.path.join(os.path.dirname(warpattn.__file__), "libwarpattn.so"))
    descs = [describe(t, "bfloat16") for t in (q, k_cache, v_cache, out)]
    length = describe(lens, "int32")
    options = WarpattnForwardOptions()
    lib.warpattn_forward_options_init.argtypes = [ctypes.POINTER(WarpattnForwardOptions)]
    lib.warpattn_forward_options_init(ctypes.byref(options))
    ptr = ctypes.POINTER(WarpattnTensor)
    fn = lib.warpattn_forward_kvcache
    fn.argtypes = [ptr] * 7 + [ctypes.c_int, ptr, ptr, ctypes.POINTER(WarpattnForwardOptions), ctypes.c_void_p,
                               ctypes.c_char_p, ctypes.c_size_t]
    fn.restype = ctypes.c_int
    refs = [ctypes.byref(d) for d in descs]
    lref, oref = ctypes.byref(length), ctypes.byref(options)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    err = ctypes.create_string_buffer(1024)

    def call():
        if fn(refs[0], refs[1], refs[2], None, None, lref, None, 0, refs[3], None, oref, stream, err, len(err)) != 0:
            raise RuntimeError(err.value.decode())
    call.keepalive = (descs, length, options)
    return call


def python_layers_alone(call):
    """call() with the extension's functions replaced by ones that do nothing: what the Python
    layers above the binding cost (their allocations included)."""
    from warpattn import torch_op

    class Stub:
        def __getattr__(self, name):
            return lambda *args, **kwargs: None

    def stubbed():
        real, torch_op._warpattn = torch_op._warpattn, Stub()
        try:
            call()
        finally:
            torch_op._warpattn = real
    return stubbed


def main():
    q, k, v = (torch.randn(1, 128, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.empty_like(q)
    lse = torch.empty(1, 4, 128, device="cuda")
    qg = q.clone().requires_grad_()
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    ops = warpattn.quantize_fp8(q, k, v)
    stream = torch.cuda.current_stream().cuda_stream
    # Decode: one sequence, one row, 8 query heads on 8 KV heads, 128 cached keys, d = 128.
    dq = torch.randn(1, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
    kc, vc = (torch.randn(1, 128, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lens = torch.full((1,), 128, dtype=torch.int32, device="cuda")
    pages = torch.randn(2, kc.shape[1], 8, 128, device="cuda", dtype=torch.bfloat16)
    table = torch.zeros(1, 1, dtype=torch.int32, device="cuda")
    dout = torch.empty_like(dq)
    rows = [
        ("warpattn flash_attn_func", lambda: warpattn.flash_attn_func(q, k, v)),
        ("warpattn flash_attn_func, out given", lambda: warpattn.flash_attn_func(q, k, v, out=out)),
        ("warpattn flash_attn_func, q requires grad (forward)", lambda: warpattn.flash_attn_func(qg, k, v)),
        ("  the binding alone (_warpattn.forward, lse too)",
         lambda: _warpattn.forward(q, k, v, out, lse, None, False, stream)),
        ("  the library alone (C ABI through ctypes)", c_abi_forward(q, k, v, out)),
        ("warpattn flash_attn_fp8_func (check_descales=False)",
         lambda: warpattn.flash_attn_fp8_func(ops, check_descales=False)),
        ("warpattn flash_attn_with_kvcache, dense, lengths",
         lambda: warpattn.flash_attn_with_kvcache(dq, kc, vc, cache_seqlens=lens)),
        ("warpattn flash_attn_with_kvcache, paged",
         lambda: warpattn.flash_attn_with_kvcache(dq, pages, pages, cache_seqlens=lens, block_table=table)),
        ("  the binding alone (_warpattn.forward_kvcache, dense)",
         lambda: _warpattn.forward_kvcache(dq, kc, vc, dout, None, None, None, lens, None, None, False, stream)),
        ("  the library alone (C ABI through ctypes, dense)", c_abi_kvcache(dq, kc, vc, lens, dout)),
        ("  the Python layers alone (the binding stubbed, dense)",
         python_layers_alone(lambda: warpattn.flash_attn_with_kvcache(dq, kc, vc, cache_seqlens=lens))),
    ]

    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(qt, kt, vt)
    # Training (issue 14): one forward and its backward through autograd (torch.autograd.grad,
    # so nothing accumulates), warpattn's and cuDNN's through SDPA, on the same tensors.
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    grad_out = torch.randn_like(q)

    def forward_backward(forward):
        def call():
            torch.autograd.grad(forward(*leaves), leaves, grad_out)
        return call

    def cudnn_bshd(a, b, c):
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(a.transpose(1, 2), b.transpose(1, 2), c.transpose(1, 2)).transpose(1, 2)
    rows += [
        ("warpattn forward + backward (autograd)", forward_backward(warpattn.flash_attn_func)),
        ("cuDNN through SDPA, forward + backward", forward_backward(cudnn_bshd)),
    ]
    rows += [
        ("cuDNN through SDPA", cudnn),
        ("SDPA, default backend", lambda: F.scaled_dot_product_attention(qt, kt, vt)),
        ("floor: two torch.empty (out and lse)",
         lambda: (torch.empty_like(q), torch.empty(1, 4, 128, device="cuda"))),
        ("floor: one kernel launch (torch.cuda._sleep(1))", lambda: torch.cuda._sleep(1)),
    ]
    # Every row in each pass, side by side (bench.host_us_per_call), so that a host whose load
    # changes during the run moves all rows alike; the minimum beside the median, and the load
    # average before and after, since a busy host (runs 270-271: load 3-8 on 16 cores after a
    # build) moved the floors 1.5-2x between runs.
    load_before = os.getloadavg()
    samples = host_us_per_call(torch, dict(rows), calls=2000, passes=7, summary=None)
    load_after = os.getloadavg()
    print("host cost per call, B=1 N=128 H=4 d=64 bf16; decode B=1 Sq=1 8/8 heads 128 keys d=128 "
          "(7 passes of 2000 calls, the rows interleaved; median, and min in brackets):")
    for name, _ in rows:
        v = samples[name]
        print("  %-56s %6.1f us (%5.1f)" % (name, statistics.median(v), min(v)))
    print("load average (1, 5, 15 min) before %.1f %.1f %.1f, after %.1f %.1f %.1f on %d CPUs%s"
          % (*load_before, *load_after, os.cpu_count(),
             ": a busy host, read the minima" if max(load_before[0], load_after[0]) > 1.5 else ""))


if __name__ == "__main__":
    main()
