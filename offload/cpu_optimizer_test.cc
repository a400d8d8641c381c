#include "offload/cpu_optimizer.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gtest/gtest.h"

namespace ze {
namespace offload {
namespace {

constexpr SimdPath kAllPaths[] = {SimdPath::kScalar, SimdPath::kAvx2,
                                  SimdPath::kAvx512};
constexpr DType kFloatTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

struct NamedOptions {
  std::string name;
  OptimizerOptions options;
};

// Every optimizer type, with weight decay, and SGD's variants.
std::vector<NamedOptions> AllOptimizers() {
  std::vector<NamedOptions> all;
  OptimizerOptions adam;
  adam.type = OptimizerType::kAdam;
  adam.weight_decay = 0.01;
  all.push_back({"adam", adam});
  OptimizerOptions adamw = adam;
  adamw.type = OptimizerType::kAdamW;
  adamw.beta2 = 0.95;
  adamw.weight_decay = 0.1;
  all.push_back({"adamw", adamw});
  OptimizerOptions sgd;
  sgd.type = OptimizerType::kSgd;
  sgd.weight_decay = 0.001;
  all.push_back({"sgd", sgd});
  OptimizerOptions momentum = sgd;
  momentum.momentum = 0.9;
  momentum.dampening = 0.1;
  all.push_back({"sgd_momentum", momentum});
  OptimizerOptions nesterov = sgd;
  nesterov.momentum = 0.9;
  nesterov.nesterov = true;
  all.push_back({"sgd_nesterov", nesterov});
  return all;
}

// Bytes of `count` elements of `dtype` holding `values` rounded to it.
std::vector<uint8_t> Encode(const std::vector<float>& values, DType dtype) {
  std::vector<uint8_t> bytes(values.size() * SizeOf(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    StoreFromFloat(bytes.data(), dtype, i, values[i]);
  }
  return bytes;
}

// Inputs for `steps` steps over `count` elements: weights and gradients
// of mixed signs and magnitudes, including exact zeros.
struct Problem {
  std::vector<float> master;
  std::vector<std::vector<uint8_t>> grads;  // one per step
};

Problem MakeProblem(int64_t count, DType grad_dtype, int steps, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Problem problem;
  problem.master.resize(count);
  for (float& p : problem.master) p = normal(rng);
  for (int s = 0; s < steps; ++s) {
    std::vector<float> g(count);
    for (int64_t i = 0; i < count; ++i) {
      g[i] = (i % 97 == 5) ? 0.0f : normal(rng) * std::ldexp(1.0f, i % 9 - 6);
    }
    problem.grads.push_back(Encode(g, grad_dtype));
  }
  return problem;
}

struct Result {
  std::vector<float> master;
  std::vector<float> exp_avg, exp_avg_sq, momentum_buffer;
  std::vector<uint8_t> out;  // the last step's fused write
};

std::vector<float> Copy(const float* data, int64_t count) {
  return data == nullptr ? std::vector<float>()
                         : std::vector<float>(data, data + count);
}

// Runs every step of `problem` through a CpuOptimizer with `execution`.
Result RunSteps(const OptimizerOptions& options, const Problem& problem,
                DType grad_dtype, bool with_out, DType out_dtype,
                const CpuExecutionOptions& execution) {
  const int64_t count = problem.master.size();
  auto optimizer = CpuOptimizer::Create(options, count, execution);
  EXPECT_TRUE(optimizer.ok()) << optimizer.status();
  Result result;
  result.master = problem.master;
  if (with_out) result.out.assign(count * SizeOf(out_dtype), 0xAB);
  StepArgs args;
  args.grad_scale = 0.5f;
  for (size_t s = 0; s < problem.grads.size(); ++s) {
    args.lr = 1e-3 * (s + 1);  // a schedule: lr changes every step
    const absl::Status status =
        (*optimizer)
            ->Step(result.master.data(), problem.grads[s].data(), grad_dtype,
                   args, with_out ? result.out.data() : nullptr, out_dtype);
    EXPECT_TRUE(status.ok()) << status;
  }
  result.exp_avg = Copy((*optimizer)->exp_avg(), count);
  result.exp_avg_sq = Copy((*optimizer)->exp_avg_sq(), count);
  result.momentum_buffer = Copy((*optimizer)->momentum_buffer(), count);
  return result;
}

// Bit-for-bit equality, reporting the first difference.
void ExpectBitwiseEqual(const std::vector<float>& expected,
                        const std::vector<float>& actual, const char* what) {
  ASSERT_EQ(expected.size(), actual.size()) << what;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (FloatBits(expected[i]) != FloatBits(actual[i])) {
      FAIL() << what << "[" << i << "]: expected " << expected[i] << " got "
             << actual[i];
    }
  }
}

void ExpectSameResult(const Result& expected, const Result& actual) {
  ExpectBitwiseEqual(expected.master, actual.master, "master");
  ExpectBitwiseEqual(expected.exp_avg, actual.exp_avg, "exp_avg");
  ExpectBitwiseEqual(expected.exp_avg_sq, actual.exp_avg_sq, "exp_avg_sq");
  ExpectBitwiseEqual(expected.momentum_buffer, actual.momentum_buffer,
                     "momentum_buffer");
  ASSERT_EQ(expected.out.size(), actual.out.size());
  EXPECT_EQ(
      std::memcmp(expected.out.data(), actual.out.data(), expected.out.size()),
      0)
      << "fused 16-bit/f32 write differs";
}

CpuExecutionOptions Execution(SimdPath path, int threads,
                              int64_t tile_bytes = 64 * 1024) {
  CpuExecutionOptions execution;
  execution.simd_path = path;
  execution.num_threads = threads;
  execution.tile_bytes = tile_bytes;
  return execution;
}

// Every supported vector path against the scalar reference, bit for bit:
// every path evaluates the same f32 operations and sqrt/division are
// correctly rounded in all of them, so no ulp tolerance is needed.
// AdamW (decoupled weight decay 0.1) over `count` elements, 3 steps of bf16
// gradients from `seed`, and what plain Steps with a bf16 output give: the
// reference the range and external-state forms are held to.
struct AdamWCase {
  OptimizerOptions options;
  Problem problem;
  Result expected;
};
AdamWCase AdamWReference(int64_t count, uint32_t seed) {
  AdamWCase reference;
  reference.options.type = OptimizerType::kAdamW;
  reference.options.weight_decay = 0.1;
  reference.problem = MakeProblem(count, DType::kBF16, 3, seed);
  reference.expected =
      RunSteps(reference.options, reference.problem, DType::kBF16, true,
               DType::kBF16, CpuExecutionOptions());
  return reference;
}

TEST(CpuOptimizerTest, EveryPathMatchesScalarBitForBit) {
  for (SimdPath path : kAllPaths) {
    if (!SimdPathSupported(path)) {
      std::printf("skipping %s: this CPU lacks it\n", SimdPathName(path));
      continue;
    }
    for (const NamedOptions& optimizer : AllOptimizers()) {
      for (DType grad_dtype : kFloatTypes) {
        for (int64_t count : {1, 7, 53, 1000}) {
          const Problem problem = MakeProblem(count, grad_dtype, 3, count);
          // No fused write, then each output dtype.
          for (int out = -1; out < 3; ++out) {
            const DType out_dtype = out < 0 ? DType::kBF16 : kFloatTypes[out];
            SCOPED_TRACE(::testing::Message()
                         << SimdPathName(path) << " " << optimizer.name
                         << " grads " << DTypeName(grad_dtype) << " out "
                         << (out < 0 ? "none" : DTypeName(out_dtype))
                         << " count " << count);
            const Result expected =
                RunSteps(optimizer.options, problem, grad_dtype, out >= 0,
                         out_dtype, Execution(SimdPath::kScalar, 1));
            const Result actual =
                RunSteps(optimizer.options, problem, grad_dtype, out >= 0,
                         out_dtype, Execution(path, 1));
            ExpectSameResult(expected, actual);
          }
        }
      }
    }
  }
}

// The exact 16+16 master (StepBuffers::master_lo) through RunStepKernel on
// every path: after every step, JoinBf16Split(hi, lo) is the f32 master of
// the kernel's f32 path bit for bit, hi its SplitForBf16 (the bf16 weights
// with ties away from zero; also what the f32 path's bf16_ties_away output
// writes), and the moments are identical. Weights are
// started at exact ties too, so both tie directions are exercised.
TEST(CpuOptimizerTest, SplitMasterEqualsF32MasterOnEveryPath) {
  for (SimdPath path : kAllPaths) {
    if (!SimdPathSupported(path)) continue;
    for (const NamedOptions& optimizer : AllOptimizers()) {
      for (DType grad_dtype : kFloatTypes) {
        for (int64_t count : {1, 7, 53, 1000}) {
          SCOPED_TRACE(::testing::Message()
                       << SimdPathName(path) << " " << optimizer.name
                       << " grads " << DTypeName(grad_dtype) << " count "
                       << count);
          Problem problem = MakeProblem(count, grad_dtype, 3, count + 11);
          for (int64_t i = 0; i < count; i += 5) {  // exact ties, both parities
            problem.master[i] = BitsToFloat(
                (FloatBits(problem.master[i]) & 0xffff0000u) | 0x8000u);
          }
          std::vector<float> master = problem.master;
          std::vector<uint16_t> hi(count), lo(count);
          for (int64_t i = 0; i < count; ++i) {
            const Bf16Split split = SplitForBf16(master[i]);
            hi[i] = split.hi;
            lo[i] = split.lo;
          }
          const bool sgd = optimizer.options.type == OptimizerType::kSgd;
          const bool has_buffer = sgd && optimizer.options.momentum != 0.0;
          std::vector<float> f32_state0(count, 0.0f), f32_state1(count, 0.0f);
          std::vector<float> split_state0 = f32_state0,
                             split_state1 = f32_state1;
          StepArgs args;
          args.grad_scale = 0.5f;
          for (int step = 0; step < 3; ++step) {
            args.lr = 1e-3 * (step + 1);
            auto coefficients = ComputeStepCoefficients(optimizer.options, step,
                                                        args, has_buffer);
            ASSERT_TRUE(coefficients.ok()) << coefficients.status();
            StepBuffers f32;
            f32.master = master.data();
            f32.state0 = sgd && !has_buffer ? nullptr : f32_state0.data();
            f32.state1 = sgd ? nullptr : f32_state1.data();
            f32.grads = problem.grads[step].data();
            f32.grad_dtype = grad_dtype;
            f32.count = count;
            // The f32 master's own path, its bf16 weights rounded as hi.
            std::vector<uint16_t> away(count);
            f32.out = away.data();
            f32.out_dtype = DType::kBF16;
            f32.bf16_ties_away = true;
            RunStepKernel(path, *coefficients, f32);
            StepBuffers split = f32;
            split.bf16_ties_away = false;
            split.master = nullptr;
            split.state0 = sgd && !has_buffer ? nullptr : split_state0.data();
            split.state1 = sgd ? nullptr : split_state1.data();
            split.out = hi.data();
            split.out_dtype = DType::kBF16;
            split.master_lo = lo.data();
            RunStepKernel(path, *coefficients, split);
            for (int64_t i = 0; i < count; ++i) {
              const Bf16Split expected = SplitForBf16(master[i]);
              ASSERT_EQ(FloatBits(JoinBf16Split(hi[i], lo[i])),
                        FloatBits(master[i]))
                  << "step " << step << " element " << i;
              ASSERT_EQ(hi[i], expected.hi) << "element " << i;
              ASSERT_EQ(away[i], expected.hi) << "ties-away out " << i;
            }
            ExpectBitwiseEqual(f32_state0, split_state0, "state0");
            ExpectBitwiseEqual(f32_state1, split_state1, "state1");
          }
        }
      }
    }
  }
}

// A size far from any vector width or tile, over several tiles and threads.
TEST(CpuOptimizerTest, LargeOddSizeMatchesScalarAcrossThreads) {
  constexpr int64_t kCount = 1000003;
  for (const NamedOptions& optimizer : AllOptimizers()) {
    for (DType grad_dtype : kFloatTypes) {
      const Problem problem = MakeProblem(kCount, grad_dtype, 2, 7);
      const Result expected =
          RunSteps(optimizer.options, problem, grad_dtype, true, DType::kBF16,
                   Execution(SimdPath::kScalar, 1));
      for (SimdPath path : kAllPaths) {
        if (!SimdPathSupported(path)) {
          std::printf("skipping %s: this CPU lacks it\n", SimdPathName(path));
          continue;
        }
        for (int threads : {1, 3, 4}) {
          SCOPED_TRACE(::testing::Message()
                       << SimdPathName(path) << " " << optimizer.name
                       << " grads " << DTypeName(grad_dtype) << " threads "
                       << threads);
          ExpectSameResult(
              expected, RunSteps(optimizer.options, problem, grad_dtype, true,
                                 DType::kBF16, Execution(path, threads)));
        }
      }
    }
  }
}

// Small tiles: many tiles per thread, a tail tile shorter than a vector.
TEST(CpuOptimizerTest, TileSizeDoesNotChangeTheResult) {
  constexpr int64_t kCount = 100003;
  OptimizerOptions options;  // AdamW
  options.weight_decay = 0.05;
  const Problem problem = MakeProblem(kCount, DType::kBF16, 2, 11);
  const Result expected =
      RunSteps(options, problem, DType::kBF16, true, DType::kF16,
               Execution(SimdPath::kScalar, 1));
  for (int64_t tile_bytes : {256, 1000, 4096, 1 << 20}) {
    SCOPED_TRACE(::testing::Message() << "tile_bytes " << tile_bytes);
    ExpectSameResult(expected,
                     RunSteps(options, problem, DType::kBF16, true, DType::kF16,
                              Execution(BestSimdPath(), 3, tile_bytes)));
  }
}

// The formulas themselves, against a plain double-precision transcription
// of the documented semantics (the bit-for-bit tests above would not catch
// a formula all paths share). Tolerance: f32 rounding of a few operations.
TEST(CpuOptimizerTest, MatchesTheDocumentedFormulas) {
  constexpr int64_t kCount = 257;
  constexpr int kSteps = 4;
  for (const NamedOptions& named : AllOptimizers()) {
    SCOPED_TRACE(named.name);
    const OptimizerOptions& o = named.options;
    const Problem problem = MakeProblem(kCount, DType::kF32, kSteps, 3);
    const Result actual = RunSteps(o, problem, DType::kF32, true, DType::kF32,
                                   CpuExecutionOptions());
    for (int64_t i = 0; i < kCount; ++i) {
      double p = problem.master[i], m = 0, v = 0, buf = 0;
      for (int s = 0; s < kSteps; ++s) {
        const double lr = 1e-3 * (s + 1);
        const int t = s + 1;
        float grad;
        std::memcpy(&grad, problem.grads[s].data() + i * 4, 4);
        double g = static_cast<double>(grad) * 0.5;
        if (o.type == OptimizerType::kSgd) {
          g += o.weight_decay * p;
          if (o.momentum != 0) {
            buf = s == 0 ? g : o.momentum * buf + (1 - o.dampening) * g;
            g = o.nesterov ? g + o.momentum * buf : buf;
          }
          p -= lr * g;
        } else {
          if (o.type == OptimizerType::kAdamW) {
            p *= 1 - lr * o.weight_decay;
          } else {
            g += o.weight_decay * p;
          }
          m = o.beta1 * m + (1 - o.beta1) * g;
          v = o.beta2 * v + (1 - o.beta2) * g * g;
          p -= lr / (1 - std::pow(o.beta1, t)) * m /
               (std::sqrt(v) / std::sqrt(1 - std::pow(o.beta2, t)) + o.eps);
        }
      }
      ASSERT_NEAR(actual.master[i], p, 1e-5 * (1 + std::fabs(p)))
          << "element " << i;
      float out;
      std::memcpy(&out, actual.out.data() + i * 4, 4);
      ASSERT_EQ(FloatBits(out), FloatBits(actual.master[i]));
    }
  }
}

// Updating a partition range by range equals one Step.
TEST(CpuOptimizerTest, StepRangeByRangeEqualsStep) {
  constexpr int64_t kCount = 10007;
  OptimizerOptions options;
  options.type = OptimizerType::kAdam;
  const Problem problem = MakeProblem(kCount, DType::kF16, 3, 5);
  const Result expected = RunSteps(options, problem, DType::kF16, true,
                                   DType::kBF16, CpuExecutionOptions());

  auto optimizer = CpuOptimizer::Create(options, kCount);
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  std::vector<float> master = problem.master;
  std::vector<uint8_t> out(kCount * 2);
  const int64_t cuts[] = {0, 1, 4000, 4017, kCount};
  StepArgs args;
  args.grad_scale = 0.5f;
  for (int s = 0; s < 3; ++s) {
    args.lr = 1e-3 * (s + 1);
    for (int r = 0; r + 1 < 5; ++r) {
      const int64_t begin = cuts[r], count = cuts[r + 1] - cuts[r];
      ASSERT_TRUE((*optimizer)
                      ->StepRange(begin, count, master.data() + begin,
                                  problem.grads[s].data() + begin * 2,
                                  DType::kF16, args, out.data() + begin * 2,
                                  DType::kBF16)
                      .ok());
    }
    (*optimizer)->AdvanceStep();
  }
  EXPECT_EQ((*optimizer)->step_count(), 3);
  ExpectBitwiseEqual(expected.master, master, "master");
  ExpectBitwiseEqual(expected.exp_avg, Copy((*optimizer)->exp_avg(), kCount),
                     "exp_avg");
  EXPECT_EQ(std::memcmp(expected.out.data(), out.data(), out.size()), 0);
}

// Caller-held state (NVMe swap buffers) gives the optimizer's own result;
// and writing the 16-bit output over the gradients themselves (out ==
// grads) gives the same as a separate output buffer.
TEST(CpuOptimizerTest, ExternalStateAndOutputOverGradientsMatchStep) {
  constexpr int64_t kCount = 10007;
  const auto [options, problem, expected] = AdamWReference(kCount, 9);

  auto optimizer = CpuOptimizer::Create(options, 0);
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  std::vector<float> master = problem.master;
  std::vector<float> exp_avg(kCount, 0.0f), exp_avg_sq(kCount, 0.0f);
  std::vector<uint8_t> grads_then_out;
  StepArgs args;
  args.grad_scale = 0.5f;
  for (int s = 0; s < 3; ++s) {
    args.lr = 1e-3 * (s + 1);
    grads_then_out = problem.grads[s];
    ASSERT_TRUE((*optimizer)
                    ->StepExternal(kCount, master.data(), exp_avg.data(),
                                   exp_avg_sq.data(), grads_then_out.data(),
                                   DType::kBF16, args, grads_then_out.data(),
                                   DType::kBF16)
                    .ok());
    (*optimizer)->AdvanceStep();
  }
  ExpectBitwiseEqual(expected.master, master, "master");
  ExpectBitwiseEqual(expected.exp_avg, exp_avg, "exp_avg");
  ASSERT_EQ(expected.out.size(), grads_then_out.size());
  EXPECT_EQ(std::memcmp(expected.out.data(), grads_then_out.data(),
                        grads_then_out.size()),
            0);
  // Adam without its state is refused.
  EXPECT_EQ((*optimizer)
                ->StepExternal(kCount, master.data(), nullptr, nullptr,
                               grads_then_out.data(), DType::kBF16, args)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CpuOptimizerTest, DefaultsToTheBestPathAndHardwareThreads) {
  auto optimizer = CpuOptimizer::Create(OptimizerOptions(), 10);
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  EXPECT_EQ((*optimizer)->simd_path(), BestSimdPath());
  EXPECT_GE((*optimizer)->num_threads(), 1);
  EXPECT_EQ((*optimizer)->tile_elements(), 65536);  // 256 KiB of f32
  EXPECT_TRUE(SimdPathSupported(SimdPath::kScalar));
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ((*optimizer)->exp_avg()[i], 0.0f);
    EXPECT_EQ((*optimizer)->exp_avg_sq()[i], 0.0f);
  }
  EXPECT_EQ((*optimizer)->momentum_buffer(), nullptr);
}

TEST(CpuOptimizerTest, RejectsBadOptionsNamingThem) {
  auto expect_error = [](const OptimizerOptions& options,
                         const CpuExecutionOptions& execution,
                         const std::string& needle) {
    auto optimizer = CpuOptimizer::Create(options, 16, execution);
    ASSERT_FALSE(optimizer.ok()) << needle;
    EXPECT_EQ(optimizer.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(optimizer.status().message().find(needle), std::string::npos)
        << optimizer.status();
  };
  OptimizerOptions bad_beta;
  bad_beta.beta2 = 1.0;
  expect_error(bad_beta, {}, "betas");
  OptimizerOptions bad_eps;
  bad_eps.eps = 0;
  expect_error(bad_eps, {}, "eps");
  OptimizerOptions bad_decay;
  bad_decay.weight_decay = -1;
  expect_error(bad_decay, {}, "weight_decay");
  OptimizerOptions bad_nesterov;
  bad_nesterov.type = OptimizerType::kSgd;
  bad_nesterov.nesterov = true;
  expect_error(bad_nesterov, {}, "nesterov");
  CpuExecutionOptions bad_threads;
  bad_threads.num_threads = -2;
  expect_error(OptimizerOptions(), bad_threads, "num_threads");
  CpuExecutionOptions bad_tile;
  bad_tile.tile_bytes = 100;
  expect_error(OptimizerOptions(), bad_tile, "tile_bytes");
  for (SimdPath path : kAllPaths) {
    if (!SimdPathSupported(path)) {
      CpuExecutionOptions unsupported;
      unsupported.simd_path = path;
      expect_error(OptimizerOptions(), unsupported, "not supported");
    }
  }
}

TEST(CpuOptimizerTest, RejectsBadStepsWithoutModifyingAnything) {
  auto optimizer = CpuOptimizer::Create(OptimizerOptions(), 16);
  ASSERT_TRUE(optimizer.ok());
  std::vector<float> master(16, 1.0f), grads(16, 1.0f);
  StepArgs args;
  args.lr = 0.1;
  auto expect_error = [&](absl::Status status, const std::string& needle) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_NE(status.message().find(needle), std::string::npos) << status;
  };
  expect_error(
      (*optimizer)->Step(master.data(), grads.data(), DType::kI32, args),
      "grad_dtype");
  expect_error((*optimizer)
                   ->Step(master.data(), grads.data(), DType::kF32, args,
                          master.data(), DType::kI32),
               "out_dtype");
  expect_error((*optimizer)->Step(nullptr, grads.data(), DType::kF32, args),
               "master_weights");
  expect_error((*optimizer)->Step(master.data(), nullptr, DType::kF32, args),
               "grads");
  expect_error(
      (*optimizer)
          ->StepRange(10, 7, master.data(), grads.data(), DType::kF32, args),
      "range [10, 17)");
  StepArgs bad_lr = args;
  bad_lr.lr = NAN;
  expect_error(
      (*optimizer)->Step(master.data(), grads.data(), DType::kF32, bad_lr),
      "lr");
  StepArgs bad_beta = args;
  bad_beta.beta1 = 1.5;
  expect_error(
      (*optimizer)->Step(master.data(), grads.data(), DType::kF32, bad_beta),
      "beta1 override");
  EXPECT_EQ((*optimizer)->step_count(), 0);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(master[i], 1.0f);
    EXPECT_EQ((*optimizer)->exp_avg()[i], 0.0f);
  }
}

// Every execution choice (split, pinning, page advice, streamed out,
// prefetch) leaves the result bit for bit the scalar reference's, with the
// fused write starting off a cache line (the streamed path's peel).
TEST(CpuOptimizerTest, ExecutionChoicesDoNotChangeTheResult) {
  constexpr int64_t kCount = 600011;  // > one 2 MiB huge page of f32
  for (const NamedOptions& optimizer : AllOptimizers()) {
    for (DType out_dtype : kFloatTypes) {
      const Problem problem = MakeProblem(kCount, DType::kBF16, 2, 13);
      const Result expected =
          RunSteps(optimizer.options, problem, DType::kBF16, true, out_dtype,
                   Execution(SimdPath::kScalar, 1));
      for (int variant = 0; variant < 6; ++variant) {
        CpuExecutionOptions execution = Execution(BestSimdPath(), 3, 4096);
        execution.schedule = variant % 2 == 0 ? CpuSchedule::kStaticSplit
                                              : CpuSchedule::kDynamicTiles;
        execution.nontemporal_out = variant < 4;
        execution.huge_pages = variant < 2;
        execution.pin_threads = variant == 2;
        execution.prefetch_bytes = variant == 3 ? 1024 : 0;
        SCOPED_TRACE(::testing::Message()
                     << optimizer.name << " out " << DTypeName(out_dtype)
                     << " variant " << variant);
        ExpectSameResult(
            expected, RunSteps(optimizer.options, problem, DType::kBF16, true,
                               out_dtype, execution));
        // The same step with `out` one element past a cache line.
        const int64_t element = SizeOf(out_dtype);
        auto shifted =
            CpuOptimizer::Create(optimizer.options, kCount, execution);
        ASSERT_TRUE(shifted.ok()) << shifted.status();
        std::vector<float> master = problem.master;
        std::vector<uint8_t> out_storage((kCount + 64) * element);
        uint8_t* out =
            out_storage.data() +
            (64 - reinterpret_cast<uintptr_t>(out_storage.data()) % 64) +
            element;
        StepArgs args;
        args.grad_scale = 0.5f;
        for (int s = 0; s < 2; ++s) {
          args.lr = 1e-3 * (s + 1);
          ASSERT_TRUE((*shifted)
                          ->Step(master.data(), problem.grads[s].data(),
                                 DType::kBF16, args, out, out_dtype)
                          .ok());
        }
        ExpectBitwiseEqual(expected.master, master, "shifted master");
        EXPECT_EQ(std::memcmp(expected.out.data(), out, kCount * element), 0);
      }
    }
  }
}

// `out` == `grads` (same dtype): the buffer that held the gradients ends
// holding the updated weights, exactly as with a separate `out`.
TEST(CpuOptimizerTest, OutMayEqualGradsInPlace) {
  constexpr int64_t kCount = 100003;
  for (const NamedOptions& optimizer : AllOptimizers()) {
    for (DType dtype : kFloatTypes) {
      for (bool nontemporal : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << optimizer.name << " " << DTypeName(dtype)
                     << (nontemporal ? " streamed" : " plain"));
        const Problem problem = MakeProblem(kCount, dtype, 1, 17);
        CpuExecutionOptions execution = Execution(BestSimdPath(), 3);
        execution.nontemporal_out = nontemporal;
        const Result expected =
            RunSteps(optimizer.options, problem, dtype, true, dtype, execution);
        auto in_place =
            CpuOptimizer::Create(optimizer.options, kCount, execution);
        ASSERT_TRUE(in_place.ok()) << in_place.status();
        std::vector<float> master = problem.master;
        std::vector<uint8_t> buffer = problem.grads[0];
        StepArgs args;
        args.grad_scale = 0.5f;
        args.lr = 1e-3;
        ASSERT_TRUE((*in_place)
                        ->Step(master.data(), buffer.data(), dtype, args,
                               buffer.data(), dtype)
                        .ok());
        ExpectBitwiseEqual(expected.master, master, "master");
        ExpectBitwiseEqual(expected.exp_avg,
                           Copy((*in_place)->exp_avg(), kCount), "exp_avg");
        EXPECT_EQ(
            std::memcmp(expected.out.data(), buffer.data(), buffer.size()), 0)
            << "in-place write differs";
      }
    }
  }
}

// StepExternal over caller-held state equals StepRange over the
// optimizer's own state with the same values, for every optimizer type,
// and leaves step_count() alone.
TEST(CpuOptimizerTest, StepExternalEqualsStepRange) {
  constexpr int64_t kCount = 20011;
  constexpr int64_t kOffset = 3001;
  for (const NamedOptions& optimizer : AllOptimizers()) {
    SCOPED_TRACE(optimizer.name);
    const Problem problem = MakeProblem(kOffset + kCount, DType::kBF16, 3, 19);
    auto owned = CpuOptimizer::Create(optimizer.options, kOffset + kCount,
                                      Execution(BestSimdPath(), 3));
    auto external = CpuOptimizer::Create(optimizer.options, 0,
                                         Execution(BestSimdPath(), 3));
    ASSERT_TRUE(owned.ok() && external.ok());
    std::vector<float> owned_master(problem.master.begin() + kOffset,
                                    problem.master.end());
    std::vector<float> external_master = owned_master;
    std::vector<float> state0(kCount, 0.0f), state1(kCount, 0.0f);
    const bool is_sgd = optimizer.options.type == OptimizerType::kSgd;
    const bool has_state0 = !is_sgd || optimizer.options.momentum != 0.0;
    std::vector<uint8_t> owned_out(kCount * 2), external_out(kCount * 2);
    StepArgs args;
    args.grad_scale = 0.5f;
    for (int s = 0; s < 3; ++s) {
      args.lr = 1e-3 * (s + 1);
      const uint8_t* grads = problem.grads[s].data() + kOffset * 2;
      ASSERT_TRUE((*owned)
                      ->StepRange(kOffset, kCount, owned_master.data(), grads,
                                  DType::kBF16, args, owned_out.data(),
                                  DType::kBF16)
                      .ok());
      ASSERT_TRUE((*external)
                      ->StepExternal(kCount, external_master.data(),
                                     has_state0 ? state0.data() : nullptr,
                                     is_sgd ? nullptr : state1.data(), grads,
                                     DType::kBF16, args, external_out.data(),
                                     DType::kBF16)
                      .ok());
      EXPECT_EQ((*external)->step_count(), s);
      (*owned)->AdvanceStep();
      (*external)->AdvanceStep();
    }
    ExpectBitwiseEqual(owned_master, external_master, "master");
    if (has_state0) {
      const float* owned_state0 =
          is_sgd ? (*owned)->momentum_buffer() : (*owned)->exp_avg();
      ExpectBitwiseEqual(Copy(owned_state0 + kOffset, kCount), state0,
                         "state0");
    }
    if (!is_sgd) {
      ExpectBitwiseEqual(Copy((*owned)->exp_avg_sq() + kOffset, kCount), state1,
                         "state1");
    }
    EXPECT_EQ(owned_out, external_out);
  }
}

TEST(CpuOptimizerTest, StepExternalRejectsMissingStateNamingIt) {
  OptimizerOptions adam;
  adam.type = OptimizerType::kAdam;
  auto optimizer = CpuOptimizer::Create(adam, 0);
  ASSERT_TRUE(optimizer.ok());
  std::vector<float> master(8, 1.0f), state(8, 0.0f), grads(8, 1.0f);
  const absl::Status no_state1 =
      (*optimizer)
          ->StepExternal(8, master.data(), state.data(), nullptr, grads.data(),
                         DType::kF32, StepArgs());
  EXPECT_EQ(no_state1.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(no_state1.message().find("state1 (exp_avg_sq)"), std::string::npos)
      << no_state1;
  const absl::Status no_state0 =
      (*optimizer)
          ->StepExternal(8, master.data(), nullptr, state.data(), grads.data(),
                         DType::kF32, StepArgs());
  EXPECT_NE(no_state0.message().find("state0 (exp_avg)"), std::string::npos)
      << no_state0;
  EXPECT_EQ(master, std::vector<float>(8, 1.0f));
  EXPECT_FALSE((*optimizer)
                   ->StepExternal(-1, master.data(), state.data(), state.data(),
                                  grads.data(), DType::kF32, StepArgs())
                   .ok());
}

// A step given as a stream of ranges (from the end backwards, as the
// offloaded update takes a bucket's chunks, an empty one among them) is the
// whole-range Step bit for bit, at every thread count; each range is
// reported done in order, with its output already written then.
TEST(CpuOptimizerTest, StepRangesEqualsStepAndReportsRangesInOrder) {
  constexpr int64_t kCount = 100003;
  const auto [options, problem, expected] = AdamWReference(kCount, 21);
  // [cuts[k], cuts[k + 1]) is range number (kRanges - 1 - k).
  const std::vector<int64_t> cuts = {0, 1, 4000, 4000, 4017, 60000, kCount};
  const int kRanges = static_cast<int>(cuts.size()) - 1;
  for (int threads : {1, 2, 5}) {
    // Tiles of 1024 elements: many per range, so ranges overlap.
    auto optimizer = CpuOptimizer::Create(
        options, kCount, Execution(BestSimdPath(), threads, 4096));
    ASSERT_TRUE(optimizer.ok()) << optimizer.status();
    std::vector<float> master = problem.master;
    std::vector<uint8_t> out(kCount * 2, 0xAB);
    StepArgs args;
    args.grad_scale = 0.5f;
    for (int s = 0; s < 3; ++s) {
      args.lr = 1e-3 * (s + 1);
      int given = 0;
      std::vector<int64_t> done;
      const absl::Status status =
          (*optimizer)
              ->StepRanges(
                  args,
                  [&](RangeToUpdate* range) -> absl::StatusOr<bool> {
                    if (given == kRanges) return false;
                    const int k = kRanges - 1 - given++;
                    range->state_offset = cuts[k];
                    range->count = cuts[k + 1] - cuts[k];
                    range->master_weights = master.data() + cuts[k];
                    range->grads = problem.grads[s].data() + cuts[k] * 2;
                    range->grad_dtype = DType::kBF16;
                    range->out = out.data() + cuts[k] * 2;
                    range->out_dtype = DType::kBF16;
                    return true;
                  },
                  [&](int64_t index) -> absl::Status {
                    const int k = kRanges - 1 - static_cast<int>(index);
                    if (s == 2 && cuts[k + 1] > cuts[k]) {
                      // The last step's output of this range is final now.
                      const int64_t last = cuts[k + 1] - 1;
                      EXPECT_EQ(std::memcmp(out.data() + last * 2,
                                            expected.out.data() + last * 2, 2),
                                0)
                          << "range " << index
                          << " reported before it was written";
                    }
                    done.push_back(index);
                    return absl::OkStatus();
                  });
      ASSERT_TRUE(status.ok()) << status;
      ASSERT_EQ(done.size(), static_cast<size_t>(kRanges));
      for (int r = 0; r < kRanges; ++r) EXPECT_EQ(done[r], r);
      (*optimizer)->AdvanceStep();
    }
    ExpectBitwiseEqual(expected.master, master, "master");
    ExpectBitwiseEqual(expected.exp_avg, Copy((*optimizer)->exp_avg(), kCount),
                       "exp_avg");
    ExpectBitwiseEqual(expected.exp_avg_sq,
                       Copy((*optimizer)->exp_avg_sq(), kCount), "exp_avg_sq");
    EXPECT_EQ(std::memcmp(expected.out.data(), out.data(), out.size()), 0);
  }
}

// The first error ends the stream: a range outside the state (named), an
// error of next_range, an error of range_done; nothing is asked for after
// it, and bad step arguments fail before any range is asked for.
TEST(CpuOptimizerTest, StepRangesStopsAtTheFirstError) {
  OptimizerOptions options;
  options.type = OptimizerType::kAdam;
  auto optimizer =
      CpuOptimizer::Create(options, 64, Execution(BestSimdPath(), 3));
  ASSERT_TRUE(optimizer.ok());
  std::vector<float> master(64, 1.0f), grads(64, 1.0f);
  StepArgs args;
  args.lr = 1e-3;
  auto ranges_then = [&](int good, absl::StatusOr<bool> last,
                         int64_t offset_of_last, int* asked) {
    return [&, good, last, offset_of_last,
            asked](RangeToUpdate* range) -> absl::StatusOr<bool> {
      const int k = (*asked)++;
      range->state_offset = k < good ? 8 * k : offset_of_last;
      range->count = 8;
      range->master_weights = master.data() + range->state_offset % 56;
      range->grads = grads.data();
      range->grad_dtype = DType::kF32;
      return k < good ? absl::StatusOr<bool>(true) : last;
    };
  };
  int asked = 0;
  int done = 0;
  auto count_done = [&](int64_t) -> absl::Status {
    ++done;
    return absl::OkStatus();
  };
  absl::Status status =
      (*optimizer)
          ->StepRanges(args, ranges_then(2, true, 60, &asked), count_done);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("range [60, 68)"), std::string::npos)
      << status;
  EXPECT_EQ(asked, 3);
  EXPECT_LE(done, 2);

  asked = 0;
  status = (*optimizer)
               ->StepRanges(
                   args,
                   ranges_then(1, absl::DataLossError("short read of chunk 1"),
                               0, &asked),
                   count_done);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(asked, 2);

  asked = 0;
  int reported = 0;
  status = (*optimizer)
               ->StepRanges(args, ranges_then(5, false, 0, &asked),
                            [&](int64_t index) -> absl::Status {
                              ++reported;
                              return index == 1
                                         ? absl::InternalError(
                                               "upload of range 1 failed")
                                         : absl::OkStatus();
                            });
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(reported, 2);  // none after the failed one
  EXPECT_LE(asked, 6);

  asked = 0;
  StepArgs bad_lr = args;
  bad_lr.lr = NAN;
  status =
      (*optimizer)
          ->StepRanges(bad_lr, ranges_then(1, false, 0, &asked), count_done);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(asked, 0);
}

// The CPU/GPU split's measure: a positive, finite time per element from
// scratch memory; the optimizer's own state and step count untouched.
TEST(CpuOptimizerTest, UpdateTimerLeavesTheStateAlone) {
  CpuExecutionOptions execution;
  execution.num_threads = 2;
  absl::StatusOr<std::unique_ptr<CpuOptimizer>> optimizer =
      CpuOptimizer::Create(OptimizerOptions(), 1000, execution);
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  absl::StatusOr<UpdateTimer> timer =
      UpdateTimer::Create(optimizer->get(), 1 << 16);
  ASSERT_TRUE(timer.ok()) << timer.status();
  ASSERT_TRUE(timer->Round().ok());  // the pages' first use
  absl::StatusOr<double> seconds = timer->Round();
  ASSERT_TRUE(seconds.ok()) << seconds.status();
  EXPECT_GT(*seconds, 0.0);
  EXPECT_LT(*seconds, 1e-3);  // a millisecond an element: surely wrong
  EXPECT_EQ((*optimizer)->step_count(), 0);
  for (int64_t i = 0; i < 1000; ++i) {
    ASSERT_EQ((*optimizer)->exp_avg()[i], 0.0f) << i;
    ASSERT_EQ((*optimizer)->exp_avg_sq()[i], 0.0f) << i;
  }
  EXPECT_EQ(UpdateTimer::Create(optimizer->get(), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace offload
}  // namespace ze
