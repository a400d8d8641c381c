// Consolidation of synthetic sharded checkpoints: the native file equals the
// concatenated pieces (f32 exactly, bf16/f16 rounded to nearest even), the
// host memory it takes is bounded by the largest parameter (measured with
// the host allocator), and the hf-gpt2 file loads back through
// nn::LoadHuggingFaceGpt2 to the same values.
#include "engine/checkpoint/consolidate.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/allocator.h"
#include "core/dtype.h"
#include "core/safetensors/reader.h"
#include "engine/checkpoint/test_checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/pretrained/hf_gpt2.h"

namespace ze {
namespace checkpoint {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Many equal parameters: the model is 12 times its largest parameter.
testing::NamesAndShapes WideModel() {
  testing::NamesAndShapes model;
  for (int i = 0; i < 12; ++i) {
    model.push_back({absl::StrCat("layers.", i, ".weight"), {40, 50}});
  }
  return model;
}

nn::Gpt2Dims TinyGptDims() {
  nn::Gpt2Dims dims;
  dims.num_layers = 2;
  dims.channels = 8;
  dims.vocab_size = 11;
  dims.max_positions = 6;
  return dims;
}

class ConsolidateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ = testing::FreshTestDirectory();
    output_ = directory_ + "/consolidated.safetensors";
  }

  std::unique_ptr<CheckpointReader> WriteAndOpen(
      const testing::NamesAndShapes& model,
      const testing::TestCheckpointOptions& options = {}) {
    absl::StatusOr<Manifest> written =
        testing::WriteTestCheckpoint(directory_, model, options);
    EXPECT_TRUE(written.ok()) << written.status();
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
        CheckpointReader::Open(directory_);
    EXPECT_TRUE(reader.ok()) << reader.status();
    return reader.ok() ? std::move(reader).value() : nullptr;
  }

  // Every tensor of the consolidated file equals the parameter's `kind`
  // values as stored (in `stored`) converted to `dtype`, bit for bit, in
  // the model's order.
  void ExpectNativeFile(const testing::NamesAndShapes& model,
                        const std::string& kind, DType stored, DType dtype) {
    absl::StatusOr<std::unique_ptr<safetensors::Reader>> file =
        safetensors::Reader::Open(output_);
    ASSERT_TRUE(file.ok()) << file.status();
    ASSERT_EQ((*file)->tensors().size(), model.size());
    for (size_t index = 0; index < model.size(); ++index) {
      const auto& [name, shape] = model[index];
      const safetensors::TensorInfo& info = (*file)->tensors()[index];
      EXPECT_EQ(info.name, name);
      EXPECT_EQ(info.shape, shape) << name;
      EXPECT_EQ(info.dtype, safetensors::ElementTypeOf(dtype)) << name;
      absl::StatusOr<Tensor> got = (*file)->ReadTensor(name);
      ASSERT_TRUE(got.ok()) << got.status();
      absl::StatusOr<Tensor> expected = testing::ExpectedParameter(
          kind, static_cast<int>(index), shape, stored, dtype);
      ASSERT_TRUE(expected.ok());
      EXPECT_EQ(std::memcmp(got->data(), expected->data(), got->nbytes()), 0)
          << name << " differs";
    }
  }

  // Options that write the consolidated file to output_.
  ConsolidateOptions ToOutput() const {
    ConsolidateOptions options;
    options.output_path = output_;
    return options;
  }

  std::string directory_;
  std::string output_;
};

TEST_F(ConsolidateTest, NativeF32EqualsTheConcatenatedPieces) {
  std::unique_ptr<CheckpointReader> reader =
      WriteAndOpen(testing::AwkwardModel());
  ASSERT_NE(reader, nullptr);
  ConsolidateOptions options = ToOutput();
  absl::StatusOr<ConsolidateReport> report = Consolidate(*reader, options);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->parameters, 6);
  EXPECT_EQ(report->bytes_written, 383 * 4);
  ExpectNativeFile(testing::AwkwardModel(), kMaster, DType::kF32, DType::kF32);
  absl::StatusOr<std::unique_ptr<safetensors::Reader>> file =
      safetensors::Reader::Open(output_);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->metadata().at("source_tag"), "global_step1");
  EXPECT_EQ((*file)->metadata().at("global_steps"), "1");
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
}

TEST_F(ConsolidateTest, Bf16AndF16RoundToNearestEven) {
  std::unique_ptr<CheckpointReader> reader =
      WriteAndOpen(testing::AwkwardModel());
  ASSERT_NE(reader, nullptr);
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    ConsolidateOptions options = ToOutput();
    options.dtype = dtype;
    absl::StatusOr<ConsolidateReport> report = Consolidate(*reader, options);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->bytes_written, 383 * 2);
    ExpectNativeFile(testing::AwkwardModel(), kMaster, DType::kF32, dtype);
  }
  // Rounding, not truncation: some layer.big master values differ between
  // the two, and the file holds the rounded ones.
  absl::StatusOr<std::unique_ptr<safetensors::Reader>> file =
      safetensors::Reader::Open(output_);
  ASSERT_TRUE(file.ok());
  ConsolidateOptions options = ToOutput();
  options.dtype = DType::kBF16;
  ASSERT_TRUE(Consolidate(*reader, options).ok());
  file = safetensors::Reader::Open(output_);
  ASSERT_TRUE(file.ok());
  absl::StatusOr<Tensor> big = (*file)->ReadTensor("layer.big");
  ASSERT_TRUE(big.ok());
  int rounded_up = 0;
  for (int64_t i = 0; i < 240; ++i) {
    const float source = testing::TestValue(kMaster, 1, i);
    const uint16_t truncated = static_cast<uint16_t>(FloatBits(source) >> 16);
    const uint16_t written = big->data_as<uint16_t>()[i];
    EXPECT_EQ(written, FloatToBf16Bits(source)) << i;
    if (written != truncated) ++rounded_up;
  }
  EXPECT_GT(rounded_up, 50);
}

TEST_F(ConsolidateTest, KindDefaultsToMasterElseWeights) {
  testing::TestCheckpointOptions weights_only;
  weights_only.kinds = {kWeights};
  std::unique_ptr<CheckpointReader> reader =
      WriteAndOpen(testing::AwkwardModel(), weights_only);
  ASSERT_NE(reader, nullptr);
  ConsolidateOptions options = ToOutput();
  ASSERT_TRUE(Consolidate(*reader, options).ok());
  ExpectNativeFile(testing::AwkwardModel(), kWeights, DType::kBF16,
                   DType::kF32);
  options.kind = kExpAvg;
  absl::StatusOr<ConsolidateReport> report = Consolidate(*reader, options);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(report.status().message()), HasSubstr("exp_avg"));
}

TEST_F(ConsolidateTest, AnyKindCanBeTaken) {
  std::unique_ptr<CheckpointReader> reader =
      WriteAndOpen(testing::AwkwardModel());
  ASSERT_NE(reader, nullptr);
  ConsolidateOptions options = ToOutput();
  options.kind = kExpAvgSq;
  ASSERT_TRUE(Consolidate(*reader, options).ok());
  ExpectNativeFile(testing::AwkwardModel(), kExpAvgSq, DType::kF32,
                   DType::kF32);
  options.kind = kWeights;
  options.dtype = DType::kBF16;
  ASSERT_TRUE(Consolidate(*reader, options).ok());
  ExpectNativeFile(testing::AwkwardModel(), kWeights, DType::kBF16,
                   DType::kBF16);
}

// Host memory allocated during `consolidate`, measured by the host
// allocator every tensor comes from.
int64_t MeasuredPeak(const std::function<void()>& consolidate) {
  const int64_t before = HostMemory()->stats().bytes_in_use;
  HostMemory()->ResetPeak();
  consolidate();
  return HostMemory()->stats().peak_bytes_in_use - before;
}

TEST_F(ConsolidateTest, MemoryIsBoundedByTheLargestParameter) {
  std::unique_ptr<CheckpointReader> reader = WriteAndOpen(WideModel());
  ASSERT_NE(reader, nullptr);
  const int64_t model_f32_bytes = 12 * 2000 * 4;
  constexpr int64_t kRounding = 256;  // per buffer, not in the report
  struct Case {
    DType dtype;
    ConsolidateFormat format;
    int64_t expected_bound;  // from the shapes
  };
  // A parameter of 2000 elements in two pieces at most (shares of 8000).
  for (const Case& test :
       {Case{DType::kF32, ConsolidateFormat::kNative, 8000},
        Case{DType::kBF16, ConsolidateFormat::kNative, 4000 + 2000 * 4}}) {
    SCOPED_TRACE(DTypeName(test.dtype));
    ConsolidateOptions options = ToOutput();
    options.dtype = test.dtype;
    absl::StatusOr<ConsolidateReport> report;
    const int64_t measured =
        MeasuredPeak([&] { report = Consolidate(*reader, options); });
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->peak_value_bytes, test.expected_bound);
    EXPECT_LE(measured, report->peak_value_bytes + 2 * kRounding);
    EXPECT_GE(measured, 2000 * static_cast<int64_t>(SizeOf(test.dtype)))
        << "the measurement saw no parameter";
    EXPECT_LT(measured, model_f32_bytes / 4);
  }
}

TEST_F(ConsolidateTest, MemoryLimitBelowTheLargestParameterIsRefused) {
  std::unique_ptr<CheckpointReader> reader =
      WriteAndOpen(testing::AwkwardModel());
  ASSERT_NE(reader, nullptr);
  ConsolidateOptions options = ToOutput();
  options.memory_limit_bytes = 240 * 4 - 1;  // layer.big in f32
  absl::StatusOr<ConsolidateReport> report = Consolidate(*reader, options);
  ASSERT_EQ(report.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(
      std::string(report.status().message()),
      AllOf(HasSubstr("layer.big"), HasSubstr("960 bytes"), HasSubstr("959")));
  EXPECT_FALSE(fs::exists(output_));
  options.memory_limit_bytes = 240 * 4;  // less than the model's 1532
  report = Consolidate(*reader, options);
  ASSERT_TRUE(report.ok()) << report.status();
  ExpectNativeFile(testing::AwkwardModel(), kMaster, DType::kF32, DType::kF32);
}

TEST_F(ConsolidateTest, UnsupportedDTypeIsRefused) {
  ConsolidateOptions options = ToOutput();
  options.dtype = DType::kI32;
  std::unique_ptr<CheckpointReader> reader =
      WriteAndOpen(testing::AwkwardModel());
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(Consolidate(*reader, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(output_));
}

// A flipped byte in a rank file: refused by name before anything is
// written, as a load refuses it; without the check (the engine's own
// consolidation of files it has just written) it would go through.
TEST_F(ConsolidateTest, CorruptRankFileIsRefusedByNameBeforeWriting) {
  std::unique_ptr<CheckpointReader> reader =
      WriteAndOpen(testing::AwkwardModel());
  ASSERT_NE(reader, nullptr);
  const std::string path =
      reader->tag_directory() + "/" + reader->manifest().files[1].name;
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(-5, std::ios::end);
    const char byte = static_cast<char>(file.get() ^ 0x40);
    file.seekp(-5, std::ios::end);
    file.put(byte);
  }
  ConsolidateOptions options = ToOutput();
  absl::StatusOr<ConsolidateReport> report = Consolidate(*reader, options);
  ASSERT_EQ(report.status().code(), absl::StatusCode::kDataLoss)
      << report.status();
  EXPECT_THAT(std::string(report.status().message()),
              AllOf(HasSubstr("rank_00001.safetensors is corrupt"),
                    HasSubstr("nothing was written")));
  EXPECT_FALSE(fs::exists(output_));
  EXPECT_EQ(std::distance(fs::directory_iterator(directory_),
                          fs::directory_iterator()),
            2)  // latest and the tag: no temporary file either
      << directory_;
  options.verify_checksums = false;
  EXPECT_TRUE(Consolidate(*reader, options).ok());
}

TEST_F(ConsolidateTest, HfGpt2LoadsBackToTheSameValues) {
  const nn::Gpt2Dims dims = TinyGptDims();
  const testing::NamesAndShapes model = nn::Gpt2ParameterShapes(dims);
  std::unique_ptr<CheckpointReader> reader = WriteAndOpen(model);
  ASSERT_NE(reader, nullptr);
  std::map<std::string, int> index_of;
  for (size_t i = 0; i < model.size(); ++i) index_of[model[i].first] = i;

  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    ConsolidateOptions options = ToOutput();
    options.format = ConsolidateFormat::kHfGpt2;
    options.dtype = dtype;
    absl::StatusOr<ConsolidateReport> report;
    const int64_t measured =
        MeasuredPeak([&] { report = Consolidate(*reader, options); });
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->parameters, static_cast<int64_t>(model.size()));
    EXPECT_LE(measured, report->peak_value_bytes + 3 * 256);

    absl::StatusOr<nn::Gpt2Dims> inferred =
        nn::InferHuggingFaceGpt2Dims(output_);
    ASSERT_TRUE(inferred.ok()) << inferred.status();
    EXPECT_EQ(inferred->num_layers, dims.num_layers);
    EXPECT_EQ(inferred->vocab_size, dims.vocab_size);
    int visited = 0;
    nn::Gpt2LoadOptions load;
    load.dtype = dtype;
    absl::Status loaded = nn::LoadHuggingFaceGpt2(
        output_,
        [&](const std::string& name, const Tensor& value) -> absl::Status {
          ++visited;
          auto found = index_of.find(name);
          if (found == index_of.end()) {
            return absl::NotFoundError(absl::StrCat("unexpected ", name));
          }
          absl::StatusOr<Tensor> expected = testing::ExpectedParameter(
              kMaster, found->second, model[found->second].second, DType::kF32,
              dtype);
          if (!expected.ok()) return expected.status();
          EXPECT_EQ(value.shape(), expected->shape()) << name;
          EXPECT_EQ(std::memcmp(value.data(), expected->data(), value.nbytes()),
                    0)
              << name << " differs after the round trip";
          return absl::OkStatus();
        },
        load);
    ASSERT_TRUE(loaded.ok()) << loaded;
    EXPECT_EQ(visited, static_cast<int>(model.size()));
    absl::StatusOr<std::unique_ptr<safetensors::Reader>> file =
        safetensors::Reader::Open(output_);
    ASSERT_TRUE(file.ok());
    EXPECT_EQ((*file)->metadata().at("source_tag"), "global_step1");
    EXPECT_NE((*file)->Find("transformer.h.1.attn.c_attn.weight"), nullptr);
  }
}

TEST_F(ConsolidateTest, HfGpt2RefusesACheckpointThatIsNotAGpt) {
  std::unique_ptr<CheckpointReader> reader =
      WriteAndOpen(testing::AwkwardModel());
  ASSERT_NE(reader, nullptr);
  ConsolidateOptions options = ToOutput();
  options.format = ConsolidateFormat::kHfGpt2;
  absl::StatusOr<ConsolidateReport> report = Consolidate(*reader, options);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(report.status().message()),
              AllOf(HasSubstr("not a GPT"), HasSubstr("global_step1")));
  EXPECT_FALSE(fs::exists(output_));
}

}  // namespace
}  // namespace checkpoint
}  // namespace ze
