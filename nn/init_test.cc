// Deterministic initialisation: Philox known answers, statistics, and the
// property partitioned construction relies on: any slice of any parameter is
// bit-identical to the same range of the whole.
#include "nn/init.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/ops.h"
#include "nn/gpt.h"
#include "gtest/gtest.h"

namespace ze {
namespace nn {
namespace {

// Known-answer vectors published with Random123 (kat_vectors, philox4x32_10).
TEST(PhiloxTest, MatchesRandom123KnownAnswers) {
  EXPECT_EQ(Philox4x32({0, 0, 0, 0}, {0, 0}),
            (std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu,
                                     0x9b00dbd8u}));
  EXPECT_EQ(Philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                       {0xffffffffu, 0xffffffffu}),
            (std::array<uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u,
                                     0x6d5451fdu}));
  EXPECT_EQ(Philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                       {0xa4093822u, 0x299f31d0u}),
            (std::array<uint32_t, 4>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u,
                                     0x24126ea1u}));
}

TEST(InitTest, NormalHasRequestedMeanAndStd) {
  const int64_t count = 200000;
  std::vector<float> values(count);
  GenerateInitialValues(Initializer::Normal(0.02f), 1234, "w", 0, count,
                        values.data());
  double sum = 0.0, squares = 0.0;
  for (float v : values) {
    sum += v;
    squares += static_cast<double>(v) * v;
  }
  const double mean = sum / count;
  const double std = std::sqrt(squares / count - mean * mean);
  // Standard error of the mean: 0.02 / sqrt(2e5) = 4.5e-5; of the std: ~3e-5.
  EXPECT_NEAR(mean, 0.0, 2.5e-4);
  EXPECT_NEAR(std, 0.02, 2.5e-4);
}

TEST(InitTest, ScaledResidualDividesBySqrtTwoLayers) {
  EXPECT_FLOAT_EQ(Initializer::ScaledResidual(0.02f, 8).std, 0.02f / 4.0f);
}

TEST(InitTest, ValuesDependOnSeedAndName) {
  std::vector<float> a(64), b(64), c(64), a_again(64);
  const Initializer init = Initializer::Normal(1.0f);
  GenerateInitialValues(init, 1, "blocks.0.attn.qkv.weight", 0, 64, a.data());
  GenerateInitialValues(init, 1, "blocks.0.attn.qkv.weight", 0, 64,
                        a_again.data());
  GenerateInitialValues(init, 2, "blocks.0.attn.qkv.weight", 0, 64, b.data());
  GenerateInitialValues(init, 1, "blocks.1.attn.qkv.weight", 0, 64, c.data());
  EXPECT_EQ(a, a_again);
  EXPECT_NE(a, b);
  EXPECT_NE(a, c);
}

TEST(InitTest, ZerosAndOnes) {
  std::vector<float> values(5, 7.0f);
  GenerateInitialValues(Initializer::Zeros(), 1, "b", 3, 5, values.data());
  EXPECT_EQ(values, std::vector<float>(5, 0.0f));
  GenerateInitialValues(Initializer::Ones(), 1, "g", 3, 5, values.data());
  EXPECT_EQ(values, std::vector<float>(5, 1.0f));
}

// Every parameter of a small GPT (which covers zeros, ones, normal and
// scaled-residual initialisers), in f32 and bf16: slices at odd offsets and
// lengths equal the full initialisation bit for bit.
TEST(InitTest, SlicesEqualFullInitialisationBitForBit) {
  GptConfig config;
  config.num_layers = 2;
  config.num_heads = 2;
  config.channels = 16;
  config.vocab_size = 37;
  config.max_seq_len = 8;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    GptOptions options;
    options.dtype = dtype;
    options.seed = 99;
    auto model = GptModel::Create(config, options).value();
    bool saw[3] = {false, false, false};
    for (Parameter *parameter : model->Parameters()) {
      saw[static_cast<int>(parameter->initializer().kind)] = true;
      const Tensor full = parameter->data().value();
      const int64_t numel = parameter->numel();
      const int64_t element_size = static_cast<int64_t>(SizeOf(dtype));
      const std::vector<std::pair<int64_t, int64_t>> ranges = {
          {0, numel},         {0, 1},
          {1, numel - 1},     {numel / 3, numel / 3 + 5},
          {numel - 1, numel}, {7, 8},
          {numel / 2, numel}};
      for (const auto &[begin, end] : ranges) {
        if (begin < 0 || end > numel || begin >= end)
          continue;
        Tensor slice =
            Tensor::Empty({end - begin}, dtype, Device::Cpu()).value();
        ASSERT_TRUE(
            parameter->InitializeSlice(99, begin, slice, Stream()).ok());
        EXPECT_EQ(0, std::memcmp(static_cast<const char *>(full.data()) +
                                     begin * element_size,
                                 slice.data(), slice.nbytes()))
            << parameter->name() << " [" << begin << ", " << end << ") "
            << DTypeName(dtype);
      }
    }
    EXPECT_TRUE(saw[0] && saw[1] && saw[2]);
  }
}

TEST(InitTest, SliceOutOfRangeIsInvalidArgument) {
  GptConfig config;
  config.num_layers = 1;
  config.num_heads = 1;
  config.channels = 4;
  config.vocab_size = 5;
  config.max_seq_len = 2;
  GptOptions options;
  options.materialize = false;
  auto model = GptModel::Create(config, options).value();
  Parameter *bias = model->FindParameter("ln_f.bias").value();
  Tensor dst = Tensor::Empty({3}, DType::kF32, Device::Cpu()).value();
  const absl::Status status = bias->InitializeSlice(0, 2, dst, Stream());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("ln_f.bias"), absl::string_view::npos);
}

} // namespace
} // namespace nn
} // namespace ze
