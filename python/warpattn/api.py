"""flash_attn_func and flash_attn_backward for any DLPack tensor: PyTorch (torch.library custom
ops, differentiable), CuPy, JAX (through warpattn.jax_ffi, differentiable and jit-able, where
this build has its XLA FFI handlers; else eagerly through DLPack)."""
import contextlib
import operator

from . import _warpattn

_FRAMEWORKS = {"torch": "torch", "cupy": "cupy", "jax": "jax", "jaxlib": "jax", "numpy": "numpy"}


_FRAMEWORK_OF_TYPE = {}  # type -> framework, for the types seen to be one (a call's host cost)


def framework_of(x, name):
    """'torch', 'cupy', 'jax' or 'numpy'; TypeError for anything else."""
    fw = _FRAMEWORK_OF_TYPE.get(type(x))
    if fw is not None:
        return fw
    root = type(x).__module__.split(".")[0]
    if root in _FRAMEWORKS and hasattr(x, "__dlpack__"):
        _FRAMEWORK_OF_TYPE[type(x)] = _FRAMEWORKS[root]
        return _FRAMEWORKS[root]
    raise TypeError("%s: expected a DLPack tensor (PyTorch, JAX, CuPy or NumPy), got %s.%s"
                    % (name, type(x).__module__, type(x).__name__))


def _common_framework(q, **others):
    """q's framework, once every other tensor given (None: not given) is found to be of it too."""
    fw = framework_of(q, "q")
    same = type(q)
    for name, t in others.items():
        if t is not None and type(t) is not same and framework_of(t, name) != fw:
            raise TypeError("%s: expected a %s tensor like q, got %s.%s"
                            % (name, fw, type(t).__module__, type(t).__name__))
    return fw


def _call_framework(q, names, *others):
    """_common_framework for tensors passed in order (`names`: their arguments' names), without
    building its keyword arguments where every tensor given has q's own type (the host cost of a
    decode step, issue 16): the named check only when one does not."""
    same = type(q)
    for t in others:
        if t is not None and type(t) is not same:
            return _common_framework(q, **dict(zip(names, others)))
    return framework_of(q, "q")


_torch_op = None


def _torch_ops():
    """warpattn.torch_op, imported on the first PyTorch call (the package imports without
    PyTorch) and then kept: an import statement in a function costs each call ~1.5 us."""
    global _torch_op
    if _torch_op is None:
        from . import torch_op
        _torch_op = torch_op
    return _torch_op


def _check_rank(q):
    if q.ndim != 4:
        raise ValueError("q: expected rank 4 (batch, seqlen, heads, head_dim), got rank %d" % len(q.shape))


def _scale(softmax_scale):
    return None if softmax_scale is None else float(softmax_scale)


def _lse_shape(q):
    return (q.shape[0], q.shape[2], q.shape[1])


# ------------------------------------------------------------ window_size, softcap, sinks
# The model options (ForwardOptions and BackwardOptions in warpattn.hpp). Python converts
# window_size to the library's two ints and leaves every rule to the library (ValueError with its
# message), so that each entry point reports a bad value the same way, the backward's included
# (softcap runs at every head dim: at 64 or less in the 128 kernel). With sinks
# the backward also writes their gradient, dsinks: fp32, one per query head.

_INT32 = (-2 ** 31, 2 ** 31 - 1)


def _window_side(x, name):
    if isinstance(x, bool):
        raise TypeError("window_size: expected a pair of ints, got bool for %s" % name)
    try:
        n = operator.index(x)
    except TypeError:
        raise TypeError("window_size: expected a pair of ints, got %s.%s for %s"
                        % (type(x).__module__, type(x).__name__, name)) from None
    # The library takes an int. Past 2^31 - 1 keys a side bounds nothing (sequences are shorter
    # than 2^31, the kernels' coordinate rule), so clamping there changes no result; below -2^31
    # the clamped value is as invalid as the given one and the library says so.
    return min(max(n, _INT32[0]), _INT32[1])


def _window(window_size):
    """FlashAttention's window_size, (left, right) with -1 for an unbounded side, as the
    library's (window_left, window_right)."""
    try:
        sides = tuple(window_size)
    except TypeError:
        raise TypeError("window_size: expected a pair of ints (left, right), got %s.%s"
                        % (type(window_size).__module__, type(window_size).__name__)) from None
    if len(sides) != 2:
        raise ValueError("window_size: expected a pair of ints (left, right), got %d values" % len(sides))
    return _window_side(sides[0], "left"), _window_side(sides[1], "right")


def _model_values(window_size, softcap):
    """(window_left, window_right, softcap) as the library takes them."""
    if (type(window_size) is tuple and len(window_size) == 2 and type(window_size[0]) is int
            and type(window_size[1]) is int and window_size == (-1, -1)):  # the default, without _window's checks
        return -1, -1, float(softcap)
    left, right = _window(window_size)
    return left, right, float(softcap)


def _model_options(window_size, softcap, sinks):
    """The keyword arguments of the module's forward calls: window_left, window_right, softcap,
    sinks (None or a tensor of the call's framework, checked by the library)."""
    left, right, cap = _model_values(window_size, softcap)
    return {"window_left": left, "window_right": right, "softcap": cap, "sinks": sinks}


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, return_lse=False, out=None, deterministic=False,
                    batch_invariant=False, window_size=(-1, -1), softcap=0.0, sinks=None):
    """Exact attention: softmax(softmax_scale * q k^T [+ causal mask]) v.

    q: (batch, seqlen_q, heads, head_dim); k, v: (batch, seqlen_k, heads_kv, head_dim) with
    heads a multiple of heads_kv (GQA/MQA); float16 or bfloat16 on a CUDA device; head_dim a
    multiple of 8 from 8 to 512 (warpattn.forward_head_dims, with gradients: backward_head_dims;
    above 256 in the 512 kernels); any batch/sequence/head strides with a contiguous last dimension.
    softmax_scale: default 1/sqrt(head_dim). causal: aligned bottom-right when
    seqlen_q != seqlen_k (as FlashAttention 2 and 3). out: optional output tensor to write
    (not differentiable). Returns out, or (out, lse) with return_lse, lse being
    (batch, heads, seqlen_q) float32 (natural log). Runs on the caller's current stream;
    argument errors raise ValueError, a tensor that is not on a CUDA device TypeError.
    PyTorch: differentiable in q, k and v (head_dim in warpattn.backward_head_dims; a gradient
    of lse is refused with NotImplementedError unless it is zero); deterministic=True makes the
    backward give the same bits on every run (slower). batch_invariant=True: a row's result
    depends only on its own sequence, never on the batch around it (no split of the last wave;
    the backward deterministic). CuPy: see flash_attn_backward. JAX: warpattn.jax_ffi.flash_attn
    (on XLA's stream; under jax.jit and jax.grad too), or without the FFI handlers the eager
    DLPack path (warpattn.jax_flash_attn for gradients).
    Model options, as FlashAttention takes them, differentiable too (PyTorch: sinks that require
    grad get their gradient; softcap's backward at 64 or less runs in the head-dim-128 kernel):
    window_size=(left, right), a
    sliding window in which query row i sees key j iff i + seqlen_k - seqlen_q - left <= j <=
    i + seqlen_k - seqlen_q + right (-1: that side unbounded; with causal, right must be -1 or
    0); softcap > 0: scores become softcap * tanh(score / softcap) before the mask and softmax
    (0: off); sinks: a float32 (heads,) tensor of the call's framework, one logit per query head
    joining its softmax denominator (a row's weights then sum to less than 1, lse includes the
    sink, and a row that sees no key gets 0 and lse = its sink).
    """
    fw = _common_framework(q, k=k, v=v, out=out, sinks=sinks)
    _check_rank(q)
    scale = _scale(softmax_scale)
    model = _model_options(window_size, softcap, sinks)
    if fw == "torch":
        return _torch_ops().flash_attn_torch(q, k, v, scale, bool(causal), return_lse, out, bool(deterministic),
                                             bool(batch_invariant), **model)
    if fw == "jax":
        ffi = _jax_ffi()
        if ffi is None:
            return _flash_attn_jax(q, k, v, scale, bool(causal), return_lse, out, bool(batch_invariant), model)
        _no_out(out)
        return ffi.flash_attn(q, k, v, scale, causal, return_lse, deterministic, batch_invariant,
                              window_size=(model["window_left"], model["window_right"]), softcap=model["softcap"],
                              sinks=sinks)
    xp = _array_module(fw)
    with device_of(q, fw):  # allocate on q's device and take that device's current stream
        if out is None:
            out = xp.empty(tuple(q.shape[:-1]) + (v.shape[-1],), dtype=q.dtype)  # v's head dim
        lse = xp.empty(_lse_shape(q), dtype=xp.float32) if return_lse else None
        _warpattn.forward(q, k, v, out, lse, scale, bool(causal), _current_stream(fw, q), bool(batch_invariant),
                          **model)
    return (out, lse) if return_lse else out


def flash_attn_backward(dout, q, k, v, out, lse, softmax_scale=None, causal=False, deterministic=False,
                        dq=None, dk=None, dv=None, window_size=(-1, -1), softcap=0.0, sinks=None):
    """The gradients (dq, dk, dv) of out = flash_attn_func(q, k, v, softmax_scale, causal,
    window_size=window_size, softcap=softcap, sinks=sinks) with respect to q, k and v, given
    dout = dL/d(out) and the forward's out and lse (return_lse=True); with sinks, (dq, dk, dv,
    dsinks), dsinks the gradient of the sinks: float32 (heads,), a new tensor of the call's
    framework on the sinks' device.

    Tensors of one framework (PyTorch, CuPy, JAX), as in flash_attn_func; dout like out. dq, dk,
    dv: tensors to write (PyTorch and CuPy), shaped as q, k, v (dk and dv summed over the query
    heads of a group); each one not given is allocated. softmax_scale and causal must be those of
    the forward call. deterministic: the same bits on every run (dq's partial sums are added in
    a fixed order), slower. Head dims: warpattn.backward_head_dims (multiples of 8 up to 512). Runs on the
    current stream (PyTorch, CuPy) and returns without synchronising; JAX arrays go through
    warpattn.jax_ffi (XLA's stream), or without its handlers are waited for and the result
    handed back once computed. PyTorch users get this through autograd. window_size, softcap and
    sinks: those of the forward call (softcap at every head dim).
    """
    fw = _common_framework(q, dout=dout, k=k, v=v, out=out, lse=lse, dq=dq, dk=dk, dv=dv, sinks=sinks)
    model = _model_options(window_size, softcap, sinks)
    _check_rank(q)
    args = (dout, q, k, v, out, lse, _scale(softmax_scale), bool(causal), bool(deterministic))
    if fw == "jax":
        if any(g is not None for g in (dq, dk, dv)):
            raise ValueError("dq, dk, dv: JAX arrays are immutable; call without them")
        ffi = _jax_ffi()
        if ffi is not None:
            return ffi.flash_attn_backward(*args, window_size=(model["window_left"], model["window_right"]),
                                           softcap=model["softcap"], sinks=sinks)
        _wait_for_jax_arrays(dout=dout, q=q, k=k, v=v, out=out, lse=lse,
                             **({} if sinks is None else {"sinks": sinks}))
        return tuple(_jax_run(q.devices().pop().id, lambda empty: _backward_into(
            *args, (None, None, None), lambda t: empty(t.shape, str(t.dtype)), lambda n: empty((n,), "uint8"), 0,
            model)))
    with device_of(q, fw):  # allocate on q's device
        return _backward_into(*args, (dq, dk, dv), *_backward_allocators(fw, q), _current_stream(fw, q), model)


def _backward_into(dout, q, k, v, out, lse, scale, causal, deterministic, grads, new_like, new_workspace, stream,
                   model):
    """Runs the backward on `stream` into `grads` (dq, dk, dv), allocating each one that is None
    with new_like(the tensor it is the gradient of); with sinks (in model, _model_options'
    keywords) also dsinks = new_like(sinks), returned fourth. The workspace is
    new_workspace(bytes) (None: the library's own pool): memory of the caller's framework, so that
    it is stream-ordered and may be taken during CUDA graph capture, where the library's pool may
    not."""
    dq, dk, dv = (g if g is not None else new_like(t) for g, t in zip(grads, (q, k, v)))
    sinks = model["sinks"]
    dsinks = None if sinks is None else new_like(sinks)
    workspace = new_workspace(_warpattn.backward_workspace_bytes(q, scale, causal, deterministic, **model))
    _warpattn.backward(dout, q, k, v, out, lse, dq, dk, dv, scale, causal, deterministic, workspace, stream,
                       dsinks=dsinks, **model)
    return (dq, dk, dv) if sinks is None else (dq, dk, dv, dsinks)


def _backward_allocators(fw, q):
    """(new_like, new_workspace) for _backward_into: contiguous tensors and bytes of the
    framework's own on q's device (CuPy: its current one). Host tensors are validated, then
    refused: they get no workspace, whose host alignment would be reported instead."""
    if fw == "torch":
        import torch

        def new_like(t):
            return t.new_empty(t.shape)

        def new_workspace(n):
            return torch.empty(n, dtype=torch.uint8, device=q.device) if q.is_cuda else None
        return new_like, new_workspace
    xp = _array_module(fw)

    def new_like(t):
        return xp.empty(t.shape, dtype=t.dtype)

    def new_workspace(n):
        return xp.empty(n, dtype=xp.uint8) if fw == "cupy" else None
    return new_like, new_workspace


def device_of(x, fw):
    """A context in which x's device is CuPy's current one (the library itself runs on the device
    of its tensors whatever is current; allocations and current streams are not)."""
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


def _current_stream(fw, x):
    """The current stream of x's device in x's framework, as an integer (0: none, for host arrays)."""
    if fw == "cupy":
        import cupy
        with cupy.cuda.Device(x.device.id):
            return cupy.cuda.get_current_stream().ptr
    if fw == "torch" and x.is_cuda:
        return _torch_raw_stream()(x.get_device())
    return 0


_raw_stream = None


def _torch_raw_stream():
    """PyTorch's current stream of a device index as an integer: torch._C's own accessor (what
    torch.compile's generated code calls) costs a fraction of torch.cuda.current_stream, which
    builds a Stream object per call; that where a build lacks it."""
    global _raw_stream
    if _raw_stream is None:
        import torch
        _raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
            lambda index: torch.cuda.current_stream(index).cuda_stream)
    return _raw_stream


# ---------------------------------------------------------------------------------- JAX
# JAX arrays go to warpattn.jax_ffi where this build has its XLA FFI handlers: custom calls on
# XLA's stream and buffers, eager or under jax.jit. What follows is the fallback for builds
# without them (jax not importable at build time): JAX arrays are immutable and JAX exposes no
# stream, so the inputs are waited for, the results are written into memory from PyTorch or CuPy
# (whichever is installed) on the legacy default stream of the device, the device is
# synchronised, and the memory is handed to JAX without a copy. Those calls run eagerly, on
# concrete arrays; under jax.jit they are refused.

# False: JAX arrays take the DLPack fallback even where the handlers exist (for tests that hold
# the two paths against each other).
_PREFER_JAX_FFI = True


def _jax_ffi():
    """warpattn.jax_ffi where this build has its handlers, else None (the DLPack fallback).
    Imported here, on a call that got JAX arrays, so that importing warpattn imports no JAX."""
    if not _PREFER_JAX_FFI:
        return None
    from . import jax_ffi
    return jax_ffi if jax_ffi.available() else None


def _no_out(out):
    if out is not None:
        raise ValueError("out: JAX arrays are immutable; call without out")


def _wait_for_jax_arrays(**arrays):
    """Blocks until every array is computed. TypeError for an abstract (traced) array, which has
    no memory to read, and for one that is not on a GPU."""
    import jax
    tracer = getattr(jax.core, "Tracer", ())
    for name, a in arrays.items():
        if isinstance(a, tracer):
            raise TypeError("%s: this build of warpattn takes concrete JAX arrays only (it reads their memory "
                            "through DLPack), not traced ones under jax.jit, vmap or the like: it has no XLA FFI "
                            "handlers (warpattn.jax_ffi.available() is False; rebuild with jax installed). For "
                            "gradients use warpattn.jax_flash_attn with jax.grad outside jax.jit" % name)
        platform = a.devices().pop().platform
        if platform != "gpu":
            raise TypeError("%s: CUDA tensor required (warpattn runs on the GPU), got a JAX array on %s"
                            % (name, platform))
    for a in arrays.values():
        a.block_until_ready()


def _jax_run(device_index, run):
    """run(empty) writes into memory from PyTorch or CuPy on the default stream of the device;
    the device is synchronised and run's results are handed to JAX without a copy. e4m3 buffers
    are allocated as bytes (uint8): DLPack may not carry FP8."""
    import jax
    # Everything on the device: PyTorch exports a tensor through DLPack only from its own device.
    with _framework_device(device_index) as (empty, sync):
        results = run(lambda shape, kind: empty(shape, "uint8" if kind == "e4m3" else kind))
        sync()
        return [None if r is None else jax.dlpack.from_dlpack(r) for r in results]


def _flash_attn_jax(q, k, v, scale, causal, return_lse, out, batch_invariant=False, model=None):
    """flash_attn_func on JAX arrays through DLPack (the fallback: see above). model: the module's
    model keyword arguments (_model_options), or None for none."""
    _no_out(out)
    model = model or {}
    sinks = model.get("sinks")
    _wait_for_jax_arrays(q=q, k=k, v=v, **({} if sinks is None else {"sinks": sinks}))

    def run(empty):
        o = empty(tuple(q.shape[:-1]) + (v.shape[-1],), str(q.dtype))  # v's head dim
        lse = empty(_lse_shape(q), "float32") if return_lse else None
        # Stream 0: the legacy default stream of the tensors' device (the library runs there).
        _warpattn.forward(q, k, v, o, lse, scale, causal, 0, batch_invariant, **model)
        return o, lse

    o, lse = _jax_run(q.devices().pop().id, run)
    return (o, lse) if return_lse else o


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
