#include "backends/cuda/allocator.h"

#include <algorithm>

#include "backends/cuda/cuda_check.h"

namespace kiln::cuda {

size_t CachingAllocator::size_class(size_t bytes) {
  // 512-byte granularity up to 1 MiB, then powers of two split in 4: at most
  // 25% slack for activations, few distinct classes. Blocks over 256 MiB (the KV
  // cache, sized to what the device has free) round to 2 MiB only: 25% slack
  // there would ask for memory that is not free.
  if (bytes <= (1u << 20)) return (bytes + 511) / 512 * 512;
  if (bytes > (size_t(256) << 20)) return (bytes + (size_t(2) << 20) - 1) / (size_t(2) << 20) * (size_t(2) << 20);
  size_t p = 1u << 20;
  while (p < bytes) p <<= 1;
  const size_t quarter = p / 8;  // classes p/2 + k * p/8
  size_t c = p / 2;
  while (c < bytes) c += quarter;
  return c;
}

void* CachingAllocator::device_malloc(size_t bytes) {
  KILN_CUDA_CHECK(cudaSetDevice(device_));
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    release_cached();  // retry once with the cache emptied
    e = cudaMalloc(&p, bytes);
  }
  KILN_CHECK(e == cudaSuccess) << "cudaMalloc of " << bytes << " bytes: " << cudaGetErrorString(e) << " (in use "
                               << bytes_in_use() << " bytes)";
  return p;
}

std::shared_ptr<void> CachingAllocator::slab_block(size_t bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  std::shared_ptr<void> slab = slab_.lock();
  if (slab == nullptr || slab_used_ + bytes > kSlabBytes) {
    lock.unlock();  // device_malloc may empty the cache, which locks
    // The deleter holds the allocator weakly: slab_ (a weak_ptr) keeps the slab's control
    // block, and with it this deleter, alive as long as the allocator; a strong reference
    // here would keep the allocator, and every block in its cache, alive forever.
    std::weak_ptr<CachingAllocator> owner = weak_from_this();
    slab = std::shared_ptr<void>(device_malloc(kSlabBytes), [owner](void* q) {
      cudaFree(q);
      if (std::shared_ptr<CachingAllocator> self = owner.lock()) {
        std::lock_guard<std::mutex> l(self->mu_);
        self->in_use_ -= kSlabBytes;
      }
    });
    lock.lock();
    slab_ = slab;
    slab_used_ = 0;
    in_use_ += kSlabBytes;
    peak_ = std::max(peak_, in_use_);
  }
  // The block shares the slab's ownership (the aliasing constructor).
  std::shared_ptr<void> block(slab, static_cast<char*>(slab.get()) + slab_used_);
  slab_used_ += bytes;
  if (record_ != nullptr) {
    record_->push_back(block);
    recorded_bytes_ += bytes;
  }
  return block;
}

std::shared_ptr<void> CachingAllocator::allocate(size_t bytes, bool exact) {
  const size_t exact_bytes = (std::max<size_t>(bytes, 1) + 511) / 512 * 512;
  if (exact && exact_bytes <= kSlabBytes / 16) return slab_block(exact_bytes);
  const size_t cls = exact ? exact_bytes : size_class(bytes == 0 ? 1 : bytes);
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (record_ != nullptr) {  // a block the recording's earlier work let go of
      auto again = recording_free_.find(cls);
      if (again != recording_free_.end() && !again->second.empty()) {
        std::shared_ptr<void> block = std::move(again->second.back());
        again->second.pop_back();
        return recording_handle(std::move(block), cls);
      }
    }
    auto it = free_.find(cls);
    if (it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      cached_ -= cls;
    }
    in_use_ += cls;
    peak_ = std::max(peak_, in_use_);
  }
  if (p == nullptr) p = device_malloc(cls);
  std::shared_ptr<CachingAllocator> self = shared_from_this();
  std::shared_ptr<void> block(p, [self, cls](void* q) { self->give_back(q, cls); });
  std::lock_guard<std::mutex> lock(mu_);
  if (record_ == nullptr) return block;
  record_->push_back(block);
  recorded_bytes_ += cls;
  return recording_handle(std::move(block), cls);
}

std::shared_ptr<void> CachingAllocator::recording_handle(std::shared_ptr<void> block, size_t cls) {
  recorded_handouts_ += cls;
  void* p = block.get();
  std::shared_ptr<CachingAllocator> self = shared_from_this();
  const uint64_t recording = recording_;
  // The handle holds the block too (the sink may be dropped first); when it dies within
  // its recording, the block goes to that recording's free list.
  return std::shared_ptr<void>(p, [self, cls, recording, block = std::move(block)](void*) {
    std::lock_guard<std::mutex> lock(self->mu_);
    if (self->record_ != nullptr && self->recording_ == recording) self->recording_free_[cls].push_back(block);
    // The deleter (and its copy of the block) is destroyed after this returns, outside
    // the lock: the last reference's give_back locks mu_ itself.
  });
}

void CachingAllocator::record_into(std::vector<std::shared_ptr<void>>* sink) {
  std::map<size_t, std::vector<std::shared_ptr<void>>> let_go;
  {
    std::lock_guard<std::mutex> lock(mu_);
    record_ = sink;
    ++recording_;
    if (sink != nullptr) recorded_bytes_ = recorded_handouts_ = 0;
    let_go.swap(recording_free_);
  }
  // let_go's blocks are in the ended recording's sink as well: dropped here, outside the
  // lock, in case the sink is gone.
}

void CachingAllocator::give_back(void* p, size_t cls) {
  std::lock_guard<std::mutex> lock(mu_);
  free_[cls].push_back(p);
  in_use_ -= cls;
  cached_ += cls;
}

size_t CachingAllocator::bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}

size_t CachingAllocator::peak_bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_ = in_use_;
}

size_t CachingAllocator::bytes_cached() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}

void CachingAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [cls, blocks] : free_)
    for (void* p : blocks) cudaFree(p);
  free_.clear();
  cached_ = 0;
}

CachingAllocator::~CachingAllocator() { release_cached(); }

}  // namespace kiln::cuda
