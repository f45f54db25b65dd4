#!/usr/bin/env python3
"""A list-scheduling model of the backward's main kernel with dQ converted inside it
(built on branch d256, 2e98d8e, measured in run 295 and removed: docs/backward-design.md, "dQ
converted in the main kernel"): equal CTAs (one per key block and head) on the SMs in
grid order, each walking its query blocks in order (a step ~tau us, jittered); a query block is
complete when its last adder's step ends; a complete block is converted (conv us) either by the
CTA that completed it, at that CTA's end ("last adder"), or by whichever CTAs end next, one block
at a time off a queue ("queue"). Prints the main kernel's time over the conversion-free one:
what replaces the conversion kernel's ~70 us at B·N = 16K, d = 128.

  python3 scripts/fused_dq_schedule_model.py
"""
import heapq
import random


def simulate(heads, key_blocks, query_blocks, tau, conv, mode, causal=False, sms=132, jitter=0.03, seed=1,
             block_n=128, block_m=80):
    rnd = random.Random(seed)

    def first_block(n):  # causal: key block n's first query block (Sq = Sk)
        return min(query_blocks - 1, n * block_n // block_m) if causal else 0

    adders = {(h, j): sum(1 for n in range(key_blocks) if first_block(n) <= j)
              for h in range(heads) for j in range(query_blocks)}
    pending = [(h, n) for h in range(heads) for n in range(key_blocks)]
    pending.reverse()
    events, queue, converts = [], [], {}
    end = 0.0

    def dispatch(t, sm):
        if not pending:
            return
        h, n = pending.pop()
        b = first_block(n)
        for j in range(b, query_blocks):
            t += tau * (1 + jitter * rnd.uniform(-1, 1)) * (1.6 if causal and j == b else 1.0)
            heapq.heappush(events, (t, 0, (h, j, n)))
        heapq.heappush(events, (t, 1, (sm, h, n)))

    for sm in range(sms):
        dispatch(0.0, sm)
    while events:
        t, kind, d = heapq.heappop(events)
        if kind == 0:
            h, j, n = d
            adders[(h, j)] -= 1
            if adders[(h, j)] == 0:
                if mode == "queue":
                    queue.append(j)
                elif mode == "last":
                    converts[(h, n)] = converts.get((h, n), 0) + 1
            continue
        sm, h, n = d
        if mode == "queue" and queue:  # one block, then look again
            queue.pop()
            heapq.heappush(events, (t + conv, 1, d))
            continue
        if mode == "last" and converts.get((h, n), 0) > 0:
            t += conv * converts.pop((h, n))
        end = max(end, t)
        dispatch(t, sm)
    return end


def main():
    tau = 2.7  # us a step at d = 128 (H100)
    shapes = [("1K", 256, 8, 13, False), ("4K", 64, 32, 52, False), ("16K", 16, 128, 205, False),
              ("4K causal", 64, 32, 52, True), ("16K causal", 16, 128, 205, True)]
    for name, heads, n, m, causal in shapes:
        base = simulate(heads, n, m, tau, 0.0, "none", causal)
        for conv in (1.0, 2.0):
            last = simulate(heads, n, m, tau, conv, "last", causal)
            queue = simulate(heads, n, m, tau, conv, "queue", causal)
            print(f"{name:11s} main {base:6.0f} us, {conv} us a block: last adder converts +{last - base:4.0f} us, "
                  f"queue +{queue - base:4.0f} us")


if __name__ == "__main__":
    main()
