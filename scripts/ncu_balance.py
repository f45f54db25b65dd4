"""How evenly two kernels keep the SMs busy, from Nsight Compute's raw page
(`ncu -i R.ncu-rep --page raw --csv`, as scripts/fa3_backward_compare.sh writes it, gzipped or not):
for each report, the launch's elapsed cycles, each SM's active cycles (mean, least, most), the
share of the launch an average SM sat idle (the schedule's tail and its start), the tensor pipe's
activity over the active and over the elapsed cycles, and the instructions executed.

    python3 scripts/ncu_balance.py ncu-warpattn-raw.csv.gz ncu-fa3-raw.csv.gz

A causal kernel whose gap to another is its tail shows a larger idle share at the same tensor
activity over active cycles; one whose gap is its steps shows the reverse.
"""
import csv
import gzip
import sys

METRICS = [
    ("gpu__time_duration.sum", "duration"),
    ("sm__cycles_elapsed.max", "elapsed cycles (max over SMs)"),
    ("sm__cycles_active.avg", "active cycles, mean SM"),
    ("sm__cycles_active.min", "active cycles, least busy SM"),
    ("sm__cycles_active.max", "active cycles, busiest SM"),
    ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "tensor pipe % of active"),
    ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed", "tensor pipe % of elapsed"),
    ("smsp__inst_executed.sum", "warp instructions"),
]


def read(path):
    """{metric: (value as text, unit)} of the report's first kernel row."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    header = next(r for r in rows if "sm__cycles_active.avg" in r)
    at = rows.index(header)
    units, values = rows[at + 1], rows[at + 2]
    return {h: (values[i], units[i]) for i, h in enumerate(header) if i < len(values)}


def number(text):
    return float(text.replace(",", ""))


def main(paths):
    reports = [read(p) for p in paths]
    print("metric".ljust(34) + "".join(p.split("/")[-1][:28].rjust(30) for p in paths))
    for key, label in METRICS:
        cells = []
        for r in reports:
            v = r.get(key)
            cells.append(f"{v[0]} {v[1]}".strip() if v else "-")
        print(label.ljust(34) + "".join(c.rjust(30) for c in cells))
    idle = []
    for r in reports:
        try:
            idle.append(1 - number(r["sm__cycles_active.avg"][0]) / number(r["sm__cycles_elapsed.max"][0]))
        except (KeyError, ValueError, ZeroDivisionError):
            idle.append(float("nan"))
    print("idle share, mean SM".ljust(34) + "".join(f"{x:.2%}".rjust(30) for x in idle))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
