// Host side of one backward instantiation: the three launches.
#pragma once
#include <cuda_runtime.h>

#include <optional>
#include <string>

#include "api/problem.hpp"
#include "hopper/backward/backward_config.hpp"
#include "hopper/backward/backward_kernel.cuh"
#include "hopper/backward/dq_accum.cuh"
#include "hopper/backward/row_terms.cuh"
#include "hopper/backward/workspace.hpp"
#include "hopper/cuda_check.hpp"
#include "hopper/device_info.hpp"
#include "hopper/kv_tiles.hpp"
#include "hopper/log2e.hpp"
#include "hopper/launch.hpp"
#include "hopper/tensor_map.hpp"
#include "hopper/varlen/plan_varlen.hpp"
#include "common/stream_memory.hpp"

namespace warpattn::detail {

inline RowsView rows_view(const TensorView& t) {
  return {t.data, t.stride[0], t.stride[1], t.stride[2]};
}

// The parameters of a validated problem over `layout`'s workspace at `workspace`.
template <class Cfg>
BackwardParams backward_params(const BackwardProblem& pr, const BackwardTensors& t,
                               const BackwardWorkspaceLayout& layout, void* workspace) {
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  BackwardParams p;
  p.dout = rows_view(t.dout);
  p.out = rows_view(t.out);
  p.dq = rows_view(t.dq);
  p.dk = rows_view(t.dk);
  p.dv = rows_view(t.dv);
  p.lse = static_cast<const float*>(t.lse.data);
  p.lse_stride_batch = t.lse.stride[0];
  p.lse_stride_head = t.lse.stride[1];
  p.lse_stride_row = t.lse.stride[2];
  p.dq_accum = reinterpret_cast<float*>(ws + layout.dq_accum);
  p.row_d = reinterpret_cast<float*>(ws + layout.row_d);
  p.lse_log2 = reinterpret_cast<float*>(ws + layout.lse_log2);
  p.turns = pr.deterministic ? reinterpret_cast<int*>(ws + layout.turns) : nullptr;
  if (pr.sinks != nullptr) {
    p.sinks = pr.sinks, p.sinks_stride = pr.sinks_stride;
    p.sink_sums = reinterpret_cast<float*>(ws + layout.sink_sums);
    p.dsinks = pr.dsinks, p.dsinks_stride = pr.dsinks_stride;
  }
  p.batch = static_cast<int>(pr.batch);
  p.heads_q = static_cast<int>(pr.heads_q);
  p.heads_kv = static_cast<int>(pr.heads_kv);
  p.seqlen_q = static_cast<int>(pr.seqlen_q);
  p.seqlen_k = static_cast<int>(pr.seqlen_k);
  p.head_dim = static_cast<int>(pr.head_dim);
  p.head_dim_v = static_cast<int>(pr.value_head_dim());
  p.rows = static_cast<int>(layout.rows);
  p.kv_group = static_cast<int>(pr.heads_q / pr.heads_kv);
  p.softmax_scale = pr.softmax_scale;
  p.scale_log2 = static_cast<float>(pr.softmax_scale * kLog2e);
  p.band = pr.band;
  p.probability_log2 = p.scale_log2;
  if (pr.softcap > 0) {
    p.softcap_ex2 = static_cast<float>(2 * kLog2e * pr.softmax_scale / pr.softcap);
    p.softcap_inv_log2 = static_cast<float>(1 / (pr.softcap * kLog2e));
    p.probability_log2 = static_cast<float>(pr.softcap * kLog2e);
  }
  return p;
}

// With sinks, their gradient from the row kernels' `blocks` parts per head (or zeros: 0).
template <class Cfg>
void reduce_sink_sums(const BackwardParams& p, int64_t blocks, cudaStream_t stream) {
  if (p.sinks == nullptr || p.heads_q == 0) return;
  reduce_sink_sums_kernel<typename Cfg::Element, Cfg::kHeadDim><<<p.heads_q, 256, 0, stream>>>(p, blocks);
  check_cuda(cudaGetLastError(), "reduce_sink_sums_kernel: launch failed");
}

// The three launches: the row terms over row_grid, the main kernel over main_grid (none when it
// has no key block), the dQ conversion over the accumulator's first `covered_rows` rows of each
// (sequence, head) (a multiple of kDqConversionRows) in query blocks (64 rows; transposed dQ:
// kBlockM).
template <class Cfg>
void launch_backward_kernels(const BackwardParams& p, const BackwardTensors& t, dim3 row_grid, dim3 main_grid,
                             int64_t covered_rows, cudaStream_t stream) {
  using Element = typename Cfg::Element;
  backward_row_terms_kernel<Element, Cfg::kHeadDim><<<row_grid, 256, 0, stream>>>(p);
  check_cuda(cudaGetLastError(), "backward_row_terms_kernel: launch failed");
  if (main_grid.x > 0) {
    const CUtensorMap tm_q = make_panel_tensor_map(t.q, "q", Cfg::kBlockM, Cfg::kPanels, 128);
    const CUtensorMap tm_do = make_panel_tensor_map(t.dout, "dout", Cfg::kBlockM, Cfg::kPanels, 128);
    const CUtensorMap tm_k = make_panel_tensor_map(t.k, "k", Cfg::kBlockN, Cfg::kPanels, 128);
    const CUtensorMap tm_v = make_panel_tensor_map(t.v, "v", Cfg::kBlockN, Cfg::kPanels, 128);
    auto kernel = attention_backward_kernel<Cfg>;
    constexpr int kSmem = sizeof(BackwardSharedStorage<Cfg>);
    static_assert(kSmem <= 227 * 1024, "more shared memory than a CTA may have on sm_90");
    allow_shared_memory<attention_backward_kernel<Cfg>>(kSmem, "attention_backward_kernel: setting its shared-memory size");
    kernel<<<main_grid, Cfg::kThreads, kSmem, stream>>>(tm_q, tm_k, tm_v, tm_do, p);
    check_cuda(cudaGetLastError(), "attention_backward_kernel: launch failed");
  }
  constexpr int kRows = Cfg::kDqConversionRows;  // rows is a multiple of them
  const dim3 grid(static_cast<unsigned>(covered_rows / kRows), row_grid.y, row_grid.z);
  convert_dq_kernel<Element, Cfg::kHeadDim, kRows, Cfg::kRowGranule, typename Cfg::DqPiece>
      <<<grid, kConvertDqThreads, 0, stream>>>(p);
  check_cuda(cudaGetLastError(), "convert_dq_kernel: launch failed");
  reduce_sink_sums<Cfg>(p, static_cast<int64_t>(row_grid.x) * row_grid.z, stream);
}

template <class Cfg>
void run_backward(const BackwardProblem& pr, const BackwardTensors& t, void* workspace, cudaStream_t stream) {
  const BackwardWorkspaceLayout layout(pr.batch, pr.heads_q, pr.seqlen_q, pr.backward_kernel_dim(), pr.deterministic,
                                       pr.sinks != nullptr);
  BackwardParams p = backward_params<Cfg>(pr, t, layout, workspace);
  if (pr.seqlen_q == 0) {  // no query row: no gradient reaches K or V (and Q has no map), nor sinks
    zero_rows(t.dk, stream);
    zero_rows(t.dv, stream);
    reduce_sink_sums<Cfg>(p, 0, stream);
    return;
  }
  if constexpr (Cfg::kLongestFirst)
    p.longest_first_groups = longest_first_groups(p.heads_kv * p.batch, p.kv_group, p.seqlen_q, Cfg::kHeadDim,
                                                  int64_t{WARPATTN_TUNE_BWD_LONGEST_FIRST_MB} << 20);
  // The rows the main kernel's query blocks cover: its row terms and its dQ accumulator (zeroed),
  // then converted. The workspace's rows per (batch, head) are a multiple of the granule (320 at
  // d = 128, for the 64-row blocks and the 80-row ones), which at N = 1024 pads 25%: neither
  // zeroed nor read (run 240: the row terms 108 and the conversion 88 us there, 97 and 76 at 4K).
  const int64_t covered = static_cast<int64_t>(ceil_div(p.seqlen_q, Cfg::kBlockM)) * Cfg::kBlockM;
  const dim3 row_grid(static_cast<unsigned>((covered + 63) / 64), p.heads_q, p.batch);
  // kColumnHalves CTAs per key block (two at d = 512, backward_kernel.cuh's key_block_work)
  dim3 main_grid(ceil_div(p.seqlen_k, Cfg::kBlockN) * Cfg::kColumnHalves, p.heads_kv, p.batch);
  std::optional<StreamMemory> tail_memory;  // the tail split's partials and counters, if it cuts
  if constexpr (Cfg::kTailSplit) {
    const int64_t tiles = int64_t{main_grid.x} * main_grid.y * main_grid.z;
    const TailSplit cut =
        backward_tail_split(tiles, p.kv_group * ceil_div(p.seqlen_q, Cfg::kBlockM), multiprocessor_count());
    if (cut.split_tiles > 0) {
      const int64_t counter_bytes = (int64_t{cut.split_tiles} * 2 * 4 + 255) / 256 * 256;
      const int64_t slot_bytes = kTailSlotFloats<Cfg::kAccumulatorFloats> * 4;
      tail_memory.emplace(counter_bytes + int64_t{cut.split_tiles} * (cut.parts - 1) * slot_bytes, stream,
                          "backward tail split");
      p.tail = cut;
      p.tail_tiles = static_cast<int>(tiles);
      p.tail_counters = static_cast<int*>(tail_memory->get());
      p.tail_partials = reinterpret_cast<float*>(static_cast<uint8_t*>(tail_memory->get()) + counter_bytes);
      main_grid = dim3(static_cast<unsigned>(cut.ctas(static_cast<int>(tiles))));
    }
  }
  launch_backward_kernels<Cfg>(p, t, row_grid, main_grid, covered, stream);
}

// A packed batch: t's tensors as (1, total, heads, head_dim) views (lse (1, heads, total_q)),
// pr.batch sequences, pr.seqlen_q/k the packed lengths (both >= 1). The workspace holds
// varlen_padded_rows rows per head (backward_workspace_bytes_sm90 with pr.varlen); the plan of
// key-block tiles is taken from warpattn's stream-ordered pool (a few bytes per tile).
template <class Cfg>
void run_backward_varlen(const BackwardProblem& pr, const BackwardTensors& t, const VarlenSequences& seqs,
                         void* workspace, cudaStream_t stream) {
  const BackwardWorkspaceLayout layout(1, pr.heads_q, varlen_padded_rows(pr.seqlen_q, pr.batch, Cfg::kRowGranule),
                                       pr.backward_kernel_dim(), pr.deterministic, pr.sinks != nullptr);
  BackwardParams p = backward_params<Cfg>(pr, t, layout, workspace);
  if (pr.seqlen_q == 0) {  // no query row: no gradient reaches K or V (and Q has no map), nor sinks
    zero_rows(t.dk, stream);
    zero_rows(t.dv, stream);
    reduce_sink_sums<Cfg>(p, 0, stream);
    return;
  }
  p.cu_seqlens_q = seqs.cu_seqlens_q;
  VarlenGeometry g = varlen_geometry(Cfg::kBlockM, Cfg::kBlockN, p.heads_q, p.kv_group, Cfg::kCausal);
  if constexpr (Cfg::kCausal) g.band = p.band;
  g.key_blocks = true;
  g.reverse_key_blocks = Cfg::kCausal && Cfg::kDeterministic;
  // Validation bounds the table below 2^31 entries (validate_backward_varlen).
  const long long max_tiles = max_varlen_tiles(pr.seqlen_k, pr.batch, Cfg::kBlockN, pr.heads_kv);
  StreamMemory plan_memory(varlen_plan_bytes(p.batch, max_tiles), stream, "varlen plan");
  const VarlenPlan plan = plan_varlen_tiles(seqs, g, max_tiles, plan_memory.get(), stream);
  p.varlen_tiles = plan.tiles;
  p.varlen_tile_count = plan.tile_count;
  const dim3 row_grid(static_cast<unsigned>(layout.rows / 64), p.heads_q, 1);
  // No key at all: no key block to run (and K has no map); dQ comes out zero. kColumnHalves CTAs
  // per tile (validation bounds the tiles at d = 512 to half of what it lets the others have).
  const unsigned main_blocks = pr.seqlen_k > 0 ? static_cast<unsigned>(max_tiles * Cfg::kColumnHalves) : 0;
  launch_backward_kernels<Cfg>(p, t, row_grid, dim3(main_blocks), layout.rows, stream);
}

// Declared here, defined in backward_<dtype>_d<dim>.cu (causal and deterministic chosen inside);
// seqs: a packed batch's offsets, or null.
template <class Element, int kHeadDim>
void run_backward_head_dim(const BackwardProblem& p, const BackwardTensors& t, const VarlenSequences* seqs,
                           void* workspace, cudaStream_t stream);

// The dense or the packed run of one configuration.
template <class Cfg>
void run_backward_any(const BackwardProblem& p, const BackwardTensors& t, const VarlenSequences* seqs, void* workspace,
                      cudaStream_t stream) {
  if (seqs != nullptr)
    run_backward_varlen<Cfg>(p, t, *seqs, workspace, stream);
  else
    run_backward<Cfg>(p, t, workspace, stream);
}

}  // namespace warpattn::detail

#define WARPATTN_BACKWARD_INSTANCE(Element, kHeadDim)                                                             \
  namespace warpattn::detail {                                                                                    \
  template <>                                                                                                     \
  void run_backward_head_dim<Element, kHeadDim>(const BackwardProblem& p, const BackwardTensors& t,                \
                                                const VarlenSequences* seqs, void* workspace, cudaStream_t stream) { \
    if (p.banded) { /* causal or a sliding window: the banded kernels */                                          \
      if (p.deterministic)                                                                                        \
        run_backward_any<BackwardConfig<Element, kHeadDim, true, true>>(p, t, seqs, workspace, stream);           \
      else                                                                                                        \
        run_backward_any<BackwardConfig<Element, kHeadDim, true, false>>(p, t, seqs, workspace, stream);          \
    } else {                                                                                                      \
      if (p.deterministic)                                                                                        \
        run_backward_any<BackwardConfig<Element, kHeadDim, false, true>>(p, t, seqs, workspace, stream);          \
      else                                                                                                        \
        run_backward_any<BackwardConfig<Element, kHeadDim, false, false>>(p, t, seqs, workspace, stream);         \
    }                                                                                                             \
  }                                                                                                               \
  }
