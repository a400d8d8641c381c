// The output head's chunked loss (OutputHead's loss mode over
// LinearCrossEntropyForward) on the CPU in f32, against the
// whole-logits path it replaces (logits (N, V), CrossEntropyForward, the
// gradient formed in place, LinearBackward): the ops alone for several
// chunk sizes (ragged last chunks, ignored targets, a padded vocabulary),
// the decoder (tied and untied) and GPT through ForwardLoss/BackwardLoss,
// and the host allocator's peak: the chunked loss never holds (N, V)
// logits.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/allocator.h"
#include "core/ops.h"
#include "gtest/gtest.h"
#include "nn/decoder.h"
#include "nn/functional.h"
#include "nn/gpt.h"
#include "nn/layers.h"
#include "nn/test_util.h"

namespace ze {
namespace nn {
namespace {

using testing::RandomIds;
using testing::RandomTensor;
using testing::Values;

constexpr double kTolerance = 1e-6;

// |actual - expected| <= kTolerance * max |expected| for every element:
// relative to the tensor's scale, since single elements near 0 (a sum of
// terms that cancel) carry the rounding of the larger terms.
void ExpectClose(const std::vector<float> &actual,
                 const std::vector<float> &expected, const std::string &what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double scale = 0;
  for (float value : expected)
    scale = std::max(scale, std::fabs(double{value}));
  ASSERT_GT(scale, 0) << what << " is all zeros: the check would be empty";
  double worst = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    worst = std::max(worst, std::fabs(double{actual[i]} - expected[i]));
  }
  EXPECT_LE(worst, kTolerance * scale)
      << what << ": largest difference " << worst << " at scale " << scale;
}

Tensor Clone(const Tensor &tensor) {
  Tensor copy =
      Tensor::Empty(tensor.shape(), tensor.dtype(), Device::Cpu()).value();
  std::memcpy(copy.data(), tensor.data(), tensor.nbytes());
  return copy;
}

// Targets in [0, classes) with every third row ignored (-1).
Tensor TargetsWithIgnored(const Shape &shape, uint64_t seed, int32_t classes) {
  Tensor targets = RandomIds(shape, seed, classes);
  for (int64_t i = 0; i < targets.numel(); i += 3) {
    targets.data_as<int32_t>()[i] = -1;
  }
  return targets;
}

// ---- The ops alone.

TEST(LinearCrossEntropyTest, EqualsTheWholeLogitsPathForEveryChunkSize) {
  const int64_t rows = 10, in = 8, vocab = 23, classes = 20;
  const Tensor input = RandomTensor({2, 5, in}, 1);  // rows folded: (..., K)
  const Tensor weight = RandomTensor({vocab, in}, 2, 0.5f);
  const Tensor targets = TargetsWithIgnored({2, 5}, 3, classes);
  const Tensor initial_grad_weight = RandomTensor({vocab, in}, 4);
  const Stream stream;

  // The whole-logits path.
  Tensor logits =
      Tensor::Empty({rows, vocab}, DType::kF32, Device::Cpu()).value();
  Tensor losses = Tensor::Empty({rows}, DType::kF32, Device::Cpu()).value();
  ASSERT_TRUE(LinearForward(input, weight, Tensor(), logits, stream).ok());
  ASSERT_TRUE(
      CrossEntropyForward(logits, targets, losses, stream, classes).ok());
  ASSERT_TRUE(
      CrossEntropyBackward(logits, targets, 1.0f, logits, stream, classes)
          .ok());
  Tensor grad_input = RandomTensor(input.shape(), 5);
  Tensor grad_weight = Clone(initial_grad_weight);
  ASSERT_TRUE(LinearBackward(logits, input, weight, grad_input, grad_weight,
                             Tensor(), stream)
                  .ok());

  // 1 and 3 (ragged: 3+3+3+1), 4 (4+4+2), 10 (one chunk), 16 (more rows
  // than the input has).
  for (int64_t chunk : {1, 3, 4, 10, 16}) {
    SCOPED_TRACE(absl::StrCat("chunk rows ", chunk));
    Tensor workspace =
        Tensor::Empty({chunk, vocab}, DType::kF32, Device::Cpu()).value();
    Tensor chunked_losses =
        Tensor::Empty({2, 5}, DType::kF32, Device::Cpu()).value();
    // Overwritten, whatever it held.
    Tensor chunked_grad_input = RandomTensor(input.shape(), 6);
    Tensor chunked_grad_weight = Clone(initial_grad_weight);
    ASSERT_TRUE(LinearCrossEntropyForward(
                    input, weight, targets, workspace, chunked_losses, stream,
                    classes, chunked_grad_input, chunked_grad_weight)
                    .ok());
    ExpectClose(Values(chunked_losses), Values(losses), "losses");
    ExpectClose(Values(chunked_grad_input), Values(grad_input), "grad_input");
    ExpectClose(Values(chunked_grad_weight), Values(grad_weight),
                "grad_weight (accumulated)");
  }
}

TEST(LinearCrossEntropyTest, RejectsABadWorkspaceAndTargets) {
  const Tensor input = RandomTensor({4, 3}, 1);
  const Tensor weight = RandomTensor({5, 3}, 2);
  const Tensor targets = RandomIds({4}, 3, 5);
  const Tensor losses = RandomTensor({4}, 4);
  const Stream stream;
  const absl::Status wrong_width = LinearCrossEntropyForward(
      input, weight, targets, RandomTensor({2, 4}, 5), losses, stream);
  EXPECT_EQ(wrong_width.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_width.message().find("workspace"), std::string::npos)
      << wrong_width;
  const absl::Status no_rows = LinearCrossEntropyForward(
      input, weight, targets, RandomTensor({0, 5}, 5), losses, stream);
  EXPECT_EQ(no_rows.code(), absl::StatusCode::kInvalidArgument);
  const absl::Status short_targets = LinearCrossEntropyForward(
      input, weight, RandomIds({3}, 3, 5), RandomTensor({2, 5}, 5), losses,
      stream, 0, RandomTensor({4, 3}, 6));
  EXPECT_EQ(short_targets.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(short_targets.message().find("targets"), std::string::npos)
      << short_targets;
}

TEST(OutputHeadTest, ChunkRowsFollowTheByteBudget) {
  // 2 GiB of bf16 rows of Llama 3's vocabulary: 8371, rounded to 8320.
  EXPECT_EQ(OutputHead::LossChunkRowsFor(128256, DType::kBF16), 8320);
  EXPECT_EQ(OutputHead::LossChunkRowsFor(50304, DType::kBF16), 21248);
  EXPECT_EQ(OutputHead::LossChunkRowsFor(50304, DType::kF32), 10624);
  // Below one tile: as many rows as fit, at least one.
  EXPECT_EQ(OutputHead::LossChunkRowsFor(int64_t{1} << 29, DType::kF32), 1);
  EXPECT_EQ(OutputHead::LossChunkRowsFor(int64_t{1} << 24, DType::kF32), 32);
}

TEST(OutputHeadTest, DefaultChunksAreEvenAndWithinTheBudget) {
  LayerOptions options;
  options.dtype = DType::kBF16;
  // Llama 3's vocabulary; 2 channels keep the weight small.
  OutputHead output(/*channels=*/2, /*vocab=*/128256, options);
  // One chunk while the budget holds every row.
  EXPECT_EQ(output.loss_chunk_rows(4096, DType::kBF16), 4096);
  EXPECT_EQ(output.loss_chunk_rows(8320, DType::kBF16), 8320);
  // 16384 rows: two chunks of 8192, not 8320 + 8064.
  EXPECT_EQ(output.loss_chunk_rows(16384, DType::kBF16), 8192);
  // 3 chunks for 20000 rows: 6667 rounded up to the tile, 6784.
  EXPECT_EQ(output.loss_chunk_rows(20000, DType::kBF16), 6784);
  for (int64_t rows : {1, 127, 8321, 16641, 100000}) {
    const int64_t chunk = output.loss_chunk_rows(rows, DType::kBF16);
    const int64_t limit = OutputHead::LossChunkRowsFor(128256, DType::kBF16);
    EXPECT_LE(chunk, std::max<int64_t>(rows, 1)) << rows;
    EXPECT_LE(chunk, limit) << rows;
    // No more chunks than the budget needs.
    EXPECT_EQ((rows + chunk - 1) / chunk, (rows + limit - 1) / limit) << rows;
  }
  // A set value is kept as it is.
  output.set_loss_chunk_rows(3);
  EXPECT_EQ(output.loss_chunk_rows(16384, DType::kBF16), 3);
}

// LossBuffersFor states what a loss-mode forward allocates: measured with
// the host allocator around one saving forward (sizes that are multiples of
// its 256-byte rounding), chunked and whole, with a trainable weight and a
// frozen one, and freed by the backward. A memory model of the head's stage
// (bench/pipeline_model) counts these instead of its own guess.
TEST(OutputHeadTest, LossBuffersAreWhatTheForwardAllocates) {
  const int64_t rows = 64, channels = 16, vocab = 128;
  for (int64_t set_rows : {int64_t{0}, int64_t{32}}) {
    for (bool trainable : {true, false}) {
      for (OutputHead::WeightGradient where :
           {OutputHead::WeightGradient::kInForward,
            OutputHead::WeightGradient::kInBackward}) {
        const bool in_backward =
            trainable && where == OutputHead::WeightGradient::kInBackward;
        SCOPED_TRACE(absl::StrCat("chunk rows ", set_rows,
                                  trainable ? ", trainable" : ", frozen",
                                  in_backward ? ", in backward" : ""));
        OutputHead head(channels, vocab, LayerOptions{});
        ASSERT_TRUE(head.MaterializeParameters(3, Stream()).ok());
        head.weight()->set_requires_grad(trainable);
        head.set_loss_chunk_rows(set_rows);
        head.set_weight_gradient(where);
        const OutputHead::LossBuffers buffers = OutputHead::LossBuffersFor(
            rows, channels, vocab, DType::kF32, set_rows, trainable, where);
        // The saved input is this test's own tensor, allocated before.
        const int64_t kept_input = in_backward ? rows * channels * 4 : 0;
        EXPECT_EQ(buffers.logits_chunk_bytes,
                  (set_rows > 0 ? set_rows : rows) * vocab * 4);
        const Stream stream;
        const Tensor input = RandomTensor({rows, channels}, 1);
        const Tensor targets = RandomIds({rows}, 2, vocab);
        Allocator &host = *HostMemory();
        const int64_t before = host.stats().bytes_in_use;
        host.ResetPeak();
        head.ComputeLossInNextForward(targets, vocab);
        absl::StatusOr<Tensor> losses = head.Forward(input, stream);
        ASSERT_TRUE(losses.ok()) << losses.status();
        const AllocatorStats forward = host.stats();
        EXPECT_EQ(forward.bytes_in_use - before,
                  buffers.losses_bytes + buffers.saved_bytes - kept_input);
        EXPECT_EQ(forward.peak_bytes_in_use - before,
                  buffers.logits_chunk_bytes + buffers.losses_bytes +
                      buffers.saved_bytes - kept_input);
        *losses = Tensor();
        const float one = 1.0f;
        absl::StatusOr<Tensor> grad_input =
            head.Backward(Tensor::Wrap(const_cast<float *>(&one), {1},
                                       DType::kF32, Device::Cpu()),
                          stream);
        ASSERT_TRUE(grad_input.ok()) << grad_input.status();
        *grad_input = Tensor();
        head.weight()->ReleaseGrad();
        EXPECT_EQ(host.stats().bytes_in_use, before);
      }
    }
  }
}

// ---- Whole models: ForwardLoss/BackwardLoss against the whole-logits path
// through the public Forward/Backward (which still returns logits).

// The loss and every parameter's gradient (f32 values, by name).
struct LossAndGrads {
  float loss = 0;
  std::vector<std::vector<float>> grads;
};

LossAndGrads ChunkedLoss(LossModel &model, const Tensor &tokens,
                         const Tensor &targets, float loss_scale) {
  const Stream stream;
  EXPECT_TRUE(model.ZeroGrad(stream).ok());
  LossAndGrads result;
  result.loss = model.ForwardLoss(tokens, targets, stream).value();
  EXPECT_TRUE(model.BackwardLoss(loss_scale, stream).ok());
  for (Parameter *parameter : model.Parameters()) {
    result.grads.push_back(Values(parameter->grad()));
  }
  return result;
}

LossAndGrads WholeLogitsLoss(Module &model, const Tensor &tokens,
                             const Tensor &targets, int64_t classes,
                             float loss_scale) {
  const Stream stream;
  EXPECT_TRUE(model.ZeroGrad(stream).ok());
  Tensor logits = model.Forward(tokens, stream).value();  // (B, T, V)
  EXPECT_EQ(logits.dim(), 3);
  Tensor losses =
      Tensor::Empty(targets.shape(), DType::kF32, Device::Cpu()).value();
  EXPECT_TRUE(
      CrossEntropyForward(logits, targets, losses, stream, classes).ok());
  double sum = 0;
  int64_t counted = 0;
  for (int64_t i = 0; i < targets.numel(); ++i) {
    if (targets.data_as<const int32_t>()[i] < 0) continue;
    sum += losses.data_as<const float>()[i];
    ++counted;
  }
  EXPECT_GT(counted, 0);
  EXPECT_TRUE(CrossEntropyBackward(logits, targets, loss_scale / counted,
                                   logits, stream, classes)
                  .ok());
  EXPECT_TRUE(model.Backward(logits, stream).ok());
  LossAndGrads result;
  result.loss = static_cast<float>(sum / counted);
  for (Parameter *parameter : model.Parameters()) {
    result.grads.push_back(Values(parameter->grad()));
  }
  return result;
}

void ExpectSameLossAndGrads(Module &model, const LossAndGrads &actual,
                            const LossAndGrads &expected) {
  EXPECT_NEAR(actual.loss, expected.loss, kTolerance * expected.loss);
  const std::vector<Parameter *> parameters = model.Parameters();
  ASSERT_EQ(actual.grads.size(), parameters.size());
  for (size_t i = 0; i < parameters.size(); ++i) {
    ExpectClose(actual.grads[i], expected.grads[i], parameters[i]->name());
  }
}

DecoderConfig TinyDecoder(bool tied) {
  DecoderConfig config = DecoderConfig::Preset("llama-tiny").value();
  config.num_layers = 2;
  config.hidden_size = 16;
  config.num_heads = 4;
  config.num_kv_heads = 2;
  config.head_dim = 4;
  config.intermediate_size = 24;
  config.vocab_size = 37;
  config.max_position_embeddings = 16;
  config.tie_word_embeddings = tied;
  return config;
}

TEST(OutputHeadTest, DecoderLossAndGradientsMatchTheWholeLogitsPath) {
  const int64_t batch = 2, seq = 7;  // N = 14 rows
  for (bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const DecoderConfig config = TinyDecoder(tied);
    auto model = DecoderModel::Create(config, DecoderOptions{}).value();
    EXPECT_EQ(model->lm_head()->type_name(),
              tied ? "TiedOutputHead" : "OutputHead");
    const Tensor tokens = RandomIds({batch, seq}, 11, 37);
    const Tensor targets = TargetsWithIgnored({batch, seq}, 12, 37);
    const LossAndGrads whole =
        WholeLogitsLoss(*model, tokens, targets, config.vocab_size, 2.5f);
    // The default budget holds all 14 rows: one chunk, the whole-logits
    // path's ops but for the scale, applied after the products instead of
    // to the logits' gradient before them: equal to f32 rounding.
    ExpectSameLossAndGrads(*model, ChunkedLoss(*model, tokens, targets, 2.5f),
                           whole);
    // 3 rows: five chunks, the last of 2.
    model->lm_head()->set_loss_chunk_rows(3);
    ExpectSameLossAndGrads(*model, ChunkedLoss(*model, tokens, targets, 2.5f),
                           whole);
    // The weight gradient formed in the backward a vocabulary slice at a
    // time (slices of 3 * 37 / 14 = 7 columns, the last of 2), and in one
    // slice (the default budget).
    model->lm_head()->set_weight_gradient(
        OutputHead::WeightGradient::kInBackward);
    ExpectSameLossAndGrads(*model, ChunkedLoss(*model, tokens, targets, 2.5f),
                           whole);
    model->lm_head()->set_loss_chunk_rows(0);
    ExpectSameLossAndGrads(*model, ChunkedLoss(*model, tokens, targets, 2.5f),
                           whole);
    // Nothing left pending: a plain forward returns logits again.
    EXPECT_EQ(model->Forward(tokens, Stream()).value().shape(),
              (Shape{batch, seq, 37}));
    model->ClearSavedState();
  }
}

TEST(OutputHeadTest, GptLossAndGradientsMatchTheWholeLogitsPath) {
  GptConfig config;
  config.num_layers = 2;
  config.num_heads = 2;
  config.channels = 8;
  config.vocab_size = 29;
  config.padded_vocab_size = 32;  // padded columns stay out of the softmax
  config.max_seq_len = 8;
  auto model = GptModel::Create(config, GptOptions{}).value();
  const Tensor tokens = RandomIds({3, 5}, 21, 29);  // N = 15 rows
  const Tensor targets = TargetsWithIgnored({3, 5}, 22, 29);
  const LossAndGrads whole =
      WholeLogitsLoss(*model, tokens, targets, config.vocab_size, 1.0f);
  model->lm_head()->set_loss_chunk_rows(4);  // 4 + 4 + 4 + 3
  ExpectSameLossAndGrads(*model, ChunkedLoss(*model, tokens, targets, 1.0f),
                         whole);
  // In the backward: slices of 4 * 32 / 15 = 8 columns; the last, [24, 32),
  // holds the 3 padding columns next to 5 real ones.
  model->lm_head()->set_weight_gradient(
      OutputHead::WeightGradient::kInBackward);
  ExpectSameLossAndGrads(*model, ChunkedLoss(*model, tokens, targets, 1.0f),
                         whole);
}

TEST(OutputHeadTest, RefusesABackwardWithoutForwardAndACheckpointedHead) {
  auto model =
      DecoderModel::Create(TinyDecoder(true), DecoderOptions{}).value();
  const absl::Status status = model->BackwardLoss(1.0f, Stream());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  // A checkpointed root would recompute the head without its targets.
  model->set_activation_checkpointing(true);
  const Tensor tokens = RandomIds({1, 4}, 1, 37);
  const absl::Status checkpointed =
      model->ForwardLoss(tokens, tokens, Stream()).status();
  EXPECT_EQ(checkpointed.code(), absl::StatusCode::kFailedPrecondition)
      << checkpointed;
  EXPECT_NE(checkpointed.message().find("checkpointing"), std::string::npos)
      << checkpointed;
  model->ClearSavedState();
  model->set_activation_checkpointing(false);
  EXPECT_TRUE(model->ForwardLoss(tokens, tokens, Stream()).ok());
}

// ---- Memory: the host allocator's peak over one ForwardLoss + BackwardLoss.

// Bytes above what was held before: the step's own peak.
int64_t StepPeak(const std::function<void()> &step) {
  Allocator *host = GetAllocator(Device::Cpu());
  const int64_t before = host->stats().bytes_in_use;
  host->ResetPeak();
  step();
  return host->stats().peak_bytes_in_use - before;
}

TEST(OutputHeadTest, TheChunkedLossNeverHoldsTheWholeLogits) {
  // A vocabulary much wider than the model, as Llama 3's: (N, V) logits
  // outweigh everything else the step allocates.
  DecoderConfig config = DecoderConfig::Preset("llama-tiny").value();
  config.vocab_size = 32768;
  const int64_t batch = 4, seq = 64, rows = batch * seq, chunk = 32;
  auto model = DecoderModel::Create(config, DecoderOptions{}).value();
  const Tensor tokens = RandomIds({batch, seq}, 31, 32768);
  const Tensor targets = RandomIds({batch, seq}, 32, 32768);
  const Stream stream;
  // Gradients exist before the measured steps, as in training.
  ASSERT_TRUE(model->ForwardLoss(tokens, targets, stream).ok());
  ASSERT_TRUE(model->BackwardLoss(1.0f, stream).ok());

  const int64_t logits_bytes = rows * config.vocab_size * 4;
  const int64_t whole = StepPeak([&] {
    WholeLogitsLoss(*model, tokens, targets, config.vocab_size, 1.0f);
  });
  model->lm_head()->set_loss_chunk_rows(chunk);
  const int64_t chunked = StepPeak([&] {
    ASSERT_TRUE(model->ForwardLoss(tokens, targets, stream).ok());
    ASSERT_TRUE(model->BackwardLoss(1.0f, stream).ok());
  });
  std::cout << "llama-tiny, V " << config.vocab_size << ", N " << rows
            << " rows: (N, V) f32 logits " << logits_bytes
            << " bytes; step peak above the model: whole logits " << whole
            << ", chunks of " << chunk << " rows " << chunked << "\n";
  // A (N, V) tensor alone would reach logits_bytes.
  EXPECT_LT(chunked, logits_bytes);
  EXPECT_GE(whole, logits_bytes);
  // What the chunked step holds beyond the model is one chunk of logits,
  // the weight gradient's private (V, C) f32 sum (see OutputHead) and the
  // activations (well under an eighth of the whole logits here).
  const int64_t private_sum_bytes = config.vocab_size * config.hidden_size * 4;
  EXPECT_LT(chunked, chunk * config.vocab_size * 4 + private_sum_bytes +
                         logits_bytes / 8);
  // With the weight gradient formed in the backward, that sum is gone (its
  // slices' workspace is one chunk of logits, as the forward's).
  model->lm_head()->set_weight_gradient(
      OutputHead::WeightGradient::kInBackward);
  const int64_t in_backward = StepPeak([&] {
    ASSERT_TRUE(model->ForwardLoss(tokens, targets, stream).ok());
    ASSERT_TRUE(model->BackwardLoss(1.0f, stream).ok());
  });
  std::cout << "weight gradient in the backward: " << in_backward << "\n";
  EXPECT_LT(in_backward, chunk * config.vocab_size * 4 + logits_bytes / 8);
  EXPECT_LE(in_backward, chunked - private_sum_bytes / 2);
}

}  // namespace
}  // namespace nn
}  // namespace ze
