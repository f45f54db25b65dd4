"""flash_attn_func for any DLPack tensor: PyTorch (a torch.library custom op), CuPy, JAX."""
import contextlib

from . import _warpattn

_FRAMEWORKS = {"torch": "torch", "cupy": "cupy", "jax": "jax", "jaxlib": "jax", "numpy": "numpy"}


def framework_of(x, name):
    """'torch', 'cupy', 'jax' or 'numpy'; TypeError for anything else."""
    root = type(x).__module__.split(".")[0]
    if root in _FRAMEWORKS and hasattr(x, "__dlpack__"):
        return _FRAMEWORKS[root]
    raise TypeError("%s: expected a DLPack tensor (PyTorch, JAX, CuPy or NumPy), got %s.%s"
                    % (name, type(x).__module__, type(x).__name__))


def _check_rank(q):
    if len(q.shape) != 4:
        raise ValueError("q: expected rank 4 (batch, seqlen, heads, head_dim), got rank %d" % len(q.shape))


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, return_lse=False, out=None):
    """Exact attention: softmax(softmax_scale * q k^T [+ causal mask]) v.

    q: (batch, seqlen_q, heads, head_dim); k, v: (batch, seqlen_k, heads_kv, head_dim) with
    heads a multiple of heads_kv (GQA/MQA); float16 or bfloat16 on a CUDA device; head_dim 64,
    128 or 256; any batch/sequence/head strides with a contiguous last dimension.
    softmax_scale: default 1/sqrt(head_dim). causal: aligned bottom-right when
    seqlen_q != seqlen_k (as FlashAttention 2 and 3). out: optional output tensor to write.
    Returns out, or (out, lse) with return_lse, lse being (batch, heads, seqlen_q) float32
    (natural log). Runs on the caller's current stream; argument errors raise ValueError,
    a tensor that is not on a CUDA device TypeError.
    """
    fw = framework_of(q, "q")
    for name, t in (("k", k), ("v", v), ("out", out)):
        if t is not None and framework_of(t, name) != fw:
            raise TypeError("%s: expected a %s tensor like q, got %s.%s"
                            % (name, fw, type(t).__module__, type(t).__name__))
    _check_rank(q)
    scale = None if softmax_scale is None else float(softmax_scale)
    if fw == "torch":
        from .torch_op import flash_attn_torch
        return flash_attn_torch(q, k, v, scale, bool(causal), return_lse, out)
    if fw == "jax":
        return _flash_attn_jax(q, k, v, scale, bool(causal), return_lse, out)
    xp = _array_module(fw)
    with device_of(q, fw):  # allocate on q's device and take that device's current stream
        if out is None:
            out = xp.empty(q.shape, dtype=q.dtype)
        lse = xp.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=xp.float32) if return_lse else None
        _warpattn.forward(q, k, v, out, lse, scale, bool(causal), _current_stream(fw))
    return (out, lse) if return_lse else out


def device_of(x, fw):
    """A context in which x's device is CuPy's current one (the library itself runs on the
    device of its tensors whatever is current; allocations and current streams are not)."""
    if fw == "cupy":
        import cupy
        return cupy.cuda.Device(x.device.id)
    return contextlib.nullcontext()


def _array_module(fw):
    if fw == "cupy":
        import cupy
        return cupy
    import numpy  # CPU tensors: validated, then refused ("CUDA tensor required")
    return numpy


def _current_stream(fw):
    if fw == "cupy":
        import cupy
        return cupy.cuda.get_current_stream().ptr
    return 0


def _flash_attn_jax(q, k, v, scale, causal, return_lse, out):
    """JAX arrays are immutable and JAX exposes no stream: the inputs are waited for, the
    result is written into memory from PyTorch or CuPy (whichever is installed), the device is
    synchronised, and the memory is handed to JAX without a copy."""
    import jax
    if out is not None:
        raise ValueError("out: JAX arrays are immutable; call without out")
    for t in (q, k, v):
        t.block_until_ready()
    index = q.devices().pop().id
    # Everything on q's device: PyTorch exports a tensor through DLPack only from its own device.
    with _framework_device(index) as (empty, sync):
        o = empty(q.shape, str(q.dtype))
        lse = empty((q.shape[0], q.shape[2], q.shape[1]), "float32")
        # Stream 0: the legacy default stream of the tensors' device (the library runs there).
        _warpattn.forward(q, k, v, o, lse if return_lse else None, scale, causal, 0)
        sync()
        o = jax.dlpack.from_dlpack(o)
        return (o, jax.dlpack.from_dlpack(lse)) if return_lse else o


def _torch_empty(device_index):
    """empty(shape, dtype_name) on cuda:device_index; "e4m3" is float8_e4m3fn."""
    import torch
    device = torch.device("cuda", device_index)
    types = {"int8": torch.int8, "e4m3": torch.float8_e4m3fn, "uint8": torch.uint8, "float32": torch.float32,
             "float16": torch.float16, "bfloat16": torch.bfloat16}
    return lambda shape, kind: torch.empty(shape, dtype=types[kind], device=device)


def _cupy_empty(device_index):
    """empty(shape, dtype_name) on CuPy device device_index; "e4m3" is its bytes (uint8)."""
    import cupy
    types = {"int8": cupy.int8, "e4m3": cupy.uint8, "uint8": cupy.uint8, "float32": cupy.float32,
             "float16": cupy.float16}

    def empty(shape, kind):
        if kind not in types:
            raise ValueError("CuPy has no %s: use out_dtype='float16'" % kind)
        with cupy.cuda.Device(device_index):
            return cupy.empty(shape, dtype=types[kind])
    return empty


@contextlib.contextmanager
def _framework_device(index):
    """For JAX calls: (empty(shape, dtype_name), sync) from PyTorch or CuPy (whichever is
    installed), with device `index` current in it while the context lasts."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        with torch.cuda.device(index):
            yield _torch_empty(index), lambda: torch.cuda.synchronize(index)
        return
    import cupy
    with cupy.cuda.Device(index):
        yield _cupy_empty(index), cupy.cuda.Device(index).synchronize
