// The stream-ordered caching CUDA allocator against the races it exists to
// prevent. Tagged gpu: runs on the GPU machine.
//
// Each race test holds one stream back with a host function (so work queued
// on it is certain to run late), queues a read of a block behind the hold,
// frees the block, and has another stream allocate the same size and write
// at once. The old allocator kept one free list per size, whatever the
// stream: the second allocation got the very block still waiting to be read,
// the write ran while the reader was held back, and the reader saw the new
// values. These tests fail against it; with streams tracked, the block is
// not handed to the other stream until the reader's stream is past the read.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "core/ops.h"
#include "core/stream.h"
#include "core/tensor.h"

namespace ze {
namespace {

constexpr int64_t kCount = 1 << 16;

// Holds a stream back until Release() (or destruction), from a thread that
// lets go after `delay` on its own so a failing test cannot hang.
class StreamHold {
 public:
  StreamHold(const Stream& stream, std::chrono::milliseconds delay) {
    EXPECT_EQ(cudaLaunchHostFunc(
                  static_cast<cudaStream_t>(stream.native()),
                  [](void* flag) {
                    while (!static_cast<std::atomic<bool>*>(flag)->load()) {
                      std::this_thread::sleep_for(std::chrono::milliseconds(1));
                    }
                  },
                  &released_),
              cudaSuccess);
    releaser_ = std::thread([this, delay] {
      std::this_thread::sleep_for(delay);
      released_ = true;
    });
  }
  ~StreamHold() {
    released_ = true;
    releaser_.join();
  }

 private:
  std::atomic<bool> released_{false};
  std::thread releaser_;
};

std::vector<float> Values(const Tensor& tensor, const Stream& stream) {
  absl::StatusOr<std::vector<float>> values = ToHostFloats(tensor, stream);
  EXPECT_TRUE(values.ok()) << values.status();
  return values.ok() ? *values : std::vector<float>();
}

TEST(CudaCachingAllocatorTest, SameStreamReusesAtOnce) {
  ASSERT_GT(CudaDeviceCount(), 0);
  CudaCachingAllocator allocator("same_stream", 0);
  Stream stream = *Stream::Create(Device::Cuda(0));
  StreamGuard guard(stream);
  void* first = *allocator.Allocate(4096);
  allocator.Deallocate(first, 4096);
  // The stream orders its own work: no event, no wait, the same block.
  void* second = *allocator.Allocate(4096);
  EXPECT_EQ(second, first);
  allocator.Deallocate(second, 4096);
  EXPECT_EQ(allocator.stats().bytes_reserved, 4096);
}

// Allocate on A, read on A behind a hold, free, allocate on B, write.
TEST(CudaCachingAllocatorTest, FreedBlockIsNotHandedToAnotherStreamEarly) {
  ASSERT_GT(CudaDeviceCount(), 0);
  CudaCachingAllocator allocator("two_streams", 0);
  const Device gpu = Device::Cuda(0);
  Stream a = *Stream::Create(gpu);
  Stream b = *Stream::Create(gpu);
  Tensor copy = *Tensor::Zeros({kCount}, DType::kF32, gpu, a);
  Tensor source;
  {
    StreamGuard guard(a);
    source = *Tensor::Empty({kCount}, DType::kF32, gpu, &allocator);
  }
  ASSERT_TRUE(Fill(source, 3.0f, a).ok());
  ASSERT_TRUE(a.Synchronize().ok());
  void* const old_block = source.data();
  {
    StreamHold hold(a, std::chrono::milliseconds(300));
    ASSERT_TRUE(Copy(source, copy, a).ok());  // waits behind the hold
    source = Tensor();                        // freed, the copy still queued
    Tensor reused;
    {
      StreamGuard guard(b);
      reused = *Tensor::Empty({kCount}, DType::kF32, gpu, &allocator);
    }
    EXPECT_NE(reused.data(), old_block) << "handed to b while a still reads";
    ASSERT_TRUE(Fill(reused, 7.0f, b).ok());
    ASSERT_TRUE(b.Synchronize().ok());  // b is not held: written by now
  }
  for (float value : Values(copy, a)) ASSERT_EQ(value, 3.0f);
}

// Allocate on A, read on B (recorded) behind a hold, free, allocate on A
// and write at once: A's own reuse must wait for B's event.
TEST(CudaCachingAllocatorTest, RecordedStreamDelaysReuseUntilItsEvent) {
  ASSERT_GT(CudaDeviceCount(), 0);
  CudaCachingAllocator allocator("recorded", 0);
  const Device gpu = Device::Cuda(0);
  Stream a = *Stream::Create(gpu);
  Stream b = *Stream::Create(gpu);
  Tensor copy = *Tensor::Zeros({kCount}, DType::kF32, gpu, b);
  StreamGuard guard(a);
  Tensor source = *Tensor::Empty({kCount}, DType::kF32, gpu, &allocator);
  ASSERT_TRUE(Fill(source, 3.0f, a).ok());
  ASSERT_TRUE(a.Synchronize().ok());
  ASSERT_TRUE(b.Synchronize().ok());
  void* const old_block = source.data();
  // Alive to the end, so that the only free block later is the old one.
  Tensor reused;
  {
    StreamHold hold(b, std::chrono::milliseconds(300));
    ASSERT_TRUE(Copy(source, copy, b).ok());  // waits behind the hold
    ASSERT_TRUE(source.RecordStream(b).ok());
    source = Tensor();
    reused = *Tensor::Empty({kCount}, DType::kF32, gpu, &allocator);
    EXPECT_NE(reused.data(), old_block) << "reused before b's event";
    ASSERT_TRUE(Fill(reused, 7.0f, a).ok());
    ASSERT_TRUE(a.Synchronize().ok());
  }
  for (float value : Values(copy, b)) ASSERT_EQ(value, 3.0f);
  // Once b is past its event, the block is a's again with no wait.
  ASSERT_TRUE(b.Synchronize().ok());
  Tensor later = *Tensor::Empty({kCount}, DType::kF32, gpu, &allocator);
  EXPECT_EQ(later.data(), old_block);
}

// A destroyed stream's blocks become anyone's once its work is done.
TEST(CudaCachingAllocatorTest, BlocksOfADestroyedStreamGoToOtherStreams) {
  ASSERT_GT(CudaDeviceCount(), 0);
  CudaCachingAllocator allocator("orphans", 0);
  const Device gpu = Device::Cuda(0);
  void* block = nullptr;
  {
    Stream short_lived = *Stream::Create(gpu);
    StreamGuard guard(short_lived);
    block = *allocator.Allocate(8192);
    allocator.Deallocate(block, 8192);
  }  // the guard's and the last copy of the stream go here
  Stream other = *Stream::Create(gpu);
  ASSERT_TRUE(other.Synchronize().ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  StreamGuard guard(other);
  void* reused = *allocator.Allocate(8192);
  EXPECT_EQ(reused, block);
  allocator.Deallocate(reused, 8192);
}

// Zeros on a stream reuses that stream's block and fills it there, with no
// host wait before or after: a held stream does not block the call.
TEST(CudaCachingAllocatorTest, ZerosOnAStreamFillsInStreamOrder) {
  ASSERT_GT(CudaDeviceCount(), 0);
  CudaCachingAllocator allocator("zeros", 0);
  const Device gpu = Device::Cuda(0);
  Stream stream = *Stream::Create(gpu);
  Tensor copy = *Tensor::Zeros({kCount}, DType::kF32, gpu, stream);
  Tensor source;
  {
    StreamGuard guard(stream);
    source = *Tensor::Empty({kCount}, DType::kF32, gpu, &allocator);
  }
  ASSERT_TRUE(Fill(source, 3.0f, stream).ok());
  void* const old_block = source.data();
  Tensor zeros;
  {
    StreamHold hold(stream, std::chrono::milliseconds(2000));
    ASSERT_TRUE(Copy(source, copy, stream).ok());
    source = Tensor();
    const auto started = std::chrono::steady_clock::now();
    zeros = *Tensor::Zeros({kCount}, DType::kF32, gpu, stream, &allocator);
    EXPECT_LT(std::chrono::steady_clock::now() - started,
              std::chrono::milliseconds(1000))
        << "Zeros waited for the held stream";
    EXPECT_EQ(zeros.data(), old_block);
  }
  for (float value : Values(copy, stream)) ASSERT_EQ(value, 3.0f);
  for (float value : Values(zeros, stream)) ASSERT_EQ(value, 0.0f);
}

// The CPU/GPU split's registration of the CPU optimizer's small arrays:
// neighbours from aligned_alloc share a page, and a second object may
// register a page the first holds. Neither may fail, nor leave an error for
// a later launch check to find; both unregister cleanly.
TEST(HostRegistrationTest, SpansSharingPagesRegisterOnce) {
  void* memory = std::aligned_alloc(64, 3 * 4096);
  ASSERT_NE(memory, nullptr);
  char* bytes = static_cast<char*>(memory);
  {
    absl::StatusOr<HostRegistration> first = HostRegistration::Create(
        {{bytes + 64, 1000}, {bytes + 1100, 200}, {bytes + 5000, 4000}});
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_GT(first->locked_bytes(), 0u);
    // Bytes `first` holds again: left to `first`, with no error left for
    // a later check. (Bytes on one of its pages that it does not hold do
    // register: run 63 measured that the runtime refuses only overlapping
    // byte ranges.)
    absl::StatusOr<HostRegistration> second =
        HostRegistration::Create({{bytes + 1000, 100}});
    ASSERT_TRUE(second.ok()) << second.status();
    EXPECT_EQ(second->locked_bytes(), 0u);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
  // A neighbour's buffer that starts on a registered range's last page and
  // runs past it is not inside any registration: device copies into it
  // work (they failed with cudaErrorInvalidValue when ranges were rounded
  // out to whole pages).
  {
    absl::StatusOr<HostRegistration> edge =
        HostRegistration::Create({{bytes + 64, 1000}});
    ASSERT_TRUE(edge.ok()) << edge.status();
    void* device = nullptr;
    ASSERT_EQ(cudaMalloc(&device, 4000), cudaSuccess);
    ASSERT_EQ(cudaMemset(device, 7, 4000), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(bytes + 2000, device, 4000, cudaMemcpyDefault),
              cudaSuccess);
    EXPECT_EQ(bytes[2000], 7);
    EXPECT_EQ(bytes[5999], 7);
    ASSERT_EQ(cudaFree(device), cudaSuccess);
  }
  // Unregistered: the same pages register again.
  absl::StatusOr<HostRegistration> again =
      HostRegistration::Create({{bytes, 3 * 4096}});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_GE(again->locked_bytes(), 3u * 4096);
  again = HostRegistration();
  std::free(memory);
}

}  // namespace
}  // namespace ze
