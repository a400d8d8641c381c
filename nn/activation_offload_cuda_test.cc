// ActivationOffload on a GPU (tag "gpu"; the CPU tests run the same code
// with memcpy copies): a bf16 GPT of 12 checkpointed blocks trains a step
// with its block inputs offloaded to pinned host memory, and
//   - the loss is bit for bit that without the offload and the gradients
//     agree (to bf16 noise: the attention backward sums with atomics, so
//     two runs of either differ in the last bits);
//   - the device allocator's peak over the step, above what was in use
//     before it, drops by at least the saved inputs beyond the ring's two
//     and the newest, kept on the device: (L - 3) inputs;
//   - the pinned host pool holds the L inputs of one forward; in each
//     backward the last block's input was still on the device and every
//     other had been prefetched.
// Prints one JSON line with both peaks and step times (informative; the
// step-time target is measured by bench/train_bench --cpu_checkpointing).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "core/allocator.h"
#include "core/ops.h"
#include "core/stream.h"
#include "gtest/gtest.h"
#include "nn/activation_offload.h"
#include "nn/gpt.h"
#include "nn/test_util.h"

namespace ze {
namespace nn {
namespace {

using testing::RandomIds;
using testing::Values;

constexpr int kLayers = 12;
constexpr int64_t kBatch = 8, kSeq = 512, kChannels = 512;

Tensor ToCuda(const Tensor &host, const Stream &stream) {
  Tensor device =
      Tensor::Empty(host.shape(), host.dtype(), Device::Cuda(0)).value();
  EXPECT_TRUE(Copy(host, device, stream).ok());
  EXPECT_TRUE(stream.Synchronize().ok());
  return device;
}

struct StepResult {
  float loss = 0;
  int64_t peak_above_start = 0;  // allocator peak minus in-use at the start
  double step_ms = 0;            // mean over the timed steps
  std::vector<std::vector<float>> grads;
};

StepResult Train(bool offload_inputs, std::shared_ptr<ActivationOffload> *out) {
  if (CudaDeviceCount() == 0) return {};
  const Stream stream = Stream::Create(Device::Cuda(0)).value();
  GptConfig config;
  config.num_layers = kLayers;
  config.num_heads = 8;
  config.channels = kChannels;
  config.vocab_size = 1024;
  config.max_seq_len = kSeq;
  config.activation_checkpointing = true;
  GptOptions options;
  options.device = Device::Cuda(0);
  options.dtype = DType::kBF16;
  options.seed = 5;
  std::unique_ptr<GptModel> model =
      GptModel::Create(config, options, stream).value();
  if (offload_inputs) {
    *out = ActivationOffload::Create(Device::Cuda(0)).value();
    for (Module *module : model->Modules())
      module->set_activation_offload(*out);
  }
  const Tensor tokens = ToCuda(RandomIds({kBatch, kSeq}, 1, 1024), stream);
  const Tensor targets = ToCuda(RandomIds({kBatch, kSeq}, 2, 1024), stream);
  Allocator *allocator = GetAllocator(Device::Cuda(0));
  StepResult result;
  auto step = [&]() {
    EXPECT_TRUE(model->ZeroGrad(stream).ok());
    result.loss = model->ForwardLoss(tokens, targets, stream).value();
    EXPECT_TRUE(model->BackwardLoss(1.0f, stream).ok());
  };
  // Warm-up: gradients, the ring and the pinned pool are allocated.
  step();
  EXPECT_TRUE(stream.Synchronize().ok());
  const int64_t start = allocator->stats().bytes_in_use;
  allocator->ResetPeak();
  step();
  EXPECT_TRUE(stream.Synchronize().ok());
  result.peak_above_start = allocator->stats().peak_bytes_in_use - start;
  constexpr int kTimed = 5;
  const auto begin = std::chrono::steady_clock::now();
  for (int i = 0; i < kTimed; ++i) step();
  EXPECT_TRUE(stream.Synchronize().ok());
  result.step_ms = std::chrono::duration<double, std::milli>(
                       std::chrono::steady_clock::now() - begin)
                       .count() /
                   kTimed;
  for (Parameter *parameter : model->Parameters()) {
    result.grads.push_back(Values(parameter->grad()));
  }
  return result;
}

double NormalisedError(const std::vector<float> &a,
                       const std::vector<float> &b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    norm = std::max(norm, std::fabs(static_cast<double>(b[i])));
  }
  return norm > 0 ? diff / norm : diff;
}

TEST(ActivationOffloadCudaTest, OffloadCutsThePeakAndKeepsTheLoss) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  std::shared_ptr<ActivationOffload> offload;
  const StepResult kept = Train(false, nullptr);
  const StepResult offloaded = Train(true, &offload);
  ASSERT_NE(offload, nullptr);
  const int64_t input_bytes = kBatch * kSeq * kChannels * 2;  // bf16
  std::printf(
      "{\"test\":\"activation_offload_cuda\",\"layers\":%d,\"batch\":%lld,"
      "\"seq\":%lld,\"channels\":%lld,\"input_bytes\":%lld,"
      "\"peak_above_start_kept\":%lld,\"peak_above_start_offloaded\":%lld,"
      "\"peak_reduction_pct\":%.1f,\"step_ms_kept\":%.3f,"
      "\"step_ms_offloaded\":%.3f,\"step_time_increase_pct\":%.1f,"
      "\"pinned_host_bytes\":%lld,\"ring_bytes\":%lld}\n",
      kLayers, static_cast<long long>(kBatch), static_cast<long long>(kSeq),
      static_cast<long long>(kChannels), static_cast<long long>(input_bytes),
      static_cast<long long>(kept.peak_above_start),
      static_cast<long long>(offloaded.peak_above_start),
      100.0 * (kept.peak_above_start - offloaded.peak_above_start) /
          std::max<int64_t>(1, kept.peak_above_start),
      kept.step_ms, offloaded.step_ms,
      100.0 * (offloaded.step_ms - kept.step_ms) / kept.step_ms,
      static_cast<long long>(offload->stats().host_bytes),
      static_cast<long long>(offload->stats().ring_bytes));
  EXPECT_EQ(offloaded.loss, kept.loss);
  ASSERT_EQ(offloaded.grads.size(), kept.grads.size());
  for (size_t i = 0; i < kept.grads.size(); ++i) {
    EXPECT_LE(NormalisedError(offloaded.grads[i], kept.grads[i]), 2e-2)
        << "parameter " << i;
  }
  EXPECT_GE(kept.peak_above_start - offloaded.peak_above_start,
            (kLayers - 3) * input_bytes);
  const ActivationOffloadStats &stats = offload->stats();
  EXPECT_EQ(stats.host_bytes, kLayers * input_bytes);
  EXPECT_EQ(stats.ring_bytes, 2 * input_bytes);
  EXPECT_EQ(stats.restored, 7 * kLayers);  // warm-up, peak, 5 timed steps
  EXPECT_EQ(stats.prefetched, 7 * (kLayers - 1));
  EXPECT_EQ(stats.kept_newest, 7);
  EXPECT_EQ(stats.ring_misses, 0);
  EXPECT_EQ(offload->held(), 0);
}

}  // namespace
}  // namespace nn
}  // namespace ze
