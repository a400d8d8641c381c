// CPU-vs-CUDA checks of core/ops.h. Tagged gpu: runs on the GPU machine.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/ops.h"
#include "core/stream.h"
#include "core/tensor.h"

namespace ze {
namespace {

std::vector<float> RandomValues(int64_t count, uint32_t seed) {
  std::mt19937 generator(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> values(count);
  for (float& value : values) value = normal(generator);
  return values;
}

class OpsCudaTest : public testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    ASSERT_GT(CudaDeviceCount(), 0) << "this test needs a GPU";
    stream_ = *Stream::Create(Device::Cuda(0));
  }
  Stream stream_;
  Stream cpu_;
};

TEST_P(OpsCudaTest, MatchesCpu) {
  const DType dtype = GetParam();
  for (int64_t count : {1, 53, 1000, 1 << 20, 3000017}) {
    const std::vector<float> a_values = RandomValues(count, 1);
    const std::vector<float> b_values = RandomValues(count, 2);
    Tensor a_cpu = *FromHostFloats(a_values, {count}, dtype, Device::Cpu(), cpu_);
    Tensor b_cpu = *FromHostFloats(b_values, {count}, dtype, Device::Cpu(), cpu_);
    Tensor a_gpu = *FromHostFloats(a_values, {count}, dtype, Device::Cuda(0), stream_);
    Tensor b_gpu = *FromHostFloats(b_values, {count}, dtype, Device::Cuda(0), stream_);

    // Axpby in place and Scale: elementwise results are identical bit for
    // bit (same f32 math, same rounding).
    ASSERT_TRUE(Axpby(0.5f, a_cpu, 2.0f, b_cpu, a_cpu, cpu_).ok());
    ASSERT_TRUE(Axpby(0.5f, a_gpu, 2.0f, b_gpu, a_gpu, stream_).ok());
    ASSERT_TRUE(Scale(a_cpu, 0.25f, cpu_).ok());
    ASSERT_TRUE(Scale(a_gpu, 0.25f, stream_).ok());
    EXPECT_EQ(*ToHostFloats(a_cpu, cpu_), *ToHostFloats(a_gpu, stream_));

    // Cast to every dtype.
    for (DType target : {DType::kF32, DType::kBF16, DType::kF16}) {
      Tensor cast_cpu = *Tensor::Empty({count}, target, Device::Cpu());
      Tensor cast_gpu = *Tensor::Empty({count}, target, Device::Cuda(0));
      ASSERT_TRUE(Copy(a_cpu, cast_cpu, cpu_).ok());
      ASSERT_TRUE(Copy(a_gpu, cast_gpu, stream_).ok());
      EXPECT_EQ(*ToHostFloats(cast_cpu, cpu_), *ToHostFloats(cast_gpu, stream_));
    }

    // Sum of squares: f32 accumulation in a different order.
    Tensor sum_cpu = *Tensor::Zeros({1}, DType::kF32, Device::Cpu());
    Tensor sum_gpu = *Tensor::Zeros({1}, DType::kF32, Device::Cuda(0));
    ASSERT_TRUE(SumOfSquares(a_cpu, sum_cpu, cpu_).ok());
    ASSERT_TRUE(SumOfSquares(a_gpu, sum_gpu, stream_).ok());
    const float expected = *sum_cpu.data_as<float>();
    EXPECT_NEAR((*ToHostFloats(sum_gpu, stream_))[0], expected,
                1e-4 * std::abs(expected) + 1e-6);

    // Inf/NaN detection, found and not found.
    Tensor flag = *Tensor::Zeros({1}, DType::kF32, Device::Cuda(0));
    ASSERT_TRUE(HasInfOrNan(a_gpu, flag, stream_).ok());
    EXPECT_EQ((*ToHostFloats(flag, stream_))[0], 0.0f);
    ASSERT_TRUE(Fill(a_gpu.Slice(count - 1, 1), NAN, stream_).ok());
    ASSERT_TRUE(HasInfOrNan(a_gpu, flag, stream_).ok());
    EXPECT_EQ((*ToHostFloats(flag, stream_))[0], 1.0f);

    ASSERT_TRUE(Fill(b_gpu, 1.5f, stream_).ok());
    ASSERT_TRUE(Fill(b_cpu, 1.5f, cpu_).ok());
    EXPECT_EQ(*ToHostFloats(b_cpu, cpu_), *ToHostFloats(b_gpu, stream_));
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, OpsCudaTest,
                         testing::Values(DType::kF32, DType::kBF16, DType::kF16));

TEST(CudaAllocatorTest, CachesAndCaps) {
  ASSERT_GT(CudaDeviceCount(), 0);
  CudaCachingAllocator allocator("capped", 0);
  void* a = *allocator.Allocate(3 << 20);
  allocator.Deallocate(a, 3 << 20);
  void* b = *allocator.Allocate(3 << 20);
  EXPECT_EQ(a, b) << "a freed block of the same size is reused";
  allocator.SetByteCap(8 << 20);
  absl::StatusOr<void*> too_big = allocator.Allocate(16 << 20);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  allocator.Deallocate(b, 3 << 20);
  allocator.ReleaseCache();
  EXPECT_EQ(allocator.stats().bytes_reserved, 0);
}

TEST(CudaAllocatorTest, PinnedHostRoundTrip) {
  ASSERT_GT(CudaDeviceCount(), 0);
  Stream stream = *Stream::Create(Device::Cuda(0));
  Tensor pinned = *Tensor::Empty({1024}, DType::kF32, Device::Cpu(), PinnedHostMemory());
  Tensor device = *Tensor::Empty({1024}, DType::kF32, Device::Cuda(0));
  Tensor back = *Tensor::Empty({1024}, DType::kF32, Device::Cpu(), PinnedHostMemory());
  for (int i = 0; i < 1024; ++i) pinned.data_as<float>()[i] = i;
  ASSERT_TRUE(Copy(pinned, device, stream).ok());
  ASSERT_TRUE(Copy(device, back, stream).ok());
  ASSERT_TRUE(stream.Synchronize().ok());
  for (int i = 0; i < 1024; ++i) ASSERT_EQ(back.data_as<float>()[i], i);
}

}  // namespace
}  // namespace ze
