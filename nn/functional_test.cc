// nn/functional.h on the CPU: argument validation (InvalidArgument naming
// the argument), forward values against direct reference formulas, the
// bf16 storage path, and the documented aliasing rules.
#include "nn/functional.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/ops.h"
#include "gtest/gtest.h"
#include "nn/test_util.h"

namespace ze {
namespace nn {
namespace {

using testing::RandomIds;
using testing::RandomTensor;
using testing::Values;

Tensor Empty(const Shape &shape, DType dtype = DType::kF32) {
  return Tensor::Empty(shape, dtype, Device::Cpu()).value();
}

Tensor ToDType(const Tensor &tensor, DType dtype) {
  Tensor result = Empty(tensor.shape(), dtype);
  EXPECT_TRUE(Copy(tensor, result, Stream()).ok());
  return result;
}

void ExpectInvalid(const absl::Status &status, const std::string &needle) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find(needle), std::string::npos) << status;
}

TEST(FunctionalValidationTest, NamesTheBadArgument) {
  const Stream stream;
  ExpectInvalid(LinearForward(RandomTensor({4, 5}, 1), RandomTensor({3, 6}, 2),
                              Tensor(), Empty({4, 3}), stream),
                "input must have shape (..., 6)");
  ExpectInvalid(LinearForward(RandomTensor({4, 5}, 1), RandomTensor({3, 5}, 2),
                              RandomTensor({4}, 3), Empty({4, 3}), stream),
                "bias must have shape [3]");
  const Tensor same = RandomTensor({4, 4}, 1);
  ExpectInvalid(
      LinearForward(same, RandomTensor({4, 4}, 2), Tensor(), same, stream),
      "alias");
  ExpectInvalid(LayerNormForward(RandomTensor({2, 8}, 1), RandomTensor({8}, 2),
                                 RandomTensor({8}, 3), Empty({2, 8}),
                                 Empty({2}, DType::kBF16), Empty({2}), stream),
                "mean must be f32");
  ExpectInvalid(AttentionForward(RandomTensor({1, 4, 12}, 1), 3,
                                 Empty({1, 4, 4}), Empty({1, 3, 4}), stream),
                "num_heads = 3");
  ExpectInvalid(
      EmbeddingForward(RandomTensor({2, 3}, 1), RandomTensor({5, 4}, 2),
                       Tensor(), Empty({2, 3, 4}), stream),
      "tokens must be i32");
  ExpectInvalid(
      EmbeddingForward(RandomIds({2, 9}, 1, 5), RandomTensor({5, 4}, 2),
                       RandomTensor({8, 4}, 3), Empty({2, 9, 4}), stream),
      "position_table must be (max_T >= 9");
  ExpectInvalid(CrossEntropyForward(RandomTensor({6, 5}, 1),
                                    RandomIds({5}, 2, 5), Empty({6}), stream),
                "targets");
  Tensor bad_targets = RandomIds({6}, 2, 5);
  bad_targets.data_as<int32_t>()[4] = 5;
  ExpectInvalid(CrossEntropyForward(RandomTensor({6, 5}, 1), bad_targets,
                                    Empty({6}), stream),
                "targets[4] = 5");
}

// softmax(q k^T / sqrt(D) + causal mask) v, computed directly per element.
TEST(FunctionalTest, AttentionMatchesDirectFormula) {
  const int64_t batch = 2, seq = 5, heads = 2, head_dim = 3;
  const int64_t channels = heads * head_dim;
  const Tensor qkv = RandomTensor({batch, seq, 3 * channels}, 1, 2.0f);
  Tensor output = Empty({batch, seq, channels});
  Tensor lse = Empty({batch, heads, seq});
  ASSERT_TRUE(AttentionForward(qkv, heads, output, lse, Stream()).ok());
  const float *x = qkv.data_as<const float>();
  auto at = [&](int64_t b, int64_t t, int64_t part, int64_t h, int64_t d) {
    return x[(b * seq + t) * 3 * channels + part * channels + h * head_dim + d];
  };
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < seq; ++i) {
        std::vector<double> scores(i + 1);
        double max_score = -1e30, sum = 0.0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < head_dim; ++d) {
            dot += at(b, i, 0, h, d) * at(b, j, 1, h, d);
          }
          scores[j] = dot / std::sqrt(static_cast<double>(head_dim));
          max_score = std::max(max_score, scores[j]);
        }
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(scores[j] - max_score);
        EXPECT_NEAR(lse.data_as<float>()[(b * heads + h) * seq + i],
                    max_score + std::log(sum), 1e-5);
        for (int64_t d = 0; d < head_dim; ++d) {
          double expected = 0.0;
          for (int64_t j = 0; j <= i; ++j) {
            expected +=
                std::exp(scores[j] - max_score) / sum * at(b, j, 2, h, d);
          }
          EXPECT_NEAR(output.data_as<float>()[(b * seq + i) * channels +
                                              h * head_dim + d],
                      expected, 1e-5);
        }
      }
    }
  }
}

TEST(FunctionalTest, CrossEntropyValuesIgnoredRowsAndInPlaceBackward) {
  const Tensor logits = RandomTensor({3, 4}, 1, 2.0f);
  Tensor targets = RandomIds({3}, 2, 4);
  targets.data_as<int32_t>()[1] = -1;
  Tensor losses = Empty({3});
  ASSERT_TRUE(CrossEntropyForward(logits, targets, losses, Stream()).ok());
  const float *z = logits.data_as<const float>();
  for (int row : {0, 2}) {
    double sum = 0.0;
    for (int v = 0; v < 4; ++v) sum += std::exp(z[row * 4 + v]);
    EXPECT_NEAR(losses.data_as<float>()[row],
                std::log(sum) - z[row * 4 + targets.data_as<int32_t>()[row]],
                1e-5);
  }
  EXPECT_EQ(losses.data_as<float>()[1], 0.0f);
  // Out of place and in place (grad_logits aliasing logits) agree exactly.
  Tensor grad = Empty({3, 4});
  ASSERT_TRUE(CrossEntropyBackward(logits, targets, 0.5f, grad, Stream()).ok());
  Tensor in_place = RandomTensor({3, 4}, 1, 2.0f);
  ASSERT_TRUE(
      CrossEntropyBackward(in_place, targets, 0.5f, in_place, Stream()).ok());
  EXPECT_EQ(Values(grad), Values(in_place));
  for (int v = 0; v < 4; ++v) EXPECT_EQ(grad.data_as<float>()[4 + v], 0.0f);
  double row_sum = 0.0;
  for (int v = 0; v < 4; ++v) row_sum += grad.data_as<float>()[v];
  EXPECT_NEAR(row_sum, 0.0, 1e-6);  // softmax - onehot sums to zero
}

// A padded vocabulary: with `classes` < V the columns from `classes` on are
// out of the softmax (no loss share, no gradient), so the loss and the real
// columns' gradients equal those of the unpadded logits.
// CrossEntropySliceBackward, from CrossEntropyForward's logsumexp, equals
// CrossEntropyBackward's columns bit for bit (f32, CPU) for slices that
// cross the padding boundary and lie beyond it; ignored rows are zero.
TEST(FunctionalTest, CrossEntropySliceBackwardEqualsTheWholeRowsColumns) {
  const int64_t rows = 5, vocab = 12, classes = 10;
  const Tensor logits = RandomTensor({rows, vocab}, 1, 3.0f);
  Tensor targets = Tensor::Empty({rows}, DType::kI32, Device::Cpu()).value();
  const int32_t ids[rows] = {3, -1, 9, 0, 7};
  std::copy(ids, ids + rows, targets.data_as<int32_t>());
  Tensor losses = Empty({rows}), lse = Empty({rows});
  ASSERT_TRUE(
      CrossEntropyForward(logits, targets, losses, Stream(), classes, lse)
          .ok());
  Tensor whole = Empty({rows, vocab});
  ASSERT_TRUE(
      CrossEntropyBackward(logits, targets, 0.25f, whole, Stream(), classes)
          .ok());
  const std::vector<float> expected = Values(whole);
  for (int64_t width : {1, 4, 5, 12}) {
    for (int64_t offset = 0; offset < vocab; offset += width) {
      const int64_t count = std::min(width, vocab - offset);
      Tensor slice = Empty({rows, count});
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < count; ++c) {
          slice.data_as<float>()[r * count + c] =
              logits.data_as<const float>()[r * vocab + offset + c];
        }
      }
      ASSERT_TRUE(CrossEntropySliceBackward(slice, lse, targets, offset,
                                            classes, 0.25f, slice, Stream())
                      .ok());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < count; ++c) {
          EXPECT_EQ(slice.data_as<float>()[r * count + c],
                    expected[r * vocab + offset + c])
              << "width " << width << " row " << r << " column " << offset + c;
        }
      }
    }
  }
  ExpectInvalid(CrossEntropySliceBackward(logits, Empty({4}), targets, 0,
                                          classes, 1.0f, logits, Stream()),
                "logsumexp must have shape [5]");
  ExpectInvalid(CrossEntropySliceBackward(logits, lse, targets, 0, 0, 1.0f,
                                          logits, Stream()),
                "classes 0");
}

// LinearCrossEntropyWeightGradient (a vocabulary slice at a time, in the
// backward) equals the forward's (V, K) gradient sum times the scale, for
// slice widths from 1 column to the whole vocabulary, and adds into what
// the gradient held.
TEST(FunctionalTest, LinearCrossEntropyWeightGradientEqualsTheForwardsSum) {
  const int64_t rows = 7, in = 6, vocab = 11, classes = 9;
  const Tensor input = RandomTensor({rows, in}, 1);
  const Tensor weight = RandomTensor({vocab, in}, 2);
  Tensor targets = Tensor::Empty({rows}, DType::kI32, Device::Cpu()).value();
  const int32_t ids[rows] = {3, -1, 8, 0, 7, 2, -1};
  std::copy(ids, ids + rows, targets.data_as<int32_t>());
  Tensor logits = Empty({3, vocab}), losses = Empty({rows});
  Tensor grad_input = Empty({rows, in}), sum = Empty({vocab, in});
  ASSERT_TRUE(Fill(sum, 0.0f, Stream()).ok());
  Tensor lse = Empty({rows});
  ASSERT_TRUE(LinearCrossEntropyForward(input, weight, targets, logits, losses,
                                        Stream(), classes, grad_input, sum, lse)
                  .ok());
  const std::vector<float> start = Values(RandomTensor({vocab, in}, 3));
  const std::vector<float> summed = Values(sum);
  const float scale = 0.3f;
  for (int64_t width : {1, 2, 4, 9, 11}) {
    SCOPED_TRACE(width);
    Tensor grad_weight = RandomTensor({vocab, in}, 3);
    ASSERT_TRUE(LinearCrossEntropyWeightGradient(input, weight, targets, lse,
                                                 scale, Empty({rows, width}),
                                                 grad_weight, Stream(), classes)
                    .ok());
    const std::vector<float> got = Values(grad_weight);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], start[i] + scale * summed[i], 1e-6f) << i;
    }
  }
  ExpectInvalid(LinearCrossEntropyWeightGradient(
                    input, weight, targets, lse, scale, Empty({rows - 1, 2}),
                    RandomTensor({vocab, in}, 3), Stream(), classes),
                "workspace must be (7, S)");
}

TEST(FunctionalTest, CrossEntropyLeavesPaddingColumnsOut) {
  const Tensor padded = RandomTensor({3, 6}, 4, 3.0f);
  Tensor unpadded = Empty({3, 4});
  for (int row = 0; row < 3; ++row) {
    for (int v = 0; v < 4; ++v) {
      unpadded.data_as<float>()[row * 4 + v] =
          padded.data_as<const float>()[row * 6 + v];
    }
  }
  const Tensor targets = RandomIds({3}, 5, 4);
  Tensor losses = Empty({3}), expected_losses = Empty({3});
  ASSERT_TRUE(
      CrossEntropyForward(padded, targets, losses, Stream(), /*classes=*/4)
          .ok());
  ASSERT_TRUE(
      CrossEntropyForward(unpadded, targets, expected_losses, Stream()).ok());
  EXPECT_EQ(Values(losses), Values(expected_losses));
  Tensor grad = Empty({3, 6}), expected_grad = Empty({3, 4});
  ASSERT_TRUE(
      CrossEntropyBackward(padded, targets, 0.5f, grad, Stream(), 4).ok());
  ASSERT_TRUE(
      CrossEntropyBackward(unpadded, targets, 0.5f, expected_grad, Stream())
          .ok());
  for (int row = 0; row < 3; ++row) {
    for (int v = 0; v < 6; ++v) {
      EXPECT_EQ(grad.data_as<float>()[row * 6 + v],
                v < 4 ? expected_grad.data_as<float>()[row * 4 + v] : 0.0f)
          << "row " << row << " column " << v;
    }
  }
  // classes beyond V, and a target in the padding, are refused.
  ExpectInvalid(CrossEntropyForward(padded, targets, losses, Stream(), 7),
                "classes = 7 is outside [0, 6]");
  Tensor padding_target = RandomIds({3}, 5, 4);
  padding_target.data_as<int32_t>()[2] = 4;
  ExpectInvalid(
      CrossEntropyForward(padded, padding_target, losses, Stream(), 4),
      "outside the vocabulary [0, 4)");
}

// bf16 tensors are storage only: the result equals the f32 computation on
// the bf16-rounded inputs, rounded once to bf16 (so within one bf16 ulp).
TEST(FunctionalTest, Bf16StoragePathRoundsOnce) {
  const Tensor input = ToDType(RandomTensor({4, 8}, 1), DType::kBF16);
  const Tensor weight = ToDType(RandomTensor({6, 8}, 2), DType::kBF16);
  const Tensor bias = ToDType(RandomTensor({6}, 3), DType::kBF16);
  Tensor output = Empty({4, 6}, DType::kBF16);
  ASSERT_TRUE(LinearForward(input, weight, bias, output, Stream()).ok());
  Tensor reference = Empty({4, 6});
  ASSERT_TRUE(LinearForward(ToDType(input, DType::kF32),
                            ToDType(weight, DType::kF32),
                            ToDType(bias, DType::kF32), reference, Stream())
                  .ok());
  const std::vector<float> got = Values(output);
  const std::vector<float> want = Values(reference);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i], static_cast<float>(bf16(want[i]))) << i;
  }
  // Accumulating a bf16 gradient: widened, summed in f32, rounded.
  Tensor grad_weight = ToDType(RandomTensor({6, 8}, 4), DType::kBF16);
  const std::vector<float> before = Values(grad_weight);
  Tensor grad_output = ToDType(RandomTensor({4, 6}, 5), DType::kBF16);
  ASSERT_TRUE(LinearBackward(grad_output, input, weight, Tensor(), grad_weight,
                             Tensor(), Stream())
                  .ok());
  const std::vector<float> dy = Values(grad_output);
  const std::vector<float> x = Values(input);
  const std::vector<float> after = Values(grad_weight);
  for (int n = 0; n < 6; ++n) {
    for (int k = 0; k < 8; ++k) {
      double expected = before[n * 8 + k];
      for (int m = 0; m < 4; ++m) expected += dy[m * 6 + n] * x[m * 8 + k];
      EXPECT_NEAR(after[n * 8 + k], expected,
                  std::fabs(expected) * 8e-3 + 1e-6);
    }
  }
}

TEST(FunctionalTest, GeluBackwardMayAliasGradOutput) {
  const Tensor input = RandomTensor({10}, 1, 3.0f);
  const Tensor grad_output = RandomTensor({10}, 2);
  Tensor separate = Empty({10});
  ASSERT_TRUE(GeluBackward(grad_output, input, separate, Stream()).ok());
  Tensor aliased = RandomTensor({10}, 2);
  ASSERT_TRUE(GeluBackward(aliased, input, aliased, Stream()).ok());
  EXPECT_EQ(Values(separate), Values(aliased));
}

// LinearGeluForward is LinearForward into pre_activation, then GeluForward:
// in f32 the same arithmetic, so bit for bit; with bf16 storage, GELU reads
// the unrounded f32 pre-activation, so within one bf16 rounding.
TEST(FunctionalTest, LinearGeluForwardMatchesLinearThenGelu) {
  const Tensor input = RandomTensor({2, 3, 5}, 1, 2.0f);
  const Tensor weight = RandomTensor({8, 5}, 2);
  const Tensor bias = RandomTensor({8}, 3);
  for (const Tensor &maybe_bias : {bias, Tensor()}) {
    Tensor pre_ref = Empty({2, 3, 8}), out_ref = Empty({2, 3, 8});
    ASSERT_TRUE(
        LinearForward(input, weight, maybe_bias, pre_ref, Stream()).ok());
    ASSERT_TRUE(GeluForward(pre_ref, out_ref, Stream()).ok());
    Tensor pre = Empty({2, 3, 8}), out = Empty({2, 3, 8});
    ASSERT_TRUE(
        LinearGeluForward(input, weight, maybe_bias, out, pre, Stream()).ok());
    EXPECT_EQ(Values(pre), Values(pre_ref));
    EXPECT_EQ(Values(out), Values(out_ref));
  }
  Tensor pre16 = Empty({2, 3, 8}, DType::kBF16);
  Tensor out16 = Empty({2, 3, 8}, DType::kBF16);
  ASSERT_TRUE(LinearGeluForward(
                  ToDType(input, DType::kBF16), ToDType(weight, DType::kBF16),
                  ToDType(bias, DType::kBF16), out16, pre16, Stream())
                  .ok());
  Tensor pre_ref = Empty({2, 3, 8}), out_ref = Empty({2, 3, 8});
  ASSERT_TRUE(
      LinearGeluForward(ToDType(ToDType(input, DType::kBF16), DType::kF32),
                        ToDType(ToDType(weight, DType::kBF16), DType::kF32),
                        ToDType(ToDType(bias, DType::kBF16), DType::kF32),
                        out_ref, pre_ref, Stream())
          .ok());
  const std::vector<float> want_pre = Values(pre_ref);
  const std::vector<float> want_out = Values(out_ref);
  const std::vector<float> got_pre = Values(pre16);
  const std::vector<float> got_out = Values(out16);
  for (size_t i = 0; i < want_pre.size(); ++i) {
    EXPECT_EQ(got_pre[i], static_cast<float>(bf16(want_pre[i]))) << i;
    EXPECT_EQ(got_out[i], static_cast<float>(bf16(want_out[i]))) << i;
  }
}

// GeluLinearBackward against the unfused composition: LinearBackward (input
// gradient, weight and bias gradients), GeluBackward, and the column sums of
// the result for the producing Linear's bias. Every gradient accumulates
// into non-zero starting values.
TEST(FunctionalTest, GeluLinearBackwardMatchesUnfusedComposition) {
  const int64_t m = 6, k = 8, n = 5;
  const Tensor pre = RandomTensor({2, 3, k}, 1, 3.0f);
  Tensor input = Empty({2, 3, k});  // gelu(pre), as the forward saved it
  ASSERT_TRUE(GeluForward(pre, input, Stream()).ok());
  const Tensor weight = RandomTensor({n, k}, 2);
  const Tensor grad_output = RandomTensor({2, 3, n}, 3);

  Tensor grad_hidden = Empty({2, 3, k}), grad_pre_ref = Empty({2, 3, k});
  Tensor grad_weight_ref = RandomTensor({n, k}, 4);
  Tensor grad_bias_ref = RandomTensor({n}, 5);
  ASSERT_TRUE(LinearBackward(grad_output, input, weight, grad_hidden,
                             grad_weight_ref, grad_bias_ref, Stream())
                  .ok());
  ASSERT_TRUE(GeluBackward(grad_hidden, pre, grad_pre_ref, Stream()).ok());
  const std::vector<float> grad_pre_values = Values(grad_pre_ref);
  std::vector<double> pre_bias_ref(k);
  const std::vector<float> pre_bias_start = Values(RandomTensor({k}, 6));
  for (int64_t c = 0; c < k; ++c) {
    pre_bias_ref[c] = pre_bias_start[c];
    for (int64_t r = 0; r < m; ++r)
      pre_bias_ref[c] += grad_pre_values[r * k + c];
  }

  Tensor grad_pre = Empty({2, 3, k});
  Tensor grad_weight = RandomTensor({n, k}, 4);
  Tensor grad_bias = RandomTensor({n}, 5);
  Tensor pre_bias = RandomTensor({k}, 6);
  ASSERT_TRUE(GeluLinearBackward(grad_output, input, weight, pre, grad_pre,
                                 grad_weight, grad_bias, pre_bias, Stream())
                  .ok());
  EXPECT_EQ(Values(grad_pre), grad_pre_values);
  EXPECT_EQ(Values(grad_weight), Values(grad_weight_ref));
  EXPECT_EQ(Values(grad_bias), Values(grad_bias_ref));
  const std::vector<float> got_pre_bias = Values(pre_bias);
  for (int64_t c = 0; c < k; ++c) {
    EXPECT_NEAR(got_pre_bias[c], pre_bias_ref[c], 1e-5) << c;
  }

  // Only the pre-activation gradient (no parameter gradients, no input).
  Tensor grad_pre_only = Empty({2, 3, k});
  ASSERT_TRUE(GeluLinearBackward(grad_output, Tensor(), weight, pre,
                                 grad_pre_only, Tensor(), Tensor(), Tensor(),
                                 Stream())
                  .ok());
  EXPECT_EQ(Values(grad_pre_only), grad_pre_values);
}

// grad_input (grad_pre_activation) may be input itself: the result equals
// a separate buffer's bit for bit (the weight gradient reads input first),
// f32 and bf16; a partial overlap (another shape over the same data) is
// refused by name.
TEST(FunctionalTest, InputGradientsMayOverwriteTheInput) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const int64_t m = 6, k = 8, n = 5;
    const Tensor pre = ToDType(RandomTensor({m, k}, 1, 3.0f), dtype);
    Tensor input = Empty({m, k}, dtype);
    ASSERT_TRUE(GeluForward(pre, input, Stream()).ok());
    const Tensor weight = ToDType(RandomTensor({n, k}, 2), dtype);
    const Tensor grad_output = ToDType(RandomTensor({m, n}, 3), dtype);
    const Tensor addend = ToDType(RandomTensor({m, k}, 7), dtype);
    for (int op = 0; op < 3; ++op) {
      SCOPED_TRACE(op);
      auto run = [&](const Tensor &x, const Tensor &grad_x,
                     const Tensor &grad_weight) {
        switch (op) {
          case 0:
            return LinearBackward(grad_output, x, weight, grad_x, grad_weight,
                                  Tensor(), Stream());
          case 1:
            return LinearBackwardAdd(grad_output, x, weight, addend, grad_x,
                                     grad_weight, Tensor(), Stream());
          default:
            return GeluLinearBackward(grad_output, x, weight, pre, grad_x,
                                      grad_weight, Tensor(), Tensor(),
                                      Stream());
        }
      };
      Tensor grad_input = Empty({m, k}, dtype);
      Tensor grad_weight = RandomTensor({n, k}, 4);
      ASSERT_TRUE(run(input, grad_input, grad_weight).ok());
      Tensor in_place = ToDType(input, dtype);
      Tensor grad_weight_in_place = RandomTensor({n, k}, 4);
      ASSERT_TRUE(run(in_place, in_place, grad_weight_in_place).ok());
      EXPECT_EQ(Values(in_place), Values(grad_input));
      EXPECT_EQ(Values(grad_weight_in_place), Values(grad_weight));
      Tensor reshaped = ToDType(input, dtype);
      ExpectInvalid(
          run(reshaped, reshaped.View({2, m / 2, k}), RandomTensor({n, k}, 4)),
          "may be input itself");
    }
  }
}

TEST(FunctionalValidationTest, FusedGeluOpsNameTheBadArgument) {
  const Stream stream;
  const Tensor input = RandomTensor({4, 5}, 1);
  const Tensor weight = RandomTensor({8, 5}, 2);
  Tensor output = Empty({4, 8});
  ExpectInvalid(
      LinearGeluForward(input, weight, Tensor(), output, Empty({4, 7}), stream),
      "pre_activation must have shape [4, 8]");
  ExpectInvalid(
      LinearGeluForward(input, weight, Tensor(), output, output, stream),
      "pre_activation must not alias");
  ExpectInvalid(
      LinearGeluForward(input, weight, Tensor(), output, Tensor(), stream),
      "pre_activation is undefined");
  const Tensor grad_output = RandomTensor({4, 8}, 3);
  const Tensor proj_weight = RandomTensor({8, 6}, 4);
  const Tensor pre = RandomTensor({4, 6}, 5);
  ExpectInvalid(
      GeluLinearBackward(grad_output, Tensor(), proj_weight, pre, Empty({4, 6}),
                         Tensor(), Tensor(), Empty({5}), stream),
      "grad_pre_activation_bias must have shape [6]");
  ExpectInvalid(GeluLinearBackward(grad_output, Tensor(), proj_weight,
                                   RandomTensor({4, 5}, 5), Empty({4, 6}),
                                   Tensor(), Tensor(), Tensor(), stream),
                "pre_activation must have shape [4, 6]");
  ExpectInvalid(GeluLinearBackward(grad_output, Tensor(), proj_weight, pre, pre,
                                   Tensor(), Tensor(), Tensor(), stream),
                "grad_pre_activation must not alias");
  ExpectInvalid(
      GeluLinearBackward(grad_output, Tensor(), proj_weight, pre, Tensor(),
                         Tensor(), Tensor(), Tensor(), stream),
      "grad_pre_activation is undefined");
}

// The residual-fusion ops (LinearForwardAdd, LayerNormBackwardAdd) equal
// their two-step compositions exactly on the CPU (f32 and bf16 storage),
// and reject aliasing with a named error.
TEST(FunctionalTest, ResidualFusionOpsMatchTheirCompositions) {
  const Stream stream;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const Tensor input = ToDType(RandomTensor({3, 4, 6}, 1), dtype);
    const Tensor weight = ToDType(RandomTensor({6, 6}, 2), dtype);
    const Tensor bias = ToDType(RandomTensor({6}, 3), dtype);
    const Tensor residual = ToDType(RandomTensor({3, 4, 6}, 4), dtype);

    // LinearForwardAdd = LinearForward, then residual + output.
    Tensor fused = Empty({3, 4, 6}, dtype);
    ASSERT_TRUE(
        LinearForwardAdd(input, weight, bias, residual, fused, stream).ok());
    Tensor twostep = Empty({3, 4, 6}, dtype);
    ASSERT_TRUE(LinearForward(input, weight, bias, twostep, stream).ok());
    ASSERT_TRUE(Add(residual, twostep, twostep, stream).ok());
    EXPECT_EQ(Values(fused), Values(twostep)) << DTypeName(dtype);

    // A LayerNorm forward over input + residual, whose statistics the
    // backward below needs.
    const Tensor ln_weight = ToDType(RandomTensor({6}, 5), dtype);
    const Tensor ln_bias = ToDType(RandomTensor({6}, 6), dtype);
    Tensor want_sum = Empty({3, 4, 6}, dtype);
    ASSERT_TRUE(Add(input, residual, want_sum, stream).ok());
    Tensor want_normed = Empty({3, 4, 6}, dtype);
    Tensor want_mean = Empty({12}), want_rstd = Empty({12});
    ASSERT_TRUE(LayerNormForward(want_sum, ln_weight, ln_bias, want_normed,
                                 want_mean, want_rstd, stream)
                    .ok());

    // LayerNormBackwardAdd = LayerNormBackward, then + addend; parameter
    // gradients accumulate the same way.
    const Tensor grad_output = ToDType(RandomTensor({3, 4, 6}, 7), dtype);
    const Tensor addend = ToDType(RandomTensor({3, 4, 6}, 8), dtype);
    Tensor grad_input = Empty({3, 4, 6}, dtype);
    Tensor grad_weight = ToDType(RandomTensor({6}, 9), dtype);
    Tensor grad_bias = ToDType(RandomTensor({6}, 10), dtype);
    ASSERT_TRUE(LayerNormBackwardAdd(grad_output, want_sum, ln_weight,
                                     want_mean, want_rstd, addend, grad_input,
                                     grad_weight, grad_bias, stream)
                    .ok());
    Tensor want_grad_input = Empty({3, 4, 6}, dtype);
    Tensor want_grad_weight = ToDType(RandomTensor({6}, 9), dtype);
    Tensor want_grad_bias = ToDType(RandomTensor({6}, 10), dtype);
    ASSERT_TRUE(LayerNormBackward(grad_output, want_sum, ln_weight, want_mean,
                                  want_rstd, want_grad_input, want_grad_weight,
                                  want_grad_bias, stream)
                    .ok());
    ASSERT_TRUE(Add(want_grad_input, addend, want_grad_input, stream).ok());
    EXPECT_EQ(Values(grad_input), Values(want_grad_input));
    EXPECT_EQ(Values(grad_weight), Values(want_grad_weight));
    EXPECT_EQ(Values(grad_bias), Values(want_grad_bias));
  }

  const Tensor input = RandomTensor({4, 6}, 1);
  const Tensor weight = RandomTensor({6, 6}, 2);
  Tensor output = Empty({4, 6});
  ExpectInvalid(
      LinearForwardAdd(input, weight, Tensor(), output, output, Stream()),
      "residual must not alias");
  ExpectInvalid(LinearForwardAdd(input, weight, Tensor(), Empty({4, 5}), output,
                                 Stream()),
                "residual must have shape [4, 6]");
  const Tensor grad = RandomTensor({4, 6}, 3);
  ExpectInvalid(LayerNormBackwardAdd(grad, input, RandomTensor({6}, 4),
                                     Empty({4}), Empty({4}), output, output,
                                     Tensor(), Tensor(), Stream()),
                "grad_addend must not alias grad_input");
}

// The decoder's fusions of a second branch's input gradient:
// LinearBackwardAdd = LinearBackward, then addend + grad_input (the order
// the decoder layers summed in), and RmsNormBackwardAdd = RmsNormBackward,
// then grad_input + addend; parameter gradients accumulate as unfused.
TEST(FunctionalTest, GradInputAddendOpsMatchTheirCompositions) {
  const Stream stream;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const Tensor input = ToDType(RandomTensor({3, 4, 6}, 1), dtype);
    const Tensor weight = ToDType(RandomTensor({5, 6}, 2), dtype);
    const Tensor grad_output = ToDType(RandomTensor({3, 4, 5}, 3), dtype);
    const Tensor addend = ToDType(RandomTensor({3, 4, 6}, 4), dtype);
    Tensor grad_input = Empty({3, 4, 6}, dtype);
    Tensor grad_weight = ToDType(RandomTensor({5, 6}, 5), dtype);
    ASSERT_TRUE(LinearBackwardAdd(grad_output, input, weight, addend,
                                  grad_input, grad_weight, Tensor(), stream)
                    .ok());
    Tensor want_grad_input = Empty({3, 4, 6}, dtype);
    Tensor want_grad_weight = ToDType(RandomTensor({5, 6}, 5), dtype);
    ASSERT_TRUE(LinearBackward(grad_output, input, weight, want_grad_input,
                               want_grad_weight, Tensor(), stream)
                    .ok());
    ASSERT_TRUE(Add(addend, want_grad_input, want_grad_input, stream).ok());
    EXPECT_EQ(Values(grad_input), Values(want_grad_input)) << DTypeName(dtype);
    EXPECT_EQ(Values(grad_weight), Values(want_grad_weight));

    const Tensor norm_weight = ToDType(RandomTensor({6}, 6), dtype);
    Tensor normed = Empty({3, 4, 6}, dtype), rstd = Empty({12});
    ASSERT_TRUE(
        RmsNormForward(input, norm_weight, 1e-6f, normed, rstd, stream).ok());
    const Tensor norm_grad_output = ToDType(RandomTensor({3, 4, 6}, 7), dtype);
    Tensor norm_grad_input = Empty({3, 4, 6}, dtype);
    Tensor norm_grad_weight = RandomTensor({6}, 8);
    ASSERT_TRUE(RmsNormBackwardAdd(norm_grad_output, input, norm_weight, rstd,
                                   addend, norm_grad_input, norm_grad_weight,
                                   stream)
                    .ok());
    Tensor want_norm_grad_input = Empty({3, 4, 6}, dtype);
    Tensor want_norm_grad_weight = RandomTensor({6}, 8);
    ASSERT_TRUE(RmsNormBackward(norm_grad_output, input, norm_weight, rstd,
                                want_norm_grad_input, want_norm_grad_weight,
                                stream)
                    .ok());
    ASSERT_TRUE(
        Add(want_norm_grad_input, addend, want_norm_grad_input, stream).ok());
    EXPECT_EQ(Values(norm_grad_input), Values(want_norm_grad_input));
    EXPECT_EQ(Values(norm_grad_weight), Values(want_norm_grad_weight));
  }

  const Tensor input = RandomTensor({4, 6}, 1);
  const Tensor grad = RandomTensor({4, 5}, 3);
  Tensor grad_input = Empty({4, 6});
  ExpectInvalid(
      LinearBackwardAdd(grad, input, RandomTensor({5, 6}, 2), grad_input,
                        grad_input, Tensor(), Tensor(), Stream()),
      "grad_addend must not alias grad_input");
  ExpectInvalid(
      LinearBackwardAdd(grad, input, RandomTensor({5, 6}, 2), Empty({4, 5}),
                        grad_input, Tensor(), Tensor(), Stream()),
      "grad_addend must have shape [4, 6]");
  ExpectInvalid(
      RmsNormBackwardAdd(RandomTensor({4, 6}, 4), input, RandomTensor({6}, 5),
                         Empty({4}), Tensor(), grad_input, Tensor(), Stream()),
      "grad_addend");
}

TEST(FunctionalTest, EmbeddingAddsPositionRows) {
  const Tensor tokens = RandomIds({2, 3}, 1, 5);
  const Tensor wte = RandomTensor({5, 4}, 2);
  const Tensor wpe = RandomTensor({6, 4}, 3);
  Tensor output = Empty({2, 3, 4});
  ASSERT_TRUE(EmbeddingForward(tokens, wte, wpe, output, Stream()).ok());
  for (int b = 0; b < 2; ++b) {
    for (int t = 0; t < 3; ++t) {
      const int id = tokens.data_as<int32_t>()[b * 3 + t];
      for (int c = 0; c < 4; ++c) {
        EXPECT_EQ(
            output.data_as<float>()[(b * 3 + t) * 4 + c],
            wte.data_as<float>()[id * 4 + c] + wpe.data_as<float>()[t * 4 + c]);
      }
    }
  }
}

}  // namespace
}  // namespace nn
}  // namespace ze
