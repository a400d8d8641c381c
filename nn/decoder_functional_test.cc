// The decoder's functional ops on the CPU (nn/functional.h, "Decoder"
// section): forward values against direct formulas or the tested GPT ops,
// every backward against central differences, the cached path against the
// full attention, aliasing and argument errors (the CUDA kernels against
// these: //nn/cuda:decoder_cuda_test).
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/ops.h"
#include "gtest/gtest.h"
#include "nn/decoder_config.h"
#include "nn/functional.h"
#include "nn/test_util.h"

namespace ze {
namespace nn {
namespace {

using testing::RandomTensor;
using testing::Values;

Tensor Empty(const Shape &shape, DType dtype = DType::kF32) {
  return Tensor::Empty(shape, dtype, Device::Cpu()).value();
}

Tensor I32(const std::vector<int32_t> &values) {
  Tensor tensor = Empty({static_cast<int64_t>(values.size())}, DType::kI32);
  for (size_t i = 0; i < values.size(); ++i) {
    tensor.data_as<int32_t>()[i] = values[i];
  }
  return tensor;
}

Tensor F32(const std::vector<float> &values) {
  Tensor tensor = Empty({static_cast<int64_t>(values.size())});
  for (size_t i = 0; i < values.size(); ++i) {
    tensor.data_as<float>()[i] = values[i];
  }
  return tensor;
}

Tensor Clone(const Tensor &tensor) {
  Tensor copy = Empty(tensor.shape(), tensor.dtype());
  EXPECT_TRUE(Copy(tensor, copy, Stream()).ok());
  return copy;
}

void ExpectInvalid(const absl::Status &status, const std::string &needle) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find(needle), std::string::npos) << status;
}

// Central differences of loss(inputs) = sum(forward(inputs) * projection)
// against `backward`, which gets the inputs and dLoss/doutput (=
// projection) and returns dLoss/dinput for each input listed in `checked`
// (the same order). Every element is checked. f32 throughout; the loss is
// summed in double.
using Forward = std::function<Tensor(const std::vector<Tensor> &)>;
using Backward = std::function<std::vector<Tensor>(const std::vector<Tensor> &,
                                                   const Tensor &)>;

void CheckGradients(std::vector<Tensor> inputs, const std::vector<int> &checked,
                    const Forward &forward, const Backward &backward,
                    float epsilon = 1e-2f) {
  const Tensor output = forward(inputs);
  const Tensor projection = RandomTensor(output.shape(), 99);
  auto loss = [&]() {
    const Tensor y = forward(inputs);
    double sum = 0;
    for (int64_t i = 0; i < y.numel(); ++i) {
      sum += static_cast<double>(y.data_as<const float>()[i]) *
             projection.data_as<const float>()[i];
    }
    return sum;
  };
  const std::vector<Tensor> grads = backward(inputs, projection);
  ASSERT_EQ(grads.size(), checked.size());
  for (size_t g = 0; g < checked.size(); ++g) {
    Tensor &x = inputs[checked[g]];
    ASSERT_EQ(grads[g].shape(), x.shape());
    float max_grad = 0;
    for (float v : Values(grads[g])) max_grad = std::max(max_grad, std::abs(v));
    int failures = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      float &element = x.data_as<float>()[i];
      const float saved = element;
      element = saved + epsilon;
      const double plus = loss();
      element = saved - epsilon;
      const double minus = loss();
      element = saved;
      const double numeric = (plus - minus) / (2 * epsilon);
      const float analytic = grads[g].data_as<const float>()[i];
      if (std::abs(analytic - numeric) > 2e-3 + 1e-2 * max_grad &&
          ++failures <= 5) {
        ADD_FAILURE() << "input " << checked[g] << " element " << i
                      << ": analytic " << analytic << ", numeric " << numeric;
      }
    }
  }
}

TEST(RmsNormTest, ForwardMatchesTheFormula) {
  const Tensor x = RandomTensor({3, 2, 8}, 1, 2.0f);
  const Tensor w = RandomTensor({8}, 2);
  Tensor y = Empty({3, 2, 8});
  Tensor rstd = Empty({6});
  ASSERT_TRUE(RmsNormForward(x, w, 1e-5f, y, rstd, Stream()).ok());
  for (int64_t row = 0; row < 6; ++row) {
    double squares = 0;
    for (int c = 0; c < 8; ++c) {
      const double v = x.data_as<const float>()[row * 8 + c];
      squares += v * v;
    }
    const double r = 1.0 / std::sqrt(squares / 8 + 1e-5);
    EXPECT_NEAR(rstd.data_as<float>()[row], r, 1e-5 * r);
    for (int c = 0; c < 8; ++c) {
      EXPECT_NEAR(y.data_as<float>()[row * 8 + c],
                  x.data_as<const float>()[row * 8 + c] * r *
                      w.data_as<const float>()[c],
                  1e-5);
    }
  }
}

TEST(RmsNormTest, BackwardMatchesFiniteDifferences) {
  const float eps = 1e-5f;
  auto forward = [&](const std::vector<Tensor> &in) {
    Tensor y = Empty(in[0].shape());
    Tensor rstd = Empty({in[0].numel() / in[1].numel()});
    EXPECT_TRUE(RmsNormForward(in[0], in[1], eps, y, rstd, Stream()).ok());
    return y;
  };
  auto backward = [&](const std::vector<Tensor> &in, const Tensor &dy) {
    Tensor y = Empty(in[0].shape());
    Tensor rstd = Empty({in[0].numel() / in[1].numel()});
    EXPECT_TRUE(RmsNormForward(in[0], in[1], eps, y, rstd, Stream()).ok());
    Tensor dx = Empty(in[0].shape());
    Tensor dw = Empty(in[1].shape());
    EXPECT_TRUE(Fill(dw, 0.5f, Stream()).ok());  // accumulates onto 0.5
    EXPECT_TRUE(RmsNormBackward(dy, in[0], in[1], rstd, dx, dw, Stream()).ok());
    EXPECT_TRUE(Axpby(1.0f, dw, -0.5f,
                      F32(std::vector<float>(in[1].numel(), 1.0f)), dw,
                      Stream())
                    .ok());
    return std::vector<Tensor>{dx, dw};
  };
  CheckGradients({RandomTensor({4, 6}, 3, 1.5f), RandomTensor({6}, 4)}, {0, 1},
                 forward, backward);
}

TEST(RmsNormTest, InPlaceBackwardAndErrors) {
  const Tensor x = RandomTensor({4, 6}, 3);
  const Tensor w = RandomTensor({6}, 4);
  Tensor y = Empty({4, 6}), rstd = Empty({4});
  ASSERT_TRUE(RmsNormForward(x, w, 1e-6f, y, rstd, Stream()).ok());
  const Tensor dy = RandomTensor({4, 6}, 5);
  Tensor dx = Empty({4, 6});
  ASSERT_TRUE(RmsNormBackward(dy, x, w, rstd, dx, Tensor(), Stream()).ok());
  Tensor in_place = Clone(dy);
  ASSERT_TRUE(
      RmsNormBackward(in_place, x, w, rstd, in_place, Tensor(), Stream()).ok());
  EXPECT_EQ(Values(in_place), Values(dx));
  ExpectInvalid(
      RmsNormForward(x, RandomTensor({5}, 1), 1e-6f, y, rstd, Stream()),
      "input must have shape (..., 5)");
  ExpectInvalid(
      RmsNormForward(x, w, 1e-6f, y, Empty({4}, DType::kBF16), Stream()),
      "rstd must be f32");
}

TEST(RmsNormTest, Bf16StorageRoundsOnce) {
  const Tensor x = RandomTensor({3, 16}, 6);
  const Tensor w = RandomTensor({16}, 7);
  Tensor y = Empty({3, 16}), rstd = Empty({3});
  ASSERT_TRUE(RmsNormForward(x, w, 1e-6f, y, rstd, Stream()).ok());
  const Tensor x16 = Empty({3, 16}, DType::kBF16);
  ASSERT_TRUE(Copy(x, x16, Stream()).ok());
  Tensor y16 = Empty({3, 16}, DType::kBF16);
  ASSERT_TRUE(RmsNormForward(x16, w, 1e-6f, y16, rstd, Stream()).ok());
  const std::vector<float> a = Values(y), b = Values(y16);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 2e-2);
}

TEST(RotaryTest, InverseFrequencies) {
  // Default: theta^(-2i/D).
  const std::vector<float> plain = RopeInverseFrequencies(8, 10000, {});
  ASSERT_EQ(plain.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_FLOAT_EQ(plain[i], std::pow(10000.0, -2.0 * i / 8));
  }
  // Llama 3.2 1B's (head_dim 64, theta 500000, llama3 factor 32), as
  // transformers 5.25's _compute_llama3_parameters returns them: the
  // high-frequency end kept, the low-frequency end divided by 32, and the
  // smooth band between (indices 15-17).
  RopeScaling llama3;
  llama3.type = "llama3";
  llama3.factor = 32;
  const std::vector<float> scaled = RopeInverseFrequencies(64, 500000, llama3);
  ASSERT_EQ(scaled.size(), 32u);
  const std::vector<std::pair<int, float>> expected = {
      {0, 1.000000000e+00f},  {1, 6.636012793e-01f},  {14, 3.211446106e-03f},
      {15, 1.290548011e-03f}, {16, 4.295567051e-04f}, {17, 9.708286234e-05f},
      {18, 1.946163866e-05f}, {31, 9.418306490e-08f}};
  for (const auto &[index, value] : expected) {
    EXPECT_FLOAT_EQ(scaled[index], value) << index;
  }
}

TEST(RotaryTest, ForwardMatchesTheFormulaWithOffsets) {
  const int64_t batch = 2, seq = 3, heads = 2, d = 6;
  const Tensor x = RandomTensor({batch, seq, heads, d}, 1);
  const Tensor inv_freq = F32(RopeInverseFrequencies(d, 100, {}));
  const Tensor starts = I32({0, 5});
  Tensor y = Empty(x.shape());
  ASSERT_TRUE(RotaryEmbeddingForward(x, inv_freq, starts, y, Stream()).ok());
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq; ++t) {
      const int64_t p = (b == 0 ? 0 : 5) + t;
      for (int64_t h = 0; h < heads; ++h) {
        const float *xr =
            x.data_as<const float>() + ((b * seq + t) * heads + h) * d;
        const float *yr =
            y.data_as<const float>() + ((b * seq + t) * heads + h) * d;
        for (int64_t i = 0; i < d / 2; ++i) {
          const double a = p * std::pow(100.0, -2.0 * i / d);
          EXPECT_NEAR(yr[i], xr[i] * std::cos(a) - xr[i + 3] * std::sin(a),
                      1e-5);
          EXPECT_NEAR(yr[i + 3], xr[i + 3] * std::cos(a) + xr[i] * std::sin(a),
                      1e-5);
        }
      }
    }
  }
  // Without starts, positions are 0..T-1: row 0 is unchanged by starts = 0.
  Tensor y0 = Empty(x.shape());
  ASSERT_TRUE(RotaryEmbeddingForward(x, inv_freq, Tensor(), y0, Stream()).ok());
  const std::vector<float> a = Values(y), b = Values(y0);
  for (int64_t i = 0; i < seq * heads * d; ++i) EXPECT_EQ(a[i], b[i]);
  // In place gives the same.
  Tensor in_place = Clone(x);
  ASSERT_TRUE(
      RotaryEmbeddingForward(in_place, inv_freq, starts, in_place, Stream())
          .ok());
  EXPECT_EQ(Values(in_place), Values(y));
}

TEST(RotaryTest, BackwardMatchesFiniteDifferences) {
  const Tensor inv_freq = F32(RopeInverseFrequencies(4, 10, {}));
  const Tensor starts = I32({3, 0});
  auto forward = [&](const std::vector<Tensor> &in) {
    Tensor y = Empty(in[0].shape());
    EXPECT_TRUE(
        RotaryEmbeddingForward(in[0], inv_freq, starts, y, Stream()).ok());
    return y;
  };
  auto backward = [&](const std::vector<Tensor> &in, const Tensor &dy) {
    Tensor dx = Clone(dy);  // in place
    EXPECT_TRUE(
        RotaryEmbeddingBackward(dx, inv_freq, starts, dx, Stream()).ok());
    return std::vector<Tensor>{dx};
  };
  CheckGradients({RandomTensor({2, 3, 2, 4}, 2)}, {0}, forward, backward);
}

TEST(RotaryTest, Errors) {
  Tensor x = RandomTensor({1, 2, 2, 4}, 1);
  ExpectInvalid(
      RotaryEmbeddingForward(x, F32({1, 1, 1}), Tensor(), x, Stream()),
      "inv_freq must have shape [2]");
  ExpectInvalid(RotaryEmbeddingForward(RandomTensor({2, 8}, 1), F32({1, 1}),
                                       Tensor(), Empty({2, 8}), Stream()),
                "input must be (B, T, H, D)");
  ExpectInvalid(
      RotaryEmbeddingForward(x, F32({1, 1}), I32({0, 0}), x, Stream()),
      "starts must have shape [1]");
}

TEST(SwiGluTest, ForwardAndBackward) {
  const Tensor gate = RandomTensor({3, 5}, 1, 3.0f);
  const Tensor up = RandomTensor({3, 5}, 2);
  Tensor y = Empty({3, 5});
  ASSERT_TRUE(SwiGluForward(gate, up, y, Stream()).ok());
  for (int i = 0; i < 15; ++i) {
    const double g = gate.data_as<const float>()[i];
    EXPECT_NEAR(y.data_as<float>()[i],
                g / (1 + std::exp(-g)) * up.data_as<const float>()[i], 1e-6);
  }
  auto forward = [](const std::vector<Tensor> &in) {
    Tensor out = Empty(in[0].shape());
    EXPECT_TRUE(SwiGluForward(in[0], in[1], out, Stream()).ok());
    return out;
  };
  auto backward = [](const std::vector<Tensor> &in, const Tensor &dy) {
    Tensor dg = Empty(in[0].shape()), du = Empty(in[0].shape());
    EXPECT_TRUE(SwiGluBackward(dy, in[0], in[1], dg, du, Stream()).ok());
    return std::vector<Tensor>{dg, du};
  };
  CheckGradients({RandomTensor({3, 5}, 3, 3.0f), RandomTensor({3, 5}, 4)},
                 {0, 1}, forward, backward);
  ExpectInvalid(SwiGluForward(gate, up, gate, Stream()), "alias");
}

// SwiGluBackward in place (grad_gate into gate, grad_up into up) equals
// the separate buffers' result bit for bit, f32 and bf16; the crossed
// aliases are refused.
TEST(SwiGluTest, BackwardInPlace) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    auto as = [dtype](const Tensor &f32) {
      Tensor out = Tensor::Empty(f32.shape(), dtype, Device::Cpu()).value();
      EXPECT_TRUE(CopyConverting(f32, out, Stream()).ok());
      return out;
    };
    const Tensor gate = as(RandomTensor({4, 9}, 1, 3.0f));
    const Tensor up = as(RandomTensor({4, 9}, 2));
    const Tensor dy = as(RandomTensor({4, 9}, 3));
    Tensor dg = as(RandomTensor({4, 9}, 4)), du = as(RandomTensor({4, 9}, 5));
    ASSERT_TRUE(SwiGluBackward(dy, gate, up, dg, du, Stream()).ok());
    const Tensor gate_in_place = as(gate), up_in_place = as(up);
    ASSERT_TRUE(SwiGluBackward(dy, gate_in_place, up_in_place, gate_in_place,
                               up_in_place, Stream())
                    .ok());
    EXPECT_EQ(Values(gate_in_place), Values(dg));
    EXPECT_EQ(Values(up_in_place), Values(du));
    ExpectInvalid(SwiGluBackward(dy, gate, up, dg, gate, Stream()), "alias");
    const Tensor crossed = as(gate);
    ExpectInvalid(SwiGluBackward(dy, gate, crossed, crossed, du, Stream()),
                  "alias");
  }
}

// q (B, T, Hq, D), k/v (B, T, Hkv, D) -> the fused qkv (B, T, 3 * Hq * D)
// of the GPT attention with each kv head repeated for its group.
Tensor RepeatedQkv(const Tensor &q, const Tensor &k, const Tensor &v) {
  const int64_t batch = q.size(0), seq = q.size(1), hq = q.size(2),
                hkv = k.size(2), d = q.size(3);
  const int64_t c = hq * d;
  Tensor qkv = Empty({batch, seq, 3 * c});
  float *out = qkv.data_as<float>();
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq; ++t) {
      for (int64_t h = 0; h < hq; ++h) {
        const int64_t kv = h / (hq / hkv);
        for (int64_t e = 0; e < d; ++e) {
          float *row = out + (b * seq + t) * 3 * c + h * d + e;
          row[0] = q.data_as<const float>()[((b * seq + t) * hq + h) * d + e];
          row[c] = k.data_as<const float>()[((b * seq + t) * hkv + kv) * d + e];
          row[2 * c] =
              v.data_as<const float>()[((b * seq + t) * hkv + kv) * d + e];
        }
      }
    }
  }
  return qkv;
}

TEST(GroupedAttentionTest, EqualsMultiHeadAttentionWithRepeatedHeads) {
  const int64_t batch = 2, seq = 5, hq = 4, hkv = 2, d = 3;
  const Tensor q = RandomTensor({batch, seq, hq, d}, 1, 2.0f);
  const Tensor k = RandomTensor({batch, seq, hkv, d}, 2, 2.0f);
  const Tensor v = RandomTensor({batch, seq, hkv, d}, 3);
  Tensor out = Empty({batch, seq, hq, d});
  Tensor lse = Empty({batch, hq, seq});
  ASSERT_TRUE(GroupedAttentionForward(q, k, v, out, lse, Stream()).ok());
  Tensor reference = Empty({batch, seq, hq * d});
  Tensor reference_lse = Empty({batch, hq, seq});
  ASSERT_TRUE(AttentionForward(RepeatedQkv(q, k, v), hq, reference,
                               reference_lse, Stream())
                  .ok());
  const std::vector<float> a = Values(out), b = Values(reference);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6);
  const std::vector<float> la = Values(lse), lb = Values(reference_lse);
  for (size_t i = 0; i < la.size(); ++i) EXPECT_NEAR(la[i], lb[i], 1e-6);
}

TEST(GroupedAttentionTest, BackwardMatchesFiniteDifferences) {
  for (const int64_t hkv : {1, 2, 4}) {
    SCOPED_TRACE(hkv);
    auto forward = [](const std::vector<Tensor> &in) {
      Tensor out = Empty(in[0].shape());
      Tensor lse = Empty({in[0].size(0), in[0].size(2), in[0].size(1)});
      EXPECT_TRUE(
          GroupedAttentionForward(in[0], in[1], in[2], out, lse, Stream())
              .ok());
      return out;
    };
    auto backward = [](const std::vector<Tensor> &in, const Tensor &dy) {
      Tensor out = Empty(in[0].shape());
      Tensor lse = Empty({in[0].size(0), in[0].size(2), in[0].size(1)});
      EXPECT_TRUE(
          GroupedAttentionForward(in[0], in[1], in[2], out, lse, Stream())
              .ok());
      Tensor dq = Empty(in[0].shape()), dk = Empty(in[1].shape()),
             dv = Empty(in[2].shape());
      EXPECT_TRUE(GroupedAttentionBackward(dy, in[0], in[1], in[2], out, lse,
                                           dq, dk, dv, Stream())
                      .ok());
      return std::vector<Tensor>{dq, dk, dv};
    };
    CheckGradients(
        {RandomTensor({2, 4, 4, 3}, 10 + hkv), RandomTensor({2, 4, hkv, 3}, 20),
         RandomTensor({2, 4, hkv, 3}, 30)},
        {0, 1, 2}, forward, backward);
  }
}

TEST(GroupedAttentionTest, Errors) {
  const Tensor q = RandomTensor({1, 3, 4, 2}, 1);
  const Tensor k = RandomTensor({1, 3, 3, 2}, 2);
  ExpectInvalid(GroupedAttentionForward(q, k, k, Empty(q.shape()),
                                        Empty({1, 4, 3}), Stream()),
                "Hkv dividing Hq");
  const Tensor k2 = RandomTensor({1, 3, 2, 2}, 2);
  ExpectInvalid(GroupedAttentionForward(q, k2, k2, Empty(q.shape()),
                                        Empty({1, 3, 4}), Stream()),
                "logsumexp must have shape [1, 4, 3]");
}

// Prefill of 3 positions then decode of 2 more (one at a time, rows in
// another order), against the full attention over all 5.
TEST(GroupedAttentionTest, CachedPathEqualsFullAttention) {
  const int64_t batch = 2, seq = 5, hq = 4, hkv = 2, d = 4, capacity = 8;
  const Tensor q = RandomTensor({batch, seq, hq, d}, 1, 2.0f);
  const Tensor k = RandomTensor({batch, seq, hkv, d}, 2, 2.0f);
  const Tensor v = RandomTensor({batch, seq, hkv, d}, 3);
  Tensor full = Empty(q.shape());
  Tensor lse = Empty({batch, hq, seq});
  ASSERT_TRUE(GroupedAttentionForward(q, k, v, full, lse, Stream()).ok());

  // Slice positions [from, from + count) of rows `order` of a (B, T, H, D).
  auto slice = [](const Tensor &x, const std::vector<int> &order, int64_t from,
                  int64_t count) {
    const int64_t t = x.size(1), row = x.size(2) * x.size(3);
    Tensor out = Empty(
        {static_cast<int64_t>(order.size()), count, x.size(2), x.size(3)});
    for (size_t i = 0; i < order.size(); ++i) {
      for (int64_t p = 0; p < count; ++p) {
        for (int64_t e = 0; e < row; ++e) {
          out.data_as<float>()[(i * count + p) * row + e] =
              x.data_as<const float>()[(order[i] * t + from + p) * row + e];
        }
      }
    }
    return out;
  };
  Tensor key_cache = Empty({batch, hkv, capacity, d});
  Tensor value_cache = Empty({batch, hkv, capacity, d});
  ASSERT_TRUE(Fill(key_cache, 1e4f, Stream()).ok());  // stale beyond lengths
  ASSERT_TRUE(Fill(value_cache, 1e4f, Stream()).ok());
  const std::vector<float> expected = Values(full);
  auto run = [&](const std::vector<int> &order, int64_t from, int64_t count) {
    std::vector<int32_t> rows(order.begin(), order.end());
    const Tensor rows_t = I32(rows);
    const Tensor starts = I32(std::vector<int32_t>(order.size(), from));
    ASSERT_TRUE(GroupedKvCacheWrite(slice(k, order, from, count),
                                    slice(v, order, from, count), rows_t,
                                    starts, key_cache, value_cache, Stream())
                    .ok());
    const Tensor qs = slice(q, order, from, count);
    Tensor out = Empty(qs.shape());
    ASSERT_TRUE(GroupedCachedAttentionForward(qs, rows_t, starts, key_cache,
                                              value_cache, out, Stream())
                    .ok());
    const Tensor want = slice(full, order, from, count);
    const std::vector<float> a = Values(out), b = Values(want);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5) << i;
  };
  run({0, 1}, 0, 3);
  run({1, 0}, 3, 1);
  run({0, 1}, 4, 1);

  ExpectInvalid(GroupedCachedAttentionForward(slice(q, {0}, 0, 1), I32({2}),
                                              I32({0}), key_cache, value_cache,
                                              Empty({1, 1, hq, d}), Stream()),
                "rows[0] = 2");
  ExpectInvalid(
      GroupedKvCacheWrite(slice(k, {0}, 0, 2), slice(v, {0}, 0, 2), I32({0}),
                          I32({7}), key_cache, value_cache, Stream()),
      "starts[0] = 7");
}

}  // namespace
}  // namespace nn
}  // namespace ze
