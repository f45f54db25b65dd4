"""Static stall cycles of a stretch of SASS: what ptxas scheduled, before any dynamic wait.

    cuobjdump -sass build/CMakeFiles/.../forward_fp8_d256.cu.o > k.sass   # one function's listing
    python3 scripts/sass_stalls.py k.sass 37e0 6720 [4090-48b0 ...]

Sums, over the instructions at addresses [lo, hi) minus the excluded ranges (hex, e.g. a mask
block or a rarely taken rescale), the stall count ptxas put in each instruction's control bits
(bits 41-44 of the second 64-bit word on sm_90: cycles before the next instruction may issue),
and prints the total and the opcodes with the most. Used in runs 68-71 (docs/perf/LOG.md) to
compare main-loop schedules without device time; the sum is a floor on one warp's time per
iteration, not the time itself (MUFU throughput, scoreboards and the other warps add to it).
"""
import re
import sys
from collections import Counter

LINE = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);\s*/\* (0x[0-9a-f]+) \*/")
CONTROL = re.compile(r"\s*/\* (0x[0-9a-f]+) \*/")


def parse(path):
    """(address, instruction text, stall cycles) of every instruction in a cuobjdump listing."""
    lines = open(path).read().split("\n")
    out = []
    for i, line in enumerate(lines[:-1]):
        m = LINE.match(line)
        if not m:
            continue
        control = CONTROL.match(lines[i + 1])
        if not control:
            continue
        out.append((int(m.group(1), 16), m.group(2).strip(), (int(control.group(1), 16) >> 41) & 0xF))
    return out


def opcode(text, parts=1):
    """The instruction's name without its predicate: its first `parts` dot-separated pieces."""
    words = text.split()
    if not words:
        return "?"
    word = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return ".".join(word.split(".")[:parts])


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    path, lo, hi = argv[0], int(argv[1], 16), int(argv[2], 16)
    skips = [tuple(int(x, 16) for x in r.split("-")) for r in argv[3:]]
    picked = [x for x in parse(path) if lo <= x[0] < hi and not any(a <= x[0] < b for a, b in skips)]
    stalls, counts = Counter(), Counter()
    for _, text, stall in picked:
        stalls[opcode(text)] += stall
        counts[opcode(text)] += 1
    print("instructions %d, static stall cycles %d" % (len(picked), sum(x[2] for x in picked)))
    for op, cycles in stalls.most_common(12):
        print("  %-10s n=%4d stall=%d" % (op, counts[op], cycles))


if __name__ == "__main__":
    main(sys.argv[1:])
