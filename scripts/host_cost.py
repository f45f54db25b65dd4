"""Host cost per call at a tiny shape, through the Python API: warpattn (dense BF16 and FP8)
beside cuDNN through SDPA. The shape is small enough that the GPU finishes each call long
before the host has issued the next, so wall time per call is the host's cost.

    python3 scripts/host_cost.py            # after pip install . (or with the package on PYTHONPATH)
"""
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import warpattn


def per_call_us(fn, calls=2000, repeats=5):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    best = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best.append((time.perf_counter() - t) / calls * 1e6)
    best.sort()
    return best[len(best) // 2]


def main():
    q, k, v = (torch.randn(1, 128, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    ops = warpattn.quantize_fp8(q, k, v)
    rows = [("warpattn flash_attn_func", lambda: warpattn.flash_attn_func(q, k, v)),
            ("warpattn flash_attn_func, out given", lambda: warpattn.flash_attn_func(q, k, v, out=q.new_empty(q.shape))),
            ("warpattn flash_attn_fp8_func (check_descales=False)",
             lambda: warpattn.flash_attn_fp8_func(ops, check_descales=False))]

    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(qt, kt, vt)
    rows.append(("cuDNN through SDPA", cudnn))
    print("host cost per call, B=1 N=128 H=4 d=64 bf16 (median of 5 x 2000 calls):")
    for name, fn in rows:
        print("  %-52s %6.1f us" % (name, per_call_us(fn)))


if __name__ == "__main__":
    main()
