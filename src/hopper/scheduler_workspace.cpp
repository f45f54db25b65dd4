#include "hopper/scheduler_workspace.hpp"

#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "hopper/cuda_check.hpp"

namespace warpattn::detail {

namespace {

constexpr int kSlotInts = 2;           // [next tile, CTAs done]
constexpr int kSlotsPerChunk = 1024;   // 8 KB of device memory per chunk

// Where a launch's counter slot is kept: by device and stream, or by capture (never reused).
using SlotKey = std::tuple<int, int, unsigned long long, std::thread::id>;  // device, kind, stream id, thread

// The newest chunk of one device: its next unused slot and how many are left.
struct Chunk {
  int* next = nullptr;
  int left = 0;
};

struct Slots {
  std::mutex mutex;
  std::map<SlotKey, int*> by_key;
  std::vector<Chunk> chunks;  // by device ordinal
};

Slots& slots() {
  static Slots s;
  return s;
}

// A new chunk of zeroed slots on the current device, made out of any capture's sight: the
// allocation is no stream operation, and the zeroing runs on a private non-blocking stream that
// the host waits for (outside_capture_rules).
int* new_chunk() {
  constexpr size_t kBytes = kSlotsPerChunk * kSlotInts * sizeof(int);
  int* chunk = nullptr;
  const cudaError_t e = outside_capture_rules([&] {
    cudaStream_t zeroing = nullptr;
    cudaError_t r = cudaMalloc(&chunk, kBytes);
    if (r == cudaSuccess) r = cudaStreamCreateWithFlags(&zeroing, cudaStreamNonBlocking);
    if (r == cudaSuccess) r = cudaMemsetAsync(chunk, 0, kBytes, zeroing);
    if (r == cudaSuccess) r = cudaStreamSynchronize(zeroing);
    if (zeroing != nullptr) cudaStreamDestroy(zeroing);
    return r;
  });
  check_cuda(e, "scheduler counter slots: allocating and zeroing a chunk");
  return chunk;
}

int* counter_slot(cudaStream_t stream) {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
  Slots& s = slots();
  std::lock_guard<std::mutex> lock(s.mutex);
  std::optional<SlotKey> key;
  if (capture == cudaStreamCaptureStatusNone) {
    if (stream == cudaStreamPerThread) {
      key = SlotKey{device, 1, 0, std::this_thread::get_id()};
    } else {
      unsigned long long id = 0;
      check_cuda(cudaStreamGetId(stream, &id), "cudaStreamGetId");
      key = SlotKey{device, 0, id, std::thread::id()};
    }
    if (auto it = s.by_key.find(*key); it != s.by_key.end()) return it->second;
  }
  if (device >= static_cast<int>(s.chunks.size())) s.chunks.resize(device + 1);
  Chunk& chunk = s.chunks[device];
  if (chunk.left == 0) chunk = {new_chunk(), kSlotsPerChunk};
  int* slot = chunk.next;
  chunk.next += kSlotInts;
  --chunk.left;
  if (key) s.by_key[*key] = slot;
  return slot;
}

}  // namespace

SchedulerWorkspace::SchedulerWorkspace(cudaStream_t stream, size_t partial_bytes) : counter_(counter_slot(stream)) {
  if (partial_bytes > 0) partials_.emplace(partial_bytes, stream, "split-tail partial states");
}

}  // namespace warpattn::detail
