"""warpattn for PyTorch: a torch.library custom op, so flash_attn_func works under
torch.compile and CUDA graph capture, on PyTorch's current stream."""
from typing import Optional, Tuple

import torch

from . import _warpattn


def _stream(t):
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


@torch.library.custom_op("warpattn::flash_attn_forward", mutates_args=())
def flash_attn_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       softmax_scale: Optional[float], causal: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)
    _warpattn.forward(q, k, v, out, lse, softmax_scale, causal, _stream(q))
    return out, lse


@flash_attn_forward.register_fake
def _(q, k, v, softmax_scale, causal):
    return (q.new_empty(q.shape),
            q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32))


def _no_backward(ctx, grad_out, grad_lse):
    raise RuntimeError("warpattn: the backward pass is not implemented yet (forward only); "
                       "call flash_attn_func under torch.no_grad() or on tensors that do not "
                       "require grad")


flash_attn_forward.register_autograd(_no_backward, setup_context=lambda ctx, inputs, output: None)


def flash_attn_torch(q, k, v, softmax_scale, causal, return_lse, out):
    if out is None:
        o, lse = flash_attn_forward(q, k, v, softmax_scale, causal)
        return (o, lse) if return_lse else o
    # Writing into a caller's tensor is outside the custom op (a graph break under compile).
    lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device) if return_lse else None
    _warpattn.forward(q, k, v, out, lse, softmax_scale, causal, _stream(q))
    return (out, lse) if return_lse else out
