// The backward's producer: one thread loads K and V once, then for every step Q with its rows'
// LSE_log2 and dO with their D (1-D bulk copies of the preprocess's row terms on the same
// mbarriers), through rings of kQStages and kDoStages buffers, in the consumers' order.
// Cfg::kWarpProducer: the whole of warp 0 walks the steps (every lane waits on the ring; lane 0,
// `issuer`, issues), so that ptxas can keep the warp-uniform walk in uniform registers rather
// than in the thread's 24 (setmaxnreg): the rotated walk at d = 128 needs one more than a thread
// has (docs/backward-design.md, "The walk's order").
#pragma once
#include <cuda.h>

#include "hopper/backward/backward_params.hpp"
#include "hopper/backward/backward_shared_storage.cuh"
#include "hopper/backward/key_block_work.hpp"
#include "hopper/ptx/mbarrier.cuh"
#include "hopper/panel_tile.cuh"
#include "hopper/ptx/tma.cuh"
#include "hopper/ring_slot.cuh"

namespace warpattn::detail {

// row0: the block's first row in the tensor (the sequence's offset + m_block x kBlockM).
template <class Cfg>
__device__ __forceinline__ void load_query_tile(const CUtensorMap* map, uint8_t* tile, const float* row_terms,
                                                float* row_terms_smem, uint64_t* full, uint64_t* empty, RingSlot slot,
                                                int row0, int head, int batch, bool issuer) {
  using namespace ptx;
  mbarrier_wait(smem_addr(empty), slot.phase ^ 1);  // a fresh barrier's preceding phase counts as complete
  if (!issuer) return;
  const uint32_t bar = smem_addr(full);
  mbarrier_arrive_expect_tx(bar, Cfg::kQTileBytes + Cfg::kBlockM * 4);
  load_panel_tile<Cfg::kPanels, Cfg::kBlockM, 128>(smem_addr(tile), map, bar, row0, head, batch);
  bulk_load(smem_addr(row_terms_smem), row_terms, Cfg::kBlockM * 4, bar);
}

template <class Cfg>
__device__ __forceinline__ void run_backward_producer(BackwardSharedStorage<Cfg>& ss, const CUtensorMap* tm_q,
                                                      const CUtensorMap* tm_k, const CUtensorMap* tm_v,
                                                      const CUtensorMap* tm_do, const BackwardParams& p,
                                                      const KeyBlockWork& work, bool issuer) {
  using namespace ptx;
  if (work.steps() == 0) return;
  if (issuer) {
    const uint32_t kv_bar = smem_addr(&ss.kv_full);
    mbarrier_arrive_expect_tx(kv_bar, 2 * Cfg::kKTileBytes);
    const int key0 = work.k_offset + work.n_block * Cfg::kBlockN;
    load_panel_tile<Cfg::kPanels, Cfg::kBlockN, 128>(smem_addr(ss.k), tm_k, kv_bar, key0, work.head_kv, work.batch);
    load_panel_tile<Cfg::kPanels, Cfg::kBlockN, 128>(smem_addr(ss.v), tm_v, kv_bar, key0, work.head_kv, work.batch);
  }
  for (int step = 0; step < work.steps(); ++step) {
    const RingSlot qs = ring_slot<Cfg::kQStages>(step), ds = ring_slot<Cfg::kDoStages>(step);
    const int head = work.head(step), m_block = work.m_block<Cfg>(step);
    const int64_t first_row = work.ws_row0 + static_cast<int64_t>(head) * p.rows + m_block * Cfg::kBlockM;
    const int row0 = work.q_offset + m_block * Cfg::kBlockM;
    load_query_tile<Cfg>(tm_q, ss.q[qs.stage], p.lse_log2 + first_row, ss.lse_log2[qs.stage], &ss.q_full[qs.stage],
                         &ss.q_empty[qs.stage], qs, row0, head, work.batch, issuer);
    load_query_tile<Cfg>(tm_do, ss.dout[ds.stage], p.row_d + first_row, ss.row_d[ds.stage], &ss.do_full[ds.stage],
                         &ss.do_empty[ds.stage], ds, row0, head, work.batch, issuer);
  }
}

}  // namespace warpattn::detail
