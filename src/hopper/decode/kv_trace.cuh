// A KV-cache launch's timeline, for measurement only (WARPATTN_TRACE_KV=1 at compile time; off,
// every stamp compiles to nothing and ForwardParams keeps its layout): each CTA of the attention
// kernel and of the splits' combine writes the global timer (ns) at a few points of its life into
// a caller's buffer, whose device address the host reads from $WARPATTN_KV_TRACE_PTR on each call
// (run_kvcache.cuh). scripts/decode_trace.py allocates it, calls, and reads where a step's time
// goes: the prologue before the first load, the stream, the CTAs' spread at the end, the combine.
#pragma once

#include <cstdint>

#include "hopper/forward_params.hpp"

#ifndef WARPATTN_TRACE_KV
#define WARPATTN_TRACE_KV 0
#endif

namespace warpattn::detail {

// The buffer: kTraceCtas attention CTAs x kTraceSlots stamps, then kTraceCombineCtas combine CTAs
// x 4 (unsigned 64-bit each).
inline constexpr int kTraceCtas = 256, kTraceSlots = 16, kTraceCombineCtas = 1024;
enum TraceStamp : int {
  kTraceEntry = 0,           // thread 0, the kernel's first instruction
  kTraceReady = 1,           // thread 0, past the wait for the preceding grid and the CTA barrier
  kTraceFirstLoad = 2,       // the producer, its first K tile issued
  kTraceFirstPublish = 3,    // the producer, its second tile chosen (the tile counter) and published
  kTraceLastLoad = 4,        // the producer, its last V tile issued
  kTraceQArrived = 5,        // consumer warpgroup 0, its first tile's Q in shared memory
  kTraceConsumerDone = 6,    // + warpgroup: each consumer warpgroup's end (6, 7)
  kTraceSm = 9,              // the SM it ran on
  kTraceFirstTile = 10,      // the producer, its first tile worked out (the lengths read)
  kTraceCombineEntry = 0,    // the combine's slots
  kTraceCombineReady = 1,
  kTraceCombineDone = 2,
  kTraceCombineLoaded = 3,   // thread 0, its first batch of states loaded and added
};

__device__ __forceinline__ void trace_kv(const ForwardParams& params, int stamp) {
#if WARPATTN_TRACE_KV
  if (params.kv_trace == nullptr || blockIdx.x >= kTraceCtas) return;
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  params.kv_trace[blockIdx.x * kTraceSlots + stamp] = t;
  if (stamp == kTraceReady) {
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    params.kv_trace[blockIdx.x * kTraceSlots + kTraceSm] = sm;
  }
#else
  (void)params, (void)stamp;
#endif
}

__device__ __forceinline__ void trace_combine(const ForwardParams& params, int stamp) {
#if WARPATTN_TRACE_KV
  const unsigned cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (params.kv_trace == nullptr || threadIdx.x != 0 || cta >= kTraceCombineCtas) return;
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  params.kv_trace[kTraceCtas * kTraceSlots + cta * 4 + stamp] = t;
#else
  (void)params, (void)stamp;
#endif
}

}  // namespace warpattn::detail
