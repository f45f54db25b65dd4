"""Where two kernels' warps wait, instruction by instruction: Nsight Compute's per-SASS stall
samples (`ncu -i R.ncu-rep --page source --print-source sass --csv`, as
scripts/fa3_backward_compare.sh writes them) of each kernel, side by side.

    python3 scripts/ncu_stall_compare.py ncu-warpattn-sass.csv ncu-fa3-sass.csv [--top 25]

For each kernel: the samples by stall reason (all samples, so 'selected' is the issuing warps),
the samples and executed instructions by opcode, and the instructions with the most samples
with their two largest reasons. Samples are PC samples over every warp of every SM; two kernels
of equal duration and equal warps a CTA have comparable totals.
"""
import argparse
import csv
import os
import sys
from collections import Counter, defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sass_stalls import opcode as sass_opcode  # noqa: E402


def load(path):
    """(kernel name, rows): each row (address, SASS text, samples, executed, {reason: samples})."""
    with open(path, newline="") as f:
        lines = list(csv.reader(f))
    name = lines[0][1] if lines and lines[0] and lines[0][0] == "Kernel Name" else path
    header_at = next(i for i, r in enumerate(lines) if r and r[0] == "Address")
    header = lines[header_at]
    col = {h: i for i, h in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "(Not Issued)" not in h]
    rows = []
    for r in lines[header_at + 1:]:
        if len(r) != len(header) or not r[0]:
            continue
        num = lambda h: float(r[col[h]] or 0) if h in col else 0.0
        rows.append((r[0], r[col["Source"]].strip(), num("Warp Stall Sampling (All Samples)"),
                     num("Instructions Executed"), {h[6:]: num(h) for h in reasons}))
    return name, rows


def opcode(text):
    """sass_stalls.opcode, with the qualifier that tells the kinds apart where it does
    (SYNCS.PHASECHK, WARPGROUP.DEPBAR, BAR.SYNC, HGMMA.64x80x16 ...)."""
    op = sass_opcode(text)
    return sass_opcode(text, 2) if op in ("SYNCS", "WARPGROUP", "BAR", "HGMMA", "UTMALDG", "UBLKRED") else op


def summarise(path, top):
    name, rows = load(path)
    total = sum(r[2] for r in rows)
    executed = sum(r[3] for r in rows)
    print(f"== {name[:140]}")
    print(f"   {total:,.0f} samples, {executed:,.0f} warp instructions executed, {len(rows)} SASS lines")
    by_reason = Counter()
    for r in rows:
        by_reason.update(r[4])
    print("   by reason: " + ", ".join(f"{k} {v / total:.1%}" for k, v in by_reason.most_common(10) if v > 0))
    by_op, by_op_exec = Counter(), Counter()
    op_reasons = defaultdict(Counter)
    for r in rows:
        op = opcode(r[1])
        by_op[op] += r[2]
        by_op_exec[op] += r[3]
        op_reasons[op].update(r[4])
    print("   by opcode (samples share, executed, top reasons):")
    for op, v in by_op.most_common(18):
        rs = ", ".join(f"{k} {n / v:.0%}" for k, n in op_reasons[op].most_common(3) if n > 0)
        print(f"     {op:<22} {v / total:6.1%}  {by_op_exec[op]:>14,.0f}  {rs}")
    print(f"   top {top} instructions:")
    for addr, text, s, ex, rs in sorted(rows, key=lambda r: -r[2])[:top]:
        two = ", ".join(f"{k} {n / s:.0%}" for k, n in Counter(rs).most_common(2) if n > 0)
        print(f"     {addr:>6} {s / total:6.2%}  {text[:70]:<70} {two}")
    return total, by_reason, by_op, by_op_exec


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    results = [summarise(p, a.top) for p in a.csv]
    if len(results) == 2:
        (ta, ra, oa, ea), (tb, rb, ob, eb) = results
        print("== first minus second, in samples (and as a share of the second's total)")
        for k in sorted(set(ra) | set(rb), key=lambda k: -abs(ra[k] - rb[k]))[:10]:
            print(f"   {k:<18} {ra[k] - rb[k]:>+12,.0f}  ({(ra[k] - rb[k]) / tb:+.1%})")
        print("   by opcode:")
        for k in sorted(set(oa) | set(ob), key=lambda k: -abs(oa[k] - ob[k]))[:14]:
            print(f"   {k:<22} {oa[k] - ob[k]:>+12,.0f}  ({(oa[k] - ob[k]) / tb:+.1%})  executed {ea[k]:,.0f} / {eb[k]:,.0f}")


if __name__ == "__main__":
    main()
