"""What the Python layers of a decode call (flash_attn_with_kvcache) cost on the dev machine, no
GPU needed (issue 16's host cost): the extension's functions stubbed, CPU tensors, and the
dispatcher skip's CUDA test taken as a CPU one (the same attribute read), so that the call takes
the path a CUDA tensor takes. scripts/host_cost.py measures the same layers on the GPU host.
    python3 scripts/kvcache_python_layers_cpu.py [--profile]   # with PyTorch installed (any build)
2026-12-06 (LOG runs 235 and after): 10.2 us before the positional path, 8.5 after.
"""
import cProfile
import pstats
import sys
import time

import torch
import warpattn
from warpattn import torch_op

print(warpattn.__file__)
class Stub:
    def __getattr__(self, name): return lambda *a, **k: None
torch_op._warpattn = Stub()
orig = torch_op._may_skip_dispatcher
def skip_cpu(args):
    if torch_op._modes_active(): return False
    grad = torch_op._grad_enabled()
    for a in args:
        t = type(a)
        if t in torch_op._PLAIN_TENSORS:
            if not a.is_cpu or (grad and a.requires_grad): return False
        elif t not in torch_op._NOT_TENSORS and isinstance(a, torch.Tensor): return False
    return True
torch_op._may_skip_dispatcher = skip_cpu
torch.set_grad_enabled(True)
q = torch.randn(1, 1, 8, 128, dtype=torch.bfloat16)
k = torch.randn(1, 128, 8, 128, dtype=torch.bfloat16); v = torch.randn_like(k)
lens = torch.full((1,), 128, dtype=torch.int32)
f = lambda: warpattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens)
def per_call(fn, n=20000):
    for _ in range(500): fn()
    best = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n): fn()
        best.append((time.perf_counter() - t) / n * 1e6)
    return sorted(best)[2]
print("python layers (stubbed, cpu tensors): %.2f us" % per_call(f))
print("one q.new_empty: %.2f us" % per_call(lambda: q.new_empty((1, 1, 8, 128))))
print("empty fn call: %.3f us" % per_call(lambda: None))
if "--profile" in sys.argv[1:]:
    cProfile.run("for _ in range(20000): f()", "/tmp/prof.out")
    pstats.Stats("/tmp/prof.out").sort_stats("tottime").print_stats(15)
