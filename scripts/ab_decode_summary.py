#!/usr/bin/env python3
"""Medians of a decode A/B: the point lines of `python -m warpattn.bench --decode` logs, one log
per variant and pass, named VARIANT-PASS.log (e.g. bench-fr2-3.log: give the prefix "bench-").

    python3 scripts/ab_decode_summary.py OUT_DIR [--prefix bench-] [--runs warpattn,warpattn_fp8,cudnn]

Prints, per point, each variant's median time (us) of each run named, over its passes, and the
ratio of each variant's median to the first variant's (the base).
"""
import argparse
import collections
import pathlib
import re
import statistics

LINE = re.compile(r"^(B=\d+ S=\d+ \d+/\d+ d=\d+ Sq=\d+): (.*)$")
RUN = re.compile(r"(\S+) ([\d.]+) us")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--prefix", default="bench-")
    p.add_argument("--runs", default="warpattn,warpattn_fp8,cudnn")
    a = p.parse_args()
    runs = a.runs.split(",")
    times = collections.defaultdict(list)  # (point, run, variant) -> [us]
    variants, points = [], []
    for f in sorted(pathlib.Path(a.out).glob(a.prefix + "*.log")):
        variant = f.stem[len(a.prefix):].rsplit("-", 1)[0]
        if variant not in variants:
            variants.append(variant)
        for line in f.read_text(errors="replace").splitlines():
            m = LINE.match(line.strip())
            if not m:
                continue
            if m.group(1) not in points:
                points.append(m.group(1))
            for name, us in RUN.findall(m.group(2)):
                if name in runs:
                    times[(m.group(1), name, variant)].append(float(us))
    base = "base" if "base" in variants else (variants[0] if variants else None)
    order = [base] + [v for v in variants if v != base] if base else []
    for point in points:
        for run in runs:
            cells = []
            for v in order:
                t = times.get((point, run, v))
                if not t:
                    continue
                med = statistics.median(t)
                b = times.get((point, run, base))
                ratio = "" if v == base or not b else " (%.3f)" % (med / statistics.median(b))
                cells.append("%s %.1f%s n%d" % (v, med, ratio, len(t)))
            if cells:
                print("%s %s: %s" % (point, run, "  ".join(cells)))


if __name__ == "__main__":
    main()
