// offload_param (cpu and nvme) with part of the optimizer kept on the device
// (issue 28: offload_optimizer's ratio below 1, or no offload_optimizer at
// all), through the public engine API, alone and under mpirun at 2 and 3
// ranks. The buckets whose optimizer stays on the device are updated there
// and their new weights copied to the weights' tier (host memory, or a swap
// buffer that is written to the file), so the next gather reads them:
//   - parity: stage 3 with gradient clipping, f32 and bf16, gradient
//     accumulation 1 and 3, trains bit for bit like the same model with no
//     offload at all and like offload_param with the whole optimizer on the
//     CPU (ratio 1): the same losses, the same f32 master weights and the
//     same logits (the gathered weights themselves). Variants: offload_param
//     cpu at ratios 0.5 and 0.25 and without offload_optimizer; nvme with
//     nothing kept in CPU memory and two swap buffers at ratios 0.5 and
//     0.25, with everything kept (max_in_cpu) at 0.5, with one swap buffer,
//     and with the optimizer's offloaded part on NVMe too;
//   - 8-bit moments (blockwise_8bit_moments): at ratio 0.5 the weights in
//     host memory or on NVMe train bit for bit like the weights on the
//     device with the same optimizer placement (the CPU optimizer keeps
//     8-bit moments over all its buckets together, a device bucket only
//     when it is large enough, so the comparison holds the placement);
//   - checkpoints: saved at ratio 0.5 with the weights on NVMe and loaded
//     without offload, at ratio 1, and at ratio 0.5 again (and saved
//     without offload, loaded at ratio 0.5), training goes on bit for bit
//     like the uninterrupted run.
// Every use of a module fetches it (nothing persistent, no reuse), so each
// forward and backward reads what the update wrote to the tier.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/communicator.h"
#include "engine/offload_report.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"

namespace ze {
namespace enginetest {
namespace {

// The global samples whose logits each run records (EvalLogitBytes).
constexpr int64_t kLogitsSample = 2000;

constexpr int kSteps = 4;

std::string TempDirectory(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = absl::StrCat(dir != nullptr ? dir : "/tmp",
                                        "/param_ratio_w", World(), "_", name);
  std::filesystem::create_directories(path);
  return path;
}

struct Variant {
  std::string name;
  // "none": no offload_optimizer; else its device ("cpu", "nvme") with
  // `ratio`.
  std::string optimizer = "none";
  double ratio = 1.0;
  // "none", "cpu", or "nvme" followed by offload_param's extra keys.
  std::string param = "none";
  std::string param_extra;
};

struct Setting {
  std::string dtype;  // f32 or bf16
  int accumulation = 1;
  bool eight_bit = false;  // optimizer.params.blockwise_8bit_moments
};

std::string ConfigJson(const Setting& s, const Variant& v,
                       const std::string& directory) {
  std::string offload;
  if (v.optimizer != "none") {
    offload = absl::StrCat(R"(, "offload_optimizer": {"device": ")",
                           v.optimizer, R"(", "ratio": )", v.ratio);
    if (v.optimizer == "nvme") {
      absl::StrAppend(&offload, R"(, "nvme_path": ")", directory,
                      R"(", "buffer_count": 2)");
    }
    offload += "}";
  }
  if (v.param == "cpu") {
    offload += R"(, "offload_param": {"device": "cpu"})";
  } else if (v.param == "nvme") {
    absl::StrAppend(&offload,
                    R"(, "offload_param": {"device": "nvme", "nvme_path": ")",
                    directory, R"(")", v.param_extra, "}");
  }
  return absl::StrCat(
      R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": )",
      s.accumulation, R"(, "gradient_clipping": 1.0,)",
      s.dtype == "bf16" ? R"("bf16": {"enabled": true},)" : "",
      R"("optimizer": {"type": "AdamW", "params": {"lr": 0.01, "eps": 1e-3, "weight_decay": 0.01)",
      s.eight_bit ? R"(, "blockwise_8bit_moments": true)" : "", "}},",
      // A minimum lr above 0: every update moves the weights (WarmupLR's
      // first two are at the minimum), so every loss after the first reads
      // what the previous update wrote.
      R"("scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.002, "warmup_max_lr": 0.01, "warmup_num_steps": 3}},)",
      // Nothing persistent or kept for reuse, a small prefetch: every use
      // of a module gathers it from the tier. Chunks of 100 elements: the
      // offloaded part's update runs in many pieces.
      R"("zero_optimization": {"stage": 3, "sub_group_size": 100,)",
      R"("stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 3000,)",
      R"("stage3_max_reuse_distance": 0)", offload, "}}");
}

absl::StatusOr<std::unique_ptr<engine::Engine>> MakeEngine(
    const Setting& s, const Variant& v, const std::string& directory) {
  ZE_ASSIGN_OR_RETURN(std::shared_ptr<nn::GptModel> model,
                      MakeGpt(SmallGpt(32, 2, 2),
                              s.dtype == "bf16" ? DType::kBF16 : DType::kF32));
  return engine::Initialize(model, ConfigJson(s, v, directory), Comm());
}

// Trains `v` for kSteps; checks that the swap file, if any, was used both
// ways (the device buckets' weights went through it).
BitwiseRun TrainVariant(const Setting& s, const Variant& v,
                        const std::string& what) {
  BitwiseRun run;
  const std::string directory = TempDirectory(absl::StrCat(
      v.name, "_", s.dtype, "_a", s.accumulation, s.eight_bit ? "_8bit" : ""));
  auto engine = MakeEngine(s, v, directory);
  EXPECT_TRUE(engine.ok()) << what << ": " << engine.status();
  if (!engine.ok()) return run;
  TrainRecording(**engine, 0, kSteps, kLogitsSample, run);
  if (v.param == "nvme" &&
      v.param_extra.find("max_in_cpu\": 0") != std::string::npos) {
    const engine::NvmeCounters io = (*engine)->nvme_counters();
    EXPECT_GT(io.bytes_written, 0) << what;
    EXPECT_GT(io.bytes_read, 0) << what;
  }
  return run;
}

const char kSwapped[] = R"(, "max_in_cpu": 0, "buffer_count": 2)";

// The weights off the device with part (or all) of the optimizer on it:
// bit for bit no offload, and offload_param with the whole optimizer on the
// CPU.
TEST(ParamOffloadRatioTest, BitIdenticalToNoOffloadAndToRatioOne) {
  const std::vector<Variant> references = {
      {"none"},
      {"cpu_r1", "cpu", 1.0, "cpu"},
      {"nvme_r1", "cpu", 1.0, "nvme", kSwapped},
  };
  const std::vector<Variant> variants = {
      {"cpu_r05", "cpu", 0.5, "cpu"},
      {"cpu_r025", "cpu", 0.25, "cpu"},
      // Every bucket's optimizer on the device.
      {"cpu_device_optimizer", "none", 1.0, "cpu"},
      {"nvme_r05", "cpu", 0.5, "nvme", kSwapped},
      {"nvme_r025", "cpu", 0.25, "nvme", kSwapped},
      // One swap buffer: every device bucket's write waits for the last.
      {"nvme_r05_one_buffer", "cpu", 0.5, "nvme",
       R"(, "max_in_cpu": 0, "buffer_count": 1, "pin_memory": true)"},
      // DeepSpeed's max_in_cpu (1e9): every bucket kept in host memory.
      {"nvme_r05_kept", "cpu", 0.5, "nvme", ""},
      // The offloaded part's optimizer on NVMe too.
      {"nvme_r05_nvme_optimizer", "nvme", 0.5, "nvme", kSwapped},
      {"nvme_device_optimizer", "none", 1.0, "nvme", kSwapped},
  };
  for (const char* dtype : {"f32", "bf16"}) {
    for (int accumulation : {1, 3}) {
      const Setting s{dtype, accumulation};
      const std::string setting = absl::StrCat(
          dtype, " accumulation ", accumulation, " world ", World());
      const BitwiseRun expected =
          TrainVariant(s, references[0], "reference none " + setting);
      for (size_t i = 1; i < references.size(); ++i) {
        const std::string what = references[i].name + " " + setting;
        ExpectBitIdentical(TrainVariant(s, references[i], what), expected,
                           what);
      }
      for (const Variant& v : variants) {
        const std::string what = v.name + " " + setting;
        ExpectBitIdentical(TrainVariant(s, v, what), expected, what);
      }
    }
  }
}

// 8-bit moments: the same optimizer placement (ratio 0.5) with the weights
// on the device, in host memory and on NVMe.
TEST(ParamOffloadRatioTest, EightBitMomentsBitIdenticalAcrossWeightTiers) {
  const Setting s{"bf16", 1, /*eight_bit=*/true};
  const std::string setting = absl::StrCat("8-bit world ", World());
  const BitwiseRun expected =
      TrainVariant(s, {"weights_on_device", "cpu", 0.5}, "device " + setting);
  ExpectBitIdentical(
      TrainVariant(s, {"cpu_r05", "cpu", 0.5, "cpu"}, "cpu " + setting),
      expected, "cpu " + setting);
  ExpectBitIdentical(TrainVariant(s, {"nvme_r05", "cpu", 0.5, "nvme", kSwapped},
                                  "nvme " + setting),
                     expected, "nvme " + setting);
}

// Checkpoints between ratio 0.5 with the weights on NVMe and the other
// placements: any pairing resumes bit for bit like the uninterrupted run.
TEST(ParamOffloadRatioTest, CheckpointsMoveBetweenPlacements) {
  const Setting s{"bf16", 3};
  const Variant none{"ckpt_none"};
  const Variant ratio_one{"ckpt_cpu_r1", "cpu", 1.0, "cpu"};
  const Variant half{"ckpt_nvme_r05", "cpu", 0.5, "nvme", kSwapped};
  BitwiseRun reference;
  {
    auto engine = MakeEngine(s, none, TempDirectory("ckpt_reference"));
    ASSERT_TRUE(engine.ok()) << engine.status();
    TrainRecording(**engine, 0, kSteps, kLogitsSample, reference);
  }
  reference.losses.erase(reference.losses.begin(),
                         reference.losses.begin() + 2);
  const std::pair<const Variant*, const Variant*> pairs[] = {
      {&half, &none}, {&half, &ratio_one}, {&half, &half}, {&none, &half}};
  for (const auto& [saver, loader] : pairs) {
    const std::string what =
        absl::StrCat(saver->name, " -> ", loader->name, " world ", World());
    const std::string name = absl::StrCat(saver->name, "_", loader->name);
    const std::string checkpoint = TempDirectory(name + "_files");
    {
      auto engine = MakeEngine(s, *saver, TempDirectory(name + "_save"));
      ASSERT_TRUE(engine.ok()) << what << ": " << engine.status();
      BitwiseRun first;
      TrainRecording(**engine, 0, 2, kLogitsSample, first);
      const absl::Status saved = (*engine)->SaveCheckpoint(checkpoint, "t2");
      ASSERT_TRUE(saved.ok()) << what << ": " << saved;
    }
    auto engine = MakeEngine(s, *loader, TempDirectory(name + "_load"));
    ASSERT_TRUE(engine.ok()) << what << ": " << engine.status();
    auto loaded = (*engine)->LoadCheckpoint(checkpoint, "t2");
    ASSERT_TRUE(loaded.ok()) << what << ": " << loaded.status();
    BitwiseRun resumed;
    TrainRecording(**engine, 2, kSteps, kLogitsSample, resumed);
    ExpectBitIdentical(resumed, reference, what);
  }
}

}  // namespace
}  // namespace enginetest
}  // namespace ze

int main(int argc, char** argv) {
  return ze::enginetest::RunAllTests(argc, argv);
}
