"""A list-scheduling model of the causal backward's launch orders on 132 SMs, one CTA an SM (no
GPU): each CTA a key block of 128 keys whose time is its query steps (M rows each, in units of
an 80-row step) plus half a step for its start and end, started in launch order on the first
free SM. Prints, against the ideal (all work spread evenly), the grid's order (ours at d = 64
and 128: row outer, key block inner, each row's longest first), FlashAttention-3's grouped order
(rows in groups whose Q, dO and dQ accumulator fit 40 MB, key block outer; ours at d = 256) and
longest first over all; for 80- and 64-row query blocks (ours and FlashAttention-3's at d = 128
causal). The ideal itself shows the work the diagonal's partly masked blocks add. BF16 d = 128,
H = 16, B·N = 16K (the benchmark's shape). docs/backward-design.md, "FlashAttention-3 per GHz".
    python3 scripts/causal_schedule_model.py
"""
import heapq, math
def tiles(S, M, N, rows):
    nb = math.ceil(S / N); mb = math.ceil(S / M)
    return [[(mb - (n * N) // M) * M / 80 + 0.5 for n in range(nb)] for _ in range(rows)]  # time in 80-row steps, +0.5 start/end
def run(order, slots=132):
    free = [0.0] * slots; heapq.heapify(free); end = 0
    for t in order:
        s = heapq.heappop(free); e = s + t; end = max(end, e); heapq.heappush(free, e)
    return end
def grid_order(T):  # ours: row outer, key block inner (key block fastest in the grid)
    return [t for row in T for t in row]
def grouped(T, groups):  # FA3's causal / ours at d = 256: groups of rows, key block outer, row inner
    rows = len(T); out = []
    for g in range(groups):
        lo, hi = rows * g // groups, rows * (g + 1) // groups
        for n in range(len(T[0])):
            out += [T[r][n] for r in range(lo, hi)]
    return out
def lpt(T):
    return sorted((t for row in T for t in row), reverse=True)
for S, B, H in ((4096, 4, 16), (16384, 1, 16), (1024, 16, 16)):
    rows = B * H
    for M in (80, 64):
        T = tiles(S, M, 128, rows)
        ideal = sum(map(sum, T)) / 132
        head_bytes = S * 128 * 8
        groups = max(1, math.ceil(rows / max(1, (40 << 20) // head_bytes)))
        print(f"N={S} M={M}: ideal {ideal:8.1f}  grid {run(grid_order(T))/ideal:.3f}  grouped({groups}) {run(grouped(T, groups))/ideal:.3f}  LPT {run(lpt(T))/ideal:.3f}")
