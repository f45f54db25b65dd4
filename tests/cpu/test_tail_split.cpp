// The backward's tail split (hopper/backward/tail_split.hpp): every (tile, step) of a launch
// covered by exactly one CTA, the cut tiles last with their parts together, and the host's
// choice against the wave arithmetic of docs/backward-design.md.
#include <cstdlib>
#include <vector>

#include "hopper/backward/tail_split.hpp"
#include "harness.hpp"

using warpattn::detail::choose_tail_split;
using warpattn::detail::part_steps;
using warpattn::detail::tail_split_part;
using warpattn::detail::TailSplit;

TEST(tail_split_covers_every_step_once) {
  int bad = 0, configs = 0;
  for (int tiles : {1, 2, 7, 133, 200, 2048})
    for (int steps : {1, 2, 3, 13, 52, 205})
      for (int split = 0; split <= tiles && split <= 201; split += split < 3 ? 1 : 67)
        for (int parts = 1; parts <= 5; ++parts) {
          ++configs;
          const TailSplit t{split, parts};
          std::vector<int> seen(static_cast<size_t>(tiles) * steps, 0);
          int prev_tile = -1, prev_part = -1;
          for (int cta = 0; cta < t.ctas(tiles); ++cta) {
            const auto tp = tail_split_part(cta, tiles, t);
            if (tp.tile < 0 || tp.tile >= tiles || tp.part >= parts) {
              ++bad;
              break;
            }
            // whole tiles in order first, then each cut tile's parts 0 .. parts - 1 in a row
            const bool cut = tp.tile >= tiles - split;
            if (cut != (tp.part >= 0)) ++bad;
            if (tp.part <= 0 ? tp.tile != prev_tile + 1 : (tp.tile != prev_tile || tp.part != prev_part + 1)) ++bad;
            prev_tile = tp.tile, prev_part = tp.part;
            const auto r = part_steps(steps, tp.part, parts);
            if (r.begin < 0 || r.end > steps || r.begin > r.end) ++bad;
            for (int s = r.begin; s < r.end; ++s) ++seen[static_cast<size_t>(tp.tile) * steps + s];
          }
          for (int c : seen) bad += c != 1;
        }
  CHECK(bad == 0) << bad << " mismatches over " << configs << " configurations";
}

TEST(tail_split_parts_are_nearly_equal) {
  for (int steps : {1, 5, 52, 205})
    for (int parts = 1; parts <= 7; ++parts)
      for (int p = 0; p < parts; ++p) {
        const auto r = part_steps(steps, p, parts);
        CHECK(r.end - r.begin >= steps / parts && r.end - r.begin <= steps / parts + 1)
            << steps << " steps, part " << p << " of " << parts;
      }
}

TEST(tail_split_choice) {
  // 2048 tiles on 132 SMs (d = 128, B·N = 16K, H·d = 2048): the last 200 tiles (one full wave
  // and the 68 of the partial one). With a free fix-up three parts (5 rounds of 1/3: 1.67 tiles'
  // time against 2) beat two (4 rounds of 1/2: 2.0); at 0.03 of a tile a part three still win
  // (5 x 0.363 = 1.82).
  auto t = choose_tail_split(2048, 132, 4, 0.0, 0.05);
  CHECK(t.split_tiles == 200 && t.parts == 3) << t.split_tiles << " / " << t.parts;
  t = choose_tail_split(2048, 132, 4, 0.03, 0.05);
  CHECK(t.split_tiles == 200 && t.parts == 3) << t.split_tiles << " / " << t.parts;
  // A costly fix-up (a short tile, N = 1K): no cut.
  t = choose_tail_split(2048, 132, 4, 0.1, 0.05);
  CHECK(t.split_tiles == 0 && t.parts == 1) << t.split_tiles << " / " << t.parts;
  // No tail (whole waves), too few tiles for two waves: no cut.
  CHECK(choose_tail_split(2112, 132, 4, 0.0, 0.05).split_tiles == 0);
  CHECK(choose_tail_split(200, 132, 4, 0.0, 0.05).split_tiles == 0);
  // The CTAs the cut launch takes: 1848 whole + 600 parts.
  CHECK((TailSplit{200, 3}.ctas(2048) == 2448));
}

// The launch's choice (backward_tail_split): the benchmark's shapes on 132 SMs, and the test
// hook WARPATTN_BWD_TAIL_SPLIT.
TEST(backward_tail_split_choice) {
  using warpattn::detail::backward_tail_split;
  unsetenv("WARPATTN_BWD_TAIL_SPLIT");
  // d = 128 (80-row steps) at 4K and 16K tokens: 2048 tiles of 52 and 205 steps, 200 cut in 3.
  auto t = backward_tail_split(2048, 52, 132);
  CHECK(t.split_tiles == 200 && t.parts == 3) << t.split_tiles << " / " << t.parts;
  t = backward_tail_split(2048, 205, 132);
  CHECK(t.split_tiles == 200 && t.parts == 3) << t.split_tiles << " / " << t.parts;
  // d = 64 at 4K (128-row steps, 4096 tiles: 31 waves and 4 tiles): 136 cut in 4.
  t = backward_tail_split(4096, 32, 132);
  CHECK(t.split_tiles == 136 && t.parts == 4) << t.split_tiles << " / " << t.parts;
  // d = 256 at 4K (80-key tiles, 64-row steps: 1664 tiles, 12 waves and 80): 212 cut in 3.
  t = backward_tail_split(1664, 64, 132);
  CHECK(t.split_tiles == 212 && t.parts == 3) << t.split_tiles << " / " << t.parts;
  // 1K (13 steps): a part's start and fix-up cost more than the tail.
  CHECK(backward_tail_split(2048, 13, 132).split_tiles == 0);
  // Forced (clamped to the launch's tiles), and refused forms.
  setenv("WARPATTN_BWD_TAIL_SPLIT", "7,3", 1);
  t = backward_tail_split(2048, 13, 132);
  CHECK(t.split_tiles == 7 && t.parts == 3) << t.split_tiles << " / " << t.parts;
  setenv("WARPATTN_BWD_TAIL_SPLIT", "500,2", 1);
  t = backward_tail_split(100, 13, 132);
  CHECK(t.split_tiles == 100 && t.parts == 2) << t.split_tiles << " / " << t.parts;
  for (const char* off : {"0", "5", "5,1", "x", "5,3x", "-1,3"}) {
    setenv("WARPATTN_BWD_TAIL_SPLIT", off, 1);
    CHECK(backward_tail_split(2048, 52, 132).split_tiles == 0) << "WARPATTN_BWD_TAIL_SPLIT=" << off;
  }
  unsetenv("WARPATTN_BWD_TAIL_SPLIT");
}
