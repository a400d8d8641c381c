// offload::CpuOptimizer against zero::FlatOptimizer's CPU path: 10 steps
// of every optimizer, gradient dtype and fused-write dtype give the same
// weights, state and 16-bit copy bit for bit. Both evaluate the same f32
// expression with the same fused multiply-adds from the same coefficients
// (formed in double and rounded once), and sqrt/division are correctly
// rounded everywhere, so no tolerance is needed.
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/ops.h"
#include "gtest/gtest.h"
#include "offload/cpu_optimizer.h"
#include "zero/optimizer.h"

namespace ze {
namespace {

constexpr int kSteps = 10;
constexpr DType kFloatTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

struct Case {
  std::string name;
  zero::OptimizerOptions zero_options;
  offload::OptimizerOptions offload_options;
};

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  auto add = [&](const std::string& name, zero::OptimizerType zero_type,
                 offload::OptimizerType offload_type, double weight_decay,
                 double momentum, double dampening, bool nesterov) {
    Case c;
    c.name = name;
    c.zero_options.type = zero_type;
    c.zero_options.beta2 = 0.95;
    c.zero_options.weight_decay = weight_decay;
    c.zero_options.momentum = momentum;
    c.zero_options.dampening = dampening;
    c.zero_options.nesterov = nesterov;
    c.offload_options.type = offload_type;
    c.offload_options.beta2 = 0.95;
    c.offload_options.weight_decay = weight_decay;
    c.offload_options.momentum = momentum;
    c.offload_options.dampening = dampening;
    c.offload_options.nesterov = nesterov;
    cases.push_back(c);
  };
  add("adam", zero::OptimizerType::kAdam, offload::OptimizerType::kAdam, 0.01,
      0, 0, false);
  add("adamw", zero::OptimizerType::kAdamW, offload::OptimizerType::kAdamW, 0.1,
      0, 0, false);
  add("sgd", zero::OptimizerType::kSgd, offload::OptimizerType::kSgd, 0.001, 0,
      0, false);
  add("sgd_momentum", zero::OptimizerType::kSgd, offload::OptimizerType::kSgd,
      0.001, 0.9, 0.1, false);
  add("sgd_nesterov", zero::OptimizerType::kSgd, offload::OptimizerType::kSgd,
      0.0, 0.9, 0, true);
  return cases;
}

Tensor HostTensor(const std::vector<float>& values, DType dtype) {
  auto tensor = FromHostFloats(values, {static_cast<int64_t>(values.size())},
                               dtype, Device::Cpu(), Stream());
  EXPECT_TRUE(tensor.ok()) << tensor.status();
  return *tensor;
}

void ExpectSameBytes(const void* expected, const void* actual, size_t bytes,
                     const char* what) {
  EXPECT_EQ(std::memcmp(expected, actual, bytes), 0) << what << " differs";
}

TEST(CpuOptimizerParityTest, TenStepsMatchFlatOptimizerBitForBit) {
  constexpr int64_t kCount = 4099;  // several vectors, odd tail
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> initial(kCount);
  for (float& p : initial) p = normal(rng);
  std::vector<std::vector<float>> grads(kSteps, std::vector<float>(kCount));
  for (auto& step : grads) {
    for (int64_t i = 0; i < kCount; ++i) {
      step[i] = normal(rng) * std::ldexp(1.0f, i % 7 - 4);
    }
  }

  for (const Case& c : AllCases()) {
    for (DType grad_dtype : kFloatTypes) {
      for (DType out_dtype : kFloatTypes) {
        SCOPED_TRACE(::testing::Message()
                     << c.name << " grads " << DTypeName(grad_dtype) << " out "
                     << DTypeName(out_dtype));
        auto zero_optimizer =
            zero::FlatOptimizer::Create(c.zero_options, kCount, Device::Cpu());
        ASSERT_TRUE(zero_optimizer.ok()) << zero_optimizer.status();
        offload::CpuExecutionOptions execution;
        execution.num_threads = 3;
        execution.tile_bytes = 4096;  // several tiles
        auto cpu_optimizer =
            offload::CpuOptimizer::Create(c.offload_options, kCount, execution);
        ASSERT_TRUE(cpu_optimizer.ok()) << cpu_optimizer.status();

        Tensor zero_master = HostTensor(initial, DType::kF32);
        Tensor zero_out = HostTensor(initial, out_dtype);
        std::vector<float> master = initial;
        std::vector<uint8_t> out(kCount * SizeOf(out_dtype));
        for (int s = 0; s < kSteps; ++s) {
          const Tensor grad = HostTensor(grads[s], grad_dtype);
          zero::StepArgs zero_args;
          offload::StepArgs cpu_args;
          zero_args.lr = cpu_args.lr = 1e-2 / (s + 1);
          zero_args.grad_scale = cpu_args.grad_scale = 1.0f / (s + 2);
          if (s == 5) {  // OneCycle-style override on one step
            zero_args.beta1 = cpu_args.beta1 = 0.85;
          }
          ASSERT_TRUE(
              (*zero_optimizer)
                  ->Step(zero_master, grad, zero_args, Stream(), zero_out)
                  .ok());
          ASSERT_TRUE((*cpu_optimizer)
                          ->Step(master.data(), grad.data(), grad_dtype,
                                 cpu_args, out.data(), out_dtype)
                          .ok());
        }
        ExpectSameBytes(zero_master.data(), master.data(),
                        kCount * sizeof(float), "master weights");
        ExpectSameBytes(zero_out.data(), out.data(), out.size(),
                        "fused 16-bit write");
        for (const zero::NamedStateTensor& state :
             (*zero_optimizer)->StateTensors()) {
          const float* mine = state.name == "exp_avg"
                                  ? (*cpu_optimizer)->exp_avg()
                              : state.name == "exp_avg_sq"
                                  ? (*cpu_optimizer)->exp_avg_sq()
                                  : (*cpu_optimizer)->momentum_buffer();
          ASSERT_NE(mine, nullptr) << state.name;
          ExpectSameBytes(state.tensor.data(), mine, kCount * sizeof(float),
                          state.name.c_str());
        }
        EXPECT_EQ((*zero_optimizer)->step_count(),
                  (*cpu_optimizer)->step_count());
      }
    }
  }
}

}  // namespace
}  // namespace ze
