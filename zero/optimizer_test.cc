#include "zero/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/ops.h"
#include "gtest/gtest.h"
#include "zero/optimizer_test_options.h"

namespace ze {
namespace zero {
namespace {

// A straightforward double-precision optimizer, written from the PyTorch
// formulas, to check the vectorised f32 kernel against.
struct Reference {
  OptimizerOptions options;
  std::vector<double> p, m, v, buf;
  int64_t t = 0;

  void Step(const std::vector<double>& grad, double lr, double grad_scale,
            double beta1_override = -1) {
    ++t;
    const bool sgd = options.type == OptimizerType::kSgd;
    const double b1 = beta1_override >= 0
                          ? beta1_override
                          : (sgd ? options.momentum : options.beta1);
    const double b2 = options.beta2;
    const double wd = options.weight_decay;
    for (size_t i = 0; i < p.size(); ++i) {
      double g = grad[i] * grad_scale;
      if (sgd) {
        g += wd * p[i];
        if (options.momentum != 0) {
          buf[i] = t == 1 ? g : b1 * buf[i] + (1 - options.dampening) * g;
          g = options.nesterov ? g + b1 * buf[i] : buf[i];
        }
        p[i] -= lr * g;
        continue;
      }
      if (options.type == OptimizerType::kAdam) g += wd * p[i];
      if (options.type == OptimizerType::kAdamW) p[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const double m_hat = m[i] / (1 - std::pow(b1, double(t)));
      const double v_hat = v[i] / (1 - std::pow(b2, double(t)));
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + options.eps);
    }
  }
};

Tensor HostTensor(const std::vector<float>& values, DType dtype) {
  auto tensor = FromHostFloats(values, {static_cast<int64_t>(values.size())},
                               dtype, Device::Cpu(), Stream());
  EXPECT_TRUE(tensor.ok()) << tensor.status();
  return *tensor;
}

std::vector<float> Read(const Tensor& tensor) {
  auto values = ToHostFloats(tensor, Stream());
  EXPECT_TRUE(values.ok()) << values.status();
  return *values;
}

std::unique_ptr<FlatOptimizer> MakeOptimizer(const OptimizerOptions& options,
                                             int64_t n) {
  auto optimizer = FlatOptimizer::Create(options, n, Device::Cpu());
  EXPECT_TRUE(optimizer.ok()) << optimizer.status();
  return std::move(*optimizer);
}

// One step of each optimizer on p = 1, g = 0.5, lr = 0.1, wd = 0.1, worked
// by hand:
//   Adam:  g = 0.5 + 0.1 = 0.6, m = 0.06, v = 0.00036, m_hat = 0.6,
//          v_hat = 0.36, p = 1 - 0.1 * 0.6 / (0.6 + 1e-8) = 0.9 (+1.7e-9).
//   AdamW: p = 1 * (1 - 0.01) = 0.99, m = 0.05, v = 0.00025,
//          p = 0.99 - 0.1 * 0.5 / (0.5 + 1e-8) = 0.89.
//   SGD (momentum 0.9): g = 0.6, buf = 0.6, p = 1 - 0.06 = 0.94; a second
//          step with g = 0.5: g = 0.5 + 0.094 = 0.594, buf = 0.54 + 0.594 =
//          1.134, p = 0.94 - 0.1134 = 0.8266.
// The gradient is given pre-scaled by 1024 with grad_scale 1/1024 (exact).
TEST(OptimizerTest, HandComputedFirstSteps) {
  const Tensor grad = HostTensor({0.5f * 1024}, DType::kF32);
  StepArgs args;
  args.lr = 0.1f;
  args.grad_scale = 1.0f / 1024;

  OptimizerOptions adam;
  adam.type = OptimizerType::kAdam;
  adam.weight_decay = 0.1f;
  auto adam_opt = MakeOptimizer(adam, 1);
  Tensor p = HostTensor({1.0f}, DType::kF32);
  ASSERT_TRUE(adam_opt->Step(p, grad, args, Stream()).ok());
  EXPECT_FLOAT_EQ(Read(p)[0], 0.9f);
  const auto adam_state = adam_opt->StateTensors();
  ASSERT_EQ(adam_state.size(), 2u);
  EXPECT_EQ(adam_state[0].name, "exp_avg");
  EXPECT_EQ(adam_state[1].name, "exp_avg_sq");
  EXPECT_FLOAT_EQ(Read(adam_state[0].tensor)[0], 0.06f);
  EXPECT_FLOAT_EQ(Read(adam_state[1].tensor)[0], 0.00036f);
  EXPECT_EQ(adam_opt->step_count(), 1);

  OptimizerOptions adamw = adam;
  adamw.type = OptimizerType::kAdamW;
  auto adamw_opt = MakeOptimizer(adamw, 1);
  p = HostTensor({1.0f}, DType::kF32);
  ASSERT_TRUE(adamw_opt->Step(p, grad, args, Stream()).ok());
  EXPECT_FLOAT_EQ(Read(p)[0], 0.89f);
  EXPECT_FLOAT_EQ(Read(adamw_opt->StateTensors()[0].tensor)[0], 0.05f);
  EXPECT_FLOAT_EQ(Read(adamw_opt->StateTensors()[1].tensor)[0], 0.00025f);

  OptimizerOptions sgd;
  sgd.type = OptimizerType::kSgd;
  sgd.momentum = 0.9f;
  sgd.weight_decay = 0.1f;
  auto sgd_opt = MakeOptimizer(sgd, 1);
  p = HostTensor({1.0f}, DType::kF32);
  ASSERT_TRUE(sgd_opt->Step(p, grad, args, Stream()).ok());
  EXPECT_FLOAT_EQ(Read(p)[0], 0.94f);
  ASSERT_TRUE(sgd_opt->Step(p, grad, args, Stream()).ok());
  EXPECT_FLOAT_EQ(Read(p)[0], 0.8266f);
  const auto sgd_state = sgd_opt->StateTensors();
  ASSERT_EQ(sgd_state.size(), 1u);
  EXPECT_EQ(sgd_state[0].name, "momentum_buffer");
  EXPECT_FLOAT_EQ(Read(sgd_state[0].tensor)[0], 1.134f);

  OptimizerOptions plain_sgd;
  plain_sgd.type = OptimizerType::kSgd;
  auto plain = MakeOptimizer(plain_sgd, 1);
  EXPECT_TRUE(plain->StateTensors().empty());
  p = HostTensor({1.0f}, DType::kF32);
  ASSERT_TRUE(plain->Step(p, grad, args, Stream()).ok());
  EXPECT_FLOAT_EQ(Read(p)[0], 0.95f);
}

struct Case {
  const char* name;
  OptimizerOptions options;
  DType grad_dtype;
  bool cycle_beta1;
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  const auto [adam, adamw, sgd, nesterov, dampened, plain] = TestOptimizers();
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    cases.push_back({"adam", adam, dtype, false});
    cases.push_back({"adamw", adamw, dtype, false});
    cases.push_back({"sgd", sgd, dtype, false});
  }
  cases.push_back({"adamw-cycled-beta1", adamw, DType::kF32, true});
  cases.push_back({"sgd-nesterov", nesterov, DType::kF32, false});
  cases.push_back({"sgd-dampening", dampened, DType::kBF16, false});
  cases.push_back({"sgd-plain", plain, DType::kF16, false});
  return cases;
}

// 40 steps on 1003 elements (the vector body and a tail) against the double
// reference, with every gradient dtype and the fused 16-bit copy-back.
TEST(OptimizerTest, MatchesDoubleReferenceOverManySteps) {
  const int64_t n = 1003;
  const int steps = 40;
  for (const Case& test_case : Cases()) {
    SCOPED_TRACE(test_case.name);
    SCOPED_TRACE(DTypeName(test_case.grad_dtype));
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> initial(n);
    for (float& x : initial) x = normal(rng);

    Reference ref;
    ref.options = test_case.options;
    ref.p.assign(initial.begin(), initial.end());
    ref.m.assign(n, 0);
    ref.v.assign(n, 0);
    ref.buf.assign(n, 0);

    auto optimizer = MakeOptimizer(test_case.options, n);
    Tensor master = HostTensor(initial, DType::kF32);
    Tensor model = HostTensor(initial, DType::kBF16);
    for (int step = 0; step < steps; ++step) {
      // Gradients as the backward produced them: scaled by 256 and stored
      // in the gradient dtype; the reference sees the same stored values.
      std::vector<float> scaled(n);
      for (float& x : scaled) x = 256.0f * (0.5f * normal(rng) + 0.1f);
      const Tensor grads = HostTensor(scaled, test_case.grad_dtype);
      const std::vector<float> stored = Read(grads);
      StepArgs args;
      args.lr = 0.01 * (1.0 + 0.1 * step);
      args.grad_scale = 1.0f / 256;
      double beta1 = -1;
      if (test_case.cycle_beta1) {
        beta1 = 0.8 + 0.005 * step;
        args.beta1 = beta1;
      }
      ASSERT_TRUE(optimizer->Step(master, grads, args, Stream(), model).ok());
      ref.Step(std::vector<double>(stored.begin(), stored.end()), args.lr,
               args.grad_scale, beta1);
    }
    EXPECT_EQ(optimizer->step_count(), steps);
    const std::vector<float> weights = Read(master);
    const std::vector<float> model_weights = Read(model);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_NEAR(weights[i], ref.p[i], 2e-5 * (1.0 + std::fabs(ref.p[i])))
          << "element " << i;
      // The fused copy-back is the master weight rounded to nearest even.
      ASSERT_EQ(model_weights[i], Bf16BitsToFloat(FloatToBf16Bits(weights[i])))
          << "element " << i;
    }
    for (const NamedStateTensor& state : optimizer->StateTensors()) {
      const std::vector<double>& expected = state.name == "exp_avg" ? ref.m
                                            : state.name == "exp_avg_sq"
                                                ? ref.v
                                                : ref.buf;
      // Moments are sums with cancellation: judge each element's error
      // against the vector's magnitude, not its own.
      double magnitude = 0;
      for (double x : expected) magnitude = std::max(magnitude, std::fabs(x));
      const std::vector<float> actual = Read(state.tensor);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(actual[i], expected[i], 1e-5 * magnitude)
            << state.name << " element " << i;
      }
    }
  }
}

// The vector body and the scalar tail compute bit-identical results: the
// same 3 elements updated as part of a 16-element slice (vector body) and
// as a 3-element slice (tail only). That is what lets the CUDA kernel match.
TEST(OptimizerTest, VectorBodyAndTailAgreeBitForBit) {
  for (const Case& test_case : Cases()) {
    SCOPED_TRACE(test_case.name);
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> weights(16), grads(16);
    for (float& x : weights) x = normal(rng);
    auto wide = MakeOptimizer(test_case.options, 16);
    auto narrow = MakeOptimizer(test_case.options, 3);
    Tensor wide_master = HostTensor(weights, DType::kF32);
    Tensor narrow_master = HostTensor(
        std::vector<float>(weights.begin(), weights.begin() + 3), DType::kF32);
    Tensor wide_out = HostTensor(weights, DType::kF16);
    Tensor narrow_out = HostTensor({0, 0, 0}, DType::kF16);
    for (int step = 0; step < 5; ++step) {
      for (float& x : grads) x = normal(rng);
      StepArgs args;
      args.lr = 0.05f;
      args.grad_scale = 0.75f;
      ASSERT_TRUE(wide->Step(wide_master,
                             HostTensor(grads, test_case.grad_dtype), args,
                             Stream(), wide_out)
                      .ok());
      ASSERT_TRUE(narrow
                      ->Step(narrow_master,
                             HostTensor(std::vector<float>(grads.begin(),
                                                           grads.begin() + 3),
                                        test_case.grad_dtype),
                             args, Stream(), narrow_out)
                      .ok());
    }
    const auto wide_values = Read(wide_master);
    const auto narrow_values = Read(narrow_master);
    const auto wide_f16 = Read(wide_out);
    const auto narrow_f16 = Read(narrow_out);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(FloatBits(wide_values[i]), FloatBits(narrow_values[i]));
      EXPECT_EQ(wide_f16[i], narrow_f16[i]);
    }
  }
}

TEST(OptimizerTest, FusedCopyBackRoundsLikeTheScalarConversions) {
  // Values whose bf16/f16 rounding is a tie or near one, updated by a plain
  // SGD step of zero so the master weights stay exactly these values.
  std::vector<float> values;
  for (uint32_t bits :
       {0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u, 0xbf808000u,
        0x477fe000u, 0x477ff000u, 0x33800000u, 0x00000001u, 0x7f7fffffu}) {
    values.push_back(BitsToFloat(bits));
  }
  while (values.size() < 19) values.push_back(values[values.size() % 8] * 3);
  const int64_t n = static_cast<int64_t>(values.size());
  OptimizerOptions options;
  options.type = OptimizerType::kSgd;
  for (DType out_dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    auto optimizer = MakeOptimizer(options, n);
    Tensor master = HostTensor(values, DType::kF32);
    Tensor out = HostTensor(std::vector<float>(n, 0.0f), out_dtype);
    StepArgs args;
    args.lr = 0.0f;
    ASSERT_TRUE(optimizer
                    ->Step(master,
                           HostTensor(std::vector<float>(n, 0.0f), DType::kF32),
                           args, Stream(), out)
                    .ok());
    for (int64_t i = 0; i < n; ++i) {
      uint16_t expected = 0, actual = 0;
      if (out_dtype == DType::kBF16) {
        expected = FloatToBf16Bits(values[i]);
        actual = out.data_as<uint16_t>()[i];
      } else if (out_dtype == DType::kF16) {
        expected = FloatToF16Bits(values[i]);
        actual = out.data_as<uint16_t>()[i];
      } else {
        EXPECT_EQ(out.data_as<float>()[i], values[i]);
        continue;
      }
      EXPECT_EQ(actual, expected) << DTypeName(out_dtype) << " element " << i;
    }
  }
}

TEST(OptimizerTest, ValidatesInputsAndModifiesNothingOnError) {
  OptimizerOptions options;
  auto optimizer = MakeOptimizer(options, 4);
  Tensor master = HostTensor({1, 2, 3, 4}, DType::kF32);
  StepArgs args;
  args.lr = 0.1f;
  EXPECT_EQ(
      optimizer
          ->Step(master, HostTensor({1, 2, 3}, DType::kF32), args, Stream())
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(optimizer
                ->Step(HostTensor({1, 2, 3, 4}, DType::kBF16),
                       HostTensor({1, 2, 3, 4}, DType::kF32), args, Stream())
                .code(),
            absl::StatusCode::kInvalidArgument);
  args.lr = NAN;
  EXPECT_EQ(
      optimizer
          ->Step(master, HostTensor({1, 2, 3, 4}, DType::kF32), args, Stream())
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(optimizer->step_count(), 0);
  EXPECT_EQ(Read(master), (std::vector<float>{1, 2, 3, 4}));

  OptimizerOptions bad = options;
  bad.beta2 = 1.0f;
  EXPECT_FALSE(FlatOptimizer::Create(bad, 4, Device::Cpu()).ok());
  bad = options;
  bad.eps = 0.0f;
  EXPECT_FALSE(FlatOptimizer::Create(bad, 4, Device::Cpu()).ok());
  bad.type = OptimizerType::kSgd;
  bad.nesterov = true;  // without momentum
  EXPECT_FALSE(FlatOptimizer::Create(bad, 4, Device::Cpu()).ok());
  bad.weight_decay = -1.0f;
  EXPECT_FALSE(FlatOptimizer::Create(bad, 4, Device::Cpu()).ok());
}

// Checkpoint round trip: state tensors and the step counter written into a
// fresh optimizer continue the run exactly.
TEST(OptimizerTest, RestoredStateContinuesExactly) {
  OptimizerOptions options;
  options.type = OptimizerType::kAdamW;
  options.weight_decay = 0.05f;
  const int64_t n = 37;
  std::vector<float> weights(n, 0.5f), grads(n);
  for (int64_t i = 0; i < n; ++i) grads[i] = 0.01f * (i - 18);
  StepArgs args;
  args.lr = 0.01f;
  auto first = MakeOptimizer(options, n);
  Tensor master = HostTensor(weights, DType::kF32);
  const Tensor g = HostTensor(grads, DType::kF32);
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(first->Step(master, g, args, Stream()).ok());

  auto resumed = MakeOptimizer(options, n);
  resumed->set_step_count(first->step_count());
  for (size_t k = 0; k < first->StateTensors().size(); ++k) {
    ASSERT_TRUE(Copy(first->StateTensors()[k].tensor,
                     resumed->StateTensors()[k].tensor, Stream())
                    .ok());
  }
  Tensor master_copy = HostTensor(Read(master), DType::kF32);
  ASSERT_TRUE(first->Step(master, g, args, Stream()).ok());
  ASSERT_TRUE(resumed->Step(master_copy, g, args, Stream()).ok());
  EXPECT_EQ(Read(master), Read(master_copy));
  EXPECT_EQ(resumed->step_count(), 4);
}

// Updating a partition range by range (then AdvanceStep) equals one Step
// over the whole partition.
TEST(OptimizerTest, StepRangeByRangeEqualsOneStep) {
  OptimizerOptions options;
  options.type = OptimizerType::kAdam;
  options.weight_decay = 0.01;
  const int64_t n = 40;
  std::vector<float> weights(n), grads(n);
  for (int64_t i = 0; i < n; ++i) {
    weights[i] = 0.1f * i - 2;
    grads[i] = 0.03f * (i % 7) - 0.1f;
  }
  auto whole = MakeOptimizer(options, n);
  auto ranged = MakeOptimizer(options, n);
  Tensor whole_master = HostTensor(weights, DType::kF32);
  Tensor ranged_master = HostTensor(weights, DType::kF32);
  const Tensor g = HostTensor(grads, DType::kBF16);
  StepArgs args;
  args.lr = 0.02;
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(whole->Step(whole_master, g, args, Stream()).ok());
    for (int64_t begin : {0, 13, 29}) {
      const int64_t end = begin == 29 ? n : (begin == 0 ? 13 : 29);
      ASSERT_TRUE(ranged
                      ->StepRange(begin,
                                  ranged_master.Slice(begin, end - begin),
                                  g.Slice(begin, end - begin), args, Stream())
                      .ok());
    }
    EXPECT_EQ(ranged->step_count(), step);
    ranged->AdvanceStep();
  }
  EXPECT_EQ(Read(whole_master), Read(ranged_master));
  EXPECT_EQ(Read(whole->StateTensors()[1].tensor),
            Read(ranged->StateTensors()[1].tensor));
  EXPECT_EQ(ranged
                ->StepRange(30, ranged_master.Slice(0, 11), g.Slice(0, 11),
                            args, Stream())
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// The exact 16+16 master (StepSplitRange) against StepRange's f32 master
// over every optimizer: the joined halves are the f32 master bit for bit
// after each step, hi its ties-away bf16, and the state identical. Starts
// with exact ties of both parities.
TEST(OptimizerTest, SplitMasterStepEqualsF32MasterStep) {
  std::vector<OptimizerOptions> all(4);
  all[0].type = OptimizerType::kAdam;
  all[0].weight_decay = 0.01;
  all[1].type = OptimizerType::kAdamW;
  all[1].weight_decay = 0.1;
  all[2].type = OptimizerType::kSgd;
  all[2].momentum = 0.9;
  all[3].type = OptimizerType::kSgd;
  const int64_t n = 37;
  for (const OptimizerOptions& options : all) {
    SCOPED_TRACE(OptimizerTypeName(options.type));
    std::vector<float> weights(n), grads(n);
    for (int64_t i = 0; i < n; ++i) {
      weights[i] = 0.1f * i - 2;
      if (i % 4 == 0) {  // exact ties, both parities of the high half
        weights[i] = BitsToFloat((FloatBits(weights[i]) & 0xfffe0000u) |
                                 0x8000u | static_cast<uint32_t>(i % 8) << 14);
      }
      grads[i] = 0.03f * (i % 7) - 0.1f;
    }
    auto f32 = MakeOptimizer(options, n);
    auto split = MakeOptimizer(options, n);
    Tensor master = HostTensor(weights, DType::kF32);
    auto hi = Tensor::Empty({n}, DType::kBF16, Device::Cpu());
    auto lo = Tensor::Empty({n}, DType::kBF16, Device::Cpu());
    ASSERT_TRUE(hi.ok() && lo.ok());
    for (int64_t i = 0; i < n; ++i) {
      const Bf16Split halves = SplitForBf16(weights[i]);
      hi->data_as<uint16_t>()[i] = halves.hi;
      lo->data_as<uint16_t>()[i] = halves.lo;
    }
    const Tensor g = HostTensor(grads, DType::kBF16);
    StepArgs args;
    args.lr = 0.02;
    for (int step = 0; step < 3; ++step) {
      ASSERT_TRUE(f32->StepRange(0, master, g, args, Stream()).ok());
      ASSERT_TRUE(split->StepSplitRange(0, *hi, *lo, g, args, Stream()).ok());
      f32->AdvanceStep();
      split->AdvanceStep();
      for (int64_t i = 0; i < n; ++i) {
        const float p = master.data_as<float>()[i];
        ASSERT_EQ(FloatBits(JoinBf16Split(hi->data_as<uint16_t>()[i],
                                          lo->data_as<uint16_t>()[i])),
                  FloatBits(p))
            << "step " << step << " element " << i;
        ASSERT_EQ(hi->data_as<uint16_t>()[i], SplitForBf16(p).hi);
      }
      const auto f32_state = f32->StateTensors();
      const auto split_state = split->StateTensors();
      ASSERT_EQ(f32_state.size(), split_state.size());
      for (size_t k = 0; k < f32_state.size(); ++k) {
        EXPECT_EQ(Read(f32_state[k].tensor), Read(split_state[k].tensor));
      }
    }
  }
  // The halves must be a bf16 weight and a 2-byte remainder.
  auto split = MakeOptimizer(all[0], n);
  const Tensor f32_hi = HostTensor(std::vector<float>(n, 1.0f), DType::kF32);
  const Tensor bf16 = HostTensor(std::vector<float>(n, 1.0f), DType::kBF16);
  const absl::Status status = split->StepSplitRange(
      0, f32_hi, bf16, HostTensor(std::vector<float>(n, 0.0f), DType::kF32),
      StepArgs(), Stream());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("16+16"), std::string::npos) << status;
}

TEST(OptimizerTest, StateBytesPerElement) {
  OptimizerOptions options;
  EXPECT_EQ(StateBytesPerElement(options), 8);
  options.type = OptimizerType::kSgd;
  EXPECT_EQ(StateBytesPerElement(options), 0);
  options.momentum = 0.9f;
  EXPECT_EQ(StateBytesPerElement(options), 4);
}

// The compressed formats the optimizer tests run (bf16.bf16_optimizer_states
// with either rounding, optimizer.params.blockwise_8bit_moments).
std::vector<OptimizerOptions> CompressedAdams() {
  std::vector<OptimizerOptions> all;
  OptimizerOptions adamw = TestOptimizers().adamw;
  adamw.moments = MomentFormat::kBf16;
  all.push_back(adamw);
  adamw.stochastic_rounding = true;
  adamw.rounding_seed = 5;
  all.push_back(adamw);
  adamw.stochastic_rounding = false;
  adamw.moments = MomentFormat::kBlockwise8;
  all.push_back(adamw);
  return all;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The device optimizer's CPU path is offload's kernel: the same bits as
// CpuOptimizer::Step from the same inputs, and its 16+16 master the same
// as its f32 master; the state reads and writes back unchanged.
TEST(OptimizerTest, CompressedMomentsMatchTheCpuOptimizer) {
  const int64_t count = 4096 + 300;  // 8-bit: 17 blocks, the last short
  for (const OptimizerOptions& options : CompressedAdams()) {
    const MomentsRun flat =
        RunFlatOptimizer(Device::Cpu(), options, count, 5, DType::kBF16, false);
    ASSERT_EQ(flat.decoded.size(), 2u);
    const MomentsRun split =
        RunFlatOptimizer(Device::Cpu(), options, count, 5, DType::kBF16, true);
    // The 16+16 master: the same master and moments (weights tie away).
    EXPECT_TRUE(SameBits(flat.master, split.master));
    EXPECT_TRUE(SameBits(flat.decoded[0], split.decoded[0]));
    EXPECT_TRUE(SameBits(flat.decoded[1], split.decoded[1]));

    // CpuOptimizer from the same inputs (RunFlatOptimizer's generator).
    std::mt19937 rng(17);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> master(count);
    for (float& p : master) p = Bf16BitsToFloat(FloatToBf16Bits(normal(rng)));
    auto cpu = offload::CpuOptimizer::Create(options, count);
    ASSERT_TRUE(cpu.ok());
    for (int s = 0; s < 5; ++s) {
      std::vector<float> g(count);
      for (int64_t i = 0; i < count; ++i) {
        g[i] = (i % 61 == 9 && s > 0)
                   ? 0.0f
                   : normal(rng) *
                         std::ldexp(
                             1.0f, static_cast<int>((i / 256) % 9 + i % 3) - 6);
      }
      std::vector<uint16_t> bf16(count);
      for (int64_t i = 0; i < count; ++i) bf16[i] = FloatToBf16Bits(g[i]);
      StepArgs args;
      args.lr = 1e-2;
      args.grad_scale = 0.5f;
      ASSERT_TRUE(
          (*cpu)->Step(master.data(), bf16.data(), DType::kBF16, args).ok());
    }
    EXPECT_TRUE(SameBits(flat.master, master));
    for (int a = 0; a < 2; ++a) {
      std::vector<float> state(count);
      (*cpu)->ReadState(a, 0, count, state.data());
      EXPECT_TRUE(SameBits(flat.decoded[a], state)) << "array " << a;
    }
  }
}

TEST(OptimizerTest, CompressedStateReadsAndWritesBackUnchanged) {
  for (const OptimizerOptions& options : CompressedAdams()) {
    auto optimizer = FlatOptimizer::Create(options, 5000, Device::Cpu());
    ASSERT_TRUE(optimizer.ok());
    // Give the state values: a few steps.
    Tensor master = *Tensor::Zeros({5000}, DType::kF32, Device::Cpu());
    std::vector<float> g(5000);
    for (int i = 0; i < 5000; ++i) g[i] = std::sin(0.37f * i) * (1 + i % 5);
    Tensor grads =
        *FromHostFloats(g, {5000}, DType::kF32, Device::Cpu(), Stream());
    StepArgs args;
    args.lr = 1e-3;
    for (int s = 0; s < 3; ++s) {
      ASSERT_TRUE((*optimizer)->Step(master, grads, args, Stream()).ok());
    }
    const std::vector<NamedStateTensor> state = (*optimizer)->StateTensors();
    for (int a = 0; a < 2; ++a) {
      const std::vector<float> raw = *ToHostFloats(state[a].tensor, Stream());
      Tensor values = *Tensor::Empty({1000}, DType::kF32, Device::Cpu());
      ASSERT_TRUE((*optimizer)->ReadState(a, 700, values, Stream()).ok());
      ASSERT_TRUE((*optimizer)->WriteState(a, 700, values, Stream()).ok());
      EXPECT_TRUE(SameBits(raw, *ToHostFloats(state[a].tensor, Stream())));
    }
    // A range the state does not hold, or not host f32, is refused.
    Tensor wrong = *Tensor::Empty({10}, DType::kBF16, Device::Cpu());
    EXPECT_TRUE(absl::IsInvalidArgument(
        (*optimizer)->ReadState(0, 0, wrong, Stream())));
    Tensor past = *Tensor::Empty({10}, DType::kF32, Device::Cpu());
    EXPECT_TRUE(absl::IsInvalidArgument(
        (*optimizer)->WriteState(1, 4995, past, Stream())));
  }
  // 8-bit ranges start on blocks.
  OptimizerOptions eight = TestOptimizers().adamw;
  eight.moments = MomentFormat::kBlockwise8;
  auto optimizer = FlatOptimizer::Create(eight, 5000, Device::Cpu());
  ASSERT_TRUE(optimizer.ok());
  Tensor master = *Tensor::Zeros({100}, DType::kF32, Device::Cpu());
  StepArgs args;
  args.lr = 1e-3;
  const absl::Status bad =
      (*optimizer)->StepRange(10, master, master, args, Stream());
  EXPECT_TRUE(absl::IsInvalidArgument(bad)) << bad;
  // Below 4096 elements 8-bit falls back to f32.
  auto small = FlatOptimizer::Create(eight, 1000, Device::Cpu());
  ASSERT_TRUE(small.ok());
  EXPECT_EQ((*small)->moment_format(), MomentFormat::kF32);
  EXPECT_EQ(StateBytesPerElement(eight), 2);
}

}  // namespace
}  // namespace zero
}  // namespace ze
