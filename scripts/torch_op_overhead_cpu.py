"""What PyTorch's op machinery costs per call on the host, without a GPU (issue 16's host cost):
a do-nothing attention op registered as torch.library.custom_op (warpattn's torch_op.py style,
with register_autograd) against a torch.library.Library op under an autograd.Function, and plain
Python. The kernels are replaced by two torch.empty calls, so what is timed is the wrapping.
Run: python scripts/torch_op_overhead_cpu.py (2026-12-01, the 2-core dev machine: LOG.md)."""
import time, torch
from typing import Tuple, Optional
torch.set_grad_enabled(False)

@torch.library.custom_op("probe::fwd", mutates_args=())
def fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: Optional[float], causal: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    return q.new_empty(q.shape), q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
@fwd.register_fake
def _(q, k, v, scale, causal):
    return q.new_empty(q.shape), q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)

lib = torch.library.Library("probe2", "DEF")
lib.define("fwd(Tensor q, Tensor k, Tensor v, float? scale, bool causal) -> (Tensor, Tensor)")
def fwd2(q, k, v, scale, causal):
    return q.new_empty(q.shape), q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
lib.impl("fwd", fwd2, "CPU")
lib.impl("fwd", fwd2, "CompositeExplicitAutograd") if False else None

q = torch.randn(1, 128, 4, 64)
def bench(f, n=20000):
    for _ in range(200): f()
    t = time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter() - t) / n * 1e6
print("plain python  %.1f us" % bench(lambda: fwd2(q, q, q, None, True)))
print("custom_op     %.1f us" % bench(lambda: fwd(q, q, q, None, True)))
print("Library.impl  %.1f us" % bench(lambda: torch.ops.probe2.fwd(q, q, q, None, True)))
print("torch.empty(0) %.1f us" % bench(lambda: torch.empty(0), 20000))

torch.set_grad_enabled(True)
def setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], output[0])
def bwd(ctx, go, glse):
    return go, go, go, None, None
fwd.register_autograd(bwd, setup_context=setup)
class F(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, causal):
        o, l = torch.ops.probe2.fwd(q, k, v, scale, causal)
        ctx.save_for_backward(q, o)
        return o, l
    @staticmethod
    def backward(ctx, go, gl):
        return go, go, go, None, None
qg = q.clone().requires_grad_()
print("grad: custom_op+register_autograd  %.1f us" % bench(lambda: fwd(qg, qg, qg, None, True), 5000))
print("grad: autograd.Function(Library)   %.1f us" % bench(lambda: F.apply(qg, qg, qg, None, True), 5000))
with torch.no_grad():
    print("no_grad: custom_op %.1f us" % bench(lambda: fwd(qg, qg, qg, None, True), 5000))
print("grad: torch.ops.probe.fwd (same custom op, via dispatcher)  %.1f us" % bench(lambda: torch.ops.probe.fwd(qg, qg, qg, None, True), 5000))
print("grad: torch.ops.probe.fwd.default  %.1f us" % bench(lambda: torch.ops.probe.fwd.default(qg, qg, qg, None, True), 5000))
with torch.no_grad():
    print("no_grad: torch.ops.probe.fwd.default %.1f us" % bench(lambda: torch.ops.probe.fwd.default(qg, qg, qg, None, True), 5000))
