// The caching allocator's two kinds of block: activations in size classes (a freed block
// is reused for the same class), weights (`exact`) carved from shared slabs at 512-byte
// granularity, the slab returned to the driver when its last block dies; and what a CUDA
// graph being recorded keeps.
#include <cstdint>
#include <memory>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "backends/cuda/allocator.h"
#include "backends/cuda/device.h"

namespace kiln {
namespace {

using cuda::CachingAllocator;

uintptr_t addr(const std::shared_ptr<void>& p) { return reinterpret_cast<uintptr_t>(p.get()); }

TEST(CudaAllocator, ExactBlocksShareASlabBackToBackAndFreeItWithTheLastBlock) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto a = CachingAllocator::create(0);
  // An expert's code matrices (gpt-oss: 8,478,720 and 4,239,360 bytes) and a scale row
  // block that is not a multiple of 512.
  std::vector<std::shared_ptr<void>> blocks;
  for (size_t bytes : {size_t(8478720), size_t(4239360), size_t(529921), size_t(8478720)})
    blocks.push_back(a->allocate(bytes, true));
  EXPECT_EQ(a->bytes_in_use(), CachingAllocator::kSlabBytes);  // one slab holds them all
  EXPECT_EQ(addr(blocks[1]), addr(blocks[0]) + 8478720);
  EXPECT_EQ(addr(blocks[2]), addr(blocks[1]) + 4239360);
  EXPECT_EQ(addr(blocks[3]), addr(blocks[2]) + 530432);  // 529,921 rounded up to 512 bytes
  for (const auto& b : blocks) EXPECT_EQ(addr(b) % 512, 0u);
  // The blocks are usable device memory, distinct from each other.
  for (size_t i = 0; i < blocks.size(); ++i)
    ASSERT_EQ(cudaMemset(blocks[i].get(), int(i + 1), 512), cudaSuccess);
  unsigned char first[4] = {};
  for (size_t i = 0; i < blocks.size(); ++i)
    ASSERT_EQ(cudaMemcpy(&first[i], blocks[i].get(), 1, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(first[0], 1);
  EXPECT_EQ(first[3], 4);
  blocks.resize(1);
  EXPECT_EQ(a->bytes_in_use(), CachingAllocator::kSlabBytes);  // block 0 keeps the slab
  blocks.clear();
  EXPECT_EQ(a->bytes_in_use(), 0u);
  EXPECT_EQ(a->bytes_cached(), 0u);  // a slab goes back to the driver, not to the cache
}

TEST(CudaAllocator, ExactBlocksOverflowIntoANewSlabAndBigOnesStandAlone) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto a = CachingAllocator::create(0);
  const size_t piece = CachingAllocator::kSlabBytes / 16;  // the largest slab block
  std::vector<std::shared_ptr<void>> blocks;
  for (int i = 0; i < 17; ++i) blocks.push_back(a->allocate(piece, true));
  EXPECT_EQ(a->bytes_in_use(), 2 * CachingAllocator::kSlabBytes);
  // A block over kSlabBytes / 16 is its own allocation of exactly its 512-byte size.
  auto big = a->allocate(piece + 1, true);
  EXPECT_EQ(a->bytes_in_use(), 2 * CachingAllocator::kSlabBytes + piece + 512);
  big.reset();
  blocks.clear();
  EXPECT_EQ(a->bytes_in_use(), 0u);
}

TEST(CudaAllocator, ActivationBlocksAreReusedWithinTheirSizeClass) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto a = CachingAllocator::create(0);
  void* first = nullptr;
  {
    auto b = a->allocate(size_t(3) << 20);
    first = b.get();
  }
  EXPECT_GT(a->bytes_cached(), 0u);
  auto again = a->allocate((size_t(3) << 20) - 4096);  // same class: the cached block
  EXPECT_EQ(again.get(), first);
}

// Once its owner and every block it handed out are gone, the allocator itself goes, and
// its cache and slabs back to the driver (a slab's deleter once held it: an allocator
// that had made a slab lived forever, cache included: gigabytes per CUDA backend made and
// dropped in one process, as `kiln bench op` does).
TEST(CudaAllocator, IsFreedWithItsLastBlockSlabsIncluded) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  size_t free_before = 0, free_after = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  std::weak_ptr<CachingAllocator> weak;
  std::shared_ptr<void> late;  // a slab block that outlives its allocator
  {
    auto a = CachingAllocator::create(0);
    weak = a;
    auto w = a->allocate(4096, true);                  // a slab
    late = a->allocate(8192, true);
    { auto cached = a->allocate(size_t(512) << 20); }  // 512 MiB into the cache
    EXPECT_GE(a->bytes_cached(), size_t(512) << 20);
  }
  EXPECT_TRUE(weak.expired()) << "the allocator outlived its owner and blocks";
  ASSERT_NE(late.get(), nullptr);
  ASSERT_EQ(cudaMemset(late.get(), 7, 8192), cudaSuccess);  // still device memory
  late.reset();
  ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  // Everything went back: the cache's 512 MiB and the slab (other processes aside).
  EXPECT_GE(free_after + (size_t(64) << 20), free_before);
}

// While a graph is recorded every block goes to the sink, and one the recorded work let go
// of is handed out again within the same recording (so the graph holds the step's peak);
// a block let go after the recording is not, and a handle that outlives its recording
// keeps its block after the sink is dropped.
TEST(CudaAllocator, ARecordingReusesWhatItsWorkLetGoOfAndNothingElse) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto a = CachingAllocator::create(0);
  std::vector<std::shared_ptr<void>> sink;
  std::shared_ptr<void> outlives;
  {
    a->record_into(&sink);
    auto first = a->allocate(1 << 20);
    const uintptr_t first_addr = addr(first);
    first.reset();  // the recorded work is done with it
    auto second = a->allocate(1 << 20);
    EXPECT_EQ(addr(second), first_addr) << "a block let go of within the recording is reused";
    auto third = a->allocate(1 << 20);
    EXPECT_NE(addr(third), first_addr);
    EXPECT_EQ(sink.size(), 2u);
    EXPECT_EQ(a->recorded_bytes(), sink.size() * (size_t(1) << 20)) << "the graph holds two blocks, not three";
    EXPECT_EQ(a->recorded_handouts(), 3 * (size_t(1) << 20));
    outlives = third;  // like a step's output, read after the recording
    second.reset();
    a->record_into(nullptr);
  }
  outlives.reset();
  // Outside any recording nothing the sink holds comes back.
  std::vector<std::shared_ptr<void>> later;
  for (int i = 0; i < 3; ++i) later.push_back(a->allocate(1 << 20));
  for (const auto& block : later)
    for (const auto& kept : sink) EXPECT_NE(addr(block), addr(kept)) << "a recorded block handed out again";
  // A later recording does not take the earlier one's blocks either.
  std::vector<std::shared_ptr<void>> sink2;
  a->record_into(&sink2);
  auto x = a->allocate(1 << 20);
  for (const auto& kept : sink) EXPECT_NE(addr(x), addr(kept));
  a->record_into(nullptr);
  // Dropping the sinks gives their blocks back to the cache, the outliving one included.
  const size_t in_use = a->bytes_in_use();
  sink.clear();
  EXPECT_EQ(a->bytes_in_use(), in_use - 2 * (size_t(1) << 20));
}

}  // namespace
}  // namespace kiln
