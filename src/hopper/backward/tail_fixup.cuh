// The backward's tail split, on the device (tail_split.hpp has the mapping): a cut tile's parts
// each hold partial dK and dV for the tile's keys, over their step ranges; the part that
// finishes last adds the others' and stores the gradients as a whole tile does.
//
// Which part is last is decided by a ticket, taken once a part's consumers are done: tickets 0
// .. parts - 2 store their fp32 accumulators into a slot of their own (the workspace's tail
// partials: parts - 1 slots a cut tile) and count themselves done; ticket parts - 1 waits until
// the others are done (they hold their tickets, so none of them waits in turn), reads their
// slots and adds them. A slot is the two consumers' registers, each thread's floats 16 bytes at
// a time, a warp's 32 stores contiguous. Not deterministic (the sum's order is the tickets');
// the deterministic mode does not split.
#pragma once

#include "hopper/backward/backward_params.hpp"
#include "hopper/backward/backward_shared_storage.cuh"
#include "hopper/backward/key_block_work.hpp"
#include "hopper/ptx/memory_order.cuh"
#include "hopper/ptx/warpgroup.cuh"

namespace warpattn::detail {

// Floats of a cut tile's slot: two consumers' dK and dV of kFloats each (a thread's) x 128.
template <int kFloats>
inline constexpr int64_t kTailSlotFloats = int64_t{2} * 2 * kFloats * 128;

// Called by all 256 consumer threads with their dK and dV (unscaled) after the last step;
// `consumer` 0 or 1, `ticket` a shared-memory int. True: dk and dv now hold the whole tile's
// sums (for this thread's elements), to be stored; false: this part's sums are in its slot and
// nothing is left to do.
template <int kFloats>
__device__ __forceinline__ bool add_up_cut_tile(float (&dk)[kFloats], float (&dv)[kFloats], const BackwardParams& p,
                                                const KeyBlockWork& work, int consumer, int* ticket) {
  static_assert(kFloats % 4 == 0, "16-byte stores");
  using namespace ptx;
  const int t = threadIdx.x % 128;
  const bool leader = consumer == 0 && t == 0;
  const int last = p.tail.parts - 1;
  int* taken = p.tail_counters + 2 * work.cut_tile;  // tickets handed out
  int* done = taken + 1;                             // slots stored
  if (leader) *ticket = atomicAdd(taken, 1);
  named_barrier_sync(BackwardBarrier::kTailFixup, 256);
  const int mine = *ticket;
  const auto slot = [&](int s) {
    return p.tail_partials + (static_cast<int64_t>(work.cut_tile) * last + s) * kTailSlotFloats<kFloats> +
           consumer * (2 * kFloats * 128);
  };
  if (mine < last) {
    float4* out = reinterpret_cast<float4*>(slot(mine));
#pragma unroll
    for (int j = 0; j < kFloats / 4; ++j) {
      out[j * 128 + t] = make_float4(dk[4 * j], dk[4 * j + 1], dk[4 * j + 2], dk[4 * j + 3]);
      out[(kFloats / 4 + j) * 128 + t] = make_float4(dv[4 * j], dv[4 * j + 1], dv[4 * j + 2], dv[4 * j + 3]);
    }
    // every thread's stores, then the leader's release (cumulative over them through the barrier)
    named_barrier_sync(BackwardBarrier::kTailFixup, 256);
    if (leader) add_release_gpu(done, 1);
    return false;
  }
  if (leader)
    while (load_acquire_gpu(done) < last) __nanosleep(256);
  named_barrier_sync(BackwardBarrier::kTailFixup, 256);
  for (int s = 0; s < last; ++s) {
    const float4* in = reinterpret_cast<const float4*>(slot(s));
#pragma unroll
    for (int j = 0; j < kFloats / 4; ++j) {
      const float4 a = __ldcg(in + j * 128 + t), b = __ldcg(in + (kFloats / 4 + j) * 128 + t);
      dk[4 * j] += a.x, dk[4 * j + 1] += a.y, dk[4 * j + 2] += a.z, dk[4 * j + 3] += a.w;
      dv[4 * j] += b.x, dv[4 * j + 1] += b.y, dv[4 * j + 2] += b.z, dv[4 * j + 3] += b.w;
    }
  }
  return true;
}

}  // namespace warpattn::detail
