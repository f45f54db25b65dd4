// The Hopper backward's main kernel: one CTA per (key block, KV head, batch), three
// warpgroups: warpgroup 0 produces (warp 0 loads through TMA, warps 1 and 2 add the consumers'
// dQ pieces to global memory), the other two consume (backward_consumer.cuh).
// Not persistent: the grid is ordered key block fastest, so under the causal mask the long
// key blocks (the first ones see the most query blocks) start first, and in the deterministic
// mode the key blocks a CTA waits for were launched before it.
#pragma once
#include <cuda.h>

#include "hopper/backward/backward_consumer.cuh"
#include "hopper/backward/backward_dq_writer.cuh"
#include "hopper/backward/backward_producer.cuh"
#include "hopper/ptx/mbarrier.cuh"
#include "hopper/ptx/tma.cuh"
#include "hopper/ptx/warpgroup.cuh"

namespace warpattn::detail {

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    attention_backward_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                              const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                              const __grid_constant__ BackwardParams params) {
  using namespace ptx;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  auto& ss = *reinterpret_cast<BackwardSharedStorage<Cfg>*>(smem_raw);
  if (threadIdx.x == 0) {
    mbarrier_init(smem_addr(&ss.kv_full), 1);
#pragma unroll
    for (int s = 0; s < Cfg::kQStages; ++s) {
      mbarrier_init(smem_addr(&ss.q_full[s]), 1);
      mbarrier_init(smem_addr(&ss.q_empty[s]), Cfg::kConsumerWarpgroups);
    }
#pragma unroll
    for (int s = 0; s < Cfg::kDoStages; ++s) {
      mbarrier_init(smem_addr(&ss.do_full[s]), 1);
      mbarrier_init(smem_addr(&ss.do_empty[s]), Cfg::kConsumerWarpgroups);
    }
    fence_barrier_init();
  }
  __syncthreads();  // the last CTA-wide barrier: roles split below

  KeyBlockWork work;
  // Key blocks first-first (the longest under the causal mask start first), except for the
  // deterministic causal order, which needs them last-first (dq_turn).
  work.n_block = Cfg::kCausal && Cfg::kDeterministic ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  work.head_kv = blockIdx.y;
  work.batch = blockIdx.z;
  work.group = params.kv_group;
  work.m = query_block_range(work.n_block, Cfg::kBlockN, Cfg::kBlockM, params.seqlen_q, params.seqlen_k, Cfg::kCausal);

  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  if (warpgroup == 0) {
    release_registers<Cfg::kProducerRegisters>();
    const int warp = threadIdx.x / 32;
    if (threadIdx.x == 0) {
      prefetch_tensor_map(&tm_q);
      prefetch_tensor_map(&tm_do);
      run_backward_producer<Cfg>(ss, &tm_q, &tm_k, &tm_v, &tm_do, params, work);
    } else if (warp == 1 || warp == 2) {
      run_dq_writer<Cfg>(ss, params, work, warp - 1);
    }
  } else {
    acquire_registers<Cfg::kConsumerRegisters>();
    BackwardConsumer<Cfg>(ss, params, work, warpgroup - 1).run();
  }
}

}  // namespace warpattn::detail
