// CPU-vs-CUDA checks of core/ops.h. Tagged gpu: runs on the GPU machine.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "core/cuda/elementwise.h"
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

// The bit patterns of a tensor's values (as f32, which every dtype converts
// to exactly), so -0 vs +0 and rounding differences all show.
std::vector<uint32_t> Bits(const Tensor& x, const Stream& stream) {
  const std::vector<float> values = *ToHostFloats(x, stream);
  std::vector<uint32_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    std::memcpy(&bits[i], &values[i], sizeof(float));
  }
  return bits;
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
    Tensor a_cpu =
        *FromHostFloats(a_values, {count}, dtype, Device::Cpu(), cpu_);
    Tensor b_cpu =
        *FromHostFloats(b_values, {count}, dtype, Device::Cpu(), cpu_);
    Tensor a_gpu =
        *FromHostFloats(a_values, {count}, dtype, Device::Cuda(0), stream_);
    Tensor b_gpu =
        *FromHostFloats(b_values, {count}, dtype, Device::Cuda(0), stream_);

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
      EXPECT_EQ(*ToHostFloats(cast_cpu, cpu_),
                *ToHostFloats(cast_gpu, stream_));
    }

    // Sum of squares: f32 accumulation in a different order.
    Tensor sum_cpu = *Tensor::Zeros({1}, DType::kF32, Device::Cpu());
    Tensor sum_gpu = *Tensor::Zeros({1}, DType::kF32, Device::Cuda(0));
    ASSERT_TRUE(SumOfSquares(a_cpu, sum_cpu, cpu_).ok());
    ASSERT_TRUE(SumOfSquares(a_gpu, sum_gpu, stream_).ok());
    const float expected = *sum_cpu.data_as<float>();
    EXPECT_NEAR((*ToHostFloats(sum_gpu, stream_))[0], expected,
                1e-4 * std::abs(expected) + 1e-6);

    // The same from an odd offset: no 16-byte alignment, so every element
    // takes the one-at-a-time path.
    if (count > 1) {
      Tensor tail_cpu = *Tensor::Zeros({1}, DType::kF32, Device::Cpu());
      Tensor tail_gpu = *Tensor::Zeros({1}, DType::kF32, Device::Cuda(0));
      ASSERT_TRUE(SumOfSquares(a_cpu.Slice(1, count - 1), tail_cpu, cpu_).ok());
      ASSERT_TRUE(
          SumOfSquares(a_gpu.Slice(1, count - 1), tail_gpu, stream_).ok());
      const float tail_expected = *tail_cpu.data_as<float>();
      EXPECT_NEAR((*ToHostFloats(tail_gpu, stream_))[0], tail_expected,
                  1e-4 * std::abs(tail_expected) + 1e-6);
    }

    // Inf/NaN detection, found and not found: in the vectorised part, in
    // the tail, and at an odd offset.
    Tensor flag = *Tensor::Zeros({1}, DType::kF32, Device::Cuda(0));
    ASSERT_TRUE(HasInfOrNan(a_gpu, flag, stream_).ok());
    EXPECT_EQ((*ToHostFloats(flag, stream_))[0], 0.0f);
    if (count > 64) {
      ASSERT_TRUE(Fill(a_gpu.Slice(count / 2, 1), INFINITY, stream_).ok());
      ASSERT_TRUE(HasInfOrNan(a_gpu, flag, stream_).ok());
      EXPECT_EQ((*ToHostFloats(flag, stream_))[0], 1.0f) << count;
      ASSERT_TRUE(Fill(flag, 0.0f, stream_).ok());
      ASSERT_TRUE(HasInfOrNan(a_gpu.Slice(1, count - 1), flag, stream_).ok());
      EXPECT_EQ((*ToHostFloats(flag, stream_))[0], 1.0f) << count;
      ASSERT_TRUE(Fill(flag, 0.0f, stream_).ok());
      ASSERT_TRUE(Fill(a_gpu.Slice(count / 2, 1), 0.5f, stream_).ok());
    }
    ASSERT_TRUE(Fill(a_gpu.Slice(count - 1, 1), NAN, stream_).ok());
    ASSERT_TRUE(HasInfOrNan(a_gpu, flag, stream_).ok());
    EXPECT_EQ((*ToHostFloats(flag, stream_))[0], 1.0f);

    ASSERT_TRUE(Fill(b_gpu, 1.5f, stream_).ok());
    ASSERT_TRUE(Fill(b_cpu, 1.5f, cpu_).ok());
    EXPECT_EQ(*ToHostFloats(b_cpu, cpu_), *ToHostFloats(b_gpu, stream_));
  }
}

// The CUDA maps take 16 bytes of the narrowest operand per thread step when
// every pointer is 16-byte aligned, then a scalar tail; otherwise they go one
// element at a time. Counts around and between the vector widths (4 and 8),
// views offset by one element (misaligned) alone or together, and mixed
// dtypes cover all three paths. Each view sits inside a buffer with guard
// elements around it; whole buffers are compared, so a vector access past
// the view would show. Coefficients are powers of two: the CPU reference's
// fused multiply-add pairing is the compiler's choice (and differs between
// its loops), and only exact products make it irrelevant.
// The GPU's sum of squares in the order core/cuda/elementwise.cu fixes
// (grid-stride threads over pairs of 16-byte vectors, then the scalar tail;
// a shuffle tree per warp, per block and over the blocks' partials),
// emulated on the host: the GPU must equal it bit for bit, so the sum
// cannot depend on the run or on the GPU's size.
float EmulatedSumOfSquares(const std::vector<float>& values, int element_bytes,
                           bool aligned) {
  const int64_t count = static_cast<int64_t>(values.size());
  constexpr int kThreads = 256;
  const int64_t vector_width = 16 / element_bytes;
  const int64_t step = 2 * vector_width;
  const int64_t vector_end = aligned ? count / step * step : 0;
  const int blocks = cuda::SumOfSquaresBlocks(count);
  const int64_t threads = int64_t{blocks} * kThreads;
  auto warp_sum = [](const float* lanes) {
    std::vector<float> value(lanes, lanes + 32);
    for (int offset = 16; offset > 0; offset /= 2) {
      std::vector<float> next = value;
      for (int i = 0; i + offset < 32; ++i)
        next[i] = value[i] + value[i + offset];
      value = next;
    }
    return value[0];
  };
  auto block_sum = [&](const float* thread_values) {
    float warps[32] = {};
    for (int w = 0; w < kThreads / 32; ++w)
      warps[w] = warp_sum(thread_values + 32 * w);
    return warp_sum(warps);
  };
  std::vector<float> thread_partial(threads, 0.0f);
  for (int64_t t = 0; t < threads; ++t) {
    float partial = 0.0f;
    for (int64_t first = t * step; first < vector_end;
         first += threads * step) {
      for (int64_t i = first; i < first + step; ++i) {
        partial = std::fma(values[i], values[i], partial);
      }
    }
    for (int64_t i = vector_end + t; i < count; i += threads) {
      partial = std::fma(values[i], values[i], partial);
    }
    thread_partial[t] = partial;
  }
  std::vector<float> partials(blocks);
  for (int b = 0; b < blocks; ++b) {
    partials[b] = block_sum(thread_partial.data() + int64_t{b} * kThreads);
  }
  std::vector<float> adders(kThreads, 0.0f);
  for (int t = 0; t < kThreads; ++t) {
    for (int i = t; i < blocks; i += kThreads) adders[t] += partials[i];
  }
  return 0.0f + block_sum(adders.data());
}

TEST_P(OpsCudaTest, SumOfSquaresFollowsItsFixedOrder) {
  const DType dtype = GetParam();
  // The last count needs more than kMaxReductionBlocks blocks' worth.
  for (int64_t count : {1, 53, 1000, 1 << 20, 3000017, (1 << 23) + 5}) {
    const std::vector<float> values = RandomValues(count + 1, 5);
    Tensor x =
        *FromHostFloats(values, {count + 1}, dtype, Device::Cuda(0), stream_);
    const std::vector<float> rounded = *ToHostFloats(x, stream_);
    for (bool aligned : {true, false}) {
      const Tensor view = aligned ? x.Slice(0, count) : x.Slice(1, count);
      const std::vector<float> view_values(
          rounded.begin() + (aligned ? 0 : 1),
          rounded.begin() + (aligned ? 0 : 1) + count);
      Tensor sum = *Tensor::Zeros({1}, DType::kF32, Device::Cuda(0));
      ASSERT_TRUE(SumOfSquares(view, sum, stream_).ok());
      EXPECT_EQ(Bits(sum, stream_)[0],
                Bits(*FromHostFloats({EmulatedSumOfSquares(
                                         view_values, SizeOf(dtype), aligned)},
                                     {1}, DType::kF32, Device::Cpu(), cpu_),
                     cpu_)[0])
          << DTypeName(dtype) << " count " << count
          << (aligned ? " aligned" : " at an odd offset");
    }
  }
}

TEST_P(OpsCudaTest, AlignedAndMisalignedViewsMatchCpu) {
  const DType a_dtype = GetParam();
  const DType float_dtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
  struct Offsets {
    int64_t a, b, out;
  };
  // All aligned (vector body and tail), all misaligned, and one operand
  // misaligned among aligned ones (each falls back to scalar).
  const Offsets offset_cases[] = {{0, 0, 0}, {1, 1, 1}, {0, 1, 0}, {1, 0, 1}};
  uint32_t seed = 10;
  for (DType b_dtype : float_dtypes) {
    for (DType out_dtype : float_dtypes) {
      for (int64_t count : {1, 3, 7, 8, 9, 12, 17, 1003, 65541}) {
        for (const Offsets& offsets : offset_cases) {
          SCOPED_TRACE(testing::Message()
                       << DTypeName(a_dtype) << " + " << DTypeName(b_dtype)
                       << " -> " << DTypeName(out_dtype) << ", count " << count
                       << ", offsets " << offsets.a << "/" << offsets.b << "/"
                       << offsets.out);
          const int64_t size = count + 2;  // guard elements around the view
          struct Pair {
            Tensor cpu, gpu;
          };
          auto make = [&](DType dtype) {
            const std::vector<float> values = RandomValues(size, ++seed);
            return Pair{
                *FromHostFloats(values, {size}, dtype, Device::Cpu(), cpu_),
                *FromHostFloats(values, {size}, dtype, Device::Cuda(0),
                                stream_)};
          };
          Pair a = make(a_dtype);
          Pair b = make(b_dtype);
          Pair out = make(out_dtype);
          auto view = [&](const Tensor& buffer, int64_t offset) {
            return buffer.Slice(offset, count);
          };

          // Out of place, mixed dtypes.
          ASSERT_TRUE(Axpby(0.5f, view(a.cpu, offsets.a), -2.0f,
                            view(b.cpu, offsets.b), view(out.cpu, offsets.out),
                            cpu_)
                          .ok());
          ASSERT_TRUE(Axpby(0.5f, view(a.gpu, offsets.a), -2.0f,
                            view(b.gpu, offsets.b), view(out.gpu, offsets.out),
                            stream_)
                          .ok());
          EXPECT_EQ(Bits(out.cpu, cpu_), Bits(out.gpu, stream_));

          // In place (the residual add): out += a.
          ASSERT_TRUE(Add(view(out.cpu, offsets.out), view(a.cpu, offsets.a),
                          view(out.cpu, offsets.out), cpu_)
                          .ok());
          ASSERT_TRUE(Add(view(out.gpu, offsets.out), view(a.gpu, offsets.a),
                          view(out.gpu, offsets.out), stream_)
                          .ok());
          EXPECT_EQ(Bits(out.cpu, cpu_), Bits(out.gpu, stream_));

          ASSERT_TRUE(Scale(view(out.cpu, offsets.out), 0.3f, cpu_).ok());
          ASSERT_TRUE(Scale(view(out.gpu, offsets.out), 0.3f, stream_).ok());
          EXPECT_EQ(Bits(out.cpu, cpu_), Bits(out.gpu, stream_));

          // Cast a into b (a device copy when the dtypes are equal).
          ASSERT_TRUE(
              Copy(view(a.cpu, offsets.a), view(b.cpu, offsets.b), cpu_).ok());
          ASSERT_TRUE(
              Copy(view(a.gpu, offsets.a), view(b.gpu, offsets.b), stream_)
                  .ok());
          EXPECT_EQ(Bits(b.cpu, cpu_), Bits(b.gpu, stream_));

          ASSERT_TRUE(Fill(view(a.cpu, offsets.a), 0.1f, cpu_).ok());
          ASSERT_TRUE(Fill(view(a.gpu, offsets.a), 0.1f, stream_).ok());
          EXPECT_EQ(Bits(a.cpu, cpu_), Bits(a.gpu, stream_));
          if (HasFailure()) return;  // one report per failing case is enough
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, OpsCudaTest,
                         testing::Values(DType::kF32, DType::kBF16,
                                         DType::kF16));

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

// Copy refuses a transfer with differing dtypes; CopyConverting converts on
// the source's side and then transfers, both ways.
TEST(CopyConvertingTest, TransfersBetweenDevicesAcrossDTypes) {
  ASSERT_GT(CudaDeviceCount(), 0);
  Stream stream = *Stream::Create(Device::Cuda(0));
  const std::vector<float> values = RandomValues(1000, 7);
  Tensor host = *Tensor::Empty({1000}, DType::kF32, Device::Cpu());
  std::memcpy(host.data(), values.data(), host.nbytes());
  Tensor device = *Tensor::Empty({1000}, DType::kBF16, Device::Cuda(0));
  EXPECT_FALSE(Copy(host, device, stream).ok());
  ASSERT_TRUE(CopyConverting(host, device, stream).ok());
  Tensor back = *Tensor::Empty({1000}, DType::kF16, Device::Cpu());
  ASSERT_TRUE(CopyConverting(device, back, stream).ok());
  ASSERT_TRUE(stream.Synchronize().ok());
  for (int i = 0; i < 1000; ++i) {
    // f32 -> bf16 rounds once; bf16 -> f16 again (both nearest even).
    const float bf16 = Bf16BitsToFloat(FloatToBf16Bits(values[i]));
    ASSERT_EQ(LoadAsFloat(back.data(), DType::kF16, i),
              F16BitsToFloat(FloatToF16Bits(bf16)))
        << i;
  }
}

TEST(CudaAllocatorTest, PinnedHostRoundTrip) {
  ASSERT_GT(CudaDeviceCount(), 0);
  Stream stream = *Stream::Create(Device::Cuda(0));
  Tensor pinned =
      *Tensor::Empty({1024}, DType::kF32, Device::Cpu(), PinnedHostMemory());
  Tensor device = *Tensor::Empty({1024}, DType::kF32, Device::Cuda(0));
  Tensor back =
      *Tensor::Empty({1024}, DType::kF32, Device::Cpu(), PinnedHostMemory());
  for (int i = 0; i < 1024; ++i) pinned.data_as<float>()[i] = i;
  ASSERT_TRUE(Copy(pinned, device, stream).ok());
  ASSERT_TRUE(Copy(device, back, stream).ok());
  ASSERT_TRUE(stream.Synchronize().ok());
  for (int i = 0; i < 1024; ++i) ASSERT_EQ(back.data_as<float>()[i], i);
}

// Tensor::Zeros on a block that the caching allocator recycled while work
// queued on a non-blocking stream still reads it: Engine::Impl's setup
// freed a parameter's initial storage right after queueing the copy out of
// it, and the next Zeros (an optimizer's momentum, of the same size class)
// zeroed that storage on the legacy default stream before the copy ran, so
// a rank started training with that weight all zero (parity_cuda_w2_test,
// w2_f32_sgd_s0_a1_m2, now and then). A host function holds the stream back
// until well after Zeros would have returned without waiting for it. Since
// the allocator is stream-aware, the freeing side declares the reader's
// stream (RecordStream, as the engine's setup now does) instead of Zeros
// waiting on the whole device: the block is then not handed out again
// until the reader is past it, so the zeros cannot land first.
TEST(CudaAllocatorTest, ZerosWaitsForQueuedReadersOfARecycledBlock) {
  ASSERT_GT(CudaDeviceCount(), 0);
  CudaCachingAllocator allocator("recycling", 0);  // a cache of its own
  Stream stream = *Stream::Create(Device::Cuda(0));
  constexpr int64_t kCount = 256;
  Tensor source =
      *Tensor::Empty({kCount}, DType::kF32, Device::Cuda(0), &allocator);
  Tensor copy = *Tensor::Empty({kCount}, DType::kF32, Device::Cuda(0));
  ASSERT_TRUE(Fill(source, 3.0f, stream).ok());
  ASSERT_TRUE(stream.Synchronize().ok());

  std::atomic<bool> release{false};
  // Whatever happens below, the stream is let go and the thread joined.
  struct Releaser {
    std::atomic<bool>* release;
    std::thread thread;
    ~Releaser() {
      *release = true;
      if (thread.joinable()) thread.join();
    }
  } releaser{&release, {}};
  ASSERT_EQ(cudaLaunchHostFunc(
                static_cast<cudaStream_t>(stream.native()),
                [](void* flag) {
                  while (!static_cast<std::atomic<bool>*>(flag)->load()) {
                    std::this_thread::sleep_for(std::chrono::milliseconds(1));
                  }
                },
                &release),
            cudaSuccess);
  ASSERT_TRUE(Copy(source, copy, stream).ok());  // waits behind the hold
  void* const recycled = source.data();
  ASSERT_TRUE(source.RecordStream(stream).ok());
  source = Tensor();  // freed with the copy still queued, as the engine does
  releaser.thread = std::thread([&release] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    release = true;
  });
  absl::StatusOr<Tensor> zeros =
      Tensor::Zeros({kCount}, DType::kF32, Device::Cuda(0), &allocator);
  ASSERT_TRUE(zeros.ok()) << zeros.status();
  EXPECT_NE(zeros->data(), recycled) << "recycled while the copy still reads";
  ASSERT_TRUE(stream.Synchronize().ok());
  const std::vector<float> copied = *ToHostFloats(copy, stream);
  const std::vector<float> zeroed = *ToHostFloats(*zeros, stream);
  for (float value : copied) ASSERT_EQ(value, 3.0f) << "read after the zeros";
  for (float value : zeroed) ASSERT_EQ(value, 0.0f);
}

}  // namespace
}  // namespace ze
