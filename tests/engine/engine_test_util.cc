#include "tests/engine/engine_test_util.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/factory.h"
#include "core/allocator.h"
#include "core/logging.h"
#include "core/ops.h"
#include "core/status.h"
#include "gtest/gtest.h"

namespace ze {
namespace enginetest {
namespace {

std::shared_ptr<comm::Communicator>& CommSlot() {
  static auto* slot = new std::shared_ptr<comm::Communicator>();
  return *slot;
}

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

std::shared_ptr<comm::Communicator> Comm() { return CommSlot(); }

int RunWithCommunicator(const std::function<int()>& body) {
  comm::CommOptions options;
  options.device = "cpu";
  absl::StatusOr<std::unique_ptr<comm::Communicator>> created =
      comm::CreateCommunicator(options);
  if (!created.ok()) {
    std::cerr << "CreateCommunicator: " << created.status() << "\n";
    return 1;
  }
  CommSlot() = std::move(created).value();
  // The tests read the engine's INFO lines (memory, steps_per_print), so
  // they must be printed whatever ZE_LOG_LEVEL says.
  SetMinLogLevel(LogLevel::kInfo);
  return body();
}

int RunAllTests(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RunWithCommunicator([] {
    const int result = RUN_ALL_TESTS();
    if (result != 0) {
      std::cerr << "rank " << Rank() << " of " << World() << ": FAILED\n";
    }
    return result;
  });
}

nn::GptConfig SmallGpt(int64_t channels, int layers, int heads) {
  nn::GptConfig config;
  config.num_layers = layers;
  config.num_heads = heads;
  config.channels = channels;
  config.vocab_size = kVocab;
  config.max_seq_len = kSeqLen;
  return config;
}

absl::StatusOr<std::shared_ptr<nn::GptModel>> MakeGpt(
    const nn::GptConfig& config, DType dtype, bool materialize) {
  nn::GptOptions options;
  options.device = Device::Cpu();
  options.dtype = dtype;
  options.seed = 1234;
  options.materialize = materialize;
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<nn::GptModel> model,
                      nn::GptModel::Create(config, options));
  return std::shared_ptr<nn::GptModel>(std::move(model));
}

void FillSample(int64_t g, int32_t* tokens, int32_t* targets) {
  int32_t current = static_cast<int32_t>(Mix(g) % kVocab);
  for (int t = 0; t < kSeqLen; ++t) {
    tokens[t] = current;
    const uint64_t noise = Mix(g * 1000 + t);
    const int32_t next = noise % 4 == 0 ? static_cast<int32_t>(noise % kVocab)
                                        : (current * 5 + 3) % kVocab;
    targets[t] = next;
    current = next;
  }
}

absl::StatusOr<engine::StepReport> TrainStep(engine::Engine& engine,
                                             int64_t step) {
  const int64_t micro = engine.config().train_micro_batch_size_per_gpu.value();
  const int64_t accumulation =
      engine.config().gradient_accumulation_steps.value();
  const int world = engine.communicator().world_size();
  const int rank = engine.communicator().rank();
  std::vector<int32_t> tokens(micro * kSeqLen), targets(micro * kSeqLen);
  engine::StepReport report;
  for (int64_t m = 0; m < accumulation; ++m) {
    for (int64_t i = 0; i < micro; ++i) {
      const int64_t sample =
          ((step * accumulation + m) * world + rank) * micro + i;
      FillSample(sample, &tokens[i * kSeqLen], &targets[i * kSeqLen]);
    }
    Tensor token_tensor = Tensor::Wrap(tokens.data(), {micro, kSeqLen},
                                       DType::kI32, Device::Cpu());
    Tensor target_tensor = Tensor::Wrap(targets.data(), {micro, kSeqLen},
                                        DType::kI32, Device::Cpu());
    ZE_RETURN_IF_ERROR(engine.Forward(token_tensor, target_tensor).status());
    ZE_RETURN_IF_ERROR(engine.Backward());
    ZE_ASSIGN_OR_RETURN(report, engine.Step());
  }
  return report;
}

absl::StatusOr<std::vector<float>> AllMasterWeights(engine::Engine& engine) {
  std::vector<float> all;
  for (const std::string& name : engine.ParameterNames()) {
    ZE_ASSIGN_OR_RETURN(std::vector<float> values,
                        engine.GatherMasterWeights(name));
    all.insert(all.end(), values.begin(), values.end());
  }
  return all;
}

StderrCapture::StderrCapture() {
  std::fflush(stderr);
  file_ = std::tmpfile();
  if (file_ == nullptr) return;
  saved_fd_ = dup(2);
  dup2(fileno(file_), 2);
}

StderrCapture::~StderrCapture() { Finish(); }

std::string StderrCapture::Finish() {
  if (saved_fd_ < 0) return "";
  std::fflush(stderr);
  dup2(saved_fd_, 2);
  close(saved_fd_);
  saved_fd_ = -1;
  std::string text;
  std::rewind(file_);
  char buffer[4096];
  size_t got;
  while ((got = std::fread(buffer, 1, sizeof(buffer), file_)) > 0) {
    text.append(buffer, got);
  }
  std::fclose(file_);
  file_ = nullptr;
  std::fwrite(text.data(), 1, text.size(), stderr);
  return text;
}

void ExpectRunsClose(
    const std::vector<double>& losses,
    const std::map<std::string, std::vector<float>>& weights,
    const std::vector<double>& reference_losses,
    const std::map<std::string, std::vector<float>>& reference_weights,
    double tolerance) {
  ASSERT_EQ(losses.size(), reference_losses.size());
  ASSERT_EQ(weights.size(), reference_weights.size());
  double loss_error = 0, weight_error = 0;
  for (size_t i = 0; i < losses.size(); ++i) {
    loss_error =
        std::max(loss_error, std::abs(losses[i] - reference_losses[i]) /
                                 std::max(1.0, std::abs(reference_losses[i])));
  }
  for (const auto& [name, values] : reference_weights) {
    auto found = weights.find(name);
    ASSERT_NE(found, weights.end()) << name;
    ASSERT_EQ(found->second.size(), values.size()) << name;
    for (size_t i = 0; i < values.size(); ++i) {
      weight_error =
          std::max(weight_error,
                   std::abs(found->second[i] - values[i]) /
                       std::max(1.0, std::abs(static_cast<double>(values[i]))));
    }
  }
  EXPECT_LE(loss_error, tolerance);
  EXPECT_LE(weight_error, tolerance);
  std::printf("rank %d world %d: loss error %.2e, weight error %.2e\n", Rank(),
              World(), loss_error, weight_error);
}

namespace {

// Clears the host allocator's cap however the caller ends.
struct CapGuard {
  ~CapGuard() { HostMemory()->SetByteCap(0); }
};

}  // namespace

void ExpectOnlyFittingStageTrainsUnderCap(
    int fitting_stage, const nn::GptConfig& model,
    const std::function<std::string(int stage)>& config,
    const std::function<int64_t(int64_t need_stage0, int64_t need_fitting)>&
        cap_of) {
  auto initialize =
      [&](int stage) -> absl::StatusOr<std::unique_ptr<engine::Engine>> {
    ZE_ASSIGN_OR_RETURN(std::shared_ptr<nn::GptModel> made,
                        MakeGpt(model, DType::kBF16, /*materialize=*/false));
    return engine::Initialize(made, config(stage), Comm());
  };
  int64_t need_stage0 = 0, need_fitting = 0;
  for (int stage : {0, fitting_stage}) {
    absl::StatusOr<std::unique_ptr<engine::Engine>> created = initialize(stage);
    ASSERT_TRUE(created.ok()) << created.status();
    (stage == 0 ? need_stage0 : need_fitting) =
        (*created)->memory_breakdown().total_bytes();
  }
  CapGuard guard;
  const int64_t base = HostMemory()->stats().bytes_in_use;
  const int64_t cap = cap_of(need_stage0, need_fitting);
  HostMemory()->SetByteCap(base + cap);
  HostMemory()->ResetPeak();
  {
    absl::StatusOr<std::unique_ptr<engine::Engine>> created = initialize(0);
    ASSERT_FALSE(created.ok());
    EXPECT_EQ(created.status().code(), absl::StatusCode::kResourceExhausted)
        << created.status();
    EXPECT_NE(created.status().message().find(
                  absl::StrCat("needs ", need_stage0, " bytes per rank")),
              std::string::npos)
        << created.status();
  }
  // Whatever the failed attempt allocated is back.
  EXPECT_EQ(HostMemory()->stats().bytes_in_use, base);

  absl::StatusOr<std::unique_ptr<engine::Engine>> created =
      initialize(fitting_stage);
  ASSERT_TRUE(created.ok()) << created.status();
  double first = 0, last = 0;
  for (int step = 0; step < 4; ++step) {
    absl::StatusOr<engine::StepReport> report = TrainStep(**created, step);
    ASSERT_TRUE(report.ok()) << report.status();
    ASSERT_TRUE(std::isfinite(report->loss));
    (step == 0 ? first : last) = report->loss;
  }
  EXPECT_LT(last, first);
  const int64_t peak = HostMemory()->stats().peak_bytes_in_use - base;
  EXPECT_LE(peak, cap);
  std::printf(
      "rank %d: cap %lld B over base; stage 0 needs %lld, stage %d %lld; "
      "stage %d peak while training under the cap %lld\n",
      Rank(), static_cast<long long>(cap), static_cast<long long>(need_stage0),
      fitting_stage, static_cast<long long>(need_fitting), fitting_stage,
      static_cast<long long>(peak));
}

std::vector<uint8_t> EvalLogitBytes(engine::Engine& engine,
                                    int64_t first_sample) {
  std::vector<int32_t> tokens(2 * kSeqLen), targets(2 * kSeqLen);
  FillSample(first_sample, tokens.data(), targets.data());
  FillSample(first_sample + 1, tokens.data() + kSeqLen,
             targets.data() + kSeqLen);
  absl::StatusOr<Tensor> out = engine.EvalOutputs(
      Tensor::Wrap(tokens.data(), {2, kSeqLen}, DType::kI32, Device::Cpu()));
  EXPECT_TRUE(out.ok()) << out.status();
  if (!out.ok()) return {};
  const uint8_t* bytes = static_cast<const uint8_t*>(out->data());
  return std::vector<uint8_t>(bytes, bytes + out->nbytes());
}

void TrainRecording(engine::Engine& engine, int first, int end,
                    int64_t logits_sample, BitwiseRun& run) {
  for (int step = first; step < end; ++step) {
    absl::StatusOr<engine::StepReport> report = TrainStep(engine, step);
    ASSERT_TRUE(report.ok()) << report.status();
    run.losses.push_back(report->loss);
  }
  absl::StatusOr<std::vector<float>> master = AllMasterWeights(engine);
  ASSERT_TRUE(master.ok()) << master.status();
  run.master = *master;
  run.logits = EvalLogitBytes(engine, logits_sample);
}

void ExpectBitIdentical(const BitwiseRun& run, const BitwiseRun& reference,
                        const std::string& what) {
  ASSERT_EQ(run.losses.size(), reference.losses.size()) << what;
  for (size_t i = 0; i < run.losses.size(); ++i) {
    EXPECT_EQ(run.losses[i], reference.losses[i]) << what << " step " << i;
  }
  ASSERT_EQ(run.master.size(), reference.master.size()) << what;
  EXPECT_EQ(0, std::memcmp(run.master.data(), reference.master.data(),
                           run.master.size() * sizeof(float)))
      << what << ": master weights differ";
  ASSERT_FALSE(run.logits.empty()) << what;
  EXPECT_EQ(run.logits, reference.logits) << what << ": logits differ";
}

}  // namespace enginetest
}  // namespace ze
