// offload_param.device "nvme" (issue 28: ZeRO-Infinity's parameter tier)
// through the public engine API, alone and under mpirun at 2 and 3 ranks:
//   - parity: stage 3's 16-bit (or f32) parameter partition in a swap file
//     trains bit for bit like the partition in CPU memory (offload_param
//     cpu): the same losses, the same f32 master weights and the same
//     logits (the gathered 16-bit weights), with offload_optimizer cpu and
//     nvme, bf16, f32 and fp16 (dynamic loss scaling), gradient
//     accumulation 2 (a bucket gathered again
//     in the second micro-step) and clipping; with nothing kept in CPU
//     memory and few swap buffers (every gather goes through the file and
//     the buffers are reused), with part kept (max_in_cpu), and with one
//     buffer;
//   - the swap file exists under nvme_path while the engine lives, holds
//     the swapped slices (its size), and is gone afterwards;
//   - checkpoints: saved with the parameters on NVMe and loaded with them
//     in CPU memory (and the other way round, and NVMe to NVMe), training
//     goes on bit for bit like the uninterrupted CPU run;
//   - errors: a missing nvme_path names the path and the section at
//     Initialize; a swap buffer smaller than a bucket's slice names
//     offload_param.buffer_size.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/communicator.h"
#include "core/ops.h"
#include "engine/offload_report.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"

namespace ze {
namespace enginetest {
namespace {

// The global samples whose logits each run records (EvalLogitBytes).
constexpr int64_t kLogitsSample = 1000;

constexpr int kSteps = 4;

std::string TempDirectory(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = absl::StrCat(dir != nullptr ? dir : "/tmp",
                                        "/nvme_param_w", World(), "_", name);
  std::filesystem::create_directories(path);
  return path;
}

struct Variant {
  std::string name;
  std::string dtype;      // bf16 or f32
  std::string optimizer;  // offload_optimizer device: cpu or nvme
  std::string param;      // cpu, or the offload_param nvme JSON's extras
};

std::string ConfigJson(const Variant& v, const std::string& directory) {
  const std::string optimizer =
      v.optimizer == "nvme"
          ? absl::StrCat(
                R"("offload_optimizer": {"device": "nvme", "nvme_path": ")",
                directory, R"(", "buffer_count": 2})")
          : R"("offload_optimizer": {"device": "cpu"})";
  const std::string param =
      v.param == "cpu"
          ? R"("offload_param": {"device": "cpu"})"
          : absl::StrCat(
                R"("offload_param": {"device": "nvme", "nvme_path": ")",
                directory, R"(")", v.param, "}");
  return absl::StrCat(
      R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,)",
      R"("gradient_clipping": 1.0,)",
      v.dtype == "bf16" ? R"("bf16": {"enabled": true},)"
      : v.dtype == "fp16"
          ? R"("fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 10},)"
          : "",
      R"("optimizer": {"type": "AdamW", "params": {"lr": 0.01, "eps": 1e-3, "weight_decay": 0.01}},)",
      R"("scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.002, "warmup_max_lr": 0.01, "warmup_num_steps": 3}},)",
      // Nothing persistent or kept for reuse and a small prefetch: every
      // use of a module fetches it (from the swap file, or from the
      // update's staging once after a step) on demand or a little ahead,
      // so training itself reads what was written back. Chunks of 100
      // elements: the offloaded update runs in many pieces.
      R"("zero_optimization": {"stage": 3, "sub_group_size": 100,)",
      R"("stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 3000,)",
      R"("stage3_max_reuse_distance": 0,)", optimizer, ",", param, "}}");
}

absl::StatusOr<std::unique_ptr<engine::Engine>> MakeEngine(
    const Variant& v, const std::string& directory) {
  ZE_ASSIGN_OR_RETURN(
      std::shared_ptr<nn::GptModel> model,
      MakeGpt(SmallGpt(32, 2, 2), v.dtype == "bf16"   ? DType::kBF16
                                  : v.dtype == "fp16" ? DType::kF16
                                                      : DType::kF32));
  return engine::Initialize(model, ConfigJson(v, directory), Comm());
}

std::string SwapFile(const std::string& directory) {
  return absl::StrCat(directory, "/zero_engine_rank", Rank(),
                      "_parameters.swp");
}

int64_t FileSize(const std::string& path) {
  struct stat info;
  if (stat(path.c_str(), &info) != 0) return -1;
  return static_cast<int64_t>(info.st_size);
}

// The parameter partition in a swap file trains bit for bit like it does in
// CPU memory.
TEST(NvmeParamTest, BitIdenticalToParametersInCpuMemory) {
  for (const char* dtype : {"bf16", "f32", "fp16"}) {
    for (const char* optimizer : {"cpu", "nvme"}) {
      const Variant reference{"ref", dtype, optimizer, "cpu"};
      BitwiseRun expected;
      {
        auto engine = MakeEngine(
            reference,
            TempDirectory(absl::StrCat("ref_", dtype, "_", optimizer)));
        ASSERT_TRUE(engine.ok()) << engine.status();
        TrainRecording(**engine, 0, kSteps, kLogitsSample, expected);
      }
      const std::vector<Variant> variants = {
          // Nothing in CPU memory, two buffers: every bucket is read from
          // the file through reused buffers.
          {"swapped", dtype, optimizer,
           R"(, "max_in_cpu": 0, "buffer_count": 2)"},
          // One buffer: no read-ahead room at all.
          {"one_buffer", dtype, optimizer,
           R"(, "max_in_cpu": 0, "buffer_count": 1, "pin_memory": true)"},
          // The first buckets kept in CPU memory, the rest swapped.
          {"partly", dtype, optimizer, R"(, "max_in_cpu": 2000)"},
          // DeepSpeed's defaults (max_in_cpu 1e9): all kept on the host.
          {"defaults", dtype, optimizer, ""},
      };
      for (const Variant& v : variants) {
        const std::string what =
            absl::StrCat(v.name, " ", dtype, " offload_optimizer ", optimizer,
                         " world ", World());
        const std::string directory =
            TempDirectory(absl::StrCat(v.name, "_", dtype, "_", optimizer));
        BitwiseRun run;
        {
          auto engine = MakeEngine(v, directory);
          ASSERT_TRUE(engine.ok()) << what << ": " << engine.status();
          // The swap file is there, preallocated: the swapped slices
          // (nothing but one aligned block when everything is kept).
          const int64_t size = FileSize(SwapFile(directory));
          EXPECT_GE(size, 4096) << what;
          if (v.name == "swapped" || v.name == "one_buffer") {
            EXPECT_GT(size, 8 * 4096) << what;
          }
          if (v.name == "defaults") {
            EXPECT_EQ(size, 4096) << what;
          }
          TrainRecording(**engine, 0, kSteps, kLogitsSample, run);
          // Training went through the file: written back after updates
          // and read again (no reuse between a module's uses).
          if (v.name == "swapped" || v.name == "one_buffer") {
            const engine::NvmeCounters io = (*engine)->nvme_counters();
            EXPECT_GT(io.bytes_written, 0) << what;
            EXPECT_GT(io.bytes_read, 0) << what;
          }
        }
        EXPECT_EQ(FileSize(SwapFile(directory)), -1)
            << what << ": the swap file outlived the engine";
        ExpectBitIdentical(run, expected, what);
      }
    }
  }
}

// Checkpoints save and load the same with the parameters on NVMe as in CPU
// memory: any pairing resumes bit for bit like the uninterrupted run.
TEST(NvmeParamTest, CheckpointsMoveBetweenCpuAndNvmeParameters) {
  const Variant cpu{"cpu", "bf16", "nvme", "cpu"};
  const Variant nvme{"nvme", "bf16", "nvme",
                     R"(, "max_in_cpu": 0, "buffer_count": 2)"};
  BitwiseRun reference;
  {
    auto engine = MakeEngine(cpu, TempDirectory("ckpt_ref"));
    ASSERT_TRUE(engine.ok()) << engine.status();
    TrainRecording(**engine, 0, kSteps, kLogitsSample, reference);
  }
  reference.losses.erase(reference.losses.begin(),
                         reference.losses.begin() + 2);
  const std::pair<const Variant*, const Variant*> pairs[] = {
      {&nvme, &cpu}, {&cpu, &nvme}, {&nvme, &nvme}};
  for (const auto& [saver, loader] : pairs) {
    const std::string what =
        absl::StrCat(saver->name, " -> ", loader->name, " world ", World());
    const std::string name =
        absl::StrCat("ckpt_", saver->name, "_", loader->name);
    const std::string checkpoint = TempDirectory(name + "_files");
    {
      auto engine = MakeEngine(*saver, TempDirectory(name + "_save"));
      ASSERT_TRUE(engine.ok()) << engine.status();
      BitwiseRun first;
      TrainRecording(**engine, 0, 2, kLogitsSample, first);
      const absl::Status saved = (*engine)->SaveCheckpoint(checkpoint, "t2");
      ASSERT_TRUE(saved.ok()) << what << ": " << saved;
    }
    auto engine = MakeEngine(*loader, TempDirectory(name + "_load"));
    ASSERT_TRUE(engine.ok()) << engine.status();
    auto loaded = (*engine)->LoadCheckpoint(checkpoint, "t2");
    ASSERT_TRUE(loaded.ok()) << what << ": " << loaded.status();
    BitwiseRun resumed;
    TrainRecording(**engine, 2, kSteps, kLogitsSample, resumed);
    ExpectBitIdentical(resumed, reference, what);
  }
}

// GatherParameters with a modifier writes part of a bucket (one parameter's
// piece of each rank's slice: a read-modify-write of its swap record), and
// training goes on bit for bit as with the parameters in CPU memory.
TEST(NvmeParamTest, ModifiedGatheredParametersReachTheSwapFile) {
  const Variant cpu{"scope_cpu", "bf16", "cpu", "cpu"};
  // One swap buffer: the modified records are not all cached, so the
  // rest of each record must come from the file.
  const Variant nvme{"scope_nvme", "bf16", "cpu",
                     R"(, "max_in_cpu": 0, "buffer_count": 1)"};
  std::vector<BitwiseRun> runs;
  for (const Variant* v : {&cpu, &nvme}) {
    auto engine = MakeEngine(*v, TempDirectory(v->name));
    ASSERT_TRUE(engine.ok()) << engine.status();
    BitwiseRun run;
    TrainRecording(**engine, 0, 2, kLogitsSample, run);
    const std::vector<std::string> names = (*engine)->ParameterNames();
    ASSERT_GT(names.size(), 3u);
    const std::vector<std::string> modified = {names[names.size() / 2],
                                               names[1]};
    {
      auto scope = (*engine)->GatherParameters(modified, /*modifier_rank=*/0);
      ASSERT_TRUE(scope.ok()) << scope.status();
      if (Rank() == 0) {
        for (const std::string& name : modified) {
          nn::Parameter* parameter = nullptr;
          for (nn::Parameter* p : (*engine)->model().Parameters()) {
            if (p->name() == name) parameter = p;
          }
          ASSERT_NE(parameter, nullptr) << name;
          absl::StatusOr<Tensor> data = parameter->data();
          ASSERT_TRUE(data.ok()) << data.status();
          ASSERT_TRUE(Fill(*data, 0.25f, (*engine)->compute_stream()).ok());
        }
      }
      ASSERT_TRUE((*scope)->Release().ok());
    }
    TrainRecording(**engine, 2, kSteps, kLogitsSample, run);
    runs.push_back(run);
  }
  ExpectBitIdentical(runs[1], runs[0],
                     absl::StrCat("modified scope, world ", World()));
}

// A swap file that cannot be read in the middle of a forward (rank 0's,
// truncated): that rank's gather goes on (with zeros) so no rank is left in
// a collective, and the step's boundary fails on every rank (rank 0 with
// the DataLoss naming its file, the others Aborted) before the step is
// applied: the master weights are those from before it.
TEST(NvmeParamTest, UnreadableSwapFileStopsEveryRankBeforeTheStep) {
  const std::string directory = TempDirectory("unreadable");
  const Variant v{"unreadable", "bf16", "cpu",
                  R"(, "max_in_cpu": 0, "buffer_count": 1)"};
  auto engine = MakeEngine(v, directory);
  ASSERT_TRUE(engine.ok()) << engine.status();
  absl::StatusOr<std::vector<float>> before = AllMasterWeights(**engine);
  ASSERT_TRUE(before.ok()) << before.status();
  if (Rank() == 0) {
    ASSERT_EQ(::truncate(SwapFile(directory).c_str(), 0), 0);
  }
  absl::StatusOr<engine::StepReport> failed = TrainStep(**engine, 0);
  ASSERT_FALSE(failed.ok());
  if (Rank() == 0) {
    EXPECT_EQ(failed.status().code(), absl::StatusCode::kDataLoss)
        << failed.status();
    EXPECT_NE(failed.status().message().find(SwapFile(directory)),
              std::string::npos)
        << failed.status();
    EXPECT_NE(failed.status().message().find("offload_param"),
              std::string::npos)
        << failed.status();
  } else {
    EXPECT_EQ(failed.status().code(), absl::StatusCode::kAborted)
        << failed.status();
    EXPECT_NE(failed.status().message().find("failed on 1 other rank"),
              std::string::npos)
        << failed.status();
  }
  absl::StatusOr<std::vector<float>> after = AllMasterWeights(**engine);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, *before);
}

// The optimizer tier's errors, for the parameter tier: by path and key, at
// Initialize, on every rank.
TEST(NvmeParamTest, ErrorsNameThePathAndTheKey) {
  const std::string missing = TempDirectory("errors") + "/no/such/dir";
  const Variant v{"missing", "bf16", "cpu", R"(, "max_in_cpu": 0)"};
  auto refused = MakeEngine(v, missing);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition)
      << refused.status();
  EXPECT_NE(refused.status().message().find(missing), std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("offload_param"), std::string::npos)
      << refused.status();

  const Variant small{"small", "bf16", "cpu",
                      R"(, "max_in_cpu": 0, "buffer_size": 10)"};
  auto too_small = MakeEngine(small, TempDirectory("small"));
  ASSERT_FALSE(too_small.ok());
  EXPECT_EQ(too_small.status().code(), absl::StatusCode::kInvalidArgument)
      << too_small.status();
  EXPECT_NE(too_small.status().message().find(
                "zero_optimization.offload_param.buffer_size 10"),
            std::string::npos)
      << too_small.status();
}

}  // namespace
}  // namespace enginetest
}  // namespace ze

int main(int argc, char** argv) {
  return ze::enginetest::RunAllTests(argc, argv);
}
