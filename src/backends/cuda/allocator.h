// A caching device allocator: cudaMalloc only (no managed memory), freed blocks
// kept in size classes for reuse, so a steady decode loop allocates nothing.
// Blocks are handed out as shared_ptr whose deleter returns them to the cache;
// the cache lives as long as any block does. Reuse is safe because kiln issues
// all work of a backend on one stream: a block freed by the host is reused only
// by work queued after the work that used it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace kiln::cuda {

class CachingAllocator : public std::enable_shared_from_this<CachingAllocator> {
 public:
  static std::shared_ptr<CachingAllocator> create(int device) {
    return std::shared_ptr<CachingAllocator>(new CachingAllocator(device));
  }
  ~CachingAllocator();

  // A device block of at least `bytes`, rounded up to its size class. `exact`: for
  // weights (allocated once and kept), 512-byte granularity carved from slabs of
  // kSlabBytes (blocks up to kSlabBytes / 16; bigger ones are their own cudaMalloc).
  // A size class's up to 25% slack, or cudaMalloc's own 2 MiB granularity (a 4.04 MiB
  // expert matrix takes 6 MiB), on every expert matrix of a model is memory it does not
  // have: gpt-oss-120b's 9,216 packed experts took 32% more than their bytes. A slab is
  // returned to the driver when its last block dies.
  static constexpr size_t kSlabBytes = size_t(256) << 20;
  std::shared_ptr<void> allocate(size_t bytes, bool exact = false);
  size_t bytes_in_use() const;
  size_t bytes_cached() const;
  // The most bytes_in_use since the last reset.
  size_t peak_bytes_in_use() const;
  void reset_peak();
  // Returns every cached (free) block to the driver.
  void release_cached();
  // While set, every block handed out is also appended to *sink (a CUDA graph
  // being recorded keeps the blocks its kernels use); nullptr stops recording.
  // recorded_bytes: the bytes of the blocks appended since the last non-null sink.
  // Within a recording a block the recorded work has let go of (the handle allocate
  // returned died) is handed out again to later work of the same recording instead of a
  // new one: the graph replays that work in the same order, so the sink holds the step's
  // peak, not the sum of its allocations. A handle that outlives the recording keeps its
  // block as before.
  void record_into(std::vector<std::shared_ptr<void>>* sink);
  size_t recorded_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return recorded_bytes_;
  }
  // The bytes handed out since the last non-null sink, reused blocks counted each time
  // (what the sink would hold without reuse).
  size_t recorded_handouts() const {
    std::lock_guard<std::mutex> lock(mu_);
    return recorded_handouts_;
  }

 private:
  explicit CachingAllocator(int device) : device_(device) {}
  static size_t size_class(size_t bytes);
  void give_back(void* p, size_t bytes);
  // cudaMalloc, after emptying the cache once if the device is full.
  void* device_malloc(size_t bytes);
  std::shared_ptr<void> slab_block(size_t bytes);
  // The handle of a block handed out while recording (see record_into); mu_ held.
  std::shared_ptr<void> recording_handle(std::shared_ptr<void> block, size_t cls);

  int device_;
  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;  // size class -> free blocks
  size_t in_use_ = 0, cached_ = 0, peak_ = 0;
  std::vector<std::shared_ptr<void>>* record_ = nullptr;
  size_t recorded_bytes_ = 0, recorded_handouts_ = 0;
  uint64_t recording_ = 0;  // counts record_into calls: which recording a handle belongs to
  std::map<size_t, std::vector<std::shared_ptr<void>>> recording_free_;  // size class -> blocks let go
  // The slab exact blocks are carved from (bump allocation; its blocks keep it alive).
  std::weak_ptr<void> slab_;
  size_t slab_used_ = 0;
};

}  // namespace kiln::cuda
