// The compressed moments (moment_codec.h) and the CPU kernels over them:
// the encodings' promises (exact round trips, error bounds, unbiased and
// reproducible stochastic rounding) and the kernels' (every SIMD path
// equals the scalar reference bit for bit; threads and tiles change
// nothing).
#include "offload/moment_codec.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gtest/gtest.h"
#include "offload/cpu_optimizer.h"

namespace ze {
namespace offload {
namespace {

constexpr SimdPath kAllPaths[] = {SimdPath::kScalar, SimdPath::kAvx2,
                                  SimdPath::kAvx512};

TEST(MomentCodecTest, NearestBf16IsCoresRounding) {
  std::mt19937 rng(1);
  for (int i = 0; i < 100000; ++i) {
    const uint32_t bits = rng();
    float value;
    std::memcpy(&value, &bits, 4);
    if (std::isnan(value)) continue;
    ASSERT_EQ(NearestBf16(value), FloatToBf16Bits(value)) << value;
  }
}

TEST(MomentCodecTest, StochasticBf16IsUnbiasedAndReproducible) {
  // A value a quarter of the way between two bf16 neighbours rounds up a
  // quarter of the time; the mean over many elements is the value.
  const float low = Bf16BitsToFloat(0x3f80);  // 1.0
  const float high = Bf16BitsToFloat(0x3f81);
  const float value = low + (high - low) * 0.25f;
  const uint32_t key = RoundingKey(42, 7, 0);
  double sum = 0.0;
  int ups = 0;
  constexpr int kSamples = 200000;
  for (int i = 0; i < kSamples; ++i) {
    const uint16_t rounded = StochasticBf16(value, RoundingNoise(key, i));
    ASSERT_TRUE(rounded == 0x3f80 || rounded == 0x3f81);
    ups += rounded == 0x3f81;
    sum += Bf16BitsToFloat(rounded);
    // Reproducible: the same seed, step and element round alike.
    ASSERT_EQ(rounded, StochasticBf16(value, RoundingNoise(key, i)));
  }
  // Binomial(200000, 1/4): sigma ~ 194; 5 sigma.
  EXPECT_NEAR(ups, kSamples / 4, 1000);
  EXPECT_NEAR(sum / kSamples, value, 5e-5 * (high - low) * 200);
  // Exact values never move; negatives round symmetrically.
  EXPECT_EQ(StochasticBf16(low, 0xffffffffu), 0x3f80);
  EXPECT_EQ(StochasticBf16(-value, 0xffffffffu), 0xbf81);
  EXPECT_EQ(StochasticBf16(-value, 0), 0xbf80);
  // Another step or moment draws other noise.
  int differ = 0;
  for (int i = 0; i < 1000; ++i) {
    differ += RoundingNoise(RoundingKey(42, 7, 0), i) !=
              RoundingNoise(RoundingKey(42, 8, 0), i);
    differ += RoundingNoise(RoundingKey(42, 7, 0), i) !=
              RoundingNoise(RoundingKey(42, 7, 1), i);
  }
  EXPECT_EQ(differ, 2000);
}

// The update's 8-bit codes: x rounds to floor(x) or floor(x) + 1 with
// code^2 unbiased (m, and sqrt(v), are code^2 times the step's), exact
// codes never move, and the same noise gives the same code.
// The two neighbours on `grid` of a value and what a code decodes to.
float Decoded(uint32_t code, float top, MomentGrid grid) {
  return code == 0 ? 0.0f : GridValue(code, top, grid);
}

// Stochastic rounding on either grid is unbiased in the value itself, in
// range (between two grid points, the octave's end included) and under the
// lowest point (between 0 and it), from either half of the hash; values on
// the grid stay exact at both ends of the noise.
TEST(MomentCodecTest, GridRoundingIsUnbiased) {
  const uint32_t key = RoundingKey(3, 11, 1);
  for (const MomentGrid grid : {kVGrid, kMGrid}) {
    // A top about 2^8 (the float exponent's bias 127 + 8, in grid points),
    // far enough up for a lowest point above 0.
    const uint32_t top_index = (127u + 8u) << (23 - grid.shift);
    const float top = GridPoint(top_index, grid);
    const float lowest = GridLowest(top, grid);
    ASSERT_GT(lowest, 0.0f);
    const float below_top = GridValue(grid.levels - 1, top, grid);
    for (const float x :
         {top * 0.6f, top * 0.93f, below_top * 1.01f, top * 0.51f,
          lowest * 1.3f, lowest * 0.7f, lowest * 0.01f}) {
      ASSERT_LE(x, top);
      // The neighbours: nearest's index and the next one up or down.
      const uint32_t down = MomentFloatBits(x) >> grid.shift;
      const float lower = x < lowest ? 0.0f : GridPoint(down, grid);
      const float upper = x < lowest ? lowest : GridPoint(down + 1, grid);
      constexpr int kSamples = 200000;
      double sums[2] = {0.0, 0.0};
      for (int i = 0; i < kSamples; ++i) {
        const uint32_t noise = RoundingNoise(key, i);
        const uint32_t halves[2] = {VCodeNoise(noise), MCodeNoise(noise)};
        for (int half = 0; half < 2; ++half) {
          const uint32_t index = GridIndexStochastic(x, grid, halves[half]);
          const float value = Decoded(
              GridCodeStochastic(x, index, top, lowest, grid, halves[half]),
              top, grid);
          ASSERT_TRUE(value == lower || value == upper)
              << x << " " << value << " " << lower << " " << upper;
          sums[half] += value;
        }
      }
      // sigma of the mean at most (upper - lower) / 2 / sqrt(kSamples).
      for (const double sum : sums) {
        EXPECT_NEAR(sum / kSamples, x,
                    5.0 * (upper - lower) / 2.0 / std::sqrt(kSamples))
            << x;
      }
    }
    for (const float x : {top, lowest, GridPoint(top_index - 5, grid)}) {
      for (const uint32_t noise16 : {0u, 0xffffu}) {
        const uint32_t index = GridIndexStochastic(x, grid, noise16);
        EXPECT_EQ(
            Decoded(GridCodeStochastic(x, index, top, lowest, grid, noise16),
                    top, grid),
            x);
      }
    }
  }
}

// The update's stochastic encoding takes a block's top from its largest
// rounded value, so decoding to f32 and encoding again (to nearest: a
// checkpoint loaded, ReadState / WriteState) gives back the same tops and
// codes. (A top rounded up from the largest value would leave the largest
// element one point below it about half the time, and the reload would
// move every code of the block.)
TEST(MomentCodecTest, StochasticBlockReencodesExactly) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> m(kMomentBlock), v(kMomentBlock), m_in(kMomentBlock),
      m_back(kMomentBlock), v_back(kMomentBlock);
  std::vector<int8_t> m_codes(kMomentBlock), m_again(kMomentBlock);
  std::vector<uint8_t> v_codes(kMomentBlock), v_again(kMomentBlock);
  for (int trial = 0; trial < 2000; ++trial) {
    for (int64_t i = 0; i < kMomentBlock; ++i) {
      // 3 decades, and some elements under the grids' range.
      const float scale =
          i % 31 == 7 ? 1e-12f
                      : std::pow(10.0f, -3.0f * (rng() % 1000) / 1000.0f);
      m_in[i] = scale * normal(rng);
      v[i] = scale * scale * (1.0f + std::fabs(normal(rng)));
    }
    m = m_in;
    float m_top, v_top;
    EncodeBlock8Stochastic(m.data(), v.data(), kMomentBlock, m_codes.data(),
                           v_codes.data(), &m_top, &v_top,
                           RoundingKey(1, trial, 0), trial * kMomentBlock);
    for (int64_t i = 0; i < kMomentBlock; ++i) {
      m_back[i] = DecodeM(m_codes[i], m_top);
      v_back[i] = DecodeV(v_codes[i], v_top);
    }
    float m_top_again, v_top_again;
    EncodeBlock8(m_back.data(), v_back.data(), kMomentBlock, m_again.data(),
                 v_again.data(), &m_top_again, &v_top_again);
    ASSERT_EQ(m_top_again, m_top) << trial;
    ASSERT_EQ(v_top_again, v_top) << trial;
    ASSERT_EQ(m_again, m_codes) << trial;
    ASSERT_EQ(v_again, v_codes) << trial;
  }
}

// A block of moments like Adam's: m of both signs over several decades,
// v = m^2-like and larger, some exact zeros, some under the range.
void MakeBlock(std::mt19937& rng, int64_t n, std::vector<float>* m,
               std::vector<float>* v) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  m->resize(n);
  v->resize(n);
  for (int64_t i = 0; i < n; ++i) {
    // 11 octaves, and some elements 46 octaves below (under m's range).
    const float scale =
        std::ldexp(1.0f, i % 29 == 11 ? -60 : static_cast<int>(i % 11) - 14);
    (*m)[i] = i % 37 == 3 ? 0.0f : normal(rng) * scale;
    (*v)[i] = i % 41 == 5 ? 0.0f : (*m)[i] * (*m)[i] * 3.0f + 1e-12f * i;
  }
}

TEST(MomentCodecTest, EightBitRoundTripIsExactAndWithinHalfAGridStep) {
  std::mt19937 rng(2);
  for (int64_t n : {int64_t{256}, int64_t{200}, int64_t{1}}) {
    std::vector<float> m, v;
    MakeBlock(rng, n, &m, &v);
    std::vector<float> m_in = m;
    std::vector<int8_t> m_codes(n);
    std::vector<uint8_t> v_codes(n);
    float m_top = 0.0f, v_top = 0.0f;
    EncodeBlock8(m_in.data(), v.data(), n, m_codes.data(), v_codes.data(),
                 &m_top, &v_top);
    const float m_lowest = GridLowest(m_top, kMGrid);
    const float v_lowest = GridLowest(v_top, kVGrid);
    std::vector<float> m_out(n), v_out(n);
    float m_largest = 0.0f, v_largest = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
      m_out[i] = DecodeM(m_codes[i], m_top);
      v_out[i] = DecodeV(v_codes[i], v_top);
      m_largest = std::max(m_largest, std::fabs(m_out[i]));
      v_largest = std::max(v_largest, v_out[i]);
      // Within half a grid step: 2^-3 of |m| (2 significand bits), 2^-4
      // of v (3); under the lowest point, within half of it.
      if (v_codes[i] != 0) {
        const float m_bound = std::fabs(m_in[i]) < m_lowest
                                  ? m_lowest * 0.5f
                                  : std::fabs(m_in[i]) * 0.125f;
        EXPECT_LE(std::fabs(m_out[i] - m_in[i]), m_bound) << i;
        EXPECT_EQ(m_out[i] < 0, m_codes[i] < 0) << i;
      } else {
        EXPECT_EQ(m_codes[i], 0) << i;
      }
      const float v_bound = v[i] < v_lowest ? v_lowest * 0.5f : v[i] * 0.0625f;
      EXPECT_LE(std::fabs(v_out[i] - v[i]), v_bound) << i;
    }
    // The largest element decodes to the top itself.
    EXPECT_EQ(m_largest, m_top);
    EXPECT_EQ(v_largest, v_top);
    // Decoded values encode to the same codes and tops, bit for bit (a
    // checkpoint saved as f32 reloads to the same state).
    std::vector<int8_t> m_again(n);
    std::vector<uint8_t> v_again(n);
    float m_top_again = 0.0f, v_top_again = 0.0f;
    EncodeMBlock(m_out.data(), n, m_again.data(), &m_top_again);
    EncodeVBlock(v_out.data(), n, v_again.data(), &v_top_again);
    EXPECT_EQ(m_again, m_codes);
    EXPECT_EQ(v_again, v_codes);
    EXPECT_EQ(FloatBits(m_top_again), FloatBits(m_top));
    EXPECT_EQ(FloatBits(v_top_again), FloatBits(v_top));
  }
}

TEST(MomentCodecTest, AllZeroBlockStaysZero) {
  std::vector<float> m(256, 0.0f), v(256, 0.0f);
  std::vector<int8_t> m_codes(256, 5);
  std::vector<uint8_t> v_codes(256, 5);
  float m_top = 1.0f, v_top = 1.0f;
  EncodeBlock8(m.data(), v.data(), 256, m_codes.data(), v_codes.data(), &m_top,
               &v_top);
  EXPECT_EQ(m_top, 0.0f);
  EXPECT_EQ(v_top, 0.0f);
  for (int i = 0; i < 256; ++i) {
    EXPECT_EQ(m_codes[i], 0);
    EXPECT_EQ(v_codes[i], 0);
  }
}

// ---- the kernels -----------------------------------------------------------

// One optimizer state in `format` over `count` elements, and a few steps'
// inputs, run through RunStepKernel on one path.
struct KernelRun {
  std::vector<float> master;
  std::vector<uint8_t> state0, state1;
  std::vector<float> step0, step1;
  std::vector<uint16_t> out;
};

KernelRun RunKernel(SimdPath path, MomentFormat format, bool stochastic,
                    DType grad_dtype, bool with_out, int64_t count, int steps) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t bytes = format == MomentFormat::kF32    ? 4
                        : format == MomentFormat::kBf16 ? 2
                                                        : 1;
  const int64_t blocks = (count + kMomentBlock - 1) / kMomentBlock;
  KernelRun run;
  run.master.resize(count);
  for (float& p : run.master) p = normal(rng);
  run.state0.assign(count * bytes, 0);
  run.state1.assign(count * bytes, 0);
  run.step0.assign(blocks, 0.0f);
  run.step1.assign(blocks, 0.0f);
  run.out.assign(count, 0);
  OptimizerOptions options;
  options.type = OptimizerType::kAdamW;
  options.weight_decay = 0.1;
  options.moments = format;
  options.stochastic_rounding = stochastic;
  options.rounding_seed = 9;
  for (int s = 0; s < steps; ++s) {
    std::vector<uint8_t> grads(count * SizeOf(grad_dtype));
    for (int64_t i = 0; i < count; ++i) {
      // Scales change from block to block (tensors) and within one by
      // 4x; some gradients are 0 (unused rows).
      const float g =
          (i % 53 == 7 && s > 0)
              ? 0.0f
              : normal(rng) *
                    std::ldexp(1.0f,
                               static_cast<int>((i / 256) % 13 + i % 3) - 7);
      StoreFromFloat(grads.data(), grad_dtype, i, g);
    }
    StepArgs args;
    args.lr = 1e-2;
    args.grad_scale = 0.5f;
    auto coefficients = ComputeStepCoefficients(options, s, args, false);
    EXPECT_TRUE(coefficients.ok());
    StepBuffers buffers;
    buffers.master = run.master.data();
    buffers.state0 = run.state0.data();
    buffers.state1 = run.state1.data();
    buffers.step0 = run.step0.data();
    buffers.step1 = run.step1.data();
    buffers.moment_format = format;
    buffers.first_index = 0;
    buffers.grads = grads.data();
    buffers.grad_dtype = grad_dtype;
    buffers.out = with_out ? run.out.data() : nullptr;
    buffers.out_dtype = DType::kBF16;
    buffers.count = count;
    RunStepKernel(path, *coefficients, buffers);
  }
  return run;
}

void ExpectSameRun(const KernelRun& expected, const KernelRun& actual,
                   const std::string& what) {
  ASSERT_EQ(expected.master.size(), actual.master.size());
  EXPECT_EQ(0, std::memcmp(expected.master.data(), actual.master.data(),
                           expected.master.size() * 4))
      << what << ": master";
  EXPECT_EQ(expected.state0, actual.state0) << what << ": exp_avg";
  EXPECT_EQ(expected.state1, actual.state1) << what << ": exp_avg_sq";
  EXPECT_EQ(0, std::memcmp(expected.step0.data(), actual.step0.data(),
                           expected.step0.size() * 4))
      << what << ": exp_avg steps";
  EXPECT_EQ(0, std::memcmp(expected.step1.data(), actual.step1.data(),
                           expected.step1.size() * 4))
      << what << ": exp_avg_sq steps";
  EXPECT_EQ(expected.out, actual.out) << what << ": out";
}

TEST(CompressedMomentsKernelTest, EveryPathMatchesScalarBitForBit) {
  struct Format {
    MomentFormat format;
    bool stochastic;
  };
  for (const Format& f :
       {Format{MomentFormat::kBf16, false}, Format{MomentFormat::kBf16, true},
        Format{MomentFormat::kBlockwise8, false}}) {
    for (DType grad_dtype : {DType::kF32, DType::kBF16}) {
      for (bool with_out : {false, true}) {
        // 1000: three whole blocks and a short one, vector tails included.
        const KernelRun reference =
            RunKernel(SimdPath::kScalar, f.format, f.stochastic, grad_dtype,
                      with_out, 1000, 4);
        for (SimdPath path : kAllPaths) {
          if (!SimdPathSupported(path)) continue;
          ExpectSameRun(reference,
                        RunKernel(path, f.format, f.stochastic, grad_dtype,
                                  with_out, 1000, 4),
                        std::string(MomentFormatName(f.format)) +
                            (f.stochastic ? " stochastic " : " ") +
                            SimdPathName(path));
        }
      }
    }
  }
}

// The master weights after `steps` steps of each format, against f32.
TEST(CompressedMomentsKernelTest, CompressedMomentsTrackTheF32Update) {
  const int64_t count = 4096;
  const KernelRun exact = RunKernel(SimdPath::kScalar, MomentFormat::kF32,
                                    false, DType::kF32, false, count, 20);
  const KernelRun start = RunKernel(SimdPath::kScalar, MomentFormat::kF32,
                                    false, DType::kF32, false, count, 0);
  struct Case {
    MomentFormat format;
    bool stochastic;
    double tolerance;  // of the f32 run's mean |update|
  };
  for (const Case& c : {Case{MomentFormat::kBf16, false, 0.02},
                        Case{MomentFormat::kBf16, true, 0.02},
                        Case{MomentFormat::kBlockwise8, false, 0.1}}) {
    const KernelRun run = RunKernel(BestSimdPath(), c.format, c.stochastic,
                                    DType::kF32, false, count, 20);
    double moved = 0.0, error = 0.0;
    for (int64_t i = 0; i < count; ++i) {
      moved += std::fabs(exact.master[i] - start.master[i]);
      error += std::fabs(run.master[i] - exact.master[i]);
      ASSERT_TRUE(std::isfinite(run.master[i]));
    }
    EXPECT_LT(error, c.tolerance * moved)
        << MomentFormatName(c.format) << (c.stochastic ? " stochastic" : "");
  }
}

// Adam's decay reaches elements low in their 8-bit block. Each block has
// one loud element (gradient 1 every step, so the block's tops stay put)
// and 255 quiet ones (gradient 0.004 for 20 steps, then 0 for 40): f32's
// quiet m falls to 0.9^40 (1.5%) and sqrt(v) to 0.95^20 (36%) of their
// step-20 values. Codes rounded to nearest on a grid whose points are
// 6-25% apart would stick where a step's decay (10% of m, 5% of v) is
// under half the spacing (the first 8-bit codes, linear in roots of the
// block's largest, stuck at 76x and 3.3x f32's). Rounded stochastically,
// the mean over 64 blocks' quiet elements follows f32's (0.995 and 0.989),
// on every path.
TEST(CompressedMomentsKernelTest, EightBitMomentsFollowAdamsDecay) {
  constexpr int64_t kBlocks = 64;
  constexpr int64_t kCount = kBlocks * kMomentBlock;
  for (const SimdPath path : kAllPaths) {
    if (!SimdPathSupported(path)) continue;
    OptimizerOptions options;
    options.type = OptimizerType::kAdamW;
    options.beta1 = 0.9;
    options.beta2 = 0.95;
    options.rounding_seed = 9;
    CpuExecutionOptions one;
    one.num_threads = 1;
    one.pin_threads = false;
    one.huge_pages = false;
    one.simd_path = path;
    auto exact = CpuOptimizer::Create(options, kCount, one);
    options.moments = MomentFormat::kBlockwise8;
    auto eight = CpuOptimizer::Create(options, kCount, one);
    ASSERT_TRUE(exact.ok() && eight.ok());
    std::vector<float> master(kCount), grads(kCount);
    StepArgs args;
    args.lr = 1e-3;
    for (int step = 1; step <= 60; ++step) {
      for (int64_t i = 0; i < kCount; ++i) {
        grads[i] = i % kMomentBlock == 0 ? 1.0f : step <= 20 ? 0.004f : 0.0f;
      }
      for (CpuOptimizer* optimizer : {exact->get(), eight->get()}) {
        ASSERT_TRUE(
            optimizer->Step(master.data(), grads.data(), DType::kF32, args)
                .ok());
      }
    }
    std::vector<float> m_exact(kCount), v_exact(kCount), m_eight(kCount),
        v_eight(kCount);
    (*exact)->ReadState(0, 0, kCount, m_exact.data());
    (*exact)->ReadState(1, 0, kCount, v_exact.data());
    (*eight)->ReadState(0, 0, kCount, m_eight.data());
    (*eight)->ReadState(1, 0, kCount, v_eight.data());
    double m_sum[2] = {0, 0}, root_sum[2] = {0, 0};
    for (int64_t i = 0; i < kCount; ++i) {
      if (i % kMomentBlock == 0) continue;
      m_sum[0] += m_exact[i];
      m_sum[1] += m_eight[i];
      root_sum[0] += std::sqrt(v_exact[i]);
      root_sum[1] += std::sqrt(v_eight[i]);
    }
    EXPECT_NEAR(m_sum[1] / m_sum[0], 1.0, 0.02) << SimdPathName(path);
    EXPECT_NEAR(root_sum[1] / root_sum[0], 1.0, 0.02) << SimdPathName(path);
  }
}

TEST(CompressedMomentsKernelTest, OptimizerThreadsAndReadWriteState) {
  const int64_t count = 5000;  // 19 blocks and a short one
  for (MomentFormat format : {MomentFormat::kBf16, MomentFormat::kBlockwise8}) {
    OptimizerOptions options;
    options.type = OptimizerType::kAdam;
    options.moments = format;
    CpuExecutionOptions one;
    one.num_threads = 1;
    one.simd_path = SimdPath::kScalar;
    CpuExecutionOptions many;
    many.num_threads = 2;
    many.tile_bytes = 256;  // 64 f32: rounded up to one block a tile
    auto a = CpuOptimizer::Create(options, count, one);
    auto b = CpuOptimizer::Create(options, count, many);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ((*a)->moment_format(), format);
    EXPECT_EQ((*b)->tile_elements() % MomentGranule(format), 0);
    std::vector<float> master_a(count), master_b(count), grads(count);
    std::mt19937 rng(4);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t i = 0; i < count; ++i) master_a[i] = master_b[i] = normal(rng);
    for (int s = 0; s < 3; ++s) {
      for (float& g : grads) g = normal(rng);
      StepArgs args;
      args.lr = 1e-3;
      ASSERT_TRUE(
          (*a)->Step(master_a.data(), grads.data(), DType::kF32, args).ok());
      ASSERT_TRUE(
          (*b)->Step(master_b.data(), grads.data(), DType::kF32, args).ok());
    }
    EXPECT_EQ(0, std::memcmp(master_a.data(), master_b.data(), count * 4));
    for (int array = 0; array < 2; ++array) {
      std::vector<float> va(count), vb(count);
      (*a)->ReadState(array, 0, count, va.data());
      (*b)->ReadState(array, 0, count, vb.data());
      EXPECT_EQ(0, std::memcmp(va.data(), vb.data(), count * 4));
    }
    // Read and written back, piece by piece across blocks: no bit moves.
    std::vector<CpuOptimizer::RawArray> raw = (*a)->RawStateArrays();
    std::vector<std::vector<char>> before;
    for (const auto& array : raw) {
      const int64_t n =
          array.per_block ? (count + kMomentBlock - 1) / kMomentBlock : count;
      before.emplace_back(array.data, array.data + n * array.bytes);
    }
    for (int array = 0; array < 2; ++array) {
      std::vector<float> values(count);
      (*a)->ReadState(array, 0, count, values.data());
      (*a)->WriteState(array, 100, 700, values.data() + 100);
      (*a)->WriteState(array, 0, 100, values.data());
      (*a)->WriteState(array, 800, count - 800, values.data() + 800);
    }
    for (size_t r = 0; r < raw.size(); ++r) {
      EXPECT_EQ(0, std::memcmp(before[r].data(), raw[r].data, before[r].size()))
          << MomentFormatName(format) << " raw array " << r;
    }
    // A new value reads back to within its rounding: bf16's half ulp, or
    // half a step of its root (the block's largest m is about 0.3 here:
    // d ~ sqrt(0.3) / 127, so |got - wanted| < sqrt(wanted) d ~ 2e-3).
    const float wanted = 0.25f;
    (*a)->WriteState(0, 300, 1, &wanted);
    float got = 0.0f;
    (*a)->ReadState(0, 300, 1, &got);
    EXPECT_NEAR(got, wanted, format == MomentFormat::kBf16 ? 1e-3 : 5e-3);
  }
}

TEST(CompressedMomentsKernelTest, BytesRangesAndRefusals) {
  OptimizerOptions adam;
  adam.type = OptimizerType::kAdamW;
  EXPECT_EQ(OptimizerStateBytes(adam, 1000), 8000);
  adam.moments = MomentFormat::kBf16;
  EXPECT_EQ(OptimizerStateBytes(adam, 1000), 4000);
  adam.moments = MomentFormat::kBlockwise8;
  // Below kMin8BitElements: f32.
  EXPECT_EQ(OptimizerStateBytes(adam, 1000), 8000);
  EXPECT_EQ(EffectiveMomentFormat(adam, 1000), MomentFormat::kF32);
  EXPECT_EQ(OptimizerStateBytes(adam, 5000), 2 * 5000 + 2 * 4 * 20);
  // 8-bit ranges cover whole blocks.
  auto optimizer = CpuOptimizer::Create(adam, 5000);
  ASSERT_TRUE(optimizer.ok());
  std::vector<float> master(5000), grads(5000);
  StepArgs args;
  args.lr = 1e-3;
  absl::Status bad =
      (*optimizer)
          ->StepRange(100, 256, master.data(), grads.data(), DType::kF32, args);
  EXPECT_TRUE(absl::IsInvalidArgument(bad)) << bad;
  EXPECT_NE(bad.message().find("whole blocks of 256"), std::string::npos);
  EXPECT_TRUE(
      (*optimizer)
          ->StepRange(4864, 136, master.data(), grads.data(), DType::kF32, args)
          .ok());  // the short last block
  OptimizerOptions sgd;
  sgd.type = OptimizerType::kSgd;
  sgd.moments = MomentFormat::kBf16;
  absl::Status refused = ValidateOptimizerOptions(sgd, 10);
  EXPECT_TRUE(absl::IsInvalidArgument(refused));
  EXPECT_NE(refused.message().find("SGD's momentum buffer stays f32"),
            std::string::npos);
}

}  // namespace
}  // namespace offload
}  // namespace ze
