// TEMPORARY measurement knobs (WARPATTN_TUNE="tiles alt"), read on every call so that one
// benchmark process can compare variants. To be removed once the choices are recorded in
// tile_shapes.hpp and docs/perf/.
#pragma once
#include <cstdlib>
#include <cstring>

namespace warpattn::detail {

struct Tuning {
  bool one_tile_per_cta = false;  // grid = tiles instead of one CTA per SM
  bool static_order = false;      // no tile counter: the static snake order
  bool alt_block_n = false;       // the alternative kBlockN of each head dim
};

inline Tuning tuning() {
  Tuning t;
  const char* env = std::getenv("WARPATTN_TUNE");
  if (!env) return t;
  t.one_tile_per_cta = std::strstr(env, "tiles") != nullptr;
  t.static_order = std::strstr(env, "static") != nullptr;
  t.alt_block_n = std::strstr(env, "alt") != nullptr;
  return t;
}

}  // namespace warpattn::detail
