// Bad checkpoints and bad saves, through the public API, alone and under
// mpirun: each is refused with an error naming what is wrong, on every
// rank, and the engine's state is untouched (it still equals what it was
// and still loads a good checkpoint afterwards).
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "core/safetensors/reader.h"
#include "engine/engine.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"

namespace ze {
namespace {

namespace fs = std::filesystem;
using enginetest::Comm;
using enginetest::Rank;
using enginetest::World;

std::string Config(int stage, int accumulation = 1) {
  return absl::StrCat(
      R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": )",
      accumulation,
      R"(, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},)",
      R"("zero_optimization": {"stage": )", stage,
      R"(, "reduce_bucket_size": 700}})");
}

absl::StatusOr<std::unique_ptr<engine::Engine>> MakeEngine(
    int stage, int64_t channels = 16, int accumulation = 1) {
  ZE_ASSIGN_OR_RETURN(
      std::shared_ptr<nn::GptModel> model,
      enginetest::MakeGpt(enginetest::SmallGpt(channels), DType::kF32));
  return engine::Initialize(model, Config(stage, accumulation), Comm());
}

// A directory every rank sees (rank 0's test temporary directory, sent to
// the others by name: all ranks run on one host).
std::string SharedDirectory(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string directory = absl::StrCat(base != nullptr ? base : "/tmp",
                                       "/ckpt_errors_w", World(), "_", name);
  if (Rank() == 0) {
    fs::remove_all(directory);
    fs::create_directories(directory);
  }
  EXPECT_TRUE(Comm()->Barrier().ok());
  return directory;
}

// Runs `edit` on rank 0 only, then waits for every rank.
void OnRankZero(const std::function<void()>& edit) {
  if (Rank() == 0) edit();
  ASSERT_TRUE(Comm()->Barrier().ok());
}

class CheckpointErrorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto created = MakeEngine(/*stage=*/2);
    ASSERT_TRUE(created.ok()) << created.status();
    engine_ = std::move(created).value();
    for (int64_t step = 0; step < 2; ++step) {
      ASSERT_TRUE(enginetest::TrainStep(*engine_, step).ok());
    }
    directory_ = SharedDirectory(
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_TRUE(
        engine_->SaveCheckpoint(directory_, "good", nlohmann::json{{"step", 2}})
            .ok());
    // Train on, so a load that wrongly took effect would show.
    ASSERT_TRUE(enginetest::TrainStep(*engine_, 2).ok());
    auto weights = enginetest::AllMasterWeights(*engine_);
    ASSERT_TRUE(weights.ok());
    weights_before_ = *weights;
    steps_before_ = engine_->counters().global_steps;
  }

  // A copy of the good checkpoint as tag `tag`, for corrupting.
  std::string Copy(const std::string& tag) {
    OnRankZero([&] {
      fs::copy(directory_ + "/good", directory_ + "/" + tag,
               fs::copy_options::recursive);
    });
    return directory_ + "/" + tag;
  }

  // The engine is as it was after SetUp, and still loads the good one.
  void ExpectUntouchedAndUsable() {
    auto weights = enginetest::AllMasterWeights(*engine_);
    ASSERT_TRUE(weights.ok());
    EXPECT_EQ(*weights, weights_before_) << "a failed load changed weights";
    EXPECT_EQ(engine_->counters().global_steps, steps_before_);
    auto loaded = engine_->LoadCheckpoint(directory_, "good");
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->client_state["step"], 2);
    EXPECT_EQ(engine_->counters().global_steps, 2);
    EXPECT_TRUE(enginetest::TrainStep(*engine_, 2).ok());
  }

  std::unique_ptr<engine::Engine> engine_;
  std::string directory_;
  std::vector<float> weights_before_;
  int64_t steps_before_ = 0;
};

void ExpectError(const absl::Status& status, absl::StatusCode code,
                 const std::vector<std::string>& mentions) {
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), code) << status;
  // Rank 0 does the failing work in some cases; every other rank reports
  // that another rank failed. Either way, nobody succeeds.
  for (const std::string& text : mentions) {
    if (status.code() == code) {
      EXPECT_NE(status.message().find(text), std::string::npos)
          << "'" << text << "' not in: " << status;
    }
  }
}

TEST_F(CheckpointErrorsTest, TruncatedRankFile) {
  const std::string tag_directory = Copy("truncated");
  OnRankZero([&] {
    const std::string file = tag_directory + "/rank_00000.safetensors";
    fs::resize_file(file, fs::file_size(file) - 100);
  });
  ExpectError(engine_->LoadCheckpoint(directory_, "truncated").status(),
              absl::StatusCode::kDataLoss, {"rank_00000.safetensors"});
  ExpectUntouchedAndUsable();
}

TEST_F(CheckpointErrorsTest, OneFlippedByte) {
  const std::string tag_directory = Copy("flipped");
  const int victim = World() - 1;
  OnRankZero([&] {
    const std::string file =
        absl::StrCat(tag_directory, "/rank_0000", victim, ".safetensors");
    std::fstream stream(file, std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>(fs::file_size(file) - 9);
    stream.seekg(at);
    char byte = 0;
    stream.read(&byte, 1);
    byte ^= 0x01;
    stream.seekp(at);
    stream.write(&byte, 1);
  });
  const absl::Status status =
      engine_->LoadCheckpoint(directory_, "flipped").status();
  ASSERT_FALSE(status.ok());
  // The rank that verifies the victim's file names it; the others learn
  // that a rank failed.
  if (Rank() == victim % World()) {
    ExpectError(status, absl::StatusCode::kDataLoss,
                {absl::StrCat("rank_0000", victim, ".safetensors"), "crc32c"});
  }
  ExpectUntouchedAndUsable();
}

// Flips one byte in the middle of rank `victim`'s file of `tag_directory`.
void FlipMiddleByte(const std::string& tag_directory, int victim) {
  const std::string file =
      absl::StrCat(tag_directory, "/rank_0000", victim, ".safetensors");
  std::fstream stream(file, std::ios::in | std::ios::out | std::ios::binary);
  const auto at = static_cast<std::streamoff>(fs::file_size(file) / 2);
  stream.seekg(at);
  char byte = 0;
  stream.read(&byte, 1);
  byte ^= 0x10;
  stream.seekp(at);
  stream.write(&byte, 1);
}

// The one-pass load (the state staged in host memory as it is read, the
// checksums computed from those reads) still refuses a corrupt file before
// anything changes: a byte flipped in the middle of a rank file, inside
// the optimizer state that a load at the same layout reads exactly once.
TEST_F(CheckpointErrorsTest, FlippedByteMidFileIsCaughtInOnePass) {
  const std::string tag_directory = Copy("flipped_middle");
  const int victim = World() - 1;
  OnRankZero([&] { FlipMiddleByte(tag_directory, victim); });
  const absl::Status status =
      engine_->LoadCheckpoint(directory_, "flipped_middle").status();
  ASSERT_FALSE(status.ok());
  if (Rank() == victim % World()) {
    ExpectError(status, absl::StatusCode::kDataLoss,
                {absl::StrCat("rank_0000", victim, ".safetensors"), "crc32c"});
  }
  ExpectUntouchedAndUsable();
  // The same with only the weights asked for: the files are then read in
  // part, and verified by reading them again.
  const absl::Status weights_only =
      engine_->LoadCheckpoint(directory_, "flipped_middle", false).status();
  ASSERT_FALSE(weights_only.ok());
  if (Rank() == victim % World()) {
    ExpectError(weights_only, absl::StatusCode::kDataLoss,
                {absl::StrCat("rank_0000", victim, ".safetensors"), "crc32c"});
  }
}

// Both load paths give the same state: the one-pass path (verified from
// its own reads, no file read twice at the same layout), a weights-only
// load (partial reads, so the verified file is read again), the two-pass
// path (ZE_CHECKPOINT_STAGING_LIMIT=0), and a load at another stage
// (stage 3's partitioning: resharding).
TEST_F(CheckpointErrorsTest, LoadPathsAgree) {
  auto one_pass = engine_->LoadCheckpoint(directory_, "good");
  ASSERT_TRUE(one_pass.ok()) << one_pass.status();
  EXPECT_TRUE(one_pass->one_pass);
  EXPECT_GT(one_pass->bytes_staged, 0);
  EXPECT_EQ(one_pass->files_reread, 0);
  auto loaded = enginetest::AllMasterWeights(*engine_);
  ASSERT_TRUE(loaded.ok());
  EXPECT_NE(*loaded, weights_before_);  // SetUp trained past the save

  ASSERT_TRUE(enginetest::TrainStep(*engine_, 3).ok());
  auto weights_only = engine_->LoadCheckpoint(directory_, "good", false);
  ASSERT_TRUE(weights_only.ok()) << weights_only.status();
  EXPECT_TRUE(weights_only->one_pass);
  EXPECT_EQ(weights_only->files_reread, 1);  // this rank's share: one file
  EXPECT_EQ(*enginetest::AllMasterWeights(*engine_), *loaded);

  ASSERT_TRUE(enginetest::TrainStep(*engine_, 3).ok());
  // The engine reads the staging limit from the environment once, at setup
  // (core/host_facts.h): the two-pass load runs on an engine created under
  // it, the one-pass engine set aside meanwhile.
  setenv("ZE_CHECKPOINT_STAGING_LIMIT", "0", 1);
  auto limited = MakeEngine(/*stage=*/2);
  unsetenv("ZE_CHECKPOINT_STAGING_LIMIT");
  ASSERT_TRUE(limited.ok()) << limited.status();
  std::swap(engine_, *limited);
  auto two_pass = engine_->LoadCheckpoint(directory_, "good");
  ASSERT_TRUE(two_pass.ok()) << two_pass.status();
  EXPECT_FALSE(two_pass->one_pass);
  EXPECT_EQ(*enginetest::AllMasterWeights(*engine_), *loaded);
  // Training on from either gives the same step.
  ASSERT_TRUE(enginetest::TrainStep(*engine_, 3).ok());
  auto after_two_pass = enginetest::AllMasterWeights(*engine_);
  std::swap(engine_, *limited);  // back to the one-pass engine
  ASSERT_TRUE(engine_->LoadCheckpoint(directory_, "good").ok());
  ASSERT_TRUE(enginetest::TrainStep(*engine_, 3).ok());
  EXPECT_EQ(*enginetest::AllMasterWeights(*engine_), *after_two_pass);

  auto stage3 = MakeEngine(/*stage=*/3);
  ASSERT_TRUE(stage3.ok()) << stage3.status();
  auto resharded = (*stage3)->LoadCheckpoint(directory_, "good");
  ASSERT_TRUE(resharded.ok()) << resharded.status();
  EXPECT_TRUE(resharded->one_pass);
  EXPECT_EQ(*enginetest::AllMasterWeights(**stage3), *loaded);
  // And a corrupt file is refused there too, the stage-3 engine unchanged.
  const std::string tag_directory = Copy("flipped_stage3");
  OnRankZero([&] { FlipMiddleByte(tag_directory, 0); });
  ASSERT_TRUE(enginetest::TrainStep(**stage3, 3).ok());
  auto before = enginetest::AllMasterWeights(**stage3);
  ASSERT_TRUE(before.ok());
  const absl::Status refused =
      (*stage3)->LoadCheckpoint(directory_, "flipped_stage3").status();
  ASSERT_FALSE(refused.ok());
  if (Rank() == 0) {
    ExpectError(refused, absl::StatusCode::kDataLoss,
                {"rank_00000.safetensors", "crc32c"});
  }
  EXPECT_EQ(*enginetest::AllMasterWeights(**stage3), *before);
}

TEST_F(CheckpointErrorsTest, MissingRankFile) {
  const std::string tag_directory = Copy("missing");
  const int victim = World() - 1;
  OnRankZero([&] {
    fs::remove(
        absl::StrCat(tag_directory, "/rank_0000", victim, ".safetensors"));
  });
  ExpectError(engine_->LoadCheckpoint(directory_, "missing").status(),
              absl::StatusCode::kNotFound,
              {absl::StrCat("rank_0000", victim, ".safetensors")});
  ExpectUntouchedAndUsable();
}

TEST_F(CheckpointErrorsTest, UnknownFormatVersion) {
  const std::string tag_directory = Copy("newer");
  OnRankZero([&] {
    const std::string path = tag_directory + "/manifest.json";
    std::ifstream in(path);
    nlohmann::json manifest = nlohmann::json::parse(in);
    manifest["format_version"] = 99;
    std::ofstream(path) << manifest.dump(1);
  });
  ExpectError(engine_->LoadCheckpoint(directory_, "newer").status(),
              absl::StatusCode::kFailedPrecondition, {"99"});
  ExpectUntouchedAndUsable();
}

TEST_F(CheckpointErrorsTest, TagThatDoesNotExist) {
  ExpectError(engine_->LoadCheckpoint(directory_, "no_such_tag").status(),
              absl::StatusCode::kNotFound, {"no_such_tag"});
  ExpectUntouchedAndUsable();
}

TEST_F(CheckpointErrorsTest, AnotherModel) {
  // The same layer names with other shapes (channels 24, not 16).
  auto other = MakeEngine(/*stage=*/2, /*channels=*/24);
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_TRUE((*other)->SaveCheckpoint(directory_, "other_model").ok());
  ExpectError(engine_->LoadCheckpoint(directory_, "other_model").status(),
              absl::StatusCode::kInvalidArgument, {"embed.wte", "shape"});
  ExpectUntouchedAndUsable();
}

TEST_F(CheckpointErrorsTest, LatestPointsAtTheNewestCompleteSave) {
  ASSERT_TRUE(
      engine_->SaveCheckpoint(directory_, "", nlohmann::json{{"step", 3}})
          .ok());
  auto loaded = engine_->LoadCheckpoint(directory_);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->tag, "global_step3");
  EXPECT_EQ(loaded->client_state["step"], 3);
  EXPECT_EQ(loaded->saved_world_size, World());
}

TEST_F(CheckpointErrorsTest, BadArgumentsAreRefusedBeforeWriting) {
  EXPECT_EQ(engine_->SaveCheckpoint(directory_, "bad/tag").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      engine_->SaveCheckpoint(directory_, "x", nlohmann::json::array()).code(),
      absl::StatusCode::kInvalidArgument);
  if (World() > 1) {
    // Ranks that disagree on the directory: every rank refuses.
    const absl::Status status = engine_->SaveCheckpoint(
        Rank() == 0 ? directory_ : directory_ + "/elsewhere", "agreed");
    EXPECT_EQ(status.code(), Rank() == 0 ? absl::StatusCode::kFailedPrecondition
                                         : absl::StatusCode::kInvalidArgument)
        << status;
    EXPECT_FALSE(fs::exists(directory_ + "/agreed"));
  }
  std::ifstream latest(directory_ + "/latest");
  std::string tag;
  latest >> tag;
  EXPECT_EQ(tag, "good");
}

TEST_F(CheckpointErrorsTest, DisagreeingTagsFollowTagValidation) {
  if (World() == 1) GTEST_SKIP() << "needs several ranks";
  // The default, Warn: rank 0's tag is used (and the others log it).
  ASSERT_TRUE(
      engine_
          ->SaveCheckpoint(directory_, Rank() == 0 ? "rank0_tag" : "other_tag")
          .ok());
  EXPECT_TRUE(fs::exists(directory_ + "/rank0_tag/manifest.json"));
  EXPECT_FALSE(fs::exists(directory_ + "/other_tag"));
  // Fail: every rank refuses, naming both tags.
  auto strict = engine::Initialize(
      *enginetest::MakeGpt(enginetest::SmallGpt(), DType::kF32),
      absl::StrReplaceAll(
          Config(2),
          {{R"("zero_optimization")",
            R"("checkpoint": {"tag_validation": "Fail"}, "zero_optimization")"}}),
      Comm());
  ASSERT_TRUE(strict.ok()) << strict.status();
  const absl::Status status = (*strict)->SaveCheckpoint(
      directory_, Rank() == 0 ? "strict0" : "strict1");
  ASSERT_FALSE(status.ok());
  if (Rank() != 0) {
    EXPECT_NE(status.message().find("strict0"), std::string::npos) << status;
  }
  EXPECT_FALSE(fs::exists(directory_ + "/strict0"));
}

TEST_F(CheckpointErrorsTest, GatheredWeightsFileOnSave) {
  // stage3_gather_16bit_weights_on_model_save: rank 0 also writes the whole
  // model as one file, streamed from the rank files.
  auto created = engine::Initialize(
      *enginetest::MakeGpt(enginetest::SmallGpt(), DType::kF32),
      absl::StrReplaceAll(
          Config(3),
          {{R"("stage": 3)",
            R"("stage": 3, "stage3_gather_16bit_weights_on_model_save": true)"}}),
      Comm());
  ASSERT_TRUE(created.ok()) << created.status();
  ASSERT_TRUE(enginetest::TrainStep(**created, 0).ok());
  ASSERT_TRUE((*created)->SaveCheckpoint(directory_, "gathered").ok());
  auto reader = safetensors::Reader::Open(directory_ +
                                          "/gathered/model_16bit.safetensors");
  ASSERT_TRUE(reader.ok()) << reader.status();
  for (const std::string& name : (*created)->ParameterNames()) {
    auto expected = (*created)->GatherMasterWeights(name);
    ASSERT_TRUE(expected.ok());
    auto stored = (*reader)->ReadTensor(name);
    ASSERT_TRUE(stored.ok()) << name << ": " << stored.status();
    ASSERT_EQ(stored->numel(), static_cast<int64_t>(expected->size()));
    for (int64_t i = 0; i < stored->numel(); ++i) {
      ASSERT_EQ(stored->data_as<float>()[i], (*expected)[i]) << name << i;
    }
  }
}

// Whether every value is exactly a bf16 value (its low 16 bits are zero).
bool AllBf16(const std::vector<float>& values) {
  for (float value : values) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    if ((bits & 0xFFFFu) != 0) return false;
  }
  return true;
}

TEST_F(CheckpointErrorsTest, LoadFromFp32WeightsFalseTakesTheBf16Weights) {
  auto config = [](bool from_fp32) {
    return absl::StrReplaceAll(
        Config(2),
        {{R"("stage": 2)",
          absl::StrCat(R"("stage": 2, "load_from_fp32_weights": )",
                       from_fp32 ? "true" : "false")},
         {R"("optimizer")", R"("bf16": {"enabled": true}, "optimizer")"}});
  };
  auto make = [&](bool from_fp32) {
    return engine::Initialize(
        *enginetest::MakeGpt(enginetest::SmallGpt(), DType::kBF16),
        config(from_fp32), Comm());
  };
  auto saver = make(true);
  ASSERT_TRUE(saver.ok()) << saver.status();
  ASSERT_TRUE(enginetest::TrainStep(**saver, 0).ok());
  ASSERT_TRUE((*saver)->SaveCheckpoint(directory_, "bf16").ok());
  for (bool from_fp32 : {true, false}) {
    auto loader = make(from_fp32);
    ASSERT_TRUE(loader.ok()) << loader.status();
    ASSERT_TRUE((*loader)->LoadCheckpoint(directory_, "bf16").ok());
    auto master = enginetest::AllMasterWeights(**loader);
    ASSERT_TRUE(master.ok());
    // The f32 master after an AdamW step is not bf16-representable; the
    // 16-bit weights are.
    EXPECT_EQ(AllBf16(*master), !from_fp32) << "from_fp32 " << from_fp32;
  }
}

TEST_F(CheckpointErrorsTest, MidAccumulationWindowIsRefused) {
  auto created = MakeEngine(/*stage=*/1, 16, /*accumulation=*/2);
  ASSERT_TRUE(created.ok());
  std::vector<int32_t> tokens(2 * enginetest::kSeqLen, 1);
  Tensor batch = Tensor::Wrap(tokens.data(), {2, enginetest::kSeqLen},
                              DType::kI32, Device::Cpu());
  ASSERT_TRUE((*created)->Forward(batch, batch).ok());
  EXPECT_EQ((*created)->SaveCheckpoint(directory_, "x").code(),
            absl::StatusCode::kFailedPrecondition);  // backward owed
  ASSERT_TRUE((*created)->Backward().ok());
  ASSERT_TRUE((*created)->Step().ok());
  const absl::Status status = (*created)->SaveCheckpoint(directory_, "x");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(status.message().find("accumulation"), std::string::npos);
}

// What a save that failed or was killed leaves (.<tag>.partial/, of any
// tag) goes at the next save, which says so on rank 0 with its size.
TEST_F(CheckpointErrorsTest, NextSaveRemovesWhatFailedSavesLeft) {
  const std::string crashed = directory_ + "/.crashed.partial";
  OnRankZero([&] {
    fs::create_directories(crashed);
    std::ofstream(crashed + "/rank_00000.safetensors.tmp")
        << std::string(1000, 'x');
  });
  if (Rank() == 0) ::testing::internal::CaptureStderr();
  const absl::Status saved = engine_->SaveCheckpoint(directory_, "next");
  const std::string log =
      Rank() == 0 ? ::testing::internal::GetCapturedStderr() : "";
  ASSERT_TRUE(saved.ok()) << saved;
  EXPECT_FALSE(fs::exists(crashed));
  EXPECT_TRUE(fs::exists(directory_ + "/next"));
  EXPECT_TRUE(fs::exists(directory_ + "/good"));
  if (Rank() == 0) {
    EXPECT_NE(log.find(crashed + "/ (1000 bytes)"), std::string::npos) << log;
  }
}

TEST_F(CheckpointErrorsTest, FullDiskLeavesThePreviousCheckpoint) {
  // A file size limit stands in for a full disk: writes past it fail with
  // EFBIG, which the writer reports like ENOSPC. Only the last rank hits it.
  const bool limited = Rank() == World() - 1;
  rlimit old_limit{};
  if (limited) {
    std::signal(SIGXFSZ, SIG_IGN);
    getrlimit(RLIMIT_FSIZE, &old_limit);
    rlimit small = old_limit;
    small.rlim_cur = 2048;
    setrlimit(RLIMIT_FSIZE, &small);
  }
  const absl::Status status = engine_->SaveCheckpoint(directory_, "too_big");
  if (limited) setrlimit(RLIMIT_FSIZE, &old_limit);
  ASSERT_FALSE(status.ok());
  if (limited) {
    EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  }
  EXPECT_FALSE(fs::exists(directory_ + "/too_big"));
  std::ifstream latest(directory_ + "/latest");
  std::string tag;
  latest >> tag;
  EXPECT_EQ(tag, "good");
  ExpectUntouchedAndUsable();
}

}  // namespace
}  // namespace ze

int main(int argc, char** argv) {
  return ze::enginetest::RunAllTests(argc, argv);
}
