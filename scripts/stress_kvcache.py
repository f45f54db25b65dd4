"""Repeats KV-cache calls thousands of times and checks every result bitwise against the first.

A ring protocol race (a consumer passing a barrier a phase early, a tile loaded twice) rarely
shows in a test's one call but shows here as a moved bit, a hang or a fault. Each variant runs in
its own process, so a fault in one (which ends its CUDA context) does not hide the others:

    python scripts/stress_kvcache.py [--calls 3000] [--only NAME ...]

Prints one line per variant: calls, how many results differed from the first, or the error.
Exit status 1 if any variant failed.
"""
import argparse
import subprocess
import sys

# name: (B, S, Hq, Hkv, d, Sq, options); the first is the decode benchmark's headline point.
VARIANTS = {
    "decode_d128": (8, 4096, 32, 8, 128, 1, {}),
    "decode_d128_s1": (8, 4096, 32, 8, 128, 1, {"num_splits": 1}),
    "decode_d128_odd_tiles": (8, 4000, 32, 8, 128, 1, {"num_splits": 3}),
    "decode_d64": (8, 4096, 32, 8, 64, 1, {}),
    "decode_d256": (8, 4096, 32, 8, 256, 1, {}),
    "decode_invariant": (8, 4096, 32, 8, 128, 1, {"batch_invariant": True}),
    "decode_invariant_s1": (8, 4096, 32, 8, 128, 1, {"batch_invariant": True, "num_splits": 1}),
    "decode_long": (1, 65536, 32, 8, 128, 1, {}),
    "invariant_long": (1, 65536, 32, 8, 128, 1, {"batch_invariant": True}),
    "invariant_sq16": (8, 16384, 64, 8, 128, 16, {"batch_invariant": True, "causal": True}),
    "decode_ragged": (8, 4096, 32, 8, 128, 1, {"ragged": True}),
    "decode_causal_sq4": (8, 4096, 32, 8, 128, 4, {"causal": True}),
    "paged16": (8, 4096, 32, 8, 128, 1, {"page_size": 16}),
    "paged64": (8, 4096, 32, 8, 128, 1, {"page_size": 64}),
    "paged16_d64": (8, 4096, 32, 8, 64, 1, {"page_size": 16}),
    "prefill_tile_sq16": (8, 4096, 64, 8, 128, 16, {"causal": True}),
    # The 512 kernel (split head dim: both consumer warpgroups on 64 rows; built, not yet run)
    "decode_d512": (8, 4096, 32, 8, 512, 1, {}),
    "paged16_d512": (8, 4096, 32, 8, 512, 1, {"page_size": 16}),
    "decode_causal_sq4_d512": (8, 4096, 32, 8, 512, 4, {"causal": True}),
}


def run_variant(name, calls):
    import torch
    import warpattn

    B, S, Hq, Hkv, d, Sq, opts = VARIANTS[name]
    opts = dict(opts)
    torch.manual_seed(0)
    dt = torch.bfloat16
    q = torch.randn(B, Sq, Hq, d, dtype=dt, device="cuda")
    k = torch.randn(B, S, Hkv, d, dtype=dt, device="cuda")
    v = torch.randn(B, S, Hkv, d, dtype=dt, device="cuda")
    lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
    if opts.pop("ragged", False):
        lens = torch.randint(1, S + 1, (B,), dtype=torch.int32, device="cuda")
    kwargs = {"cache_seqlens": lens}
    page = opts.pop("page_size", 0)
    if page:
        per_seq = (S + page - 1) // page
        order = torch.randperm(B * per_seq, device="cuda")
        kp = torch.zeros(B * per_seq, page, Hkv, d, dtype=dt, device="cuda")
        vp = torch.zeros_like(kp)
        kp[order] = k.view(B * per_seq, page, Hkv, d)
        vp[order] = v.view(B * per_seq, page, Hkv, d)
        k, v = kp, vp
        kwargs["block_table"] = order.view(B, per_seq).to(torch.int32)
    kwargs.update(opts)
    flush = torch.empty(64 << 20, dtype=torch.int32, device="cuda")  # 256 MB: past the L2
    out = torch.empty_like(q)
    first = warpattn.flash_attn_with_kvcache(q, k, v, **kwargs).clone()
    torch.cuda.synchronize()
    if not torch.isfinite(first).all():
        return "first result not finite"
    differ = 0
    for i in range(calls):
        if i % 4 == 0:
            flush.zero_()
        out.fill_(float("nan"))
        warpattn.flash_attn_with_kvcache(q, k, v, out=out, **kwargs)
        if i % 64 == 63:
            torch.cuda.synchronize()
        if not torch.equal(out, first):
            differ += 1
    torch.cuda.synchronize()
    return "%d calls, %d differed" % (calls, differ) if differ else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=float, default=120.0)
    a = ap.parse_args()
    if a.child:
        err = run_variant(a.child, a.calls)
        print("FAIL " + err if err else "ok")
        return 1 if err else 0
    failed = 0
    for name in a.only or list(VARIANTS):
        try:
            r = subprocess.run([sys.executable, __file__, "--child", name, "--calls", str(a.calls)],
                               capture_output=True, text=True, timeout=a.timeout)
            lines = (r.stdout + r.stderr).strip().splitlines()
            tail = [l for l in lines if "Warning" not in l][-1:] if lines else ["(no output)"]
            ok = r.returncode == 0
            msg = "ok, %d calls bitwise equal" % a.calls if ok else "rc=%d %s" % (r.returncode, tail[0][:240])
        except subprocess.TimeoutExpired:
            ok, msg = False, "TIMEOUT after %.0f s (a hang?)" % a.timeout
        failed += not ok
        print("%-24s %s" % (name, msg), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
