"""The E4M3 KV cache's accuracy against the BF16 cache (issue 16): the same decode step over a
BF16 cache and over the E4M3 cache quantised from it (quantize_kvcache_fp8, descales amax / 448
per KV head), each against a float64 reference on the BF16 data, on N(0, 1) data and on
FlashAttention-3's outlier data (N(0, 1) plus an independent N(0, 10^2) term on 0.1% of the
entries, as docs/perf/fp8-accuracy.md's). No rotation: this version of the cache has none.

Used by bench_decode.py --fp8 (the report) and tests/python/test_kvcache_fp8.py (its bounds).
"""

DATA_KINDS = ("normal", "outlier")


def draw(torch, kind, shape, gen, dtype):
    x = torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32)
    if kind == "outlier":
        hit = torch.rand(shape, generator=gen, device="cuda") < 1e-3
        x = x + hit * (10.0 * torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32))
    elif kind != "normal":
        raise ValueError("kind: expected one of %s, got %r" % (", ".join(DATA_KINDS), kind))
    return x.to(dtype)


def reference(torch, q, k, v):
    """softmax(q k^T / sqrt(d)) v in float64 over whole caches (GQA by repeating K and V)."""
    group = q.shape[2] // k.shape[2]
    qd = q.double()
    kd = k.double().repeat_interleave(group, dim=2)
    vd = v.double().repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bshd->bhqs", qd, kd) / q.shape[-1] ** 0.5
    return torch.einsum("bhqs,bshd->bqhd", torch.softmax(scores, dim=-1), vd)


def errors(torch, warpattn, kind, B=8, S=4096, Hq=32, Hkv=8, d=128, Sq=1, seed=0):
    """rel L2 and RMSE of out against the float64 reference, for the BF16 cache and the E4M3
    cache of the same data, and their ratio."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    bf16 = torch.bfloat16
    q = draw(torch, kind, (B, Sq, Hq, d), gen, bf16)
    k = draw(torch, kind, (B, S, Hkv, d), gen, bf16)
    v = draw(torch, kind, (B, S, Hkv, d), gen, bf16)
    want = reference(torch, q, k, v)
    cache = warpattn.quantize_kvcache_fp8(k, v)
    outs = {"bf16": warpattn.flash_attn_with_kvcache(q, k, v),
            "e4m3": warpattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, k_descale=cache.k_descale,
                                                     v_descale=cache.v_descale)}
    result = dict(kind=kind, B=B, S=S, Hq=Hq, Hkv=Hkv, d=d, Sq=Sq, seed=seed)
    for name, out in outs.items():
        diff = out.double() - want
        result[name] = dict(rel_l2=(diff.norm() / want.norm()).item(), rmse=diff.pow(2).mean().sqrt().item(),
                            finite=bool(torch.isfinite(out).all()))
    result["e4m3_over_bf16"] = result["e4m3"]["rel_l2"] / result["bf16"]["rel_l2"]
    return result
