"""The E4M3 (FP8) KV cache of flash_attn_with_kvcache: half the bytes a decode step reads
(include/warpattn/warpattn.hpp, KvCache::k_descale; docs/decode-fp8-cache-design.md). PyTorch.

    cache = warpattn.empty_kvcache_fp8(batch, capacity, heads_kv, head_dim, k_descale, v_descale,
                                       device="cuda")  # paged: num_pages, page_size instead
    out = warpattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, k=k, v=v,
                                           cache_seqlens=lens, k_descale=cache.k_descale,
                                           v_descale=cache.v_descale)

Layouts (the library's own, so a step reads them without a transpose):
  k_cache float8_e4m3fn, as a 16-bit cache: dense (batch, capacity, heads_kv, head_dim) or paged
          (num_pages, page_size, heads_kv, head_dim);
  v_cache float8_e4m3fn, V transposed in slices of 16 keys: dense (batch, heads_kv, capacity // 16,
          16 * head_dim) or paged (num_pages, heads_kv, page_size // 16, 16 * head_dim),
          v_cache[p, h, s, 16 * c + j] holding column c of key 16 s + FP8_KEY_ORDER[j]
          (forward_fp8's Vᵀ order): each slice's bytes are the step's P·V tile layout, so a key
          tile streams in rows of 128 bytes;
  capacity (dense) or page_size (paged) a multiple of 16; head_dim 64, 128 or 256.
A cached element stands for its e4m3 value times its KV head's descale ((heads_kv) float32, fixed
for the cache's life: an append quantises the new rows with them, e4m3(x / descale) rounded to
nearest even and saturated to +-448, and never re-scales old rows). Choose them with headroom for
the keys and values still to come: a row past 448 x descale saturates.
"""
from typing import Any, NamedTuple

from .fp8 import FP8_KEY_ORDER

E4M3_MAX = 448.0
_VT_GROUP = len(FP8_KEY_ORDER)


class Fp8KvCache(NamedTuple):
    k_cache: Any
    v_cache: Any
    k_descale: Any
    v_descale: Any


_E4M3_BY_DTYPE = {}  # dtype -> is_e4m3's answer: str(dtype) costs ~1 us, a dict lookup ~50 ns (a decode step's host time)


def is_e4m3(t):
    """Whether a cache tensor is an E4M3 one: float8_e4m3fn (PyTorch, JAX), or uint8 bytes of
    e4m3 from a framework without an FP8 type (CuPy; NumPy, whose arrays the rules are tested on).
    PyTorch's uint8 is not: it has float8_e4m3fn (torch.uint8 is a dtype object of its own)."""
    dtype = getattr(t, "dtype", None)
    try:
        return _E4M3_BY_DTYPE[dtype]
    except (KeyError, TypeError):  # TypeError: a dtype that is not hashable
        pass
    text = str(dtype)
    answer = text.replace("torch.", "") == "float8_e4m3fn" or (text == "uint8" and not
                                                               type(t).__module__.startswith("torch"))
    try:
        _E4M3_BY_DTYPE[dtype] = answer
    except TypeError:
        pass
    return answer


def _torch():
    import torch
    return torch


def _key_columns(keys, device):
    """perm with vt[..., c] = v[perm[c]]: the Vᵀ column c of a run of `keys` keys (a multiple of 16)
    holds key 16 (c // 16) + FP8_KEY_ORDER[c % 16]."""
    torch = _torch()
    c = torch.arange(keys, device=device)
    order = torch.tensor(FP8_KEY_ORDER, device=device)
    return (c // _VT_GROUP) * _VT_GROUP + order[c % _VT_GROUP]


def _to_slices(vt):
    """(pages, heads_kv, head_dim, keys) Vᵀ columns -> (pages, heads_kv, keys // 16, 16 * head_dim)."""
    pages, heads_kv, head_dim, keys = vt.shape
    return vt.reshape(pages, heads_kv, head_dim, keys // _VT_GROUP, _VT_GROUP).permute(0, 1, 3, 2, 4).reshape(
        pages, heads_kv, keys // _VT_GROUP, _VT_GROUP * head_dim)


def _from_slices(v_cache):
    """_to_slices' inverse."""
    pages, heads_kv, slices, width = v_cache.shape
    head_dim = width // _VT_GROUP
    return v_cache.reshape(pages, heads_kv, slices, head_dim, _VT_GROUP).permute(0, 1, 3, 2, 4).reshape(
        pages, heads_kv, head_dim, slices * _VT_GROUP)


def _check_keys(keys, what):
    if keys % _VT_GROUP != 0:
        raise ValueError("%s: expected a multiple of 16 for an E4M3 cache (Vᵀ's keys come in 16-key slices), got %d"
                         % (what, keys))


def _descales(given, amax, name, heads_kv, device):
    """A (heads_kv) float32 descale: the one given (a float, or a tensor of heads_kv or one
    element), else amax / 448 per head (1 where a head is all zeros)."""
    torch = _torch()
    if given is None and amax is None:
        raise ValueError("%s: expected a float or (heads_kv=%d) values, got None" % (name, heads_kv))
    if given is None:
        d = amax.float() / E4M3_MAX
        return torch.where(d > 0, d, torch.ones_like(d)).contiguous()
    d = torch.as_tensor(given, dtype=torch.float32, device=device).reshape(-1)
    if d.numel() == 1:
        d = d.expand(heads_kv)
    if d.shape != (heads_kv,):
        raise ValueError("%s: expected a float or (heads_kv=%d) values, got shape %s" % (name, heads_kv,
                                                                                          tuple(d.shape)))
    if not bool(torch.all(torch.isfinite(d) & (d > 0))):
        raise ValueError("%s: expected finite descales > 0" % name)
    return d.contiguous()


def _e4m3(x, descale):
    """e4m3(x / descale), rounded to nearest even and saturated to +-448: the append kernel's
    rule (a division in fp32, then a saturating conversion), so its bytes match."""
    torch = _torch()
    return (x.float() / descale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def quantize_kvcache_fp8(k_cache, v_cache, k_descale=None, v_descale=None):
    """An E4M3 cache holding a 16-bit one: k_cache, v_cache (batch, capacity, heads_kv, head_dim)
    or pages (num_pages, page_size, heads_kv, head_dim) in float16 or bfloat16 (PyTorch), the
    rows' count per sequence or page a multiple of 16. k_descale, v_descale: floats or (heads_kv)
    tensors, default each head's amax / 448 over the whole cache (no headroom for rows appended
    later). Returns Fp8KvCache(k_cache, v_cache (Vᵀ in 16-key slices), k_descale, v_descale), the descales
    (heads_kv) float32 on the cache's device."""
    torch = _torch()
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError("k_cache, v_cache: expected two 16-bit caches of one shape (batch or pages, keys, heads_kv, "
                         "head_dim), got %s and %s" % (tuple(k_cache.shape), tuple(v_cache.shape)))
    _check_keys(k_cache.shape[1], "k_cache.shape[1]")
    heads_kv, dev = k_cache.shape[2], k_cache.device
    ks = _descales(k_descale, k_cache.abs().amax(dim=(0, 1, 3)), "k_descale", heads_kv, dev)
    vs = _descales(v_descale, v_cache.abs().amax(dim=(0, 1, 3)), "v_descale", heads_kv, dev)
    # (the key order applied before the conversion: not every indexing kernel takes FP8)
    vt = v_cache.permute(0, 2, 3, 1)[..., _key_columns(k_cache.shape[1], dev)]  # (pages, heads_kv, head_dim, keys)
    return Fp8KvCache(_e4m3(k_cache, ks[:, None]).contiguous(), _e4m3(_to_slices(vt), vs[:, None, None]).contiguous(),
                      ks, vs)


def dequantize_kvcache_fp8(cache, dtype=None):
    """The 16-bit (or float32: dtype) K and V an E4M3 cache stands for, in the 16-bit cache's
    layout: what a step over it computes with (the reference of the tests and the accuracy
    report)."""
    torch = _torch()
    dtype = dtype or torch.float32
    keys = cache.k_cache.shape[1]
    k = cache.k_cache.float() * cache.k_descale[:, None]
    inverse = torch.argsort(_key_columns(keys, cache.v_cache.device))
    vt = _from_slices(cache.v_cache.float())  # (pages, heads_kv, head_dim, keys)
    v = (vt[..., inverse] * cache.v_descale[:, None, None]).permute(0, 3, 1, 2)
    return k.to(dtype), v.contiguous().to(dtype)


def empty_kvcache_fp8(batch_or_pages, keys, heads_kv, head_dim, k_descale, v_descale, device=None):
    """A zeroed E4M3 cache for `batch_or_pages` sequences (dense) or pages (paged, with a block
    table at the call) of `keys` keys each (a multiple of 16), with the descales given (floats or
    (heads_kv) tensors): the cache a serving loop appends into."""
    torch = _torch()
    _check_keys(keys, "keys")
    k8 = torch.zeros((batch_or_pages, keys, heads_kv, head_dim), dtype=torch.float8_e4m3fn, device=device)
    vt8 = torch.zeros((batch_or_pages, heads_kv, keys // _VT_GROUP, _VT_GROUP * head_dim), dtype=torch.float8_e4m3fn,
                      device=device)
    return Fp8KvCache(k8, vt8, _descales(k_descale, None, "k_descale", heads_kv, k8.device),
                      _descales(v_descale, None, "v_descale", heads_kv, k8.device))
