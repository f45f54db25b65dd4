"""A model of the backward's walk orders (no GPU; docs/backward-design.md, "The walk's order"):
which query blocks' Q, dO and dQ accumulator a launch finds in the L2, and how many CTAs add
into the same dQ block at once, with the causal walk up from each key block's diagonal (today)
or down from the last query block (WARPATTN_TUNE_BWD_WALK_DOWN) or up rotated, and the walk
without a mask from query block 0 (today) or rotated; rotated, key block n starts n blocks into
its range (WARPATTN_TUNE_BWD_ROTATE=1).

The launch as scripts/causal_schedule_model.py has it: one CTA an SM on 132 SMs, the grid's
order (row outer, key block inner), each CTA's time its query steps plus half a step for its
start and end, every step the same length. Each step touches one (row, query block) block: its
Q and dO tiles (read) and its dQ accumulator tile (fp32, added to in the L2), 80 KB at d = 128
and 80-row blocks. The L2 is one LRU of `--l2-mb` (50 MB; an H100's or H200's is 50 MB, in two
partitions, which this ignores). A step whose block is not in the L2 reads Q and dO from DRAM and
its dQ tile (and writes one back later): it counts as a miss. Prints the misses' share, the
DRAM bytes a step (a step is ~2 us at d = 128; 132 CTAs x 10 KB a step is ~0.7 TB/s), and the
mean number of CTAs on the step's query block in the same time slot (the same-block dQ adds
that run 296's deterministic mode, which staggers them, was faster without at 16K).
    python3 scripts/walk_order_l2_model.py [--d 64|128|256] [--l2-mb 50]
"""
import argparse, heapq, math
from collections import OrderedDict


ORDERS = {  # name: (causal, the walk's blocks for key block n, of mb query blocks from `first`)
    "ascending": (True, lambda n, first, mb: range(first, mb)),
    "descending": (True, lambda n, first, mb: range(mb - 1, first - 1, -1)),
    "rotated": (True, lambda n, first, mb: [first + (i + n) % (mb - first) for i in range(mb - first)]),
    "full": (False, lambda n, first, mb: range(mb)),
    "full rotated": (False, lambda n, first, mb: [(i + n) % mb for i in range(mb)]),
}


def walk(order, n, N, M, mb):
    causal, blocks = ORDERS[order]
    return blocks(n, (n * N) // M if causal else 0, mb)  # causal: from the diagonal's query block


def trace(S, rows, M, N, order, slots=132):
    """(time, row, block) of every step of the launch, in time order."""
    nb, mb = math.ceil(S / N), math.ceil(S / M)
    free = [0.0] * slots
    heapq.heapify(free)
    events = []
    for r in range(rows):
        for n in range(nb):
            walk_ = walk(order, n, N, M, mb)
            start = heapq.heappop(free)
            for i, m in enumerate(walk_):
                events.append((start + 0.5 + i, r, m))
            heapq.heappush(free, start + 1.0 + len(walk_))
    events.sort()
    return events


def misses(events, capacity_blocks):
    lru, miss = OrderedDict(), 0
    for _, r, m in events:
        key = (r, m)
        if key in lru:
            lru.move_to_end(key)
        else:
            miss += 1
            lru[key] = True
            if len(lru) > capacity_blocks:
                lru.popitem(last=False)
    return miss


def sharing(events):
    """The mean, over steps, of the CTAs on the same (row, block) in the same time slot."""
    count = {}
    for t, r, m in events:
        key = (math.floor(t), r, m)
        count[key] = count.get(key, 0) + 1
    return sum(c * c for c in count.values()) / len(events)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--l2-mb", type=float, default=50.0)
    ap.add_argument("--d", type=int, default=128, choices=(64, 128, 256),
                    help="head dim: its tile (query rows x keys: 128 x 128, 80 x 128, 64 x 80)")
    args = ap.parse_args()
    d = args.d
    M, N = {64: (128, 128), 128: (80, 128), 256: (64, 80)}[d]
    block_bytes = M * d * (2 + 2 + 4)  # Q, dO, the dQ accumulator's tile
    capacity = int(args.l2_mb * (1 << 20) / block_bytes)
    print(f"L2 {args.l2_mb:.0f} MB = {capacity} blocks of {block_bytes >> 10} KB (d = {d}, {M}-row query blocks)")
    for S, B in ((1024, 16), (4096, 4), (16384, 1)):
        H = 2048 // d  # the benchmark's H x d = 2048
        rows = B * H
        for order in ORDERS:
            ev = trace(S, rows, M, N, order)
            mis = misses(ev, capacity)
            # a miss: Q + dO read (40 KB) and the dQ tile read and later written back (2 x 40 KB)
            dram = mis * (M * d * 4 + 2 * M * d * 4)
            print(f"N={S:5d} B={B:2d} H={H:2d} {'causal' if ORDERS[order][0] else 'full  '}"
                  f" {order:12s}  steps {len(ev):7d}  misses {mis / len(ev):6.1%}"
                  f"  DRAM {dram / len(ev) / 1024:6.1f} KB a step  CTAs on the block {sharing(ev):6.1f}")


if __name__ == "__main__":
    main()
