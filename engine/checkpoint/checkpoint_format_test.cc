// The checkpoint format on synthetic checkpoints written from one process:
// manifest round trip and validation, ranged reads across pieces with
// dtype conversion, corruption, and the crash-safe save protocol.
#include "engine/checkpoint/checkpoint_format.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/crc32c.h"
#include "core/dtype.h"
#include "engine/checkpoint/test_checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ze {
namespace checkpoint {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using testing::AwkwardModel;
using ::testing::HasSubstr;
using testing::NamesAndShapes;
using testing::StoredTestValue;
using testing::TestCheckpointOptions;
using testing::WriteTestCheckpoint;

std::string ReadAll(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

void WriteAll(const std::string& path, const std::string& contents) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file << contents;
}

std::set<std::string> Entries(const std::string& directory) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(directory)) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

// A save of global_step2 (generation 1) that writes two of its three rank
// files, then dies.
TestCheckpointOptions DyingSave() {
  TestCheckpointOptions dying;
  dying.tag = "global_step2";
  dying.generation = 1;
  dying.ranks_to_write = 2;
  dying.commit = false;
  return dying;
}

class CheckpointFormatTest : public ::testing::Test {
 protected:
  void SetUp() override { directory_ = testing::FreshTestDirectory(); }

  // The awkward model's test checkpoint, written and opened; null (with a
  // failure) when either fails.
  std::unique_ptr<CheckpointReader> WriteAndOpenAwkward() {
    EXPECT_TRUE(WriteTestCheckpoint(directory_, AwkwardModel()).ok());
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
        CheckpointReader::Open(directory_);
    EXPECT_TRUE(reader.ok()) << reader.status();
    return reader.ok() ? std::move(reader).value() : nullptr;
  }

  std::string RankPath(const std::string& tag, int rank) const {
    return absl::StrCat(directory_, "/", tag, "/", RankFileName(rank));
  }

  // Reads every parameter of every kind in full as f32 and compares with
  // the values written in `generation`.
  void ExpectAllValues(const CheckpointReader& reader, int generation) {
    const Manifest& manifest = reader.manifest();
    for (const std::string& kind : manifest.kinds) {
      const DType stored =
          kind == kWeights ? manifest.model_dtype : DType::kF32;
      for (size_t index = 0; index < manifest.parameters.size(); ++index) {
        const ParameterRecord& record = manifest.parameters[index];
        absl::StatusOr<Tensor> value =
            Tensor::Empty(record.shape, DType::kF32, Device::Cpu());
        ASSERT_TRUE(value.ok());
        ASSERT_TRUE(reader.ReadRange(kind, record.name, 0, *value).ok());
        for (int64_t i = 0; i < record.numel(); ++i) {
          ASSERT_EQ(value->data_as<float>()[i],
                    StoredTestValue(kind, index, i, stored, generation))
              << kind << "/" << record.name << "[" << i << "]";
        }
      }
    }
  }

  std::string directory_;
};

// A valid manifest with every field set, for mutating.
Manifest SampleManifest() {
  Manifest manifest;
  manifest.tag = "global_step7";
  manifest.world_size = 3;
  manifest.zero_stage = 2;
  manifest.model_dtype = DType::kBF16;
  manifest.kinds = {kMaster, kExpAvg, kExpAvgSq, kWeights};
  manifest.parameters = testing::PartitionLikeZero(AwkwardModel(), 3);
  for (int rank = 0; rank < 3; ++rank) {
    manifest.files.push_back({RankFileName(rank), rank,
                              uint64_t{1000} + static_cast<uint64_t>(rank),
                              0x01234567u * static_cast<uint32_t>(rank + 1)});
  }
  manifest.training_state = {{"global_steps", 7}, {"skipped_steps", 1}};
  manifest.config = {{"zero_optimization", {{"stage", 2}}}};
  manifest.client_state = {{"epoch", 3}};
  manifest.saved_at = "2026-12-02T10:00:00Z";
  return manifest;
}

TEST(ManifestTest, RoundTripKeepsEveryField) {
  const Manifest manifest = SampleManifest();
  const std::string text = SerializeManifest(manifest);
  absl::StatusOr<Manifest> parsed = ParseManifest(text, "m.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->format_version, kFormatVersion);
  EXPECT_EQ(parsed->tag, manifest.tag);
  EXPECT_EQ(parsed->world_size, 3);
  EXPECT_EQ(parsed->zero_stage, 2);
  EXPECT_EQ(parsed->model_dtype, DType::kBF16);
  EXPECT_EQ(parsed->kinds, manifest.kinds);
  EXPECT_EQ(parsed->training_state, manifest.training_state);
  EXPECT_EQ(parsed->config, manifest.config);
  EXPECT_EQ(parsed->client_state, manifest.client_state);
  EXPECT_EQ(parsed->saved_at, manifest.saved_at);
  ASSERT_EQ(parsed->files.size(), 3u);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(parsed->files[rank].name, manifest.files[rank].name);
    EXPECT_EQ(parsed->files[rank].bytes, manifest.files[rank].bytes);
    EXPECT_EQ(parsed->files[rank].crc32c, manifest.files[rank].crc32c);
  }
  ASSERT_EQ(parsed->parameters.size(), manifest.parameters.size());
  for (size_t i = 0; i < manifest.parameters.size(); ++i) {
    const ParameterRecord& a = manifest.parameters[i];
    const ParameterRecord& b = parsed->parameters[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.shape, b.shape);
    ASSERT_EQ(a.pieces.size(), b.pieces.size()) << a.name;
    for (size_t p = 0; p < a.pieces.size(); ++p) {
      EXPECT_EQ(a.pieces[p].rank, b.pieces[p].rank);
      EXPECT_EQ(a.pieces[p].begin, b.pieces[p].begin);
      EXPECT_EQ(a.pieces[p].count, b.pieces[p].count);
    }
  }
  // Serialising what was parsed gives the same text (keys in fixed order).
  EXPECT_EQ(SerializeManifest(*parsed), text);
}

// moments_dtype: absent for f32 moments (older manifests read as f32),
// "bf16" for bf16 moments; anything else refused naming the key.
TEST(ManifestTest, MomentsDtypeRoundTripsAndIsOptional) {
  Manifest manifest = SampleManifest();
  EXPECT_EQ(SerializeManifest(manifest).find("moments_dtype"),
            std::string::npos);
  manifest.moments_dtype = DType::kBF16;
  const std::string text = SerializeManifest(manifest);
  absl::StatusOr<Manifest> parsed = ParseManifest(text, "m.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->moments_dtype, DType::kBF16);
  EXPECT_EQ(SerializeManifest(*parsed), text);
  nlohmann::json bad = nlohmann::json::parse(text);
  bad["moments_dtype"] = "f16";
  absl::StatusOr<Manifest> refused = ParseManifest(bad.dump(), "m.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("moments_dtype"), std::string::npos)
      << refused.status();
}

TEST(ManifestTest, ZeroPartitionSplitsLikeZero) {
  const std::vector<ParameterRecord> records =
      testing::PartitionLikeZero(AwkwardModel(), 3);
  // layer.big, elements [35, 275) of the flat buffer, shares of 128.
  ASSERT_EQ(records[1].name, "layer.big");
  ASSERT_EQ(records[1].pieces.size(), 3u);
  EXPECT_EQ(records[1].pieces[0].count, 93);
  EXPECT_EQ(records[1].pieces[1].count, 128);
  EXPECT_EQ(records[1].pieces[2].count, 19);
  EXPECT_TRUE(records[4].pieces.empty());  // layer.empty
}

struct InvalidCase {
  std::string what;
  std::function<void(nlohmann::json&)> mutate;
  absl::StatusCode code;
  std::vector<std::string> message_parts;
};

TEST(ManifestTest, EachValidationErrorNamesWhatIsWrong) {
  using nlohmann::json;
  const std::vector<InvalidCase> cases = {
      {"another format",
       [](json& m) { m["format"] = "torch"; },
       absl::StatusCode::kInvalidArgument,
       {"\"format\" is \"torch\""}},
      {"a newer version",
       [](json& m) { m["format_version"] = 2; },
       absl::StatusCode::kFailedPrecondition,
       {"format_version 2", "newer version"}},
      {"version 0",
       [](json& m) { m["format_version"] = 0; },
       absl::StatusCode::kInvalidArgument,
       {"format_version 0"}},
      {"a missing key",
       [](json& m) { m.erase("world_size"); },
       absl::StatusCode::kInvalidArgument,
       {"world_size"}},
      {"a mistyped key",
       [](json& m) { m["zero_stage"] = "two"; },
       absl::StatusCode::kInvalidArgument,
       {"zero_stage"}},
      {"world size 0",
       [](json& m) { m["world_size"] = 0; },
       absl::StatusCode::kInvalidArgument,
       {"world_size must be >= 1"}},
      {"stage 4",
       [](json& m) { m["zero_stage"] = 4; },
       absl::StatusCode::kInvalidArgument,
       {"zero_stage 4"}},
      {"an unknown dtype",
       [](json& m) { m["model_dtype"] = "f8"; },
       absl::StatusCode::kInvalidArgument,
       {"model_dtype", "f8"}},
      {"an unknown kind",
       [](json& m) { m["kinds"].push_back("velocity"); },
       absl::StatusCode::kInvalidArgument,
       {"kinds", "velocity"}},
      {"a repeated kind",
       [](json& m) { m["kinds"].push_back("master"); },
       absl::StatusCode::kInvalidArgument,
       {"kinds", "master"}},
      {"state that is not an object",
       [](json& m) { m["training_state"] = json::array(); },
       absl::StatusCode::kInvalidArgument,
       {"training_state"}},
      {"a gap between pieces",
       [](json& m) { m["parameters"][1]["pieces"][1][1] = 94; },
       absl::StatusCode::kInvalidArgument,
       {"layer.big", "begin 94", "expected begin 93"}},
      {"overlapping pieces",
       [](json& m) { m["parameters"][1]["pieces"][1][1] = 92; },
       absl::StatusCode::kInvalidArgument,
       {"layer.big", "begin 92"}},
      {"a piece beyond the parameter",
       [](json& m) { m["parameters"][1]["pieces"][2][2] = 20; },
       absl::StatusCode::kInvalidArgument,
       {"layer.big", "cover 241 of its 240"}},
      {"pieces that stop short",
       [](json& m) { m["parameters"][1]["pieces"].erase(2); },
       absl::StatusCode::kInvalidArgument,
       {"layer.big", "cover 221 of its 240"}},
      {"a rank out of range",
       [](json& m) { m["parameters"][2]["pieces"][0][0] = 3; },
       absl::StatusCode::kInvalidArgument,
       {"layer.vector", "rank 3"}},
      {"two pieces on one rank",
       [](json& m) { m["parameters"][1]["pieces"][1][0] = 0; },
       absl::StatusCode::kInvalidArgument,
       {"layer.big", "rank 0"}},
      {"a duplicate name",
       [](json& m) { m["parameters"][3]["name"] = "layer.vector"; },
       absl::StatusCode::kInvalidArgument,
       {"layer.vector", "listed twice"}},
      {"a negative dimension",
       [](json& m) { m["parameters"][4]["shape"][0] = -1; },
       absl::StatusCode::kInvalidArgument,
       {"layer.empty", "negative"}},
      {"a missing file",
       [](json& m) { m["files"].erase(2); },
       absl::StatusCode::kInvalidArgument,
       {"files lists 2 files for world_size 3"}},
      {"files out of rank order",
       [](json& m) { std::swap(m["files"][0], m["files"][1]); },
       absl::StatusCode::kInvalidArgument,
       {"files[0]", "rank_00001.safetensors", "expected rank_00000"}},
      {"a malformed checksum",
       [](json& m) { m["files"][1]["crc32c"] = "12345678"; },
       absl::StatusCode::kInvalidArgument,
       {"rank_00001.safetensors", "crc32c \"12345678\" is malformed"}},
  };
  const json valid = json::parse(SerializeManifest(SampleManifest()));
  ASSERT_TRUE(ParseManifest(valid.dump(), "m.json").ok());
  for (const InvalidCase& test : cases) {
    json mutated = valid;
    test.mutate(mutated);
    absl::StatusOr<Manifest> parsed =
        ParseManifest(mutated.dump(), "/ckpt/t/manifest.json");
    ASSERT_FALSE(parsed.ok()) << test.what << " was accepted";
    EXPECT_EQ(parsed.status().code(), test.code)
        << test.what << ": " << parsed.status();
    EXPECT_THAT(std::string(parsed.status().message()),
                HasSubstr("/ckpt/t/manifest.json"))
        << test.what;
    for (const std::string& part : test.message_parts) {
      EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(part))
          << test.what;
    }
  }
}

TEST(ManifestTest, BadJsonNamesTheFile) {
  absl::StatusOr<Manifest> parsed = ParseManifest("{\"format\": ", "x.json");
  ASSERT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(parsed.status().message()),
              AllOf(HasSubstr("x.json"), HasSubstr("not valid JSON")));
  EXPECT_EQ(ParseManifest("[1, 2]", "x.json").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ManifestTest, CheckMatchesModelListsEveryMismatch) {
  const Manifest manifest = SampleManifest();
  EXPECT_TRUE(CheckMatchesModel(manifest, AwkwardModel()).ok());
  NamesAndShapes other = AwkwardModel();
  other[0].second = {5, 7};      // embed.table transposed
  other[2].first = "layer.vec";  // renamed: one missing, one unexpected
  absl::Status status = CheckMatchesModel(manifest, other);
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      std::string(status.message()),
      AllOf(HasSubstr("global_step7"),
            HasSubstr("embed.table has shape [7, 5] in the checkpoint but "
                      "[5, 7] in the model"),
            HasSubstr("layer.vec is not in the checkpoint"),
            HasSubstr("layer.vector is in the checkpoint but not the model")));
}

TEST(ManifestTest, ValidateTag) {
  EXPECT_TRUE(ValidateTag("global_step10").ok());
  EXPECT_TRUE(ValidateTag("run-2.best").ok());
  for (const std::string bad : {"", ".hidden", "a/b", "a b", "..", "x\n"}) {
    EXPECT_EQ(ValidateTag(bad).code(), absl::StatusCode::kInvalidArgument)
        << "\"" << bad << "\"";
  }
}

TEST_F(CheckpointFormatTest, SaveProtocolLeavesOnlyTheCompleteTag) {
  absl::StatusOr<Manifest> written =
      WriteTestCheckpoint(directory_, AwkwardModel());
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(Entries(directory_),
            (std::set<std::string>{"latest", "global_step1"}));
  EXPECT_EQ(Entries(directory_ + "/global_step1"),
            (std::set<std::string>{"manifest.json", "rank_00000.safetensors",
                                   "rank_00001.safetensors",
                                   "rank_00002.safetensors"}));
  EXPECT_EQ(ReadAll(directory_ + "/latest"), "global_step1\n");
  absl::StatusOr<std::string> latest = ReadLatestTag(directory_);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, "global_step1");
  // Each file's record: its size and the CRC-32C of all its bytes.
  for (const FileRecord& file : written->files) {
    const std::string bytes = ReadAll(RankPath("global_step1", file.rank));
    EXPECT_EQ(file.bytes, bytes.size());
    EXPECT_EQ(file.crc32c, Crc32c(bytes.data(), bytes.size()));
  }
}

TEST_F(CheckpointFormatTest, ReadsBackEveryKindAtEveryWorldSize) {
  for (int world_size : {1, 2, 3, 5}) {
    SCOPED_TRACE(absl::StrCat("world size ", world_size));
    TestCheckpointOptions options;
    options.world_size = world_size;
    options.tag = absl::StrCat("ws", world_size);
    ASSERT_TRUE(WriteTestCheckpoint(directory_, AwkwardModel(), options).ok());
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
        CheckpointReader::Open(directory_);
    ASSERT_TRUE(reader.ok()) << reader.status();
    EXPECT_EQ((*reader)->manifest().tag, options.tag);
    EXPECT_EQ((*reader)->manifest().world_size, world_size);
    EXPECT_TRUE((*reader)->VerifyFiles().ok());
    ExpectAllValues(**reader, 0);
  }
}

TEST_F(CheckpointFormatTest, ReadRangeAcrossPiecesInEveryDType) {
  const std::unique_ptr<CheckpointReader> opened = WriteAndOpenAwkward();
  ASSERT_NE(opened, nullptr);
  const CheckpointReader& reader = *opened;
  // layer.big (index 1) has pieces [0, 93) [93, 221) [221, 240); every
  // range with ends on a grid of 3 crosses zero, one or two boundaries.
  const int64_t numel = 240;
  int conversions_that_round = 0;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t begin = 0; begin < numel; begin += 3) {
      for (int64_t end = begin + 1; end <= numel; end += 3) {
        absl::StatusOr<Tensor> got =
            Tensor::Empty({end - begin}, dtype, Device::Cpu());
        ASSERT_TRUE(got.ok());
        const int64_t before = reader.bytes_read();
        absl::Status status =
            reader.ReadRange(kMaster, "layer.big", begin, *got);
        ASSERT_TRUE(status.ok()) << status;
        // Only the needed bytes, in the stored dtype (f32 for master).
        ASSERT_EQ(reader.bytes_read() - before, (end - begin) * 4);
        for (int64_t i = begin; i < end; ++i) {
          const float source = StoredTestValue(kMaster, 1, i, DType::kF32);
          uint32_t rounded = 0;
          StoreFromFloat(&rounded, dtype, 0, source);
          const float expected = LoadAsFloat(&rounded, dtype, 0);
          ASSERT_EQ(LoadAsFloat(got->data(), dtype, i - begin), expected)
              << DTypeName(dtype) << " [" << begin << ", " << end << ") at "
              << i;
          if (expected != source) {
            ++conversions_that_round;
          }
        }
      }
    }
  }
  // The values have more bits than bf16 and f16 keep: the test sees rounding.
  EXPECT_GT(conversions_that_round, 1000);
}

TEST_F(CheckpointFormatTest, WeightsReadInTheirStoredDType) {
  const std::unique_ptr<CheckpointReader> reader = WriteAndOpenAwkward();
  ASSERT_NE(reader, nullptr);
  // "weights" is stored in bf16: a read costs 2 bytes an element whatever
  // the destination, and gives the bf16 value exactly.
  absl::StatusOr<Tensor> got = Tensor::Empty({50}, DType::kF32, Device::Cpu());
  ASSERT_TRUE(got.ok());
  ASSERT_TRUE(reader->ReadRange(kWeights, "layer.big", 80, *got).ok());
  EXPECT_EQ(reader->bytes_read(), 50 * 2);
  for (int64_t i = 0; i < 50; ++i) {
    EXPECT_EQ(got->data_as<float>()[i],
              StoredTestValue(kWeights, 1, 80 + i, DType::kBF16));
  }
  absl::StatusOr<Tensor> bf16 =
      Tensor::Empty({6, 9}, DType::kBF16, Device::Cpu());
  ASSERT_TRUE(bf16.ok());
  ASSERT_TRUE(reader->ReadRange(kWeights, "layer.matrix", 0, *bf16).ok());
  absl::StatusOr<Tensor> expected = testing::ExpectedParameter(
      kWeights, 5, {6, 9}, DType::kBF16, DType::kBF16);
  ASSERT_TRUE(expected.ok());
  EXPECT_EQ(std::memcmp(bf16->data(), expected->data(), bf16->nbytes()), 0);
}

TEST_F(CheckpointFormatTest, ReadRangeErrorsNameWhatIsMissing) {
  const std::unique_ptr<CheckpointReader> reader = WriteAndOpenAwkward();
  ASSERT_NE(reader, nullptr);
  absl::StatusOr<Tensor> ten = Tensor::Empty({10}, DType::kF32, Device::Cpu());
  ASSERT_TRUE(ten.ok());
  absl::Status status = reader->ReadRange(kMaster, "layer.nothing", 0, *ten);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(status.message()), HasSubstr("layer.nothing"));
  status = reader->ReadRange(kMomentumBuffer, "layer.big", 0, *ten);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(status.message()), HasSubstr("momentum_buffer"));
  status = reader->ReadRange(kMaster, "layer.vector", 44, *ten);
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr("layer.vector"), HasSubstr("[44, 54)")));
  // No elements: nothing read, nothing to fail.
  absl::StatusOr<Tensor> none =
      Tensor::Empty({0, 4}, DType::kF32, Device::Cpu());
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(reader->ReadRange(kMaster, "layer.empty", 0, *none).ok());
  EXPECT_EQ(reader->bytes_read(), 0);
}

TEST_F(CheckpointFormatTest, TruncatedRankFileIsDataLossAtOpen) {
  ASSERT_TRUE(WriteTestCheckpoint(directory_, AwkwardModel()).ok());
  const std::string path = RankPath("global_step1", 1);
  fs::resize_file(path, fs::file_size(path) - 10);
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(directory_);
  ASSERT_EQ(reader.status().code(), absl::StatusCode::kDataLoss)
      << reader.status();
  EXPECT_THAT(
      std::string(reader.status().message()),
      AllOf(HasSubstr("rank_00001.safetensors"), HasSubstr("truncated")));
}

TEST_F(CheckpointFormatTest, FlippedByteIsDataLossInVerifyWithBothChecksums) {
  absl::StatusOr<Manifest> written =
      WriteTestCheckpoint(directory_, AwkwardModel());
  ASSERT_TRUE(written.ok());
  const std::string path = RankPath("global_step1", 2);
  std::string bytes = ReadAll(path);
  bytes[bytes.size() - 7] ^= 0x10;  // in the data, not the header
  WriteAll(path, bytes);
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(directory_);
  ASSERT_TRUE(reader.ok()) << "sizes and headers are intact: "
                           << reader.status();
  absl::Status status = (*reader)->VerifyFiles();
  ASSERT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(
      std::string(status.message()),
      AllOf(HasSubstr("rank_00002.safetensors"),
            HasSubstr(Crc32cToString(written->files[2].crc32c)),
            HasSubstr(Crc32cToString(Crc32c(bytes.data(), bytes.size())))));
  // stride/offset: a rank of a loading job checks only its share.
  EXPECT_TRUE((*reader)->VerifyFiles(3, 0).ok());
  EXPECT_TRUE((*reader)->VerifyFiles(3, 1).ok());
  EXPECT_FALSE((*reader)->VerifyFiles(3, 2).ok());
  EXPECT_TRUE((*reader)->VerifyFiles(2, 1).ok());   // rank 1
  EXPECT_FALSE((*reader)->VerifyFiles(2, 0).ok());  // ranks 0 and 2
}

TEST_F(CheckpointFormatTest, MissingRankFileIsNotFoundNamingIt) {
  ASSERT_TRUE(WriteTestCheckpoint(directory_, AwkwardModel()).ok());
  fs::remove(RankPath("global_step1", 0));
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(directory_);
  ASSERT_EQ(reader.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(reader.status().message()),
              AllOf(HasSubstr("rank_00000.safetensors"),
                    HasSubstr("global_step1"), HasSubstr("missing")));
}

TEST_F(CheckpointFormatTest, MissingTagLatestAndDirectoryAreNotFound) {
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(directory_);
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(reader.status().message()), HasSubstr(directory_));
  fs::create_directories(directory_);
  reader = CheckpointReader::Open(directory_);
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(reader.status().message()), HasSubstr("latest"));
  ASSERT_TRUE(WriteTestCheckpoint(directory_, AwkwardModel()).ok());
  reader = CheckpointReader::Open(directory_, "global_step99");
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(reader.status().message()),
              HasSubstr("global_step99"));
  WriteAll(directory_ + "/latest", "../elsewhere\n");
  reader = CheckpointReader::Open(directory_);
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(reader.status().message()), HasSubstr("latest"));
}

TEST_F(CheckpointFormatTest, ManifestProblemsAreRefusedAtOpen) {
  ASSERT_TRUE(WriteTestCheckpoint(directory_, AwkwardModel()).ok());
  const std::string path = directory_ + "/global_step1/manifest.json";
  const std::string original = ReadAll(path);
  nlohmann::json manifest = nlohmann::json::parse(original);

  manifest["format_version"] = kFormatVersion + 1;
  WriteAll(path, manifest.dump());
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(directory_);
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(reader.status().message()),
              AllOf(HasSubstr(path), HasSubstr("newer version")));

  // The files hold four kinds; a manifest that lists three disagrees with
  // every file's header.
  manifest = nlohmann::json::parse(original);
  manifest["kinds"] = {"master", "exp_avg", "weights"};
  WriteAll(path, manifest.dump());
  reader = CheckpointReader::Open(directory_);
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(reader.status().message()),
              HasSubstr("rank_00000.safetensors"));

  // Pieces moved between ranks: the headers declare other counts.
  manifest = nlohmann::json::parse(original);
  manifest["parameters"][1]["pieces"][0][2] = 92;
  manifest["parameters"][1]["pieces"][1][1] = 92;
  manifest["parameters"][1]["pieces"][1][2] = 129;
  WriteAll(path, manifest.dump());
  reader = CheckpointReader::Open(directory_);
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(reader.status().message()), HasSubstr("layer.big"));

  fs::remove(path);
  reader = CheckpointReader::Open(directory_);
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(reader.status().message()),
              AllOf(HasSubstr("manifest.json"), HasSubstr("did not complete")));
}

TEST_F(CheckpointFormatTest, ManifestFromAnotherModelIsRefusedByTheCheck) {
  const std::unique_ptr<CheckpointReader> reader = WriteAndOpenAwkward();
  ASSERT_NE(reader, nullptr);
  NamesAndShapes model = AwkwardModel();
  model[1].second = {15, 16};
  model.push_back({"layer.extra", {3}});
  absl::Status status = CheckMatchesModel(reader->manifest(), model);
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr("layer.big has shape [16, 15]"),
                    HasSubstr("layer.extra is not in the checkpoint")));
}

TEST_F(CheckpointFormatTest, SaveThatDiesLeavesLatestAndPreviousTagIntact) {
  ASSERT_TRUE(WriteTestCheckpoint(directory_, AwkwardModel()).ok());
  // The next save dies after two of its three rank files.
  TestCheckpointOptions dying = DyingSave();
  ASSERT_TRUE(WriteTestCheckpoint(directory_, AwkwardModel(), dying).ok());
  EXPECT_TRUE(fs::exists(PartialDirectory(directory_, "global_step2")));
  EXPECT_EQ(*ReadLatestTag(directory_), "global_step1");
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(directory_);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->manifest().tag, "global_step1");
  EXPECT_TRUE((*reader)->VerifyFiles().ok());
  ExpectAllValues(**reader, 0);
  EXPECT_EQ(CheckpointReader::Open(directory_, "global_step2").status().code(),
            absl::StatusCode::kNotFound);

  // One that wrote every file but died before CommitSave: the same.
  dying.ranks_to_write = -1;
  ASSERT_TRUE(WriteTestCheckpoint(directory_, AwkwardModel(), dying).ok());
  EXPECT_EQ(*ReadLatestTag(directory_), "global_step1");
  EXPECT_EQ(CheckpointReader::Open(directory_, "global_step2").status().code(),
            absl::StatusCode::kNotFound);

  // The next save of that tag starts clean and completes.
  TestCheckpointOptions retry = dying;
  retry.commit = true;
  ASSERT_TRUE(WriteTestCheckpoint(directory_, AwkwardModel(), retry).ok());
  EXPECT_EQ(Entries(directory_),
            (std::set<std::string>{"latest", "global_step1", "global_step2"}));
  reader = CheckpointReader::Open(directory_);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->manifest().tag, "global_step2");
  ExpectAllValues(**reader, 1);
  reader = CheckpointReader::Open(directory_, "global_step1");
  ASSERT_TRUE(reader.ok());
  ExpectAllValues(**reader, 0);
}

// What failed saves leave (.<tag>.partial/ of any tag) is listed with its
// size, and the next save, of whatever tag, removes it.
TEST_F(CheckpointFormatTest, TheNextSaveRemovesEveryPartialSave) {
  ASSERT_TRUE(WriteTestCheckpoint(directory_, AwkwardModel()).ok());
  TestCheckpointOptions dying = DyingSave();
  ASSERT_TRUE(WriteTestCheckpoint(directory_, AwkwardModel(), dying).ok());
  const std::string partial = PartialDirectory(directory_, "global_step2");
  uint64_t bytes = 0;
  for (const auto& file : fs::recursive_directory_iterator(partial)) {
    if (file.is_regular_file()) bytes += file.file_size();
  }
  ASSERT_GT(bytes, 0u);
  absl::StatusOr<std::vector<PartialSave>> listed =
      ListPartialSaves(directory_);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].path, partial);
  EXPECT_EQ((*listed)[0].tag, "global_step2");
  EXPECT_EQ((*listed)[0].bytes, bytes);

  TestCheckpointOptions next;
  next.tag = "global_step3";
  ASSERT_TRUE(WriteTestCheckpoint(directory_, AwkwardModel(), next).ok());
  EXPECT_EQ(Entries(directory_),
            (std::set<std::string>{"latest", "global_step1", "global_step3"}));
  listed = ListPartialSaves(directory_);
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());

  EXPECT_EQ(ListPartialSaves(directory_ + "/none").status().code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<std::vector<PartialSave>> removed =
      RemovePartialSaves(directory_ + "/none");
  ASSERT_TRUE(removed.ok());
  EXPECT_TRUE(removed->empty());
}

TEST_F(CheckpointFormatTest, ResavingATagReplacesIt) {
  ASSERT_TRUE(WriteTestCheckpoint(directory_, AwkwardModel()).ok());
  TestCheckpointOptions again;
  again.generation = 1;
  again.world_size = 2;  // another layout under the same tag
  ASSERT_TRUE(WriteTestCheckpoint(directory_, AwkwardModel(), again).ok());
  EXPECT_EQ(Entries(directory_),
            (std::set<std::string>{"latest", "global_step1"}));
  EXPECT_FALSE(fs::exists(RankPath("global_step1", 2)));
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(directory_);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->manifest().world_size, 2);
  EXPECT_TRUE((*reader)->VerifyFiles().ok());
  ExpectAllValues(**reader, 1);
}

TEST_F(CheckpointFormatTest, CrashBetweenTheRenamesReadsTheOldTag) {
  ASSERT_TRUE(WriteTestCheckpoint(directory_, AwkwardModel()).ok());
  // CommitSave replacing global_step1 moved it aside and died before
  // renaming the new one in.
  fs::rename(directory_ + "/global_step1", directory_ + "/.global_step1.old");
  absl::StatusOr<std::string> resolved = ResolveTagDirectory(directory_, "");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(*resolved, directory_ + "/.global_step1.old");
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(directory_);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->tag_directory(), directory_ + "/.global_step1.old");
  EXPECT_TRUE((*reader)->VerifyFiles().ok());
  ExpectAllValues(**reader, 0);
  reader.value().reset();

  // The next save of the tag completes and removes the stale .old.
  TestCheckpointOptions again;
  again.generation = 1;
  ASSERT_TRUE(WriteTestCheckpoint(directory_, AwkwardModel(), again).ok());
  EXPECT_EQ(Entries(directory_),
            (std::set<std::string>{"latest", "global_step1"}));
  reader = CheckpointReader::Open(directory_);
  ASSERT_TRUE(reader.ok());
  ExpectAllValues(**reader, 1);
}

TEST_F(CheckpointFormatTest, RankFileWriterEnforcesOrderAndAtomicity) {
  fs::create_directories(directory_);
  absl::StatusOr<std::unique_ptr<RankFileWriter>> writer =
      RankFileWriter::Create(directory_, 4, {kMaster, kWeights},
                             {DType::kF32, DType::kBF16}, {{"a", 3}, {"b", 2}});
  ASSERT_TRUE(writer.ok()) << writer.status();
  absl::StatusOr<Tensor> three = Tensor::Zeros({3}, DType::kF32, Device::Cpu());
  ASSERT_TRUE(three.ok());
  // "master/b" is not next: "master/a" is.
  EXPECT_EQ((*writer)->Append(kMaster, "b", *three).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*writer)->Append(kMaster, "a", *three).ok());
  // Until Finish, the file does not exist under its name.
  EXPECT_FALSE(fs::exists(directory_ + "/rank_00004.safetensors"));
  absl::StatusOr<FileRecord> early = (*writer)->Finish();
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  writer->reset();
  EXPECT_TRUE(Entries(directory_).empty()) << "temporary file left behind";
}

}  // namespace
}  // namespace checkpoint
}  // namespace ze
