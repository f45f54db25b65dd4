// The Hopper forward kernel: one CTA of three warpgroups per 128 query rows of one
// (batch, head). Warpgroup 0 produces (TMA), warpgroups 1 and 2 consume (WGMMA + softmax).
#pragma once
#include <cuda.h>

#include "hopper/consumer.cuh"
#include "hopper/epilogue.cuh"
#include "hopper/forward_params.hpp"
#include "hopper/kv_tiles.hpp"
#include "hopper/producer.cuh"
#include "hopper/ptx/mbarrier.cuh"
#include "hopper/ptx/tma.cuh"
#include "hopper/ptx/warpgroup.cuh"
#include "hopper/shared_storage.cuh"
#include "hopper/softmax.cuh"

namespace warpattn::detail {

// Block index -> (query block, head, batch). Query blocks vary slowest and the last ones
// come first: under a causal mask they see the most keys, so the longest CTAs start in the
// first wave instead of forming a tail.
struct BlockCoords {
  int m_block, head, batch;
};
__device__ __forceinline__ BlockCoords block_coords(const ForwardParams& p) {
  const int heads_batches = p.heads_q * p.batch;
  const int hb = blockIdx.x % heads_batches;
  return {p.m_blocks - 1 - static_cast<int>(blockIdx.x) / heads_batches, hb % p.heads_q,
          hb / p.heads_q};
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    attention_forward_kernel(const __grid_constant__ CUtensorMap tm_q,
                             const __grid_constant__ CUtensorMap tm_k,
                             const __grid_constant__ CUtensorMap tm_v,
                             const __grid_constant__ CUtensorMap tm_o,
                             const __grid_constant__ ForwardParams params) {
  using namespace ptx;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  auto& ss = *reinterpret_cast<SharedStorage<Cfg>*>(smem_raw);

  const BlockCoords bc = block_coords(params);
  const int n_tiles = kv_tile_count(bc.m_block, Cfg::kBlockM, Cfg::kBlockN, params.seqlen_q,
                                    params.seqlen_k, Cfg::kCausal);
  const int warpgroup = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    mbarrier_init(smem_addr(&ss.q_full), 1);
#pragma unroll
    for (int s = 0; s < Cfg::kStages; ++s) {
      mbarrier_init(smem_addr(&ss.k_full[s]), 1);
      mbarrier_init(smem_addr(&ss.v_full[s]), 1);
      mbarrier_init(smem_addr(&ss.k_empty[s]), Cfg::kConsumerWarpgroups);
      mbarrier_init(smem_addr(&ss.v_empty[s]), Cfg::kConsumerWarpgroups);
    }
    fence_barrier_init();
    fence_proxy_async_shared();
  }
  __syncthreads();  // the last CTA-wide barrier: roles split below

  if (warpgroup == 0) {
    release_registers<Cfg::kProducerRegisters>();
    if (threadIdx.x == 0) {
      prefetch_tensor_map(&tm_q);
      prefetch_tensor_map(&tm_k);
      prefetch_tensor_map(&tm_v);
      run_producer<Cfg>(ss, &tm_q, &tm_k, &tm_v, bc.m_block, bc.head, bc.head / params.kv_group,
                        bc.batch, n_tiles);
    }
  } else {
    acquire_registers<Cfg::kConsumerRegisters>();
    const int consumer = warpgroup - 1;
    float o[Cfg::kHeadDim / 2];
    OnlineSoftmax softmax(params.scale_log2);
    if (sees_few_keys(bc.m_block * Cfg::kBlockM, params.seqlen_q, params.seqlen_k, Cfg::kCausal))
      run_consumer_precise<Cfg>(ss, params, consumer, bc.m_block, n_tiles, o, softmax);
    else
      run_consumer<Cfg>(ss, params, consumer, bc.m_block, n_tiles, o, softmax);
    float lse[2];
    softmax.finalize(o, lse);
    store_output<Cfg>(o, lse, ss.q, &tm_o, params, FragmentCoords(threadIdx.x % 128), consumer,
                      bc.m_block, bc.head, bc.batch);
  }
}

}  // namespace warpattn::detail
