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
  std::map<SlotKey, int*> merge_arrays;  // (merge_counters: one array a stream, made when first asked for)
};

Slots& slots() {
  static Slots s;
  return s;
}

// `bytes` of zeroed device memory on the current device, made out of any capture's sight: the
// allocation is no stream operation, and the zeroing runs on a private non-blocking stream that
// the host waits for (outside_capture_rules).
int* new_zeroed(size_t bytes, const char* what) {
  int* memory = nullptr;
  const cudaError_t e = outside_capture_rules([&] {
    cudaStream_t zeroing = nullptr;
    cudaError_t r = cudaMalloc(&memory, bytes);
    if (r == cudaSuccess) r = cudaStreamCreateWithFlags(&zeroing, cudaStreamNonBlocking);
    if (r == cudaSuccess) r = cudaMemsetAsync(memory, 0, bytes, zeroing);
    if (r == cudaSuccess) r = cudaStreamSynchronize(zeroing);
    if (zeroing != nullptr) cudaStreamDestroy(zeroing);
    return r;
  });
  check_cuda(e, what);
  return memory;
}

// The key of an eager launch's slot on `stream` of `device`; none for a captured one.
std::optional<SlotKey> slot_key(cudaStream_t stream, int device) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone) return std::nullopt;
  if (stream == cudaStreamPerThread) return SlotKey{device, 1, 0, std::this_thread::get_id()};
  unsigned long long id = 0;
  check_cuda(cudaStreamGetId(stream, &id), "cudaStreamGetId");
  return SlotKey{device, 0, id, std::thread::id()};
}

int* counter_slot(cudaStream_t stream) {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  const std::optional<SlotKey> key = slot_key(stream, device);
  Slots& s = slots();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (key)
    if (auto it = s.by_key.find(*key); it != s.by_key.end()) return it->second;
  if (device >= static_cast<int>(s.chunks.size())) s.chunks.resize(device + 1);
  Chunk& chunk = s.chunks[device];
  if (chunk.left == 0)
    chunk = {new_zeroed(kSlotsPerChunk * kSlotInts * sizeof(int), "scheduler counter slots: allocating and zeroing a chunk"),
             kSlotsPerChunk};
  int* slot = chunk.next;
  chunk.next += kSlotInts;
  --chunk.left;
  if (key) s.by_key[*key] = slot;
  return slot;
}

int* merge_counter_array(cudaStream_t stream, int counters) {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  const std::optional<SlotKey> key = slot_key(stream, device);
  Slots& s = slots();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (key)
    if (auto it = s.merge_arrays.find(*key); it != s.merge_arrays.end()) return it->second;
  int* array = new_zeroed(counters * sizeof(int), "merge counters: allocating and zeroing a stream's array");
  if (key) s.merge_arrays[*key] = array;
  return array;
}

}  // namespace

int* SchedulerWorkspace::merge_counters(cudaStream_t stream, int counters) {
  if (!merge_) merge_ = merge_counter_array(stream, counters);
  return merge_;
}

SchedulerWorkspace::SchedulerWorkspace(cudaStream_t stream, size_t partial_bytes) : counter_(counter_slot(stream)) {
  if (partial_bytes > 0) partials_.emplace(partial_bytes, stream, "split-tail partial states");
}

}  // namespace warpattn::detail
