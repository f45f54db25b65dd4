"""warpattn for PyTorch: torch.library custom ops for the forward and the backward (dense, and packed
varlen batches), each pair joined by register_autograd, so that flash_attn_func and
flash_attn_varlen_func are differentiable and work under torch.compile and CUDA graph capture, on
PyTorch's current stream; and the forward over KV caches (flash_attn_with_kvcache, inference
only: no autograd formula), whose appending op declares the caches it writes (mutates_args). The
public calls reach the forward op through an autograd.Function with the same formula where a
gradient is wanted (cheaper per call: _autograd_function), directly where not; and in eager
PyTorch on plain CUDA tensors each op's body runs without the dispatcher (_call), which is needed
only under torch.compile, tracing, the profiler, modes and subclasses.

The forward ops take the model options (window_left, window_right, softcap, sinks), and so do
the backward ops, which return the sinks' gradient too (dsinks, float32 (heads,); an empty (0,)
tensor when there are no sinks, since an op's tuple of outputs cannot hold None): register_autograd
hands it to the sinks input, so learned sinks (requires_grad) train. An argument error of the
backward is the library's ValueError when the backward op runs: not in the autograd formula, so
that torch.compile can still trace the backward of such a call (it does so ahead of time whenever
an input requires grad) and only a backward that actually runs fails, eagerly or compiled alike."""
from typing import Optional, Tuple

import torch

from . import _warpattn
from .api import _current_stream, flash_attn_backward as _flash_attn_backward
from .kvcache import _out_shape as _kvcache_out_shape
from .kvcache_fp8 import is_e4m3


# ------------------------------------------------------------------ the dispatcher, where needed
# Each op's body also runs directly, without PyTorch's dispatcher, where nothing the dispatcher
# gives is in play: the dispatcher's path costs ~7.5 us a call on the 2-core dev machine
# (scripts/torch_op_overhead_cpu.py; about 3x that on the H200 host's slower thread), against
# issue 16's bar of 20 us for a whole call. What needs the op (torch.compile and export, jit
# tracing, the profiler's op events, dispatch and function modes such as FakeTensorMode,
# functorch's transforms, tensor subclasses such as FakeTensor or DTensor) is each a condition of
# _may_skip_dispatcher. CUDA graph capture needs nothing of it: the body allocates through
# PyTorch's caching allocator and synchronises nothing, as the op does.

_functorch_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)
_function_mode_enabled = getattr(torch._C, "_is_torch_function_mode_enabled", lambda: False)
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 0)
# Bound once (the same function objects, which torch.compile recognises): each module attribute
# looked up per call costs on the host path.
_is_compiling, _jit_tracing = torch.compiler.is_compiling, torch.jit.is_tracing
_profiler_enabled, _grad_enabled = torch.autograd._profiler_enabled, torch.is_grad_enabled


def _modes_active():
    """Whether anything that needs the op is in play: compile or export, jit tracing, the profiler,
    dispatch or function modes, functorch's transforms."""
    return bool(_is_compiling() or _jit_tracing() or _profiler_enabled() or _dispatch_modes()
                or _function_mode_enabled() or _functorch_active())


def _may_skip_dispatcher(args):
    if _modes_active():
        return False
    # CUDA tensors only (meta and CPU ones meet the fake implementation or the refusal through
    # the op), and none that wants a gradient from the op itself (its formula, or PyTorch's
    # refusal where it has none).
    grad = _grad_enabled()
    for a in args:
        if a is None:  # an optional tensor not given (most of a decode step's): no type to test
            continue
        t = type(a)
        if t in _PLAIN_TENSORS:
            if not a.is_cuda or (grad and a.requires_grad):
                return False
        elif t not in _NOT_TENSORS and isinstance(a, torch.Tensor):  # a subclass
            return False
    return True


def _plain_cuda(*tensors):
    """_may_skip_dispatcher for a caller that names the call's tensors (None: not given) and has
    found that none wants a gradient (_needs_grad): no mode needs the op, and each is a plain
    CUDA tensor."""
    if _modes_active():
        return False
    for t in tensors:
        if t is not None and (type(t) not in _PLAIN_TENSORS or not t.is_cuda):
            return False
    return True


_PLAIN_TENSORS = frozenset((torch.Tensor, torch.nn.Parameter))
_NOT_TENSORS = frozenset((type(None), bool, int, float))  # the ops' other arguments, told apart without isinstance


_BODIES = {}  # id(op) -> the op's undecorated body (kept here, not set on PyTorch's op object)


def _custom_op(name, mutates_args=()):
    """torch.library.custom_op, with the undecorated body kept for _call."""
    def register(body):
        op = torch.library.custom_op(name, mutates_args=mutates_args)(body)
        _BODIES[id(op)] = body
        return op
    return register


def _call(op, *args):
    """op(*args), through the dispatcher only where _may_skip_dispatcher says it is needed."""
    return _BODIES[id(op)](*args) if _may_skip_dispatcher(args) else op(*args)


def _lse_like(q):
    return q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)


def _out_shape(q, v):
    """out's shape: q's with v's head dim (which may differ from q's: MLA's 192/128)."""
    return tuple(q.shape[:-1]) + (v.shape[-1],)


# Outputs are contiguous whatever the inputs' strides, in the real ops and the fake ones alike.
def _forward_outputs(q, v):
    return q.new_empty(_out_shape(q, v)), _lse_like(q)


def _gradients_like(q, k, v, sinks):
    """dq, dk, dv and dsinks as the backward ops return them (dsinks (0,) without sinks)."""
    dsinks = q.new_empty((0,), dtype=torch.float32) if sinks is None else sinks.new_empty(sinks.shape)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsinks


def _with_dsinks(grads, q):
    """The explicit backward's (dq, dk, dv[, dsinks]) as the ops return them."""
    return tuple(grads) if len(grads) == 4 else tuple(grads) + (q.new_empty((0,), dtype=torch.float32),)


@_custom_op("warpattn::flash_attn_forward")
def flash_attn_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: Optional[float],
                       causal: bool, deterministic: bool, batch_invariant: bool = False, window_left: int = -1,
                       window_right: int = -1, softcap: float = 0.0,
                       sinks: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    # deterministic is the backward's: an input here because setup_context sees only the op's
    # inputs and outputs.
    out, lse = _forward_outputs(q, v)
    _warpattn.forward(q, k, v, out, lse, softmax_scale, causal, _current_stream("torch", q), batch_invariant,
                      window_left=window_left, window_right=window_right, softcap=softcap, sinks=sinks)
    return out, lse


@flash_attn_forward.register_fake
def _(q, k, v, softmax_scale, causal, deterministic, batch_invariant=False, window_left=-1, window_right=-1,
      softcap=0.0, sinks=None):
    return _forward_outputs(q, v)


@_custom_op("warpattn::flash_attn_backward")
def flash_attn_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        out: torch.Tensor, lse: torch.Tensor, dlse: Optional[torch.Tensor],
                        softmax_scale: Optional[float], causal: bool, deterministic: bool, window_left: int = -1,
                        window_right: int = -1, softcap: float = 0.0, sinks: Optional[torch.Tensor] = None
                        ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv and dsinks of flash_attn_forward (dsinks: the sinks' gradient, float32 (heads,),
    or an empty (0,) tensor without sinks). dlse, the gradient of lse, must be None or zero:
    checked here, where the tensors are real also under torch.compile."""
    _refuse_lse_gradient(dlse)
    # The workspace is a tensor of PyTorch's caching allocator, freed in stream order: safe to
    # take during CUDA graph capture (from the graph's pool), where warpattn's own pool is not.
    grads = _flash_attn_backward(dout, q, k, v, out, lse, softmax_scale, causal, deterministic,
                                 window_size=(window_left, window_right), softcap=softcap, sinks=sinks)
    return _with_dsinks(grads, q)


@flash_attn_backward.register_fake
def _(dout, q, k, v, out, lse, dlse, softmax_scale, causal, deterministic, window_left=-1, window_right=-1,
      softcap=0.0, sinks=None):
    return _gradients_like(q, k, v, sinks)


def _refuse_lse_gradient(dlse):
    """NotImplementedError for a non-zero gradient of lse: the kernels have no term for it (nor
    has FlashAttention's backward), and dropping it would give wrong gradients silently."""
    if dlse is None:
        return
    if dlse.is_cuda and torch.cuda.is_current_stream_capturing():
        raise NotImplementedError(
            "warpattn: lse (return_lse=True) receives a gradient, which cannot be checked for zero "
            "during CUDA graph capture, and the backward supports none; detach lse (lse.detach()) "
            "where it feeds what is differentiated")
    if bool(dlse.any()):  # a synchronisation, paid only when lse is differentiated at all
        raise NotImplementedError(
            "warpattn: the backward does not support a gradient of lse (return_lse=True), as "
            "FlashAttention's does not; detach lse (lse.detach()) where it feeds what is differentiated")


def _model_inputs(optional):
    """(batch_invariant, window_left, window_right, softcap, sinks) from the forward op's inputs
    after its required ones (whichever of them setup_context is given; defaults for the rest)."""
    defaults = (False, -1, -1, 0.0, None)
    return tuple(optional) + defaults[len(optional):]


def _setup_context(ctx, inputs, output):
    q, k, v, softmax_scale, causal, deterministic, *optional = inputs
    batch_invariant, *model = _model_inputs(optional)
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, model[3])
    # A batch-invariant backward is a deterministic one (its dQ order depends on the sequence alone).
    ctx.softmax_scale, ctx.causal, ctx.deterministic = softmax_scale, causal, deterministic or batch_invariant
    ctx.window_left, ctx.window_right, ctx.softcap = model[:3]
    # Outputs without a gradient (lse, mostly) arrive as None rather than as zeros, which would
    # cost an allocation and the synchronisation that checks them.
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse, sinks = ctx.saved_tensors
    # contiguous(): sum() and expand() hand down stride-0 gradients, which the kernel cannot read.
    dout = torch.zeros_like(out) if grad_out is None else grad_out.contiguous()
    dq, dk, dv, dsinks = _call(flash_attn_backward, dout, q, k, v, out, lse, grad_lse, ctx.softmax_scale, ctx.causal,
                               ctx.deterministic, ctx.window_left, ctx.window_right, ctx.softcap, sinks)
    # The inputs after q, k, v: softmax_scale, causal, deterministic, batch_invariant, window_left,
    # window_right, softcap (no gradient), then the sinks.
    return (dq, dk, dv) + (None,) * 7 + (None if sinks is None else dsinks,)


flash_attn_forward.register_autograd(_backward, setup_context=_setup_context)


def _needs_grad(*tensors):
    if not _grad_enabled():
        return False
    for t in tensors:  # (a loop, not any() over a generator: a call's host cost)
        if t is not None and t.requires_grad:
            return True
    return False


def _autograd_function(op, setup_context, backward, name):
    """An autograd.Function over a custom op with the op's own setup_context and backward. The
    public calls go through it where a gradient is wanted, and call the op directly where not:
    per call it costs about 2/3 of the host time of the op's register_autograd path (17 against
    26 us on the dev machine, scripts/torch_op_overhead_cpu.py; issue 16's host cost), and it is
    the pattern torch.compile traces for FlashAttention 2's own interface. The op keeps its
    register_autograd for whoever calls it directly (torch.ops.warpattn.*, opcheck)."""
    def forward(ctx, *inputs):
        output = _call(op, *inputs)
        setup_context(ctx, inputs, output)
        return output
    return type(name, (torch.autograd.Function,), {"forward": staticmethod(forward),
                                                    "backward": staticmethod(backward)})


_FlashAttnFunction = _autograd_function(flash_attn_forward, _setup_context, _backward, "_FlashAttnFunction")


def flash_attn_torch(q, k, v, softmax_scale, causal, return_lse, out, deterministic, batch_invariant=False,
                     window_left=-1, window_right=-1, softcap=0.0, sinks=None):
    if out is None:
        args = (q, k, v, softmax_scale, causal, deterministic, batch_invariant, window_left, window_right, softcap,
                sinks)
        if _needs_grad(q, k, v, sinks):
            o, lse = _FlashAttnFunction.apply(*args)
            return (o, lse) if return_lse else o
        if return_lse or not _plain_cuda(q, k, v, sinks):
            o, lse = _call(flash_attn_forward, *args)
            return (o, lse) if return_lse else o
        # Eager, no gradient, no lse asked for: the call below into a new out, without the lse the
        # op would allocate and the kernel store (one allocation fewer: issue 16's host cost).
        out = q.new_empty(_out_shape(q, v))
    # Writing into a caller's tensor is outside the custom op (a graph break under compile), and
    # outside autograd: refused where a gradient could be asked for, as PyTorch's own out= are.
    elif torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise RuntimeError("out: flash_attn_func(..., out=...) is not differentiable, but q, k or v "
                           "requires grad; call it without out=, or under torch.no_grad()")
    lse = _lse_like(q) if return_lse else None
    _warpattn.forward(q, k, v, out, lse, softmax_scale, causal, _current_stream("torch", q), batch_invariant,
                      window_left=window_left, window_right=window_right, softcap=softcap, sinks=sinks)
    return (out, lse) if return_lse else out


# ------------------------------------------------------------------ packed (varlen) batches
# The same pattern as above for flash_attn_varlen_func (warpattn.varlen): the output shapes follow
# from q alone, so the fake implementations need no read of cu_seqlens (torch.compile, CUDA graphs).

def _varlen_lse_like(q):
    return q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)  # FlashAttention's (heads, total_q)


def _varlen_outputs(q, v):
    return q.new_empty(_out_shape(q, v)), _varlen_lse_like(q)


@_custom_op("warpattn::flash_attn_varlen_forward")
def flash_attn_varlen_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                              cu_seqlens_k: torch.Tensor, seqused_k: Optional[torch.Tensor], max_seqlen_q: int,
                              max_seqlen_k: int, softmax_scale: Optional[float], causal: bool,
                              deterministic: bool, batch_invariant: bool = False, window_left: int = -1,
                              window_right: int = -1, softcap: float = 0.0,
                              sinks: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    out, lse = _varlen_outputs(q, v)
    _warpattn.forward_varlen(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                             softmax_scale, causal, _current_stream("torch", q), batch_invariant,
                             window_left=window_left, window_right=window_right, softcap=softcap, sinks=sinks)
    return out, lse


@flash_attn_varlen_forward.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
      deterministic, batch_invariant=False, window_left=-1, window_right=-1, softcap=0.0, sinks=None):
    return _varlen_outputs(q, v)


@_custom_op("warpattn::flash_attn_varlen_backward")
def flash_attn_varlen_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               out: torch.Tensor, lse: torch.Tensor, dlse: Optional[torch.Tensor],
                               cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                               seqused_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int,
                               softmax_scale: Optional[float], causal: bool, deterministic: bool,
                               window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                               sinks: Optional[torch.Tensor] = None
                               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv and dsinks (as flash_attn_backward's) of flash_attn_varlen_forward."""
    _refuse_lse_gradient(dlse)
    from .varlen import flash_attn_varlen_backward as backward
    grads = backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                     causal, deterministic, seqused_k=seqused_k, window_size=(window_left, window_right),
                     softcap=softcap, sinks=sinks)
    return _with_dsinks(grads, q)


@flash_attn_varlen_backward.register_fake
def _(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
      softmax_scale, causal, deterministic, window_left=-1, window_right=-1, softcap=0.0, sinks=None):
    return _gradients_like(q, k, v, sinks)


def _varlen_setup_context(ctx, inputs, output):
    (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, det,
     *optional) = inputs
    batch_invariant, *model = _model_inputs(optional)
    ctx.save_for_backward(q, k, v, *output, cu_seqlens_q, cu_seqlens_k, seqused_k, model[3])
    ctx.options = (max_seqlen_q, max_seqlen_k, softmax_scale, causal, det or batch_invariant)
    ctx.model = tuple(model[:3])
    ctx.set_materialize_grads(False)


def _varlen_backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, sinks = ctx.saved_tensors
    dout = torch.zeros_like(out) if grad_out is None else grad_out.contiguous()
    dq, dk, dv, dsinks = _call(flash_attn_varlen_backward, dout, q, k, v, out, lse, grad_lse, cu_seqlens_q,
                               cu_seqlens_k, seqused_k, *ctx.options, *ctx.model, sinks)
    # The inputs after q, k, v: the offsets and lengths, the options (no gradient), then the sinks.
    return (dq, dk, dv) + (None,) * 12 + (None if sinks is None else dsinks,)


flash_attn_varlen_forward.register_autograd(_varlen_backward, setup_context=_varlen_setup_context)
_FlashAttnVarlenFunction = _autograd_function(flash_attn_varlen_forward, _varlen_setup_context, _varlen_backward,
                                              "_FlashAttnVarlenFunction")


def flash_attn_varlen_torch(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                            softmax_scale, causal, return_lse, out, deterministic, batch_invariant=False,
                            window_left=-1, window_right=-1, softcap=0.0, sinks=None):
    if out is None:
        args = (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                deterministic, batch_invariant, window_left, window_right, softcap, sinks)
        o, lse = (_FlashAttnVarlenFunction.apply(*args) if _needs_grad(q, k, v, sinks)
                  else _call(flash_attn_varlen_forward, *args))
        return (o, lse) if return_lse else o
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise RuntimeError("out: flash_attn_varlen_func(..., out=...) is not differentiable, but q, k or v "
                           "requires grad; call it without out=, or under torch.no_grad()")
    lse = _varlen_lse_like(q) if return_lse else None
    _warpattn.forward_varlen(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                             softmax_scale, causal, _current_stream("torch", q), batch_invariant,
                             window_left=window_left, window_right=window_right, softcap=softcap, sinks=sinks)
    return (out, lse) if return_lse else out


# ------------------------------------------------------------------------------ KV caches
# flash_attn_with_kvcache (warpattn.kvcache): inference only, so the ops have no autograd formula
# (a backward through them is refused by PyTorch). Two ops, so that only the call that appends
# declares the caches mutated (mutates_args; functionalised under torch.compile) and the call that
# only attends stays a pure one. The outputs follow from q and v_cache's shapes alone, so the fake
# implementations read neither the lengths nor the block table (torch.compile, CUDA graphs).

def _kvcache_outputs(q, v_cache):
    return q.new_empty(_kvcache_out_shape(q, v_cache)), _lse_like(q)


def _cache_bytes(cache):
    """An E4M3 cache as the module takes every FP8 operand (fp8.py): its bytes, a uint8 view."""
    return cache.view(torch.uint8) if is_e4m3(cache) else cache


def _kvcache_run(q, k_cache, v_cache, k, v, cache_seqlens, block_table, softmax_scale, causal, batch_invariant,
                 window_left, window_right, softcap, sinks, num_splits, k_descale, v_descale, out=None, lse=None):
    _warpattn.forward_kvcache(q, _cache_bytes(k_cache), _cache_bytes(v_cache), out, lse, k, v, cache_seqlens,
                              block_table, softmax_scale, causal, _current_stream("torch", q), batch_invariant,
                              window_left=window_left, window_right=window_right, softcap=softcap, sinks=sinks,
                              num_splits=num_splits, k_descale=k_descale, v_descale=v_descale)


@_custom_op("warpattn::flash_attn_kvcache_forward")
def flash_attn_kvcache_forward(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               cache_seqlens: Optional[torch.Tensor], block_table: Optional[torch.Tensor],
                               softmax_scale: Optional[float], causal: bool, batch_invariant: bool = False,
                               window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                               sinks: Optional[torch.Tensor] = None, num_splits: int = 0,
                               k_descale: Optional[torch.Tensor] = None,
                               v_descale: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """out and lse of q over the caches, which it only reads (no new keys and values)."""
    out, lse = _kvcache_outputs(q, v_cache)
    _kvcache_run(q, k_cache, v_cache, None, None, cache_seqlens, block_table, softmax_scale, causal, batch_invariant,
                 window_left, window_right, softcap, sinks, num_splits, k_descale, v_descale, out, lse)
    return out, lse


@flash_attn_kvcache_forward.register_fake
def _(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, causal, batch_invariant=False, window_left=-1,
      window_right=-1, softcap=0.0, sinks=None, num_splits=0, k_descale=None, v_descale=None):
    return _kvcache_outputs(q, v_cache)


@_custom_op("warpattn::flash_attn_kvcache_append_forward", mutates_args=("k_cache", "v_cache"))
def flash_attn_kvcache_append_forward(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                      k: torch.Tensor, v: torch.Tensor, cache_seqlens: torch.Tensor,
                                      block_table: Optional[torch.Tensor], softmax_scale: Optional[float],
                                      causal: bool, batch_invariant: bool = False, window_left: int = -1,
                                      window_right: int = -1, softcap: float = 0.0,
                                      sinks: Optional[torch.Tensor] = None, num_splits: int = 0,
                                      k_descale: Optional[torch.Tensor] = None,
                                      v_descale: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """k and v written into k_cache and v_cache in place at rows cache_seqlens[b] on (quantised
    with the descales into an E4M3 cache), then out and lse of q over the caches so grown."""
    out, lse = _kvcache_outputs(q, v_cache)
    _kvcache_run(q, k_cache, v_cache, k, v, cache_seqlens, block_table, softmax_scale, causal, batch_invariant,
                 window_left, window_right, softcap, sinks, num_splits, k_descale, v_descale, out, lse)
    return out, lse


@flash_attn_kvcache_append_forward.register_fake
def _(q, k_cache, v_cache, k, v, cache_seqlens, block_table, softmax_scale, causal, batch_invariant=False,
      window_left=-1, window_right=-1, softcap=0.0, sinks=None, num_splits=0, k_descale=None, v_descale=None):
    return _kvcache_outputs(q, v_cache)


def flash_attn_kvcache_torch(q, k_cache, v_cache, k, v, cache_seqlens, block_table, softmax_scale, causal,
                             return_lse, out, batch_invariant=False, window_left=-1, window_right=-1, softcap=0.0,
                             sinks=None, num_splits=0, k_descale=None, v_descale=None):
    if out is None and k is None and v is None and not return_lse and _may_skip_dispatcher(
            (q, k_cache, v_cache, cache_seqlens, block_table, sinks, k_descale, v_descale)):
        # Eager, nothing appended, no lse asked for: a decode step, whose host cost is issue 16's.
        # No lse is allocated (as above), and the body of flash_attn_kvcache_forward is spelled
        # out here at its cheapest: v_cache's E4M3 test made once (for out's head dim and its
        # bytes), and out's shape (_kvcache_out_shape's) handed to new_empty as separate ints,
        # which PyTorch parses in about 2/3 of the time of a tuple (2.0 against 3.1 us with the
        # tuple built, on the dev machine). q is of rank 4: flash_attn_with_kvcache checked it.
        v_e4m3 = is_e4m3(v_cache)
        batch, seqlen_q, heads, head_dim = q.shape
        out = q.new_empty(batch, seqlen_q, heads, head_dim if v_e4m3 else v_cache.shape[-1])
        _warpattn.forward_kvcache(q, _cache_bytes(k_cache), v_cache.view(torch.uint8) if v_e4m3 else v_cache, out,
                                  None, None, None, cache_seqlens, block_table, softmax_scale, causal,
                                  _current_stream("torch", q), batch_invariant, window_left=window_left,
                                  window_right=window_right, softcap=softcap, sinks=sinks, num_splits=num_splits,
                                  k_descale=k_descale, v_descale=v_descale)
        return out
    model = (batch_invariant, window_left, window_right, softcap, sinks, num_splits, k_descale, v_descale)
    if out is not None:
        # Writing into a caller's tensor is outside the custom ops (a graph break under compile).
        lse = _lse_like(q) if return_lse else None
        _kvcache_run(q, k_cache, v_cache, k, v, cache_seqlens, block_table, softmax_scale, causal, *model, out, lse)
        return (out, lse) if return_lse else out
    if k is None and v is None:
        o, lse = _call(flash_attn_kvcache_forward, q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale,
                       causal, *model)
    elif k is None or v is None or cache_seqlens is None:
        # The op's schema needs k, v and cache_seqlens: the library's own message for what is missing.
        o, lse = _kvcache_outputs(q, v_cache)
        _kvcache_run(q, k_cache, v_cache, k, v, cache_seqlens, block_table, softmax_scale, causal, *model, o, lse)
    else:
        o, lse = _call(flash_attn_kvcache_append_forward, q, k_cache, v_cache, k, v, cache_seqlens, block_table,
                       softmax_scale, causal, *model)
    return (o, lse) if return_lse else o
