#include "nn/pretrained/hf_decoder.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "core/safetensors/reader.h"
#include "core/safetensors/writer.h"
#include "core/status.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "nn/decoder_config.h"

namespace ze {
namespace nn {
namespace {

namespace fs = std::filesystem;

// The fixtures nn/pretrained/testdata/write_hf_decoder_fixtures.py wrote.
const char *const kFixtures[] = {"llama", "mistral", "qwen2", "qwen2_sharded",
                                 "qwen3"};

std::string FixtureDir(const std::string &name) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"),
                      "/zero_engine/nn/pretrained/testdata/", name);
}

std::string ReadText(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void WriteText(const std::string &path, const std::string &text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

nlohmann::json Reference(const std::string &name) {
  return nlohmann::json::parse(
      ReadText(absl::StrCat(FixtureDir(name), "/reference.json")));
}

// A fresh, empty directory under the test's temporary directory.
std::string FreshDir(const std::string &name) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  fs::remove_all(path);
  fs::create_directories(path);
  return path;
}

// A writable copy of fixture `name` (runfiles are read-only links).
std::string CopyFixture(const std::string &name, const std::string &copy) {
  const std::string directory = FreshDir(copy);
  for (const auto &entry : fs::directory_iterator(FixtureDir(name))) {
    WriteText(absl::StrCat(directory, "/", entry.path().filename().string()),
              ReadText(entry.path().string()));
  }
  return directory;
}

using Tensors = std::vector<std::pair<std::string, Tensor>>;

// Every tensor of an unsharded directory's model.safetensors.
Tensors ReadWeights(const std::string &directory) {
  auto reader =
      safetensors::Reader::Open(absl::StrCat(directory, "/model.safetensors"));
  EXPECT_TRUE(reader.ok()) << reader.status();
  Tensors tensors;
  for (const safetensors::TensorInfo &info : (*reader)->tensors()) {
    tensors.emplace_back(info.name, (*reader)->ReadTensor(info.name).value());
  }
  return tensors;
}

void WriteWeights(const std::string &directory, const Tensors &tensors) {
  ASSERT_TRUE(
      safetensors::WriteFile(absl::StrCat(directory, "/model.safetensors"),
                             tensors, {{"format", "pt"}})
          .ok());
}

Tensor Filled(const Shape &shape, DType dtype, float value) {
  Tensor tensor = Tensor::Empty(shape, dtype, Device::Cpu()).value();
  for (int64_t i = 0; i < tensor.numel(); ++i) {
    StoreFromFloat(tensor.data(), dtype, i, value);
  }
  return tensor;
}

// Bitwise equality of two CPU tensors of one dtype and shape.
bool BitEqual(const Tensor &a, const Tensor &b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

std::unique_ptr<HuggingFaceDecoderReader> OpenOrDie(
    const std::string &directory, const DecoderLoadOptions &options = {}) {
  auto reader = HuggingFaceDecoderReader::Open(directory, options);
  EXPECT_TRUE(reader.ok()) << reader.status();
  return reader.ok() ? std::move(reader).value() : nullptr;
}

// --- The name table --------------------------------------------------------

TEST(HfDecoderNamesTest, MapsEveryNameBothWays) {
  const std::pair<const char *, const char *> kPairs[] = {
      {"model.embed_tokens.weight", "embed_tokens.weight"},
      {"model.norm.weight", "norm.weight"},
      {"lm_head.weight", "lm_head.weight"},
      {"model.layers.0.input_layernorm.weight", "layers.0.input_norm.weight"},
      {"model.layers.7.self_attn.q_proj.weight", "layers.7.attn.q_proj.weight"},
      {"model.layers.7.self_attn.q_proj.bias", "layers.7.attn.q_proj.bias"},
      {"model.layers.12.self_attn.k_proj.weight",
       "layers.12.attn.k_proj.weight"},
      {"model.layers.12.self_attn.k_proj.bias", "layers.12.attn.k_proj.bias"},
      {"model.layers.3.self_attn.v_proj.weight", "layers.3.attn.v_proj.weight"},
      {"model.layers.3.self_attn.v_proj.bias", "layers.3.attn.v_proj.bias"},
      {"model.layers.3.self_attn.q_norm.weight", "layers.3.attn.q_norm.weight"},
      {"model.layers.3.self_attn.k_norm.weight", "layers.3.attn.k_norm.weight"},
      {"model.layers.3.self_attn.o_proj.weight", "layers.3.attn.o_proj.weight"},
      {"model.layers.31.post_attention_layernorm.weight",
       "layers.31.post_attn_norm.weight"},
      {"model.layers.31.mlp.gate_proj.weight",
       "layers.31.mlp.gate_proj.weight"},
      {"model.layers.31.mlp.up_proj.weight", "layers.31.mlp.up_proj.weight"},
      {"model.layers.31.mlp.down_proj.weight",
       "layers.31.mlp.down_proj.weight"},
  };
  for (const auto &[hf, ours] : kPairs) {
    EXPECT_EQ(MapHuggingFaceDecoderName(hf), std::string(ours)) << hf;
    EXPECT_EQ(MapToHuggingFaceDecoderName(ours), std::string(hf)) << ours;
  }
}

TEST(HfDecoderNamesTest, EveryParameterOfEveryPresetHasAName) {
  for (const std::string &preset : DecoderConfig::PresetNames()) {
    const DecoderConfig config = DecoderConfig::Preset(preset).value();
    for (const auto &[name, shape] : config.ParameterShapes()) {
      const std::optional<std::string> hf = MapToHuggingFaceDecoderName(name);
      ASSERT_TRUE(hf.has_value()) << preset << ": " << name;
      EXPECT_EQ(MapHuggingFaceDecoderName(*hf), name);
    }
  }
}

TEST(HfDecoderNamesTest, RefusesNamesOutsideTheTable) {
  for (const char *name :
       {"model.layers.01.mlp.up_proj.weight", "model.layers.-1.mlp.up_proj",
        "model.layers.3.self_attn.o_proj.bias", "model.layers.3.mlp.fc.weight",
        "layers.3.attn.q_proj.weight", "transformer.wte.weight",
        "model.embed_tokens", "embed_tokens.weight", ""}) {
    EXPECT_FALSE(MapHuggingFaceDecoderName(name).has_value()) << name;
  }
  EXPECT_FALSE(MapToHuggingFaceDecoderName("model.norm.weight").has_value());
  EXPECT_FALSE(MapToHuggingFaceDecoderName("layers.x.norm.weight").has_value());
  EXPECT_TRUE(IsIgnoredHuggingFaceDecoderName(
      "model.layers.4.self_attn.rotary_emb.inv_freq"));
  EXPECT_FALSE(IsIgnoredHuggingFaceDecoderName("lm_head.weight"));
}

// --- The fixtures -----------------------------------------------------------

TEST(HfDecoderReaderTest, LoadsEveryFixtureMatchingItsDigests) {
  for (const char *name : kFixtures) {
    SCOPED_TRACE(name);
    const nlohmann::json reference = Reference(name);
    auto reader = OpenOrDie(FixtureDir(name));
    ASSERT_NE(reader, nullptr);
    const DecoderConfig &config = reader->config();
    EXPECT_EQ(absl::StrCat(DecoderFamilyName(config.family)),
              absl::StrContains(name, "qwen2") ? "qwen2" : name);
    EXPECT_EQ(config.NumParameters(),
              reference["num_parameters"].get<int64_t>());
    // One source per parameter, in the model's order, each a digest.
    const auto shapes = config.ParameterShapes();
    ASSERT_EQ(reader->parameters().size(), shapes.size());
    EXPECT_EQ(reference["digests"].size(), shapes.size());
    for (size_t i = 0; i < shapes.size(); ++i) {
      const HuggingFaceDecoderReader::Source &source = reader->parameters()[i];
      EXPECT_EQ(source.our_name, shapes[i].first);
      EXPECT_EQ(source.shape, shapes[i].second);
      ASSERT_TRUE(reference["digests"].contains(source.key)) << source.key;
      const nlohmann::json &digest = reference["digests"][source.key];
      EXPECT_EQ(source.shape, digest["shape"].get<Shape>()) << source.key;
      EXPECT_EQ(safetensors::ElementTypeName(source.dtype),
                digest["dtype"].get<std::string>());
      EXPECT_EQ(fs::path(source.file).filename().string(),
                digest["file"].get<std::string>());
      auto value = reader->Read(source.our_name, DType::kF32);
      ASSERT_TRUE(value.ok()) << value.status();
      double sum = 0;
      for (int64_t e = 0; e < value->numel(); ++e)
        sum += value->data_as<float>()[e];
      const double want = digest["sum"].get<double>();
      EXPECT_NEAR(sum, want, 1e-9 * std::max(1.0, std::abs(want)))
          << source.key;
      const std::vector<double> first = digest["first"];
      for (size_t e = 0; e < first.size(); ++e) {
        EXPECT_EQ(value->data_as<float>()[e], static_cast<float>(first[e]))
            << source.key << "[" << e << "]";
      }
    }
    EXPECT_EQ(reader->Find("lm_head.weight") != nullptr,
              !config.tie_word_embeddings);
  }
}

TEST(HfDecoderReaderTest, FixturesHaveTheirFamiliesFeatures) {
  auto llama = OpenOrDie(FixtureDir("llama"));
  ASSERT_NE(llama, nullptr);
  EXPECT_EQ(llama->config().rope_scaling.type, "llama3");
  EXPECT_EQ(llama->config().rope_scaling.original_max_position_embeddings, 64);
  EXPECT_TRUE(llama->config().tie_word_embeddings);
  EXPECT_EQ(llama->Find("layers.0.attn.q_proj.bias"), nullptr);
  auto mistral = OpenOrDie(FixtureDir("mistral"));
  ASSERT_NE(mistral, nullptr);
  EXPECT_EQ(mistral->config().sliding_window, 4096);
  ASSERT_NE(mistral->Find("lm_head.weight"), nullptr);
  EXPECT_EQ(mistral->Find("lm_head.weight")->dtype,
            safetensors::ElementType::kF16);
  auto qwen2 = OpenOrDie(FixtureDir("qwen2"));
  ASSERT_NE(qwen2, nullptr);
  ASSERT_NE(qwen2->Find("layers.1.attn.v_proj.bias"), nullptr);
  EXPECT_EQ(qwen2->Find("layers.1.attn.v_proj.bias")->shape, Shape{32});
  auto sharded = OpenOrDie(FixtureDir("qwen2_sharded"));
  ASSERT_NE(sharded, nullptr);
  std::set<std::string> files;
  for (const auto &source : sharded->parameters()) files.insert(source.file);
  EXPECT_EQ(files.size(), 3u);
  auto qwen3 = OpenOrDie(FixtureDir("qwen3"));
  ASSERT_NE(qwen3, nullptr);
  EXPECT_EQ(qwen3->config().head_dim, 32);
  EXPECT_EQ(qwen3->Find("layers.0.attn.q_proj.weight")->shape,
            (Shape{4 * 32, 64}));
  ASSERT_NE(qwen3->Find("layers.1.attn.k_norm.weight"), nullptr);
}

TEST(HfDecoderReaderTest, ReadsRangesAndConvertsDtypes) {
  auto reader = OpenOrDie(FixtureDir("qwen3"));  // a bf16 file
  ASSERT_NE(reader, nullptr);
  const std::string name = "layers.1.mlp.down_proj.weight";
  const Tensor whole = reader->Read(name, DType::kF32).value();
  const Tensor as_bf16 = reader->Read(name, DType::kBF16).value();
  for (int64_t i = 0; i < whole.numel(); ++i) {
    // bf16 -> f32 is exact, and back.
    ASSERT_EQ(LoadAsFloat(as_bf16.data(), DType::kBF16, i),
              whole.data_as<float>()[i]);
  }
  // A rank's slice: 53 elements from an odd offset.
  Tensor slice = Tensor::Empty({53}, DType::kF32, Device::Cpu()).value();
  ASSERT_TRUE(reader->ReadRange(name, 1001, slice).ok());
  for (int64_t i = 0; i < 53; ++i) {
    EXPECT_EQ(slice.data_as<float>()[i], whole.data_as<float>()[1001 + i]);
  }
  Tensor tail = Tensor::Empty({2}, DType::kF32, Device::Cpu()).value();
  auto out = reader->ReadRange(name, whole.numel() - 1, tail);
  EXPECT_EQ(out.code(), absl::StatusCode::kOutOfRange) << out;
  EXPECT_TRUE(absl::StrContains(out.message(), "model.safetensors")) << out;
  auto unknown = reader->Read("layers.2.mlp.up_proj.weight", DType::kF32);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  Tensor ints = Tensor::Empty({2}, DType::kI32, Device::Cpu()).value();
  EXPECT_EQ(reader->ReadRange(name, 0, ints).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(HfDecoderReaderTest, VisitsEveryParameterOnceInOrder) {
  std::vector<std::string> seen;
  auto config =
      LoadHuggingFaceDecoder(FixtureDir("qwen2_sharded"),
                             [&](const std::string &name, const Tensor &value) {
                               EXPECT_EQ(value.dtype(), DType::kBF16);
                               seen.push_back(name);
                               return absl::OkStatus();
                             },
                             {DType::kBF16, std::nullopt});
  ASSERT_TRUE(config.ok()) << config.status();
  std::vector<std::string> want;
  for (const auto &[name, shape] : config->ParameterShapes()) {
    want.push_back(name);
  }
  EXPECT_EQ(seen, want);
  // A visitor's error stops the load, named.
  auto stopped = LoadHuggingFaceDecoder(
      FixtureDir("qwen2_sharded"),
      [&](const std::string &name, const Tensor &) {
        return name == "norm.weight" ? absl::DataLossError("no room")
                                     : absl::OkStatus();
      });
  EXPECT_EQ(stopped.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(
      absl::StrContains(stopped.status().message(), "\"model.norm.weight\""))
      << stopped.status();
}

TEST(HfDecoderReaderTest, ExpectedConfigMustMatch) {
  const DecoderConfig file =
      ReadHuggingFaceDecoderConfig(FixtureDir("qwen3")).value();
  EXPECT_NE(OpenOrDie(FixtureDir("qwen3"), {DType::kF32, file}), nullptr);
  DecoderConfig other = file;
  other.num_layers = 3;
  auto mismatch =
      HuggingFaceDecoderReader::Open(FixtureDir("qwen3"), {DType::kF32, other});
  ASSERT_FALSE(mismatch.ok());
  EXPECT_TRUE(absl::StrContains(mismatch.status().message(), "3 layers"))
      << mismatch.status();
  EXPECT_TRUE(absl::StrContains(mismatch.status().message(), "config.json"));
}

// --- Export -----------------------------------------------------------------

// Exports what `reader` holds to `directory` and checks it reads back
// bit-exact (as f32, which every file dtype converts to exactly).
void ExportAndCompare(const HuggingFaceDecoderReader &reader,
                      const std::string &directory,
                      const DecoderExportOptions &options) {
  ASSERT_TRUE(ExportHuggingFaceDecoder(
                  directory, reader.config(),
                  [&](const std::string &name) {
                    return reader.Read(name, DType::kF32);
                  },
                  options)
                  .ok());
  auto back = OpenOrDie(directory);
  ASSERT_NE(back, nullptr);
  EXPECT_EQ(back->config(), reader.config());
  ASSERT_EQ(back->parameters().size(), reader.parameters().size());
  for (const auto &source : reader.parameters()) {
    EXPECT_EQ(back->Find(source.our_name)->key, source.key);
    EXPECT_EQ(back->Find(source.our_name)->dtype,
              safetensors::ElementTypeOf(options.dtype));
    const Tensor a = reader.Read(source.our_name, DType::kF32).value();
    const Tensor b = back->Read(source.our_name, DType::kF32).value();
    EXPECT_TRUE(BitEqual(a, b)) << source.our_name;
  }
}

TEST(HfDecoderWriterTest, RoundTripsEveryFixtureBitExact) {
  for (const char *name : kFixtures) {
    SCOPED_TRACE(name);
    auto reader = OpenOrDie(FixtureDir(name));
    ASSERT_NE(reader, nullptr);
    ExportAndCompare(*reader, FreshDir(absl::StrCat(name, "_f32")), {});
    // In the fixture's own dtype: the values are representable, so exact.
    const DType file_dtype =
        safetensors::DTypeOf(reader->parameters()[0].dtype).value();
    DecoderExportOptions options;
    options.dtype = file_dtype;
    ExportAndCompare(*reader, FreshDir(absl::StrCat(name, "_own")), options);
  }
}

TEST(HfDecoderWriterTest, ShardsBySizeWithAnIndex) {
  auto reader = OpenOrDie(FixtureDir("qwen3"));
  ASSERT_NE(reader, nullptr);
  const std::string directory = FreshDir("sharded");
  DecoderExportOptions options;
  options.dtype = DType::kBF16;
  options.max_shard_bytes = 40000;
  ExportAndCompare(*reader, directory, options);
  EXPECT_FALSE(fs::exists(directory + "/model.safetensors"));
  const nlohmann::json index = nlohmann::json::parse(
      ReadText(directory + "/model.safetensors.index.json"));
  EXPECT_EQ(index["weight_map"].size(), reader->parameters().size());
  uint64_t total = 0;
  std::set<std::string> shards;
  for (const auto &[key, file] : index["weight_map"].items()) {
    shards.insert(file.get<std::string>());
  }
  ASSERT_GT(shards.size(), 3u);
  for (const std::string &file : shards) {
    auto shard = safetensors::Reader::Open(directory + "/" + file).value();
    uint64_t bytes = 0;
    for (const auto &info : shard->tensors()) bytes += info.num_bytes();
    // Over the limit only when one tensor alone is (the embedding: 34,816).
    EXPECT_TRUE(bytes <= 40000 || shard->tensors().size() == 1) << file;
    EXPECT_EQ(shard->metadata().at("format"), "pt");
    total += bytes;
    EXPECT_TRUE(
        absl::StrContains(file, absl::StrCat("-of-0000", shards.size())))
        << file;
  }
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);

  // Exporting unsharded over it removes the shards and the index, which
  // from_pretrained would otherwise read; and back.
  ExportAndCompare(*reader, directory, {});
  std::vector<std::string> left;
  for (const auto &entry : fs::directory_iterator(directory)) {
    left.push_back(entry.path().filename().string());
  }
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left,
            (std::vector<std::string>{"config.json", "model.safetensors"}));
  ExportAndCompare(*reader, directory, options);
  EXPECT_FALSE(fs::exists(directory + "/model.safetensors"));
}

TEST(HfDecoderWriterTest, TakesChunksInOrderOnly) {
  const DecoderConfig config = DecoderConfig::Preset("qwen2-tiny").value();
  const std::string directory = FreshDir("chunks");
  DecoderExportOptions options;
  options.max_shard_bytes = 30000;
  auto writer = HuggingFaceDecoderWriter::Create(directory, config, options);
  ASSERT_TRUE(writer.ok()) << writer.status();
  const auto parameters = (*writer)->parameters();
  // Out of order: refused, naming both.
  auto wrong =
      (*writer)->Append(parameters[1].first, Filled({1}, DType::kF32, 0));
  EXPECT_EQ(wrong.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(wrong.message(), parameters[0].first));
  // Each parameter in two chunks, the first of bf16, the second of f32.
  for (size_t i = 0; i < parameters.size(); ++i) {
    const int64_t n = NumElements(parameters[i].second);
    const int64_t half = n / 2;
    ASSERT_TRUE((*writer)
                    ->Append(parameters[i].first,
                             Filled({half}, DType::kBF16, 0.5f + i))
                    .ok());
    if (i == 0) {
      auto early = (*writer)->Finish();
      EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_TRUE(absl::StrContains(early.message(), "incomplete")) << early;
      auto too_many =
          (*writer)->Append(parameters[0].first, Filled({n}, DType::kF32, 0));
      EXPECT_EQ(too_many.code(), absl::StatusCode::kInvalidArgument);
    }
    ASSERT_TRUE((*writer)
                    ->Append(parameters[i].first,
                             Filled({n - half}, DType::kF32, -1.0f * i))
                    .ok());
  }
  ASSERT_TRUE((*writer)->Finish().ok());
  EXPECT_GT((*writer)->files().size(), 1u);
  auto reader = OpenOrDie(directory);
  ASSERT_NE(reader, nullptr);
  for (size_t i = 0; i < parameters.size(); ++i) {
    const Tensor value = reader->Read(parameters[i].first, DType::kF32).value();
    const int64_t half = value.numel() / 2;  // the second chunk starts here
    EXPECT_EQ(value.data_as<float>()[0], 0.5f + i);
    EXPECT_EQ(value.data_as<float>()[value.numel() - 1], -1.0f * i);
    EXPECT_EQ(value.data_as<float>()[half], -1.0f * i);
  }
}

TEST(HfDecoderWriterTest, RefusesWrongSources) {
  const DecoderConfig config = DecoderConfig::Preset("llama-tiny").value();
  auto wrong_shape = ExportHuggingFaceDecoder(
      FreshDir("wrong_shape"), config,
      [](const std::string &name) -> absl::StatusOr<Tensor> {
        return Filled({3}, DType::kF32, 1);
      });
  EXPECT_EQ(wrong_shape.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(wrong_shape.message(), "embed_tokens.weight"))
      << wrong_shape;
  const std::string failing_dir = FreshDir("failing");
  auto failing = ExportHuggingFaceDecoder(
      failing_dir, config,
      [&](const std::string &name) -> absl::StatusOr<Tensor> {
        if (name == "norm.weight") return absl::UnavailableError("gone");
        for (const auto &[n, shape] : config.ParameterShapes()) {
          if (n == name) return Filled(shape, DType::kF32, 1);
        }
        return absl::InternalError(name);
      });
  EXPECT_EQ(failing.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(failing.message(), "norm.weight")) << failing;
  // Neither a config.json nor a weights file of a failed export.
  EXPECT_FALSE(fs::exists(failing_dir + "/config.json"));
  EXPECT_FALSE(fs::exists(failing_dir + "/model.safetensors"));
  DecoderExportOptions ints;
  ints.dtype = DType::kI32;
  EXPECT_EQ(HuggingFaceDecoderWriter::Create(FreshDir("ints"), config, ints)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// --- What the reader refuses -------------------------------------------------

TEST(HfDecoderReaderErrorsTest, MissingShardNamesTheFileAndAKey) {
  const std::string directory = CopyFixture("qwen2_sharded", "missing_shard");
  const std::string shard = directory + "/model-00002-of-00003.safetensors";
  fs::remove(shard);
  auto reader = HuggingFaceDecoderReader::Open(directory);
  ASSERT_FALSE(reader.ok());
  const std::string message(reader.status().message());
  EXPECT_TRUE(absl::StrContains(message, shard)) << message;
  EXPECT_TRUE(absl::StrContains(message, "does not exist")) << message;
  EXPECT_TRUE(absl::StrContains(message, "model.safetensors.index.json"));
  EXPECT_TRUE(absl::StrContains(message, "\"model.layers.")) << message;
}

TEST(HfDecoderReaderErrorsTest, IndexAndShardsMustAgree) {
  const std::string directory = CopyFixture("qwen2_sharded", "bad_index");
  nlohmann::json index = nlohmann::json::parse(
      ReadText(directory + "/model.safetensors.index.json"));
  // One key moved to another shard, one removed from the map.
  index["weight_map"]["model.norm.weight"] =
      index["weight_map"]["model.norm.weight"] ==
              "model-00001-of-00003.safetensors"
          ? "model-00002-of-00003.safetensors"
          : "model-00001-of-00003.safetensors";
  index["weight_map"].erase("lm_head.weight");
  WriteText(directory + "/model.safetensors.index.json", index.dump());
  auto reader = HuggingFaceDecoderReader::Open(directory);
  ASSERT_FALSE(reader.ok());
  const std::string message(reader.status().message());
  EXPECT_TRUE(absl::StrContains(message, "\"model.norm.weight\" is also here"))
      << message;
  EXPECT_TRUE(absl::StrContains(message, "which lacks it")) << message;
  EXPECT_TRUE(absl::StrContains(message, "\"lm_head.weight\" is not listed"))
      << message;
}

TEST(HfDecoderReaderErrorsTest, ReportsEveryProblemOfAFileAtOnce) {
  const std::string directory = CopyFixture("qwen2", "many_problems");
  Tensors tensors;
  for (auto &[name, value] : ReadWeights(directory)) {
    if (name == "model.layers.1.mlp.up_proj.weight") continue;  // missing
    if (name == "model.layers.0.self_attn.k_proj.weight") {
      value = Filled({64, 64}, DType::kBF16, 0);  // wrong shape
    }
    if (name == "model.norm.weight") {
      value = Tensor::Zeros({64}, DType::kI32, Device::Cpu()).value();
    }
    tensors.emplace_back(name, value);
  }
  tensors.emplace_back("model.layers.2.mlp.up_proj.weight",  // beyond 2 layers
                       Filled({128, 64}, DType::kBF16, 0));
  tensors.emplace_back("model.layers.0.self_attn.o_proj.bias",  // no such
                       Filled({64}, DType::kBF16, 0));
  tensors.emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq",
                       Filled({8}, DType::kF32, 0));  // ignored
  WriteWeights(directory, tensors);
  auto reader = HuggingFaceDecoderReader::Open(directory);
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(reader.status().message());
  const std::string file = directory + "/model.safetensors";
  for (const std::string &expected : {
           absl::StrCat("missing \"model.layers.1.mlp.up_proj.weight\" "
                        "(layers.1.mlp.up_proj.weight, [128, 64]) in ",
                        file),
           absl::StrCat(file,
                        ": \"model.layers.0.self_attn.k_proj.weight\" is [64, "
                        "64], expected [32, 64]"),
           absl::StrCat(file, ": \"model.norm.weight\" has dtype I32"),
           absl::StrCat(file,
                        ": unexpected tensor "
                        "\"model.layers.2.mlp.up_proj.weight\" "
                        "(layers.2.mlp.up_proj.weight is not a parameter"),
           absl::StrCat(file,
                        ": unexpected tensor "
                        "\"model.layers.0.self_attn.o_proj.bias\" (no "),
           std::string("(5 problems)"),
       }) {
    EXPECT_TRUE(absl::StrContains(message, expected))
        << "\n"
        << expected << "\nnot in\n"
        << message;
  }
  EXPECT_FALSE(absl::StrContains(message, "inv_freq")) << message;
}

TEST(HfDecoderReaderErrorsTest, BiasesOnlyWhereTheFamilyHasThem) {
  const std::string directory = CopyFixture("llama", "llama_bias");
  Tensors tensors = ReadWeights(directory);
  tensors.emplace_back("model.layers.0.self_attn.q_proj.bias",
                       Filled({64}, DType::kBF16, 0));
  WriteWeights(directory, tensors);
  auto reader = HuggingFaceDecoderReader::Open(directory);
  ASSERT_FALSE(reader.ok());
  EXPECT_TRUE(absl::StrContains(reader.status().message(),
                                "\"model.layers.0.self_attn.q_proj.bias\""))
      << reader.status();
  EXPECT_TRUE(absl::StrContains(reader.status().message(), "llama"));
}

TEST(HfDecoderReaderErrorsTest, TiedHeadInTheFileMustEqualTheEmbedding) {
  const std::string directory = CopyFixture("qwen3", "tied_head");
  Tensors tensors = ReadWeights(directory);
  Tensor embedding;
  for (const auto &[name, value] : tensors) {
    if (name == "model.embed_tokens.weight") embedding = value;
  }
  ASSERT_TRUE(embedding.defined());
  // An equal copy, even in another dtype: accepted and ignored.
  Tensor copy =
      Tensor::Empty(embedding.shape(), DType::kF32, Device::Cpu()).value();
  for (int64_t i = 0; i < copy.numel(); ++i) {
    copy.data_as<float>()[i] = LoadAsFloat(embedding.data(), DType::kBF16, i);
  }
  tensors.emplace_back("lm_head.weight", copy);
  WriteWeights(directory, tensors);
  auto reader = OpenOrDie(directory);
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(reader->Find("lm_head.weight"), nullptr);
  EXPECT_EQ(reader->parameters().size(),
            reader->config().ParameterShapes().size());
  // One element different: refused.
  copy.data_as<float>()[1234] += 1.0f;
  tensors.back().second = copy;
  WriteWeights(directory, tensors);
  auto different = HuggingFaceDecoderReader::Open(directory);
  ASSERT_FALSE(different.ok());
  EXPECT_TRUE(
      absl::StrContains(different.status().message(), "first at element 1234"))
      << different.status();
  EXPECT_TRUE(
      absl::StrContains(different.status().message(), "tie_word_embeddings"));
}

TEST(HfDecoderReaderErrorsTest, UnknownArchitectureNamesConfigJson) {
  const std::string directory = CopyFixture("llama", "gpt_neox");
  nlohmann::json config =
      nlohmann::json::parse(ReadText(directory + "/config.json"));
  config["architectures"] = {"GPTNeoXForCausalLM"};
  config["model_type"] = "gpt_neox";
  WriteText(directory + "/config.json", config.dump());
  auto reader = HuggingFaceDecoderReader::Open(directory);
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      absl::StrContains(reader.status().message(), directory + "/config.json"))
      << reader.status();
  EXPECT_TRUE(absl::StrContains(reader.status().message(), "GPTNeoX"))
      << reader.status();
}

TEST(HfDecoderReaderErrorsTest, MissingFilesAreNamed) {
  const std::string empty = FreshDir("empty");
  auto no_config = HuggingFaceDecoderReader::Open(empty);
  EXPECT_EQ(no_config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(
      absl::StrContains(no_config.status().message(), empty + "/config.json"))
      << no_config.status();
  const std::string directory = CopyFixture("llama", "no_weights");
  fs::remove(directory + "/model.safetensors");
  auto no_weights = HuggingFaceDecoderReader::Open(directory);
  EXPECT_EQ(no_weights.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(no_weights.status().message(),
                                "model.safetensors.index.json"))
      << no_weights.status();
}

}  // namespace
}  // namespace nn
}  // namespace ze
