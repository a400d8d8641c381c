#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "core/allocator.h"
#include "core/logging.h"
#include "core/ops.h"
#include "core/status.h"
#include "core/stream.h"
#include "core/tensor.h"

namespace ze {
namespace {

absl::Status FailWhenNegative(int value) {
  if (value < 0) return absl::InvalidArgumentError("negative");
  return absl::OkStatus();
}

absl::StatusOr<int> Doubled(int value) {
  ZE_RETURN_IF_ERROR(FailWhenNegative(value));
  return value * 2;
}

absl::StatusOr<int> Quadrupled(int value) {
  ZE_ASSIGN_OR_RETURN(int doubled, Doubled(value));
  ZE_ASSIGN_OR_RETURN(doubled, Doubled(doubled));
  return doubled;
}

TEST(StatusTest, MacrosPropagate) {
  EXPECT_EQ(*Quadrupled(3), 12);
  absl::StatusOr<int> failed = Quadrupled(-1);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Annotate(failed.status(), "layer 3").message(),
            "layer 3: negative");
}

TEST(LoggingTest, RankPrefixAndRank0Only) {
  SetMinLogLevel(LogLevel::kInfo);
  SetLogRank(1, 4);
  testing::internal::CaptureStderr();
  ZE_LOG(INFO) << "hello " << 42;
  ZE_LOG_RANK0(INFO) << "rank zero only";
  ZE_LOG(DEBUG) << "hidden";
  const std::string output = testing::internal::GetCapturedStderr();
  EXPECT_NE(output.find("[rank 1] I "), std::string::npos) << output;
  EXPECT_NE(output.find("hello 42"), std::string::npos);
  EXPECT_EQ(output.find("rank zero only"), std::string::npos);
  EXPECT_EQ(output.find("hidden"), std::string::npos);
  SetLogRank(0, 4);
  testing::internal::CaptureStderr();
  ZE_LOG_RANK0(WARNING) << "rank zero only";
  EXPECT_NE(testing::internal::GetCapturedStderr().find("W "),
            std::string::npos);
  SetLogRank(-1, 0);
}

TEST(AllocatorTest, CountsBytesAndPeak) {
  HostAllocator allocator("test");
  void* a = *allocator.Allocate(1000);
  void* b = *allocator.Allocate(3000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 256, 0u);
  AllocatorStats stats = allocator.stats();
  EXPECT_EQ(stats.bytes_in_use, 1024 + 3072);
  EXPECT_EQ(stats.live_allocations, 2);
  allocator.Deallocate(b, 3000);
  stats = allocator.stats();
  EXPECT_EQ(stats.bytes_in_use, 1024);
  EXPECT_EQ(stats.peak_bytes_in_use, 1024 + 3072);
  EXPECT_EQ(stats.num_allocations, 2);
  allocator.ResetPeak();
  EXPECT_EQ(allocator.stats().peak_bytes_in_use, 1024);
  allocator.Deallocate(a, 1000);
  EXPECT_EQ(allocator.stats().bytes_in_use, 0);
}

// Peak attribution: the bytes live at the peak, by the innermost scope each
// block was allocated under; blocks from before it was enabled are named
// so; ResetPeak restarts the copy. The labels add up to the peak.
TEST(AllocatorTest, PeakAttributionNamesTheScopesAtThePeak) {
  HostAllocator allocator("attributed");
  void* early = allocator.Allocate(1024).value();
  EXPECT_TRUE(allocator.PeakAttribution().empty());
  allocator.EnablePeakAttribution();
  const std::string linear = "Linear", block = "Block";
  void* outside = allocator.Allocate(256).value();
  void* a = nullptr;
  void* b = nullptr;
  {
    AllocationScope in_block(&block, "backward");
    EXPECT_EQ(AllocationScope::CurrentLabel(), "Block backward");
    b = allocator.Allocate(4096).value();
    {
      AllocationScope in_linear(&linear, "forward");
      a = allocator.Allocate(2048).value();
    }
    EXPECT_EQ(AllocationScope::CurrentLabel(), "Block backward");
  }
  EXPECT_EQ(AllocationScope::CurrentLabel(), "");
  allocator.Deallocate(early, 1024);
  allocator.Deallocate(a, 2048);
  // Below the peak: the copy stays the one at 1024 + 256 + 4096 + 2048.
  void* small = allocator.Allocate(512).value();
  const std::vector<std::pair<std::string, int64_t>> expected = {
      {"Block backward", 4096},
      {"Linear forward", 2048},
      {"(before attribution)", 1024},
      {"(no scope)", 256}};
  EXPECT_EQ(allocator.PeakAttribution(), expected);
  EXPECT_EQ(allocator.stats().peak_bytes_in_use, 1024 + 256 + 4096 + 2048);
  allocator.ResetPeak();  // now 256 + 4096 + 512 in use
  const std::vector<std::pair<std::string, int64_t>> after_reset = {
      {"Block backward", 4096}, {"(no scope)", 256 + 512}};
  EXPECT_EQ(allocator.PeakAttribution(), after_reset);
  allocator.Deallocate(small, 512);
  allocator.Deallocate(b, 4096);
  allocator.Deallocate(outside, 256);
}

TEST(AllocatorTest, CapFailsWithResourceExhaustedNamingRequestAndCap) {
  HostAllocator allocator("small_device");
  allocator.SetByteCap(4096);
  void* a = *allocator.Allocate(2048);
  absl::StatusOr<void*> too_much = allocator.Allocate(4000);
  ASSERT_FALSE(too_much.ok());
  EXPECT_EQ(too_much.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string message(too_much.status().message());
  EXPECT_NE(message.find("small_device"), std::string::npos) << message;
  EXPECT_NE(message.find("4000 bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("cap of 4096 bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("2048 bytes already in use"), std::string::npos);
  // Nothing leaked by the failure; freeing makes room again.
  allocator.Deallocate(a, 2048);
  void* b = *allocator.Allocate(4000);
  allocator.Deallocate(b, 4000);
  EXPECT_EQ(allocator.stats().bytes_in_use, 0);
}

// A tensor larger than memory (an oversized micro-batch) is a
// ResourceExhausted naming the bytes asked for, never an abort: 2^48 bytes
// are past any host (and past x86-64's 47-bit user address space, so the
// kernel refuses them whatever its overcommit policy); a shape whose byte
// count does not fit in 63 bits is refused before it could wrap.
TEST(TensorTest, TooLargeIsResourceExhaustedWithTheBytes) {
  HostAllocator allocator("host_test");
  absl::StatusOr<Tensor> huge = Tensor::Empty(
      {int64_t{1} << 40, 64}, DType::kI32, Device::Cpu(), &allocator);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(huge.status().message().find("request of 281474976710656 bytes"),
            std::string::npos)
      << huge.status();
  absl::StatusOr<Tensor> wraps =
      Tensor::Empty({int64_t{1} << 40, int64_t{1} << 40}, DType::kF32,
                    Device::Cpu(), &allocator);
  ASSERT_FALSE(wraps.ok());
  EXPECT_EQ(wraps.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(
      wraps.status().message().find("[1099511627776, 1099511627776] of f32"),
      std::string::npos)
      << wraps.status();
  EXPECT_EQ(allocator.stats().bytes_in_use, 0);
}

TEST(AllocatorTest, TensorReturnsStorageToItsAllocator) {
  HostAllocator allocator("tensors");
  {
    Tensor tensor =
        *Tensor::Empty({4, 8}, DType::kBF16, Device::Cpu(), &allocator);
    EXPECT_EQ(tensor.nbytes(), 64u);
    Tensor view = tensor.Slice(8, 8);
    EXPECT_EQ(
        static_cast<char*>(view.data()) - static_cast<char*>(tensor.data()),
        16);
    EXPECT_EQ(allocator.stats().live_allocations, 1);
  }
  EXPECT_EQ(allocator.stats().live_allocations, 0);
}

TEST(AllocatorTest, NoGpuMeansCleanErrors) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is present";
  absl::StatusOr<void*> pinned = PinnedHostMemory()->Allocate(16);
  EXPECT_EQ(pinned.status().code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<Tensor> device =
      Tensor::Empty({4}, DType::kF32, Device::Cuda(0));
  EXPECT_EQ(device.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(TensorTest, ShapesAndViews) {
  Tensor tensor = *Tensor::Zeros({2, 3, 4}, DType::kF32, Device::Cpu());
  EXPECT_EQ(tensor.numel(), 24);
  EXPECT_EQ(tensor.size(-1), 4);
  EXPECT_EQ(tensor.View({6, 4}).shape(), (Shape{6, 4}));
  EXPECT_EQ(tensor.DebugString(), "Tensor(f32, [2, 3, 4], cpu)");
  EXPECT_FALSE(Tensor::Empty({-1}, DType::kF32, Device::Cpu()).ok());
  EXPECT_FALSE(Tensor().defined());
}

TEST(OpsTest, CpuElementwiseAndReductions) {
  const Stream stream;
  Tensor a =
      *FromHostFloats({1, 2, 3, -4}, {4}, DType::kF32, Device::Cpu(), stream);
  Tensor b = *FromHostFloats({0.5, 0.5, 0.5, 0.5}, {4}, DType::kBF16,
                             Device::Cpu(), stream);
  Tensor out = *Tensor::Empty({4}, DType::kF16, Device::Cpu());
  ASSERT_TRUE(Axpby(2.0f, a, -1.0f, b, out, stream).ok());
  EXPECT_EQ(*ToHostFloats(out, stream),
            (std::vector<float>{1.5, 3.5, 5.5, -8.5}));
  ASSERT_TRUE(Scale(out, 2.0f, stream).ok());
  EXPECT_EQ(*ToHostFloats(out, stream), (std::vector<float>{3, 7, 11, -17}));
  Tensor sum = *Tensor::Zeros({1}, DType::kF32, Device::Cpu());
  ASSERT_TRUE(SumOfSquares(a, sum, stream).ok());
  ASSERT_TRUE(SumOfSquares(a, sum, stream).ok());  // accumulates
  EXPECT_EQ(*sum.data_as<float>(), 60.0f);
  Tensor flag = *Tensor::Zeros({1}, DType::kF32, Device::Cpu());
  ASSERT_TRUE(HasInfOrNan(a, flag, stream).ok());
  EXPECT_EQ(*flag.data_as<float>(), 0.0f);
  ASSERT_TRUE(Fill(a.Slice(2, 1), INFINITY, stream).ok());
  ASSERT_TRUE(HasInfOrNan(a, flag, stream).ok());
  EXPECT_EQ(*flag.data_as<float>(), 1.0f);
  Tensor rounded = *Tensor::Empty({4}, DType::kBF16, Device::Cpu());
  ASSERT_TRUE(Copy(*FromHostFloats({1.00390625f, 1, 1, 1}, {4}, DType::kF32,
                                   Device::Cpu(), stream),
                   rounded, stream)
                  .ok());
  EXPECT_EQ((*ToHostFloats(rounded, stream))[0], 1.0f);  // tie to even
  EXPECT_FALSE(
      Add(a, *Tensor::Empty({3}, DType::kF32, Device::Cpu()), a, stream).ok());
}

TEST(StreamGuardTest, NestsPerDeviceAndRestores) {
  const Device gpu0 = Device::Cuda(0);
  const Device gpu1 = Device::Cuda(1);
  // No guard: the legacy default stream (and the CPU stream for the CPU).
  EXPECT_EQ(CurrentStream(gpu0).device(), gpu0);
  EXPECT_EQ(CurrentStream(gpu0).native(), nullptr);
  EXPECT_TRUE(CurrentStream(Device::Cpu()).device().is_cpu());
  {
    StreamGuard outer(Stream::Default(gpu1));
    EXPECT_EQ(CurrentStream(gpu1).device(), gpu1);
    // A guard for another device leaves gpu0's current stream alone.
    EXPECT_EQ(CurrentStream(gpu0).device(), gpu0);
    {
      StreamGuard inner(Stream::Default(gpu0));
      EXPECT_EQ(CurrentStream(gpu0).device(), gpu0);
      EXPECT_EQ(CurrentStream(gpu1).device(), gpu1);  // the outer guard's
    }
    EXPECT_EQ(CurrentStream(gpu1).device(), gpu1);
  }
  EXPECT_EQ(CurrentStream(gpu1).native(), nullptr);
}

TEST(TensorTest, ZerosOnAStream) {
  const Stream cpu;
  Tensor tensor = *Tensor::Zeros({3, 5}, DType::kBF16, Device::Cpu(), cpu);
  EXPECT_EQ(*ToHostFloats(tensor, cpu), std::vector<float>(15, 0.0f));
  absl::StatusOr<Tensor> mismatched =
      Tensor::Zeros({3}, DType::kF32, Device::Cuda(0), cpu);
  ASSERT_EQ(mismatched.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mismatched.status().message().find("cuda:0"), std::string::npos)
      << mismatched.status();
  EXPECT_NE(mismatched.status().message().find("cpu"), std::string::npos);
}

TEST(TensorTest, RecordStreamIsANoOpOffTheGpu) {
  const Stream cpu;
  Tensor host = *Tensor::Empty({4}, DType::kF32, Device::Cpu());
  EXPECT_TRUE(host.RecordStream(cpu).ok());
  EXPECT_TRUE(host.RecordStream(Stream::Default(Device::Cuda(0))).ok());
  float values[4] = {};
  Tensor wrapped = Tensor::Wrap(values, {4}, DType::kF32, Device::Cpu());
  EXPECT_TRUE(wrapped.RecordStream(cpu).ok());
  EXPECT_TRUE(Tensor().RecordStream(cpu).ok());
}

TEST(AllocatorTest, CachingRecordStreamNamesAnUnknownBlock) {
  CudaCachingAllocator allocator("bookkeeping", 0);
  int not_a_block = 0;
  const absl::Status unknown =
      allocator.RecordStream(&not_a_block, Stream::Default(Device::Cuda(0)));
  ASSERT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.message().find("'bookkeeping'"), std::string::npos)
      << unknown;
  EXPECT_NE(unknown.message().find("not a live block"), std::string::npos);
  const absl::Status other_device =
      allocator.RecordStream(&not_a_block, Stream::Default(Device::Cuda(1)));
  ASSERT_EQ(other_device.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(other_device.message().find("cuda:1"), std::string::npos)
      << other_device;
  // A CPU stream orders nothing on the device: nothing to record.
  EXPECT_TRUE(allocator.RecordStream(&not_a_block, Stream()).ok());
}

}  // namespace
}  // namespace ze
