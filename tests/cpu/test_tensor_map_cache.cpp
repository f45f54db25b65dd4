// The recent tensor maps (hopper/tensor_map_cache.hpp) against a counting fake encoder: a call
// that repeats a key takes the kept map and does not encode; any field that differs encodes
// anew; the oldest entry goes first once it is full; a failed encode keeps nothing.
#include <cstring>
#include <stdexcept>

#include "harness.hpp"
#include "hopper/tensor_map_cache.hpp"

using namespace warpattn::detail;

namespace {

// A map whose first word says which encode made it, so a hit can be told from a re-encode.
struct CountingEncoder {
  int calls = 0;
  CUtensorMap operator()(const TensorMapKey& key) {
    ++calls;
    CUtensorMap map;
    std::memset(&map, 0, sizeof map);
    uint64_t words[2] = {static_cast<uint64_t>(calls), reinterpret_cast<uint64_t>(key.data)};
    std::memcpy(&map, words, sizeof words);
    return map;
  }
};

uint64_t made_by(const CUtensorMap& map) {
  uint64_t first;
  std::memcpy(&first, &map, sizeof first);
  return first;
}

TensorMapKey key_at(uintptr_t address) {
  TensorMapKey k;
  k.data = reinterpret_cast<const void*>(address);
  for (int i = 0; i < 5; ++i) k.dims[i] = 10 + i;
  for (int i = 0; i < 4; ++i) k.strides[i] = 256 << i;
  for (int i = 0; i < 5; ++i) k.box[i] = 1 + i;
  k.type = 10;
  k.swizzle = 128;
  return k;
}

}  // namespace

TEST(tensor_map_cache_repeated_key_is_encoded_once) {
  TensorMapCache<4> cache;
  CountingEncoder enc;
  const CUtensorMap a = cache.get(key_at(0x1000), enc);
  const CUtensorMap b = cache.get(key_at(0x1000), enc);
  CHECK(enc.calls == 1) << enc.calls;
  CHECK(std::memcmp(&a, &b, sizeof a) == 0);
}

TEST(tensor_map_cache_any_differing_field_encodes_anew) {
  TensorMapCache<64> cache;
  CountingEncoder enc;
  const TensorMapKey base = key_at(0x2000);
  cache.get(base, enc);
  int expected = 1;
  auto differs = [&](TensorMapKey k, const char* what) {
    const CUtensorMap m = cache.get(k, enc);
    ++expected;
    CHECK(enc.calls == expected) << what;
    CHECK(made_by(m) == static_cast<uint64_t>(expected)) << what;
  };
  TensorMapKey k = base;
  k.data = reinterpret_cast<const void*>(0x2010);
  differs(k, "data");
  for (int i = 0; i < 5; ++i) {
    k = base;
    ++k.dims[i];
    differs(k, "dims");
    k = base;
    ++k.box[i];
    differs(k, "box");
  }
  for (int i = 0; i < 4; ++i) {
    k = base;
    k.strides[i] += 16;
    differs(k, "strides");
  }
  k = base;
  k.type = 11;
  differs(k, "type");
  k = base;
  k.swizzle = 64;
  differs(k, "swizzle");
  // And the first one is still kept.
  CHECK(made_by(cache.get(base, enc)) == 1);
  CHECK(enc.calls == expected);
}

TEST(tensor_map_cache_evicts_the_oldest_when_full) {
  TensorMapCache<4> cache;
  CountingEncoder enc;
  for (uintptr_t a = 1; a <= 4; ++a) cache.get(key_at(a * 0x100), enc);
  CHECK(enc.calls == 4);
  for (uintptr_t a = 1; a <= 4; ++a) cache.get(key_at(a * 0x100), enc);
  CHECK(enc.calls == 4) << "all four kept";
  cache.get(key_at(5 * 0x100), enc);  // evicts the first
  CHECK(enc.calls == 5);
  for (uintptr_t a = 2; a <= 5; ++a) cache.get(key_at(a * 0x100), enc);
  CHECK(enc.calls == 5) << "2..5 kept";
  cache.get(key_at(1 * 0x100), enc);  // back, evicting 2
  CHECK(enc.calls == 6);
  cache.get(key_at(2 * 0x100), enc);
  CHECK(enc.calls == 7) << "2 was the oldest";
}

TEST(tensor_map_cache_keeps_nothing_from_a_failed_encode) {
  TensorMapCache<4> cache;
  int calls = 0;
  auto failing = [&](const TensorMapKey&) -> CUtensorMap {
    ++calls;
    throw std::runtime_error("encode failed");
  };
  bool threw = false;
  try {
    cache.get(key_at(0x3000), failing);
  } catch (const std::runtime_error&) {
    threw = true;
  }
  CHECK(threw);
  CountingEncoder enc;
  cache.get(key_at(0x3000), enc);
  CHECK(enc.calls == 1) << "the failed key was not kept";
  CHECK(calls == 1);
}
