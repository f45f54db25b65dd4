// The backward's wave tail, cut over more CTAs (docs/backward-design.md, "The main kernel's time
// outside its steps"): without a mask every key block is the same work, so a launch of T tiles
// on S CTA slots ends with a partial wave (2048 tiles on 132 SMs: 15.52 waves, 3% of the SMs'
// time idle). The last tiles in launch order are each cut into `parts` ranges of their query
// steps, whose partial dK and dV are added up by the part that finishes last. This file is the
// mapping from a CTA to its tile and step range, and the host's choice of the cut; host-and-device
// code, so CPU tests can check both. tail_fixup.cuh adds the parts' partial dK and dV.
#pragma once

#include <cstdint>
#include <cstdlib>

#include "hopper/host_device.hpp"

namespace warpattn::detail {

struct TailSplit {
  int split_tiles = 0;  // the launch's last tiles that are cut (0: none)
  int parts = 1;        // step ranges a cut tile has
  // CTAs of a launch of `tiles` tiles: the whole ones, then every part of the cut ones.
  WARPATTN_HOST_DEVICE int ctas(int tiles) const { return tiles + split_tiles * (parts - 1); }
};

struct TilePart {
  int tile;  // in launch order
  int part;  // -1: the whole tile
};

// CTA `cta`'s tile and part: the whole tiles first, then each cut tile's parts one after
// another (a tile's parts run at about the same time, so the partial sums stay in the L2).
WARPATTN_HOST_DEVICE TilePart tail_split_part(int cta, int tiles, const TailSplit& t) {
  const int whole = tiles - t.split_tiles;
  if (cta < whole) return {cta, -1};
  const int i = cta - whole;
  return {whole + i / t.parts, i % t.parts};
}

struct StepRange {
  int begin, end;
};

// The query steps part `part` of `parts` takes of a tile's `steps`: nearly equal, in order,
// together all of them; part -1 all.
WARPATTN_HOST_DEVICE StepRange part_steps(int steps, int part, int parts) {
  if (part < 0) return {0, steps};
  return {static_cast<int>(static_cast<int64_t>(steps) * part / parts),
          static_cast<int>(static_cast<int64_t>(steps) * (part + 1) / parts)};
}

// The cut for `tiles` equal tiles on `slots` CTA slots, timed in tiles: the last full wave and the
// partial one (slots + tiles % slots tiles, two waves uncut) cut in p parts run in
// ceil(cut · p / slots) rounds of 1 / p + part_cost each (part_cost: a part's fix-up, its partial
// dK and dV added and, for the last, read back, as a share of a tile's time). The p in 2 ..
// max_parts with the shortest time, if it saves at least min_gain tiles' time; else no cut.
inline TailSplit choose_tail_split(int tiles, int slots, int max_parts, double part_cost, double min_gain) {
  if (slots <= 0 || tiles < 2 * slots || tiles % slots == 0) return {};
  const int cut = slots + tiles % slots;
  TailSplit best{};
  double best_time = 2.0 - min_gain;
  for (int p = 2; p <= max_parts; ++p) {
    const int64_t rounds = (static_cast<int64_t>(cut) * p + slots - 1) / slots;
    const double time = static_cast<double>(rounds) * (1.0 / p + part_cost);
    if (time < best_time) best_time = time, best = {cut, p};
  }
  return best;
}

// The backward's cut for `tiles` equal tiles of `steps` query steps on `slots` CTA slots (one CTA
// an SM). A part's cost beyond its steps, in steps: its start (K and V loaded, the pipeline
// filled) and its fix-up (128 KB of partials stored at d = 128, or read back by the last), ~1 us
// each against a step's ~2 us at d = 128 (docs/backward-design.md, "The main kernel's time
// outside its steps"). Up to 4 parts, only where it saves a tenth of a tile's time.
// WARPATTN_BWD_TAIL_SPLIT="tiles,parts" forces a cut (the tests' way to reach the split path at
// small shapes; parts 2 or more, tiles clamped to the launch's), "0" forbids one.
inline TailSplit backward_tail_split(int64_t tiles, int steps, int slots) {
  if (tiles <= 0 || tiles >= (int64_t{1} << 30) || steps <= 0) return {};
  if (const char* forced = std::getenv("WARPATTN_BWD_TAIL_SPLIT")) {
    char* end = nullptr;
    const long cut = std::strtol(forced, &end, 10);
    if (cut <= 0 || *end != ',') return {};
    const long parts = std::strtol(end + 1, &end, 10);
    if (parts < 2 || parts > 64 || *end != 0) return {};
    const TailSplit t{static_cast<int>(cut < tiles ? cut : tiles), static_cast<int>(parts)};
    return tiles + int64_t{t.split_tiles} * (t.parts - 1) < (int64_t{1} << 31) ? t : TailSplit{};
  }
  constexpr double kPartCostSteps = 1.0, kMinGainTiles = 0.1;
  return choose_tail_split(static_cast<int>(tiles), slots, 4, kPartCostSteps / steps, kMinGainTiles);
}

}  // namespace warpattn::detail
