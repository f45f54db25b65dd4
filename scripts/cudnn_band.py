"""cuDNN's causal attention with a sliding window, through the cuDNN frontend's Python graph
API (issue 19's anchor: PyTorch's SDPA has no window, and an explicit mask would time another
kernel). The frontend is a separate wheel, `nvidia-cudnn-frontend`; the GPU host has no network,
so scripts/gpu_run.sh installs whatever wheel lies in .wheels/ (git-ignored, carried):

    pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux_2_28_x86_64 -d .wheels nvidia-cudnn-frontend==1.14.0

It runs on the cuDNN library that PyTorch loaded (9.19 on our H200).

cuDNN's window is a length W: with the causal mask, row i sees keys i - W < j <= i, which is
FlashAttention's window_size = (W - 1, 0) on a square problem.
"""
import math


def cudnn_causal_band(q, k, v, window_left=None):
    """A callable running cuDNN's causal attention of the (B, S, H, d) BF16 tensors q, k, v
    (window_left: keys left of the diagonal each row sees, None for unbounded), and the output
    tensor it writes. Raises (ImportError, or the frontend's error) where cuDNN cannot."""
    import cudnn
    import torch

    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    out = torch.empty_like(q)
    # cuDNN's dims are (B, H, S, d); the strides keep PyTorch's (B, S, H, d) memory.
    qt, kt, vt, ot = (t.transpose(1, 2) for t in (q, k, v, out))
    graph = cudnn.pygraph(io_data_type=cudnn.data_type.BFLOAT16, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=handle)
    gq, gk, gv = graph.tensor_like(qt), graph.tensor_like(kt), graph.tensor_like(vt)
    options = dict(name="sdpa", q=gq, k=gk, v=gv, is_inference=True, attn_scale=1.0 / math.sqrt(q.shape[-1]),
                   use_causal_mask=True)
    if window_left is not None:
        options["sliding_window_length"] = window_left + 1
    go, _ = graph.sdpa(**options)
    go.set_output(True).set_dim(list(ot.shape)).set_stride(list(ot.stride()))
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()
    workspace = torch.empty(max(graph.get_workspace_size(), 1), device=q.device, dtype=torch.uint8)
    buffers = {gq: qt, gk: kt, gv: vt, go: ot}

    def run():
        graph.execute(buffers, workspace, handle=handle)
        return out

    return run, out
