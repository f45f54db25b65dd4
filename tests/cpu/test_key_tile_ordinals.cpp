// The decode tile's key-tile split between its two consumer warpgroups (hopper/
// key_tile_ordinals.hpp), over random sequences of work tiles as a persistent CTA meets them:
// each tile's key tiles are shared out exactly once, first/last/at_or_after agree with the
// visited set, and on an even ring every stage's consecutive tiles belong to one warpgroup
// (the property the parity waits need); on a ring of 3 the check must find a violation.
#include <random>
#include <vector>

#include "harness.hpp"
#include "hopper/key_tile_ordinals.hpp"

using Alternate = warpattn::detail::KeyTileOrdinals<true>;

namespace {

// The ring ordinals each warpgroup visits, in its order, over `tiles` work tiles of n key tiles
// each; checks the per-tile properties on the way.
std::vector<int> owners_of_ring(const std::vector<int>& tiles, int& bad) {
  std::vector<int> owner;
  int kv = 0;
  for (const int n : tiles) {
    std::vector<int> seen(n, 0), who(n, -1);
    for (int w = 0; w < 2; ++w) {
      const int first = Alternate::first(w, kv);
      if (!Alternate::any(first, n)) {
        bad += n > 1;  // with two or more key tiles both warpgroups have one
        continue;
      }
      int last = -1;
      for (int it = first; it < n; it += Alternate::kStep) ++seen[it], who[it] = w, last = it;
      bad += Alternate::last(first, n) != last;
      for (int from = first; from < n + 2; ++from) {
        const int at = Alternate::at_or_after(first, from);
        bad += at < from || at > from + 1 || ((at - first) & 1) != 0;
      }
    }
    for (int it = 0; it < n; ++it) {
      bad += seen[it] != 1;
      owner.push_back(who[it]);
    }
    kv += n;
  }
  return owner;
}

// How many ring ordinals g >= stages are waited for by a warpgroup other than the one that
// owned g - stages (the stage's previous tile).
int stage_owner_changes(const std::vector<int>& owner, int stages) {
  int changes = 0;
  for (size_t g = stages; g < owner.size(); ++g) changes += owner[g] != owner[g - stages];
  return changes;
}

}  // namespace

TEST(decode_tile_warpgroups_share_each_tile_and_keep_their_ring_stages) {
  std::mt19937 rng(2026);
  std::uniform_int_distribution<int> keys(0, 9);
  int bad = 0, even_changes = 0, odd_changes = 0;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int> tiles(1 + trial % 13);
    for (int& n : tiles) n = keys(rng);
    const std::vector<int> owner = owners_of_ring(tiles, bad);
    even_changes += stage_owner_changes(owner, 2) + stage_owner_changes(owner, 4);
    odd_changes += stage_owner_changes(owner, 3);
  }
  CHECK(bad == 0) << bad << " per-tile mismatches";
  CHECK(even_changes == 0) << even_changes << " stages passed between warpgroups on an even ring";
  CHECK(odd_changes > 0) << "a ring of 3 must pass stages between warpgroups (the check can fail)";
}
