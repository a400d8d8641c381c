// CUDA optimizer kernel against the CPU kernel (gpu-tagged).
#include <cmath>
#include <random>
#include <vector>

#include "core/device.h"
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

}  // namespace
}  // namespace zero
}  // namespace ze
