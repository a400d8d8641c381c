// CUDA against CPU: every layer (forward and backward) and a small GPT's
// loss and gradients (whole and chunked). The CPU runs in f32 (the reference);
// CUDA runs in bf16 (and f32), built from the same seed, so both start from the
// same parameters up to bf16 rounding. Needs a GPU (tag "gpu").
//
// The matrix-product epilogue fusions (nn/cuda/functional_cuda.h) are on by
// default; EveryLayerMatchesCpuInBf16WithoutEpilogueFusion runs the layers
// on the unfused path.
//
// Error measure: max |cuda - cpu| / max |cpu| over a tensor (a normalised
// max-norm error, robust to elements near zero). Tolerances:
//   bf16 layers: outputs 2e-2, gradients 3e-2;
//   bf16 GPT:    loss within 2e-2 absolute, gradients 5e-2;
//   f32:         everything 5e-3 (cuBLAS may use TF32-free f32 or split
//                accumulation orders; 5e-3 leaves room for either).
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/ops.h"
#include "gtest/gtest.h"
#include "nn/cuda/functional_cuda.h"
#include "nn/cuda/functional_cuda_testing.h"
#include "nn/gpt.h"
#include "nn/layers.h"
#include "nn/test_util.h"

namespace ze {
namespace nn {
namespace {

using testing::RandomIds;
using testing::RandomTensor;
using testing::Values;

const Device kCuda = Device::Cuda(0);

// Copies a CPU tensor to the GPU as `dtype` (i32 stays i32).
Tensor ToCuda(const Tensor &host, DType dtype, const Stream &stream) {
  Tensor staged = host;
  if (host.dtype() != DType::kI32 && host.dtype() != dtype) {
    staged = Tensor::Empty(host.shape(), dtype, Device::Cpu()).value();
    EXPECT_TRUE(Copy(host, staged, stream).ok());
  }
  Tensor device = Tensor::Empty(staged.shape(), staged.dtype(), kCuda).value();
  EXPECT_TRUE(Copy(staged, device, stream).ok());
  EXPECT_TRUE(stream.Synchronize().ok());
  return device;
}

double NormalisedError(const std::vector<float> &got,
                       const std::vector<float> &want) {
  EXPECT_EQ(got.size(), want.size());
  double max_error = 0.0, max_value = 1e-12;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    max_error = std::max(max_error, std::fabs(double(got[i]) - want[i]));
    max_value = std::max(max_value, std::fabs(double(want[i])));
  }
  return max_error / max_value;
}

// Every parameter gradient of `gpu` within `tol` (NormalisedError) of the
// same parameter's in `cpu`, a module of the same structure; failures name
// `what` and the parameter.
void ExpectParameterGradientsNear(Module &gpu, Module &cpu, double tol,
                                  const std::string &what) {
  const std::vector<Parameter *> cpu_params = cpu.Parameters();
  const std::vector<Parameter *> gpu_params = gpu.Parameters();
  ASSERT_EQ(cpu_params.size(), gpu_params.size()) << what;
  for (size_t i = 0; i < cpu_params.size(); ++i) {
    EXPECT_LE(NormalisedError(Values(gpu_params[i]->grad()),
                              Values(cpu_params[i]->grad())),
              tol)
        << what << " " << cpu_params[i]->name();
  }
}

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    stream_ = Stream::Create(kCuda).value();
  }
  Stream stream_;
};

using Factory = std::function<std::unique_ptr<Module>(const LayerOptions &)>;

// Runs `factory`'s layer on CPU f32 and CUDA `dtype` with the same seed,
// input and output gradient, and compares output, input grad and every
// parameter grad.
void CompareLayer(const std::string &label, const Factory &factory,
                  const Tensor &input, DType dtype, const Stream &stream,
                  double output_tol, double grad_tol) {
  SCOPED_TRACE(label + " " + DTypeName(dtype));
  auto cpu = factory(LayerOptions{Device::Cpu(), DType::kF32});
  auto gpu = factory(LayerOptions{kCuda, dtype});
  ASSERT_TRUE(cpu->MaterializeParameters(11, Stream()).ok());
  ASSERT_TRUE(gpu->MaterializeParameters(11, stream).ok());

  const Tensor cpu_out = cpu->Forward(input, Stream()).value();
  const Tensor gpu_out =
      gpu->Forward(ToCuda(input, dtype, stream), stream).value();
  EXPECT_LE(NormalisedError(Values(gpu_out), Values(cpu_out)), output_tol)
      << "output";

  const Tensor grad_output = RandomTensor(cpu_out.shape(), 5);
  const Tensor cpu_grad = cpu->Backward(grad_output, Stream()).value();
  const Tensor gpu_grad =
      gpu->Backward(ToCuda(grad_output, dtype, stream), stream).value();
  ASSERT_TRUE(stream.Synchronize().ok());
  ASSERT_EQ(cpu_grad.defined(), gpu_grad.defined());
  if (cpu_grad.defined()) {
    EXPECT_LE(NormalisedError(Values(gpu_grad), Values(cpu_grad)), grad_tol)
        << "input grad";
  }
  ExpectParameterGradientsNear(*gpu, *cpu, grad_tol, "parameter grad");
}

struct LayerCase {
  std::string label;
  Factory factory;
  std::function<Tensor()> input;
};

std::vector<LayerCase> Cases() {
  return {
      {"Linear",
       [](const LayerOptions &o) -> std::unique_ptr<Module> {
         return std::make_unique<Linear>(64, 96, true, o);
       },
       [] {
         return RandomTensor({4, 16, 64}, 1);
       }},
      {"LinearNoBias",
       [](const LayerOptions &o) -> std::unique_ptr<Module> {
         return std::make_unique<Linear>(64, 32, false, o);
       },
       [] {
         return RandomTensor({48, 64}, 1);
       }},
      {"Embedding",
       [](const LayerOptions &o) -> std::unique_ptr<Module> {
         return std::make_unique<Embedding>(101, 32, 64, o);
       },
       [] {
         return RandomIds({4, 32}, 1, 101);
       }},
      {"LayerNorm",
       [](const LayerOptions &o) -> std::unique_ptr<Module> {
         return std::make_unique<LayerNorm>(96, o);
       },
       [] {
         return RandomTensor({4, 16, 96}, 1, 2.0f);
       }},
      {"Gelu",
       [](const LayerOptions &) -> std::unique_ptr<Module> {
         return std::make_unique<Gelu>();
       },
       [] {
         return RandomTensor({4, 16, 64}, 1, 3.0f);
       }},
      {"CausalSelfAttention",
       [](const LayerOptions &o) -> std::unique_ptr<Module> {
         return std::make_unique<CausalSelfAttention>(128, 2, 2, o);
       },
       [] {
         return RandomTensor({2, 80, 128}, 1);
       }},
      {"LinearGelu",
       [](const LayerOptions &o) -> std::unique_ptr<Module> {
         return std::make_unique<Linear>(64, 96, true, o,
                                         Initializer::Normal(0.02f),
                                         Linear::Activation::kGelu);
       },
       [] {
         return RandomTensor({4, 16, 64}, 1, 20.0f);
       }},
      {"Mlp",
       [](const LayerOptions &o) -> std::unique_ptr<Module> {
         return std::make_unique<Mlp>(64, 2, o);
       },
       [] {
         return RandomTensor({2, 32, 64}, 1);
       }},
      {"MlpCheckpointedFc",  // fc saves nothing: GELU's backward unfused
       [](const LayerOptions &o) -> std::unique_ptr<Module> {
         auto mlp = std::make_unique<Mlp>(64, 2, o);
         mlp->fc()->set_activation_checkpointing(true);
         return mlp;
       },
       [] {
         return RandomTensor({2, 32, 64}, 1);
       }},
      {"MlpRunTwice",
       [](const LayerOptions &o) -> std::unique_ptr<Module> {
         return std::make_unique<Repeat>(std::make_unique<Mlp>(64, 2, o), 2);
       },
       [] {
         return RandomTensor({2, 32, 64}, 1);
       }},
      {"Block",
       [](const LayerOptions &o) -> std::unique_ptr<Module> {
         return std::make_unique<Block>(128, 4, 2, o);
       },
       [] {
         return RandomTensor({2, 64, 128}, 1);
       }},
      {"BlockRunTwice",
       [](const LayerOptions &o) -> std::unique_ptr<Module> {
         return std::make_unique<Repeat>(std::make_unique<Block>(64, 2, 2, o),
                                         2);
       },
       [] {
         return RandomTensor({2, 32, 64}, 1);
       }},
  };
}

TEST_F(CudaTest, EveryLayerMatchesCpuInBf16) {
  for (const LayerCase &layer : Cases()) {
    CompareLayer(layer.label, layer.factory, layer.input(), DType::kBF16,
                 stream_, 2e-2, 3e-2);
  }
}

// The epilogues production leaves off (slower on the H200) stay correct
// when every fusion is turned on.
TEST_F(CudaTest, EveryLayerMatchesCpuInBf16WithEpilogueFusion) {
  cuda_backend::SetMatmulEpilogueFusionForTesting(true);
  for (const LayerCase &layer : Cases()) {
    CompareLayer(layer.label + " fused", layer.factory, layer.input(),
                 DType::kBF16, stream_, 2e-2, 3e-2);
  }
  cuda_backend::ResetMatmulEpilogueFusionForTesting();
}

TEST_F(CudaTest, EveryLayerMatchesCpuInF32) {
  for (const LayerCase &layer : Cases()) {
    CompareLayer(layer.label, layer.factory, layer.input(), DType::kF32,
                 stream_, 5e-3, 5e-3);
  }
}

TEST_F(CudaTest, SmallGptLossAndGradientsMatchCpu) {
  GptConfig config;
  config.num_layers = 2;
  config.num_heads = 4;
  config.channels = 128;
  config.vocab_size = 101;
  config.padded_vocab_size = 128;
  config.max_seq_len = 64;
  const Tensor tokens = RandomIds({2, 64}, 1, 101);
  const Tensor targets = RandomIds({2, 64}, 2, 101);
  GptOptions cpu_options;
  cpu_options.seed = 3;
  auto cpu = GptModel::Create(config, cpu_options).value();
  const float cpu_loss = cpu->ForwardLoss(tokens, targets, Stream()).value();
  ASSERT_TRUE(cpu->BackwardLoss(1.0f, Stream()).ok());
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(DTypeName(dtype));
    GptOptions gpu_options = cpu_options;
    gpu_options.device = kCuda;
    gpu_options.dtype = dtype;
    for (bool checkpointing : {false, true}) {
      config.activation_checkpointing = checkpointing;
      auto gpu = GptModel::Create(config, gpu_options, stream_).value();
      const float gpu_loss =
          gpu->ForwardLoss(ToCuda(tokens, dtype, stream_),
                           ToCuda(targets, dtype, stream_), stream_)
              .value();
      ASSERT_TRUE(gpu->BackwardLoss(1.0f, stream_).ok());
      ASSERT_TRUE(stream_.Synchronize().ok());
      const double loss_tol = dtype == DType::kF32 ? 1e-3 : 2e-2;
      const double grad_tol = dtype == DType::kF32 ? 5e-3 : 5e-2;
      EXPECT_NEAR(gpu_loss, cpu_loss, loss_tol);
      ExpectParameterGradientsNear(
          *gpu, *cpu, grad_tol,
          checkpointing ? "checkpointing=1" : "checkpointing=0");
    }
  }
}

// The chunked loss on CUDA (OutputHead's loss mode, 48-row chunks of 512
// rows: ten of 48 and one of 32) against the CPU's whole batch in one
// chunk, and the device allocator's peaks: the forward holds one chunk of
// logits where the whole-logits forward holds all 512 rows, and the step
// (forward and backward) holds no more than the whole-logits step.
//
// Why the forward's peak and not only the step's: the step's peak comes
// where the backward's largest temporary lives (the embedding's (V, C)
// scatter table), not where the logits do, so a step peak cannot show what
// the logits cost; the forward's peak is at the loss, where both runs hold
// the same activations and differ only in the logits they keep.
TEST_F(CudaTest, SmallGptChunkedLossMatchesCpuAndNeverHoldsTheLogits) {
  GptConfig config;
  config.num_layers = 2;
  config.num_heads = 4;
  config.channels = 128;
  config.vocab_size = 8000;
  config.padded_vocab_size = 8064;
  config.max_seq_len = 64;
  constexpr int64_t kRows = 8 * 64;
  constexpr int64_t kChunkRows = 48;
  const Tensor tokens = RandomIds({8, 64}, 1, 8000);
  const Tensor targets = RandomIds({8, 64}, 2, 8000);
  GptOptions cpu_options;
  cpu_options.seed = 3;
  auto cpu = GptModel::Create(config, cpu_options).value();
  const float cpu_loss = cpu->ForwardLoss(tokens, targets, Stream()).value();
  ASSERT_TRUE(cpu->BackwardLoss(1.0f, Stream()).ok());
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(DTypeName(dtype));
    GptOptions gpu_options = cpu_options;
    gpu_options.device = kCuda;
    gpu_options.dtype = dtype;
    auto gpu = GptModel::Create(config, gpu_options, stream_).value();
    const Tensor gpu_tokens = ToCuda(tokens, dtype, stream_);
    const Tensor gpu_targets = ToCuda(targets, dtype, stream_);
    Allocator *allocator = GetAllocator(kCuda);
    // The allocator's peaks above what was in use before a training step
    // with the loss in chunks of `chunk_rows` rows: over its forward, and
    // over the whole step.
    struct Peaks {
      int64_t forward = 0, step = 0;
    };
    auto step_peaks = [&](int64_t chunk_rows, float *loss) -> Peaks {
      gpu->lm_head()->set_loss_chunk_rows(chunk_rows);
      // Gradients exist before the measured step, as in training.
      EXPECT_TRUE(gpu->ForwardLoss(gpu_tokens, gpu_targets, stream_).ok());
      EXPECT_TRUE(gpu->BackwardLoss(1.0f, stream_).ok());
      EXPECT_TRUE(gpu->ZeroGrad(stream_).ok());
      EXPECT_TRUE(stream_.Synchronize().ok());
      const int64_t before = allocator->stats().bytes_in_use;
      allocator->ResetPeak();
      *loss = gpu->ForwardLoss(gpu_tokens, gpu_targets, stream_).value();
      EXPECT_TRUE(stream_.Synchronize().ok());
      Peaks peaks;
      peaks.forward = allocator->stats().peak_bytes_in_use - before;
      EXPECT_TRUE(gpu->BackwardLoss(1.0f, stream_).ok());
      EXPECT_TRUE(stream_.Synchronize().ok());
      peaks.step = allocator->stats().peak_bytes_in_use - before;
      return peaks;
    };
    float whole_loss = 0.0f;
    const Peaks whole = step_peaks(kRows, &whole_loss);
    float gpu_loss = 0.0f;
    const Peaks chunked = step_peaks(kChunkRows, &gpu_loss);
    // Chunking must save the other 464 rows' logits, less the caching
    // allocator's rounding (requests over 1 MiB go up to a multiple of
    // 2 MiB: the two workspaces' rounding can close the gap by < 2 MiB).
    const int64_t row_bytes = config.padded_vocab_size * SizeOf(dtype);
    const int64_t saved_at_least =
        (kRows - kChunkRows) * row_bytes - (int64_t{2} << 20);
    EXPECT_LE(chunked.forward + saved_at_least, whole.forward)
        << "chunked forward peak " << chunked.forward
        << ", whole-logits forward peak " << whole.forward;
    EXPECT_LE(chunked.step, whole.step)
        << "chunked step peak " << chunked.step << ", whole-logits step peak "
        << whole.step;
    EXPECT_NEAR(gpu_loss, whole_loss, dtype == DType::kF32 ? 1e-5 : 1e-3);
    EXPECT_NEAR(gpu_loss, cpu_loss, dtype == DType::kF32 ? 1e-3 : 2e-2);
    const double grad_tol = dtype == DType::kF32 ? 5e-3 : 5e-2;
    ExpectParameterGradientsNear(*gpu, *cpu, grad_tol,
                                 "weight gradient in the forward");
    // The head's weight gradient formed in the backward, a vocabulary slice
    // at a time (CrossEntropySliceBackward, LinearCrossEntropyWeightGradient):
    // the same loss, the CPU's gradients, and a forward that no longer
    // holds the (V, C) f32 sum.
    gpu->lm_head()->set_weight_gradient(
        OutputHead::WeightGradient::kInBackward);
    float in_backward_loss = 0.0f;
    const Peaks in_backward = step_peaks(kChunkRows, &in_backward_loss);
    gpu->lm_head()->set_weight_gradient(OutputHead::WeightGradient::kInForward);
    EXPECT_EQ(in_backward_loss, gpu_loss);
    ExpectParameterGradientsNear(*gpu, *cpu, grad_tol,
                                 "weight gradient in the backward");
    const int64_t f32_sum_bytes =
        config.padded_vocab_size * config.channels * int64_t{4};
    EXPECT_LE(in_backward.forward + f32_sum_bytes - (int64_t{2} << 20),
              chunked.forward)
        << "forward peak with the weight gradient in the backward "
        << in_backward.forward << ", in the forward " << chunked.forward;
  }
}

// Incremental decoding on CUDA: a batch of two prompts of lengths 7 and 3
// (prefilled separately), then 6 decode steps of both rows together, each
// at its own position; every step's logits against a plain forward of the
// same model over the whole sequence (the flash attention kernels there,
// the cache kernels here).
TEST_F(CudaTest, SmallGptCachedDecodeMatchesFullForward) {
  // Every allocation belongs to the stream the work runs on, and results
  // are read on that stream (it does not synchronise with the default one).
  StreamGuard guard(stream_);
  auto host = [&](const Tensor &t) { return ToHostFloats(t, stream_).value(); };
  GptConfig config;
  config.num_layers = 2;
  config.num_heads = 4;
  config.channels = 128;
  config.vocab_size = 101;
  config.padded_vocab_size = 128;
  config.max_seq_len = 64;
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(DTypeName(dtype));
    GptOptions options;
    options.seed = 3;
    options.device = kCuda;
    options.dtype = dtype;
    auto model = GptModel::Create(config, options, stream_).value();
    std::vector<std::vector<int32_t>> sequences = {{5, 17, 99, 3, 3, 0, 42},
                                                   {7, 8, 9}};
    auto cache = model->NewKvCache(2, 16, stream_).value();
    auto device_tokens = [&](const std::vector<std::vector<int32_t>> &rows) {
      const int64_t length = static_cast<int64_t>(rows[0].size());
      Tensor host = Tensor::Empty({static_cast<int64_t>(rows.size()), length},
                                  DType::kI32, Device::Cpu())
                        .value();
      for (size_t r = 0; r < rows.size(); ++r) {
        std::copy(rows[r].begin(), rows[r].end(),
                  host.data_as<int32_t>() + r * length);
      }
      return ToCuda(host, DType::kI32, stream_);
    };
    std::vector<int32_t> next(2);
    auto check = [&](const Tensor &logits, const std::vector<int64_t> &rows,
                     const std::string &what) {
      const std::vector<float> got = host(logits);  // (N, 1, Vp)
      const int64_t vocab = logits.size(2);
      for (size_t i = 0; i < rows.size(); ++i) {
        std::vector<float> want;
        {
          NoSaveScope no_save;
          const Tensor full =
              model->Forward(device_tokens({sequences[rows[i]]}), stream_)
                  .value();
          const std::vector<float> all = host(full);
          want.assign(all.end() - vocab, all.end());
        }
        const std::vector<float> row(got.begin() + i * vocab,
                                     got.begin() + (i + 1) * vocab);
        EXPECT_LE(NormalisedError(row, want),
                  dtype == DType::kF32 ? 1e-4 : 2e-2)
            << what << " row " << rows[i];
        next[rows[i]] = static_cast<int32_t>(
            std::max_element(row.begin(), row.begin() + config.vocab_size) -
            row.begin());
      }
    };
    for (int64_t row : {0, 1}) {
      check(model
                ->ForwardCached(device_tokens({sequences[row]}), {row}, *cache,
                                stream_)
                .value(),
            {row}, "prefill");
    }
    for (int step = 0; step < 6; ++step) {
      for (int64_t row : {0, 1}) sequences[row].push_back(next[row]);
      check(model
                ->ForwardCached(device_tokens({{next[0]}, {next[1]}}), {0, 1},
                                *cache, stream_)
                .value(),
            {0, 1}, "step " + std::to_string(step));
    }
    EXPECT_EQ(cache->lengths(), (std::vector<int64_t>{13, 9}));
  }
}

}  // namespace
}  // namespace nn
}  // namespace ze
