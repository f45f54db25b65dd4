"""warpattn as an attention implementation of Hugging Face transformers (5.x).

    import warpattn.integrations.transformers  # registers "warpattn"
    model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.bfloat16, attn_implementation="warpattn")
    # or, on a loaded model: model.set_attn_implementation("warpattn")

Every attention layer then runs through warpattn. The (batch, heads, seq, head_dim) tensors the
layers hand over are read as (batch, seq, heads, head_dim) views, without copies (warpattn takes
any strides with a contiguous last dimension); GQA/MQA as they come; causal masks aligned
bottom-right, which is what a KV cache needs (prefill and one-token decode alike). Differentiable
(training), since the PyTorch ops are.

- No padding: warpattn.flash_attn_func on the whole batch.
- A padding mask (left or right padding: the ones of each row form one run): the batch goes
  through warpattn.flash_attn_varlen_func without unpadding. Each row is cut into three packed
  sequences, the padding before its tokens, its tokens and the padding after, and the padding
  sequences get seqused_k = 0, so they cost nothing and their rows come out 0 (as FlashAttention's
  pad_input leaves them). The offsets are computed on the device from the mask: no host
  synchronisation and no data-dependent shape, so torch.compile (fullgraph) and CUDA graphs work,
  and no gather or scatter of q, k, v or the output. Keys kept batch-major in memory (a
  DynamicCache's (batch, heads, seq, head_dim) tensors) are read in place through a strided view
  whose rows run on across the batch (the gaps between rows fall into the padding sequences);
  where they need gradients they are reshaped instead (a copy only if their layout needs one).
- Packed sequences in one row (padding-free training: position_ids restarting, or cu_seq_lens_q/k
  passed as FlashAttention kwargs): warpattn.flash_attn_varlen_func on those offsets.

The model options pass through as transformers' own FlashAttention path
(modeling_flash_attention_utils._process_flash_attention_kwargs) hands them to flash_attn:
- sliding_window=W (Mistral, Gemma 2/3, gpt-oss ... sliding layers: the last W keys, the current one
  included) becomes window_size=(W - 1, 0) with causal ((W - 1, W - 1) without: transformers' own
  symmetric choice for non-causal layers), and only where the keys outrun the window (key length
  > W), as there;
- softcap (Gemma 2's attn_logit_softcapping) passes as softcap;
- s_aux (gpt-oss's learned attention sinks, the module's `sinks` parameter, (heads,)) becomes
  sinks, in float32: differentiable, their gradient flows back to the parameter.
Padded batches and packed sequences get the same options (each packed sequence its own window).

What warpattn does not do is refused with NotImplementedError naming it, never done by another
implementation behind the caller's back: position biases, dropout > 0, attention weights
(output_attentions), head dims other than warpattn's (q and k: any multiple of 8 up to 512, with
gradients, warpattn.forward_head_dims and backward_head_dims; v: at most q's, e.g. MLA's 192/128
without padding v), float32 inputs outside autocast, masks other than
a 2-D padding mask (4-D or float masks, padding masks with holes, masks overlaid with
or_mask_function/and_mask_function).
"""
import weakref

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

import warpattn

NAME = "warpattn"


def _static():
    """True while torch.compile traces or a CUDA graph is captured: no host read allowed then."""
    return torch.compiler.is_compiling() or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


# --------------------------------------------------------------------------- the mask function

def warpattn_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None, attention_mask=None,
                  **kwargs):
    """transformers' mask function for "warpattn" (AttentionMaskInterface): the 2-D padding mask
    (batch, <= kv_length) as the attention layers need it, or None where nothing is padded and
    every key is in use. As transformers' flash_attention_mask, except that:
    - under torch.compile or CUDA graph capture the mask is returned even without padding
      (looking for padding would read the device);
    - without a mask, keys past the queries' last position (a StaticCache not yet full, whose
      query offset is a device tensor) get a mask of the keys in use, made on the device;
    - masks overlaid with custom mask functions are refused rather than dropped."""
    if kwargs.get("use_vmap"):
        # create_causal_mask asks for vmap exactly when or_mask_function / and_mask_function overlay
        # the causal mask (e.g. bidirectional image tokens): a pattern a padding mask cannot carry.
        raise NotImplementedError(
            "warpattn: this model overlays a custom mask function (or_mask_function/and_mask_function) on the "
            "causal mask; warpattn takes causal or full attention with a padding mask only")
    if attention_mask is None:
        if isinstance(q_offset, int) and q_offset + q_length >= kv_length:
            return None  # every key is in use
        in_use = torch.arange(kv_length, device=kwargs.get("device")) < q_offset + q_length
        return in_use[None].expand(batch_size, kv_length)
    attention_mask = attention_mask[:, -kv_length:]
    # A StaticCache gives a mask shorter than kv_length (its filled part): it is always needed then.
    if not _static() and attention_mask.shape[1] == kv_length and bool(attention_mask.all()):
        return None
    return attention_mask


# ------------------------------------------------------------------------ the attention function

def warpattn_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                               sliding_window=None, softcap=None, is_causal=None, s_aux=None, **kwargs):
    """The attention function of "warpattn" (AttentionInterface): query (batch, heads, seq_q,
    head_dim), key and value (batch, heads_kv, seq_k, head_dim), attention_mask from warpattn_mask;
    sliding_window, softcap and s_aux (attention sinks, (heads,)) as transformers' models pass them;
    returns (attn_output (batch, seq_q, heads, head_dim), None)."""
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    kv_length = attention_mask.shape[-1] if isinstance(attention_mask, torch.Tensor) else key.shape[2]
    _refuse_what_warpattn_lacks(query, key, value, attention_mask, dropout, softcap, kwargs)
    _refuse_head_dims(query, key, value, s_aux)
    # (batch, seq, heads, head_dim) views of the same memory: no copy.
    q, k, v = (t.transpose(1, 2) for t in _half_precision(query, key, value))
    deterministic = bool(kwargs.get("deterministic") or torch.are_deterministic_algorithms_enabled())
    options = dict(softmax_scale=scaling, causal=causal, deterministic=deterministic,
                   **_model_options(sliding_window, softcap, s_aux, causal, kv_length, q))

    if attention_mask is not None:
        out = _padded_attention(q, k, v, attention_mask, options)
    elif kwargs.get("cu_seq_lens_q") is not None and kwargs.get("cu_seq_lens_k") is not None:
        out = _packed_attention(q, k, v, kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"], options)
    else:
        cu_seqlens = _packed_positions(kwargs.get("position_ids"), q, k)
        if cu_seqlens is not None:
                out = _packed_attention(q, k, v, cu_seqlens, cu_seqlens, options)
        else:
            out = warpattn.flash_attn_func(q, k, v, **options)
    return out, None


def _model_options(sliding_window, softcap, s_aux, causal, kv_length, q):
    """warpattn's window_size, softcap and sinks keywords (only those in use) from transformers'
    sliding_window, softcap and s_aux, mapped as transformers' _process_flash_attention_kwargs
    (modeling_flash_attention_utils.py, 5.x) maps them for flash_attn:
        if sliding_window is not None and key_length > sliding_window:
            flash_kwargs["window_size"] = (sliding_window - 1, sliding_window - 1)
    i.e. the last `sliding_window` keys including the current one (masking_utils'
    sliding_window_overlay: kv_idx > q_idx - sliding_window). With causal the right side is 0 here
    (warpattn takes only -1 or 0 there with causal; the future keys are masked either way). The
    sinks: flash_attention_forward passes s_aux (gpt-oss: s_aux=self.sinks); warpattn takes them
    as a float32 (heads,) tensor on q's device (a differentiable cast: the parameter gets dsinks)."""
    options = {}
    if sliding_window is not None and kv_length > sliding_window:
        if sliding_window < 1:
            raise ValueError("warpattn: sliding_window must be at least 1, got %d" % sliding_window)
        options["window_size"] = (sliding_window - 1, 0 if causal else sliding_window - 1)
    if softcap is not None and softcap != 0:
        options["softcap"] = float(softcap)
    if s_aux is not None:
        options["sinks"] = s_aux.reshape(-1).to(device=q.device, dtype=torch.float32)
    return options


def _refuse_what_warpattn_lacks(query, key, value, mask, dropout, softcap, kwargs):
    def refuse(what):
        raise NotImplementedError("warpattn: %s; use another attn_implementation for this model" % what)
    if dropout:
        refuse("attention dropout is not supported (dropout=%g)" % dropout)
    if kwargs.get("position_bias") is not None:
        refuse("position_bias is not supported")
    if kwargs.get("sinks") is not None:
        refuse("a `sinks` keyword is not understood (transformers passes attention sinks as s_aux)")
    if kwargs.get("output_attentions"):
        refuse("output_attentions=True: warpattn never forms the attention weights")
    if mask is not None and not (isinstance(mask, torch.Tensor) and mask.dim() == 2
                                 and not mask.dtype.is_floating_point):
        what = type(mask).__name__
        if isinstance(mask, torch.Tensor):
            what += " with shape %s and dtype %s" % (tuple(mask.shape), mask.dtype)
        refuse("attention_mask of type %s: warpattn takes a 2-D padding mask (batch, kv_length) of booleans or "
               "0/1 only, as warpattn_mask makes; not 4-D, additive float or block masks" % what)


def _refuse_head_dims(query, key, value, s_aux):
    """q and k: a head dim warpattn's backward takes (multiples of 8 up to 512), or one of its
    forward's beyond that where no gradient is asked for (none today: both go to 512); v: its own
    head dim, at most q's (MLA's 192/128 runs as it comes)."""
    def refuse(what):
        raise NotImplementedError("warpattn: %s; use another attn_implementation for this model" % what)
    d, dv = query.shape[-1], value.shape[-1]
    if key.shape[-1] != d:
        refuse("the key head dim %d differs from the query's (%d)" % (key.shape[-1], d))
    if d not in warpattn.forward_head_dims:
        refuse("head_dim %d is not supported (supported: multiples of 8 up to %d)" % (d, max(warpattn.forward_head_dims)))
    if dv > d or dv not in warpattn.forward_head_dims:
        refuse("the value head dim %d is not supported with the query's %d (a multiple of 8 up to it)" % (dv, d))
    if max(d, dv) not in warpattn.backward_head_dims:
        wants_grad = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (query, key, value, s_aux))
        if wants_grad:
            refuse("head_dim %d has no backward (warpattn's backward takes head dims up to %d): run this model "
                   "without gradients (torch.no_grad / inference_mode)" % (d, max(warpattn.backward_head_dims)))


def _half_precision(query, key, value):
    """q, k, v in float16/bfloat16: cast to the autocast dtype under autocast (as transformers'
    FlashAttention path does, e.g. for PEFT's float32 layer norms); float32 refused otherwise."""
    if query.dtype not in (torch.float16, torch.bfloat16):
        device = query.device.type
        if torch.is_autocast_enabled(device):
            dtype = torch.get_autocast_dtype(device)
            return query.to(dtype), key.to(dtype), value.to(dtype)
        raise NotImplementedError("warpattn: inputs in %s are not supported (float16 and bfloat16 only); load the "
                                  "model with dtype=torch.bfloat16, or run it under torch.autocast" % query.dtype)
    return query, key, value


# ---------------------------------------------------------------------------- padded batches

def _padded_attention(q, k, v, mask, options):
    """Attention over a padded batch, q (B, Sq, H, D), k and v (B, Sk, Hkv, D) views, mask (B, M)
    with M <= Sk (a StaticCache's keys run past the mask: those are not used). Where Sq == M the
    queries are the mask's positions (a prefill); where Sq < M they are the last Sq positions of
    each row's tokens (decode or prefill after a cache, the unfilled part of a StaticCache behind
    them), so a left padding lies before them and the unused keys after."""
    batch, sq, heads, d = q.shape
    m = mask.shape[1]
    if mask.shape[0] != batch or not sq <= m <= k.shape[1]:
        raise ValueError("attention_mask: shape %s does not fit query length %d and key length %d (batch %d)"
                         % (tuple(mask.shape), sq, k.shape[1], batch))
    mask = mask.to(q.device)  # (a no-op but where a model's layers are spread over devices)
    if mask.dtype != torch.bool:
        mask = mask != 0
    # Each row's tokens are positions [start, end) of the mask (one run of ones; checked).
    lengths = mask.sum(-1, dtype=torch.int32)
    start = torch.where(lengths > 0, mask.to(torch.int32).argmax(-1).to(torch.int32), 0)  # first one
    end = start + lengths
    _check_one_run(mask, start, end)
    if sq == m:
        # Query i is position i: those in the padding (left or right) get no key, so 0.
        q_start, q_end = start, end
    elif options["causal"]:
        # Query i is position end - sq + i: those before `start` are left padding.
        q_start, q_end = (start - end + sq).clamp(0, sq), torch.full_like(start, sq)
    else:
        # Cross-attention (queries that are not the keys' positions): every query sees the row's tokens.
        q_start, q_end = torch.zeros_like(start), torch.full_like(start, sq)

    q_packed = q.reshape(batch * sq, heads, d)  # a view for the layouts transformers hands over
    k_packed, v_packed, row = _packed_keys(k, v)
    # Three sequences per batch row: padding before, tokens, padding after (with the gap to the
    # next row's keys, in a strided view). Offsets are int32, built on the device.
    b = torch.arange(batch, device=q.device, dtype=torch.int32)
    cu_q = torch.stack([b * sq, b * sq + q_start, b * sq + q_end], 1).flatten()
    cu_k = torch.stack([b * row, b * row + start, b * row + end], 1).flatten()
    cu_q = torch.cat([cu_q, cu_q.new_full((1,), batch * sq)])
    cu_k = torch.cat([cu_k, cu_k.new_full((1,), k_packed.shape[0])])
    zeros = torch.zeros_like(lengths)
    seqused_k = torch.stack([zeros, lengths, zeros], 1).flatten()  # the padding sequences use no key
    out = warpattn.flash_attn_varlen_func(q_packed, k_packed, v_packed, cu_q, cu_k, sq, m, seqused_k=seqused_k,
                                          **options)
    return out.view(batch, sq, heads, v.shape[-1])


def _check_one_run(mask, start, end):
    """Refuses a padding mask whose ones do not form one run per row (left and right padding
    do): the three-sequence cut would silently attend to the holes. Checked once per mask tensor
    (the model hands the same one to every layer); under torch.compile or graph capture, where
    the device may not be read, an asynchronous device-side assertion checks it instead."""
    if _static():
        positions = torch.arange(mask.shape[1], device=mask.device)
        expected = (positions >= start[:, None]) & (positions < end[:, None])
        torch._assert_async((mask == expected).all(), "warpattn: attention_mask has holes (not left/right padding)")
        return
    key = _memo_key(mask)
    entry = _checked_masks.get(key)
    if key is not None and entry is not None and entry() is mask:
        return
    positions = torch.arange(mask.shape[1], device=mask.device)
    expected = (positions >= start[:, None]) & (positions < end[:, None])
    if not bool((mask == expected).all()):
        raise NotImplementedError(
            "warpattn: attention_mask has zeros between ones in a row; warpattn takes padding masks whose ones "
            "form one run per row (left or right padding)")
    if key is not None:
        if len(_checked_masks) > 64:  # a small memo, not a leak: masks come and go with forward calls
            _checked_masks.clear()
        _checked_masks[key] = weakref.ref(mask)


_checked_masks = {}


def _memo_key(t):
    """(id, version) of a tensor, to remember what was read of it while it is neither freed (the
    memo keeps a weak reference to compare) nor changed in place; None for tensors made under
    torch.inference_mode, which keep no version counter (then nothing is remembered)."""
    try:
        return id(t), t._version
    except RuntimeError:
        return None


def _packed_keys(k, v):
    """(k_packed, v_packed, row): (T, Hkv, D) views of k and v (B, Sk, Hkv, D; v's D its own) in which batch row
    b's keys are rows b * row ... b * row + Sk - 1. Where the batch stride is a multiple of the
    key stride (contiguous (B, Sk, H, D) gives row = Sk; a DynamicCache's (B, H, Sk, D) gives
    row = H * Sk), a strided view of the same memory, whose rows between two batch rows are other
    heads' keys (finite, and in sequences that use none of them). Tensors that need a gradient
    are reshaped instead (a view where the layout allows, else a copy), so that autograd never
    meets overlapping rows."""
    batch, sk, heads, d = k.shape
    row = _row_stride(k)
    if row is not None and row != _row_stride(v):
        row = None
    total = None if row is None else (batch - 1) * row + sk
    if (batch == 1 or row == sk or row is None or k.requires_grad or v.requires_grad or total >= 2 ** 31
            or torch.compiler.is_compiling()):
        # (the offsets are int32: a strided view past 2^31 rows is reshaped too; under torch.compile
        # inductor may lay intermediates out otherwise than eager, and as_strided over them read
        # wrong rows: run 106, logits 1.35 rel off with inductor, right in eager)
        return k.reshape(batch * sk, heads, d), v.reshape(batch * sk, heads, v.shape[-1]), sk
    k_packed, v_packed = (torch.as_strided(t, (total, heads, t.shape[-1]), (t.stride(1), t.stride(2), 1)) for t in (k, v))
    return k_packed, v_packed, row


def _row_stride(t):
    """Rows between consecutive batch rows' first keys, if t's batch stride is a whole number of
    key strides and batch rows do not interleave; else None."""
    sb, ss = t.stride(0), t.stride(1)
    if ss <= 0 or sb % ss or sb // ss < t.shape[1]:
        return None
    return sb // ss


# ---------------------------------------------------------------------- packed sequences

def _packed_attention(q, k, v, cu_q, cu_k, options):
    """Attention over sequences packed along the sequence axis (batch 1 in practice; any batch
    is flattened into one packed axis), with FlashAttention-style offsets."""
    batch, sq, heads, d = q.shape
    q_packed = q.reshape(batch * sq, heads, d)
    k_packed = k.reshape(batch * k.shape[1], k.shape[2], d)
    v_packed = v.reshape(batch * v.shape[1], v.shape[2], v.shape[3])
    cu_q, cu_k = cu_q.to(torch.int32), cu_k.to(torch.int32)  # transformers may give int64
    # warpattn does not need the longest lengths: the packed lengths bound them, without a read.
    out = warpattn.flash_attn_varlen_func(q_packed, k_packed, v_packed, cu_q, cu_k, q_packed.shape[0],
                                          k_packed.shape[0], **options)
    return out.view(batch, sq, heads, v.shape[-1])


def _packed_positions(position_ids, q, k):
    """cu_seqlens of the sequences packed in a single row, found from position_ids (a new
    sequence starts wherever the position does not follow the previous one: transformers' own
    rule, find_packed_sequence_indices), or None when nothing is packed there. Only a row of
    queries that are also the keys can hold packed sequences. Eagerly, one read of the device
    per position_ids tensor (memoised across the layers) decides, and the offsets are compact;
    under torch.compile or graph capture the offsets have a fixed size instead (one entry per
    token, the unused sequences empty), so nothing is read."""
    if position_ids is None or q.shape[0] != 1 or q.shape[1] != k.shape[1] or q.shape[1] < 2:
        return None
    positions = position_ids.reshape(-1)
    if positions.shape[0] != q.shape[1]:
        return None
    n = positions.shape[0]
    starts = torch.ones(n, dtype=torch.bool, device=q.device)
    starts[1:] = positions[1:].to(q.device) != positions[:-1].to(q.device) + 1
    index = torch.arange(n, dtype=torch.int32, device=q.device)
    end = index.new_full((1,), n)
    if _static():
        return torch.cat([torch.where(starts, index, n).sort().values, end])
    key = _memo_key(position_ids)
    entry = _packed_memo.get(key)
    if key is not None and entry is not None and entry[0]() is position_ids:
        return entry[1]
    cu_seqlens = torch.cat([index[starts], end]) if bool(starts[1:].any()) else None
    if key is not None:
        if len(_packed_memo) > 64:
            _packed_memo.clear()
        _packed_memo[key] = (weakref.ref(position_ids), cu_seqlens)
    return cu_seqlens


_packed_memo = {}


# ------------------------------------------------------------------------------ registration

def register(name=NAME):
    """Registers warpattn under `name` with transformers' AttentionInterface and
    AttentionMaskInterface (the latter so that the models' mask creation hands warpattn a padding
    mask: an implementation without a mask function gets no mask at all). Done on import for
    "warpattn"; returns name."""
    AttentionInterface.register(name, warpattn_attention_forward)
    AttentionMaskInterface.register(name, warpattn_mask)
    return name


register()
