// CUDA optimizer kernel against the CPU kernel (gpu-tagged).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/ops.h"
#include "core/stream.h"
#include "gtest/gtest.h"
#include "zero/optimizer.h"
#include "zero/optimizer_test_options.h"

namespace ze {
namespace zero {
namespace {

Tensor Make(const std::vector<float>& values, DType dtype, const Device& device,
            const Stream& stream) {
  auto tensor = FromHostFloats(values, {static_cast<int64_t>(values.size())},
                               dtype, device, stream);
  EXPECT_TRUE(tensor.ok()) << tensor.status();
  return *tensor;
}

std::vector<float> Read(const Tensor& tensor, const Stream& stream) {
  auto values = ToHostFloats(tensor, stream);
  EXPECT_TRUE(values.ok()) << values.status();
  return *values;
}

void ExpectClose(const std::vector<float>& cuda, const std::vector<float>& cpu,
                 const char* what) {
  ASSERT_EQ(cuda.size(), cpu.size());
  int64_t bit_different = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_LE(std::fabs(cuda[i] - cpu[i]), 1e-6 * std::fabs(cpu[i]) + 1e-30)
        << what << " element " << i << ": cuda " << cuda[i] << " cpu "
        << cpu[i];
    bit_different += cuda[i] != cpu[i];
  }
  // Not required, but expected by construction: report it.
  if (bit_different > 0) {
    std::printf("%s: %lld of %zu elements differ in the last bits\n", what,
                static_cast<long long>(bit_different), cpu.size());
  }
}

struct Case {
  const char* name;
  OptimizerOptions options;
  DType grad_dtype;
  DType out_dtype;
  bool misaligned;  // offset every tensor by one element: the scalar kernel
};

// 200 steps of every optimizer and gradient dtype on CUDA and on the CPU
// from the same inputs: f32 master weights and state agree within 1e-6
// relative (by construction they should agree bit for bit).
TEST(OptimizerCudaTest, MatchesCpuOverManySteps) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::Cuda(0);
  auto stream_or = Stream::Create(gpu);
  ASSERT_TRUE(stream_or.ok()) << stream_or.status();
  const Stream stream = *stream_or;
  const Stream cpu_stream;

  const OptimizerVariants variants = TestOptimizers();
  const OptimizerOptions& adam = variants.adam;
  const OptimizerOptions& adamw = variants.adamw;
  const OptimizerOptions& sgd = variants.sgd;
  const OptimizerOptions& nesterov = variants.nesterov;
  const OptimizerOptions& plain = variants.plain;
  std::vector<Case> cases;
  for (DType grad : {DType::kF32, DType::kBF16, DType::kF16}) {
    cases.push_back({"adam", adam, grad, DType::kBF16, false});
    cases.push_back({"adamw", adamw, grad, DType::kF16, false});
    cases.push_back({"sgd", sgd, grad, DType::kBF16, false});
  }
  cases.push_back(
      {"adamw-misaligned", adamw, DType::kBF16, DType::kBF16, true});
  cases.push_back(
      {"sgd-nesterov-misaligned", nesterov, DType::kF32, DType::kF32, true});
  cases.push_back({"sgd-plain", plain, DType::kF16, DType::kF16, false});

  const int64_t n = (1 << 16) + 7;  // many blocks, and a tail
  for (const Case& test_case : cases) {
    SCOPED_TRACE(test_case.name);
    SCOPED_TRACE(DTypeName(test_case.grad_dtype));
    std::mt19937 rng(17);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int64_t offset = test_case.misaligned ? 1 : 0;
    std::vector<float> initial(n + offset);
    for (float& x : initial) x = normal(rng);

    auto cpu_opt = FlatOptimizer::Create(test_case.options, n, Device::Cpu());
    auto gpu_opt = FlatOptimizer::Create(test_case.options, n, gpu);
    ASSERT_TRUE(cpu_opt.ok() && gpu_opt.ok());
    Tensor cpu_master =
        Make(initial, DType::kF32, Device::Cpu(), cpu_stream).Slice(offset, n);
    Tensor gpu_master =
        Make(initial, DType::kF32, gpu, stream).Slice(offset, n);
    Tensor cpu_out =
        Make(initial, test_case.out_dtype, Device::Cpu(), cpu_stream)
            .Slice(offset, n);
    Tensor gpu_out =
        Make(initial, test_case.out_dtype, gpu, stream).Slice(offset, n);
    for (int step = 0; step < 200; ++step) {
      std::vector<float> grads(n + offset);
      for (float& x : grads) x = 1024.0f * (normal(rng) + 0.05f);
      StepArgs args;
      args.lr = 1e-3 * (1 + step % 7);
      args.grad_scale = 1.0f / 1024;
      ASSERT_TRUE((*cpu_opt)
                      ->Step(cpu_master,
                             Make(grads, test_case.grad_dtype, Device::Cpu(),
                                  cpu_stream)
                                 .Slice(offset, n),
                             args, cpu_stream, cpu_out)
                      .ok());
      const Tensor gpu_grads =
          Make(grads, test_case.grad_dtype, gpu, stream).Slice(offset, n);
      ASSERT_TRUE(
          (*gpu_opt)->Step(gpu_master, gpu_grads, args, stream, gpu_out).ok());
      ASSERT_TRUE(stream.Synchronize().ok());  // gpu_grads is freed next
    }
    ExpectClose(Read(gpu_master, stream), Read(cpu_master, cpu_stream),
                "master weights");
    // The fused copy-back is the GPU's own master weights, rounded.
    const std::vector<float> rounded =
        Read(Make(Read(gpu_master, stream), test_case.out_dtype, Device::Cpu(),
                  cpu_stream),
             cpu_stream);
    EXPECT_EQ(Read(gpu_out, stream), rounded);
    const auto cpu_state = (*cpu_opt)->StateTensors();
    const auto gpu_state = (*gpu_opt)->StateTensors();
    ASSERT_EQ(cpu_state.size(), gpu_state.size());
    for (size_t k = 0; k < cpu_state.size(); ++k) {
      ExpectClose(Read(gpu_state[k].tensor, stream),
                  Read(cpu_state[k].tensor, cpu_stream),
                  cpu_state[k].name.c_str());
    }
  }
}

// The exact 16+16 master on the GPU (LaunchSplitMasterStep through
// StepSplitRange) against the GPU's own f32 master, bit for bit (same
// kernel arithmetic), vectorised and misaligned (element-wise) kernels, over
// every optimizer: the joined halves equal the f32 master after 50 steps,
// hi its ties-away bf16, the state identical.
TEST(OptimizerCudaTest, SplitMasterEqualsF32MasterBitForBit) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::Cuda(0);
  auto stream_or = Stream::Create(gpu);
  ASSERT_TRUE(stream_or.ok()) << stream_or.status();
  const Stream stream = *stream_or;
  const OptimizerVariants variants = TestOptimizers();
  const int64_t n = 4099;
  for (const OptimizerOptions& options :
       {variants.adam, variants.adamw, variants.sgd, variants.plain}) {
    for (int64_t offset : {0, 1}) {
      SCOPED_TRACE(OptimizerTypeName(options.type));
      SCOPED_TRACE(offset);
      std::mt19937 rng(5);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> initial(n + offset);
      std::vector<uint16_t> hi_bits(n + offset), lo_bits(n + offset);
      for (size_t i = 0; i < initial.size(); ++i) {
        initial[i] = normal(rng);
        if (i % 5 == 0) {  // exact ties
          initial[i] =
              BitsToFloat((FloatBits(initial[i]) & 0xffff0000u) | 0x8000u);
        }
        const Bf16Split split = SplitForBf16(initial[i]);
        hi_bits[i] = split.hi;
        lo_bits[i] = split.lo;
      }
      auto upload_bits = [&](const std::vector<uint16_t>& bits) {
        Tensor host = Tensor::Wrap(const_cast<uint16_t*>(bits.data()),
                                   {n + offset}, DType::kBF16, Device::Cpu());
        auto device = Tensor::Empty({n + offset}, DType::kBF16, gpu);
        EXPECT_TRUE(device.ok());
        EXPECT_TRUE(Copy(host, *device, stream).ok());
        return device->Slice(offset, n);
      };
      Tensor hi = upload_bits(hi_bits);
      Tensor lo = upload_bits(lo_bits);
      Tensor master = Make(initial, DType::kF32, gpu, stream).Slice(offset, n);
      auto f32_opt = FlatOptimizer::Create(options, n, gpu);
      auto split_opt = FlatOptimizer::Create(options, n, gpu);
      ASSERT_TRUE(f32_opt.ok() && split_opt.ok());
      for (int step = 0; step < 50; ++step) {
        std::vector<float> grads(n + offset);
        for (float& x : grads) x = normal(rng);
        const Tensor g =
            Make(grads, DType::kBF16, gpu, stream).Slice(offset, n);
        StepArgs args;
        args.lr = 1e-3 * (1 + step % 7);
        ASSERT_TRUE((*f32_opt)->StepRange(0, master, g, args, stream).ok());
        ASSERT_TRUE(
            (*split_opt)->StepSplitRange(0, hi, lo, g, args, stream).ok());
        (*f32_opt)->AdvanceStep();
        (*split_opt)->AdvanceStep();
        ASSERT_TRUE(stream.Synchronize().ok());  // g is freed next
      }
      const std::vector<float> p = Read(master, stream);
      std::vector<uint16_t> hi_out(n), lo_out(n);
      Tensor hi_host =
          Tensor::Wrap(hi_out.data(), {n}, DType::kBF16, Device::Cpu());
      Tensor lo_host =
          Tensor::Wrap(lo_out.data(), {n}, DType::kBF16, Device::Cpu());
      ASSERT_TRUE(Copy(hi, hi_host, stream).ok());
      ASSERT_TRUE(Copy(lo, lo_host, stream).ok());
      ASSERT_TRUE(stream.Synchronize().ok());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(FloatBits(JoinBf16Split(hi_out[i], lo_out[i])),
                  FloatBits(p[i]))
            << "element " << i;
        ASSERT_EQ(hi_out[i], SplitForBf16(p[i]).hi) << "element " << i;
      }
      const auto f32_state = (*f32_opt)->StateTensors();
      const auto split_state = (*split_opt)->StateTensors();
      for (size_t k = 0; k < f32_state.size(); ++k) {
        EXPECT_EQ(Read(f32_state[k].tensor, stream),
                  Read(split_state[k].tensor, stream));
      }
    }
  }
}

// Compressed moments (bf16 nearest and stochastic, 8-bit) on CUDA against
// the CPU: master, weights, decoded moments and their raw storage (codes
// and steps) bit for bit, with an f32 and a 16+16 master.
TEST(OptimizerCudaTest, CompressedMomentsMatchCpuBitForBit) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  OptimizerOptions adamw = TestOptimizers().adamw;
  std::vector<OptimizerOptions> formats;
  adamw.moments = MomentFormat::kBf16;
  formats.push_back(adamw);
  adamw.stochastic_rounding = true;
  adamw.rounding_seed = 5;
  formats.push_back(adamw);
  adamw.stochastic_rounding = false;
  adamw.moments = MomentFormat::kBlockwise8;
  formats.push_back(adamw);
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() &&
           std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  for (const OptimizerOptions& options : formats) {
    for (bool split : {false, true}) {
      for (DType grad : {DType::kF32, DType::kBF16}) {
        // 8-bit: 40 blocks and a short one; bf16: vector body and tail.
        const int64_t count = 40 * 256 + 77;
        const MomentsRun cpu =
            RunFlatOptimizer(Device::Cpu(), options, count, 20, grad, split);
        const MomentsRun cuda =
            RunFlatOptimizer(Device::Cuda(0), options, count, 20, grad, split);
        const std::string what =
            std::string(offload::MomentFormatName(options.moments)) +
            (options.stochastic_rounding ? " stochastic" : "") +
            (split ? " split" : " f32 master") + " grads " + DTypeName(grad);
        ASSERT_EQ(cpu.decoded.size(), 2u) << what;
        ASSERT_EQ(cuda.decoded.size(), 2u) << what;
        EXPECT_TRUE(same(cpu.master, cuda.master)) << what;
        EXPECT_TRUE(same(cpu.weights, cuda.weights)) << what;
        for (int a = 0; a < 2; ++a) {
          EXPECT_TRUE(same(cpu.decoded[a], cuda.decoded[a]))
              << what << " " << a;
          EXPECT_TRUE(same(cpu.raw[a], cuda.raw[a])) << what << " raw " << a;
        }
      }
    }
  }
}

}  // namespace
}  // namespace zero
}  // namespace ze
