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

// Called by all 256 consumer threads after the last step; `consumer` 0 or 1, `ticket` a
// shared-memory int. at(a, i): the thread's i-th float (0 .. kFloats - 1) of dK (a = 0, unscaled)
// or dV (a = 1). True: they now hold the whole tile's sums, to be stored; false: this part's sums
// are in its slot and nothing is left to do.
template <int kFloats, class At>
__device__ __forceinline__ bool add_up_cut_tile(const At& at, const BackwardParams& p, const KeyBlockWork& work,
                                                int consumer, int* ticket) {
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
  // float4 j of accumulator a: a warp's 32 threads 512 contiguous bytes
  const auto slot = [&](int s) {
    return reinterpret_cast<float4*>(p.tail_partials +
                                     (static_cast<int64_t>(work.cut_tile) * last + s) * kTailSlotFloats<kFloats> +
                                     consumer * (2 * kFloats * 128)) +
           t;
  };
  if (mine < last) {
    float4* out = slot(mine);
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
      for (int j = 0; j < kFloats / 4; ++j)
        out[(a * kFloats / 4 + j) * 128] = make_float4(at(a, 4 * j), at(a, 4 * j + 1), at(a, 4 * j + 2), at(a, 4 * j + 3));
    // every thread's stores, then the leader's release (cumulative over them through the barrier)
    named_barrier_sync(BackwardBarrier::kTailFixup, 256);
    if (leader) add_release_gpu(done, 1);
    return false;
  }
  if (leader)
    while (load_acquire_gpu(done) < last) __nanosleep(256);
  named_barrier_sync(BackwardBarrier::kTailFixup, 256);
  for (int s = 0; s < last; ++s) {
    const float4* in = slot(s);
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
      for (int j = 0; j < kFloats / 4; ++j) {
        const float4 x = __ldcg(in + (a * kFloats / 4 + j) * 128);
        at(a, 4 * j) += x.x, at(a, 4 * j + 1) += x.y, at(a, 4 * j + 2) += x.z, at(a, 4 * j + 3) += x.w;
      }
  }
  return true;
}

// The consumers' accumulators: a thread's dK and dV as kFloats each (backward_consumer.cuh), or as
// kSlices x kAcc (backward_consumer_n80.cuh).
template <int kFloats>
__device__ __forceinline__ bool add_up_cut_tile(float (&dk)[kFloats], float (&dv)[kFloats], const BackwardParams& p,
                                                const KeyBlockWork& work, int consumer, int* ticket) {
  return add_up_cut_tile<kFloats>([&](int a, int i) -> float& { return a == 0 ? dk[i] : dv[i]; }, p, work, consumer,
                                  ticket);
}
template <int kSlices, int kAcc>
__device__ __forceinline__ bool add_up_cut_tile(float (&dk)[kSlices][kAcc], float (&dv)[kSlices][kAcc],
                                                const BackwardParams& p, const KeyBlockWork& work, int consumer,
                                                int* ticket) {
  return add_up_cut_tile<kSlices * kAcc>(
      [&](int a, int i) -> float& { return a == 0 ? dk[i / kAcc][i % kAcc] : dv[i / kAcc][i % kAcc]; }, p, work,
      consumer, ticket);
}

}  // namespace warpattn::detail
