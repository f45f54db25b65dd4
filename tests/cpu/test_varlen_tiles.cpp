// The plan of a packed batch's tiles (hopper/varlen/varlen_tiles.hpp), on the host: each
// sequence's tiles cover its (query block, head) pairs once with the right key tiles; the
// table bound holds for every valid batch; any offsets at all stay inside the tensors.
#include <algorithm>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "harness.hpp"
#include "hopper/varlen/varlen_tiles.hpp"

using namespace warpattn::detail;

namespace {

VarlenGeometry geometry(bool causal, int heads_q, int kv_group) {
  VarlenGeometry g = varlen_geometry(128, 176, heads_q, kv_group, causal);
  g.kv_bytes_per_key = 2 * 128 * 2, g.l2_bytes = 50 << 20, g.multiprocessors = 132;
  return g;
}

}  // namespace

TEST(varlen_tiles_cover_each_block_and_head_once) {
  std::mt19937_64 rng(7);
  int bad = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const bool causal = trial % 2;
    const int heads = 1 + static_cast<int>(rng() % 12), group = (trial % 3 == 0) ? 1 : heads;
    const VarlenGeometry g = geometry(causal, heads, heads % group == 0 ? group : 1);
    const int batch = 1 + static_cast<int>(rng() % 20);
    std::vector<int> cu_q{0}, cu_k{0};
    for (int b = 0; b < batch; ++b) {
      const int lq = rng() % 4 == 0 ? 0 : static_cast<int>(rng() % 3000), lk = static_cast<int>(rng() % 3000);
      cu_q.push_back(cu_q.back() + lq), cu_k.push_back(cu_k.back() + lk);
    }
    const VarlenSequences s{cu_q.data(), cu_k.data(), nullptr, batch, cu_q.back(), cu_k.back()};
    long long tiles = 0;
    for (int b = 0; b < batch; ++b) {
      const SequenceSpan span = sequence_span(s, b);
      bad += span.q_offset != cu_q[b] || span.seqlen_q != cu_q[b + 1] - cu_q[b] || span.seqlen_k != cu_k[b + 1] - cu_k[b];
      std::set<std::pair<int, int>> seen;
      const long long n = sequence_tiles(span, g);
      tiles += n;
      int longest = 0;
      for (int t = 0; t < n; ++t) {
        const VarlenTile w = varlen_tile(span, b, t, g);
        bad += w.batch != b || w.q_offset != span.q_offset || w.k_offset != span.k_offset;
        bad += w.block < 0 || w.block * g.block_m >= span.seqlen_q || w.head < 0 || w.head >= heads;
        bad += !seen.insert({w.block, w.head}).second;
        bad += w.n_tiles != kv_tile_count(w.block, g.block_m, g.block_n, span.seqlen_q, span.seqlen_k, causal);
        longest = std::max(longest, w.n_tiles);
      }
      bad += static_cast<long long>(seen.size()) != n;
      bad += longest != sequence_work(span, g);  // the sort key is the longest tile
    }
    bad += tiles > max_varlen_tiles(cu_q.back(), batch, g.block_m, heads);
  }
  CHECK(bad == 0) << bad << " violations";
}

// Offsets that break every rule still give spans inside [0, total) (the kernels read and write
// only rows of the spans).
TEST(varlen_spans_stay_inside_for_any_offsets) {
  std::mt19937_64 rng(11);
  int bad = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const int total_q = static_cast<int>(rng() % 1000), total_k = static_cast<int>(rng() % 1000);
    const auto any = [&] { return static_cast<int>(rng() % 4000) - 1500 + (rng() % 50 == 0 ? 2000000000 : 0); };
    int cu_q[2] = {any(), any()}, cu_k[2] = {any(), any()}, used = any();
    const VarlenSequences s{cu_q, cu_k, rng() % 2 ? &used : nullptr, 1, total_q, total_k};
    const SequenceSpan span = sequence_span(s, 0);
    bad += span.q_offset < 0 || span.seqlen_q < 0 || span.q_offset + span.seqlen_q > total_q;
    bad += span.k_offset < 0 || span.seqlen_k < 0 || span.k_offset + span.seqlen_k > total_k;
  }
  CHECK(bad == 0) << bad << " spans outside the tensors";
}

// The sort key orders by work, descending, then by sequence, ascending.
TEST(varlen_plan_key_orders_longest_first) {
  CHECK(plan_key(10, 5) < plan_key(9, 0));
  CHECK(plan_key(10, 1) < plan_key(10, 2));
  CHECK(plan_key(0, 0) < ~0ull);  // padding sorts last
}
