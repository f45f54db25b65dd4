"""What the Python layers of a decode call (flash_attn_with_kvcache) cost on the dev machine, no
GPU needed (issue 16's host cost): the extension's functions stubbed, CPU tensors, and the
dispatcher skip's CUDA test taken as a CPU one (the same attribute read), so that the call takes
the path a CUDA tensor takes. scripts/host_cost.py measures the same layers on the GPU host.
    python3 scripts/kvcache_python_layers_cpu.py [--profile]   # with PyTorch installed (any build)
2026-12-06 (LOG runs 235 and after): 10.2 us before the positional path, 8.5 after.
2026-12-07: 9.7 us (median of 5) before the eager decode path's new_empty from ints and the
dispatcher skip's early None, 7.6 after (this copy of the skip given the early None too).
"""
import cProfile
import pstats
import sys
import time

import torch
import warpattn
from warpattn import torch_op


class Stub:
    """The extension: every function does nothing."""
    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def skip_dispatcher_on_cpu(args):
    """torch_op._may_skip_dispatcher with its CUDA test read as a CPU one."""
    if torch_op._modes_active():
        return False
    grad = torch_op._grad_enabled()
    for a in args:
        if a is None:
            continue
        t = type(a)
        if t in torch_op._PLAIN_TENSORS:
            if not a.is_cpu or (grad and a.requires_grad):
                return False
        elif t not in torch_op._NOT_TENSORS and isinstance(a, torch.Tensor):
            return False
    return True


def per_call_us(fn, calls=20000, repeats=5):
    for _ in range(500):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t) / calls * 1e6)
    return sorted(times)[repeats // 2]


def main():
    print("warpattn from", warpattn.__file__)
    torch_op._warpattn = Stub()
    torch_op._may_skip_dispatcher = skip_dispatcher_on_cpu
    q = torch.randn(1, 1, 8, 128, dtype=torch.bfloat16)
    k = torch.randn(1, 128, 8, 128, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    lens = torch.full((1,), 128, dtype=torch.int32)

    def call():
        warpattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens)
    print("the Python layers of a decode call: %.2f us" % per_call_us(call))
    print("one q.new_empty: %.2f us" % per_call_us(lambda: q.new_empty((1, 1, 8, 128))))
    if "--profile" in sys.argv[1:]:
        profile = cProfile.Profile()
        profile.runcall(lambda: [call() for _ in range(20000)])
        pstats.Stats(profile).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
