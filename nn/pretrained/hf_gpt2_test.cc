// Tests of the Hugging Face GPT-2 name map, loader and exporter, on a tiny
// synthetic HF-style checkpoint (2 layers, C = 8) written by our writer in
// HF's layout (Conv1D weights as (in, out)).
#include "nn/pretrained/hf_gpt2.h"

#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/safetensors/reader.h"
#include "core/safetensors/writer.h"
#include "core/status.h"
#include "gtest/gtest.h"

namespace ze {
namespace nn {
namespace {

using safetensors::ElementType;

constexpr Gpt2Dims kDims = {/*num_layers=*/2, /*channels=*/8,
                            /*vocab_size=*/11, /*max_positions=*/5};

std::string TestPath(const std::string &file) {
  return absl::StrCat(
      ::testing::TempDir(), "/",
      ::testing::UnitTest::GetInstance()->current_test_info()->name(), "_",
      file);
}

// Distinct, exactly representable (in f32) values per tensor and element, so
// a wrong mapping or a missing transpose changes some value.
float ValueOf(int tensor_index, int64_t element) {
  return tensor_index * 1000.0f + element * 0.25f;
}

// The HF shape of every tensor of a GPT-2 checkpoint with `dims`, in the
// order HF lists them, including the buffers and head it may carry.
struct HfTensor {
  std::string name;
  Shape shape;
  std::vector<float> values;
};

std::vector<HfTensor> SyntheticHfTensors(const Gpt2Dims &dims) {
  const int64_t c = dims.channels;
  std::vector<std::pair<std::string, Shape>> layout = {
      {"wte.weight", {dims.vocab_size, c}},
      {"wpe.weight", {dims.max_positions, c}}};
  for (int i = 0; i < dims.num_layers; ++i) {
    const std::string h = absl::StrCat("h.", i, ".");
    layout.push_back({h + "ln_1.weight", {c}});
    layout.push_back({h + "ln_1.bias", {c}});
    layout.push_back({h + "attn.c_attn.weight", {c, 3 * c}});  // (in, out)
    layout.push_back({h + "attn.c_attn.bias", {3 * c}});
    layout.push_back({h + "attn.c_proj.weight", {c, c}});
    layout.push_back({h + "attn.c_proj.bias", {c}});
    layout.push_back({h + "ln_2.weight", {c}});
    layout.push_back({h + "ln_2.bias", {c}});
    layout.push_back({h + "mlp.c_fc.weight", {c, 4 * c}});
    layout.push_back({h + "mlp.c_fc.bias", {4 * c}});
    layout.push_back({h + "mlp.c_proj.weight", {4 * c, c}});
    layout.push_back({h + "mlp.c_proj.bias", {c}});
  }
  layout.push_back({"ln_f.weight", {c}});
  layout.push_back({"ln_f.bias", {c}});
  std::vector<HfTensor> tensors;
  for (size_t i = 0; i < layout.size(); ++i) {
    HfTensor tensor{layout[i].first, layout[i].second, {}};
    for (int64_t e = 0; e < NumElements(tensor.shape); ++e) {
      tensor.values.push_back(ValueOf(static_cast<int>(i), e));
    }
    tensors.push_back(std::move(tensor));
  }
  return tensors;
}

Tensor F32Tensor(const Shape &shape, const std::vector<float> &values) {
  Tensor tensor = Tensor::Empty(shape, DType::kF32, Device::Cpu()).value();
  std::memcpy(tensor.data(), values.data(), values.size() * sizeof(float));
  return tensor;
}

// Writes the synthetic checkpoint with `prefix`, plus HF's extra tensors
// when `with_buffers`, minus `skip`, plus `extra`.
void WriteHfFile(const std::string &path, const std::vector<HfTensor> &tensors,
                 const std::string &prefix, bool with_buffers,
                 const std::string &skip = "",
                 const std::vector<HfTensor> &extra = {}) {
  std::vector<std::pair<std::string, Tensor>> entries;
  for (const HfTensor &tensor : tensors) {
    if (tensor.name == skip) continue;
    entries.push_back(
        {prefix + tensor.name, F32Tensor(tensor.shape, tensor.values)});
  }
  if (with_buffers) {
    for (int i = 0; i < kDims.num_layers; ++i) {
      const int64_t p = kDims.max_positions;
      entries.push_back(
          {absl::StrCat(prefix, "h.", i, ".attn.bias"),
           F32Tensor({1, 1, p, p}, std::vector<float>(p * p, 1))});
      entries.push_back({absl::StrCat(prefix, "h.", i, ".attn.masked_bias"),
                         F32Tensor({}, {-1e4f})});
    }
    entries.push_back(
        {"lm_head.weight", F32Tensor(tensors[0].shape, tensors[0].values)});
  }
  for (const HfTensor &tensor : extra) {
    entries.push_back({tensor.name, F32Tensor(tensor.shape, tensor.values)});
  }
  ZE_CHECK_OK(safetensors::WriteFile(path, entries, {{"format", "pt"}}));
}

std::vector<float> Floats(const Tensor &tensor) {
  std::vector<float> values;
  for (int64_t i = 0; i < tensor.numel(); ++i) {
    values.push_back(LoadAsFloat(tensor.data(), tensor.dtype(), i));
  }
  return values;
}

// Loads `path` and returns every visited tensor by our name.
absl::StatusOr<std::map<std::string, Tensor>> LoadAll(
    const std::string &path, const Gpt2LoadOptions &options = {}) {
  std::map<std::string, Tensor> loaded;
  ZE_RETURN_IF_ERROR(LoadHuggingFaceGpt2(
      path,
      [&loaded](const std::string &name, const Tensor &value) {
        if (!loaded.emplace(name, value).second) {
          return absl::InternalError("visited twice: " + name);
        }
        return absl::OkStatus();
      },
      options));
  return loaded;
}

// Checks every loaded tensor against the synthetic HF values: same values,
// transposed exactly where HF uses Conv1D.
void ExpectMatchesHf(const std::map<std::string, Tensor> &loaded,
                     const std::vector<HfTensor> &hf, DType dtype) {
  ASSERT_EQ(loaded.size(), hf.size());
  for (const HfTensor &tensor : hf) {
    const std::optional<Gpt2NameMapping> mapping =
        MapHuggingFaceGpt2Name(tensor.name);
    ASSERT_TRUE(mapping.has_value()) << tensor.name;
    auto found = loaded.find(mapping->name);
    ASSERT_NE(found, loaded.end()) << mapping->name;
    const Tensor &ours = found->second;
    EXPECT_EQ(ours.dtype(), dtype);
    const std::vector<float> values = Floats(ours);
    if (mapping->transpose) {
      const int64_t in = tensor.shape[0];
      const int64_t out = tensor.shape[1];
      ASSERT_EQ(ours.shape(), (Shape{out, in})) << mapping->name;
      for (int64_t o = 0; o < out; ++o) {
        for (int64_t i = 0; i < in; ++i) {
          const float hf_value = tensor.values[i * out + o];
          const float expected = dtype == DType::kF32
                                     ? hf_value
                                     : static_cast<float>(bf16(hf_value));
          ASSERT_EQ(values[o * in + i], expected)
              << mapping->name << " at (" << o << ", " << i << ")";
        }
      }
    } else {
      ASSERT_EQ(ours.shape(), tensor.shape) << mapping->name;
      for (size_t e = 0; e < values.size(); ++e) {
        const float expected = dtype == DType::kF32
                                   ? tensor.values[e]
                                   : static_cast<float>(bf16(tensor.values[e]));
        ASSERT_EQ(values[e], expected) << mapping->name << " at " << e;
      }
    }
  }
}

TEST(NameMapTest, MapsEveryHfNameWithAndWithoutPrefix) {
  const struct {
    const char *hf;
    const char *ours;
    bool transpose;
  } cases[] = {
      {"transformer.wte.weight", "embed.wte", false},
      {"wpe.weight", "embed.wpe", false},
      {"transformer.h.0.ln_1.weight", "blocks.0.ln1.weight", false},
      {"h.11.ln_1.bias", "blocks.11.ln1.bias", false},
      {"transformer.h.3.attn.c_attn.weight", "blocks.3.attn.qkv.weight", true},
      {"h.3.attn.c_attn.bias", "blocks.3.attn.qkv.bias", false},
      {"h.3.attn.c_proj.weight", "blocks.3.attn.proj.weight", true},
      {"h.3.attn.c_proj.bias", "blocks.3.attn.proj.bias", false},
      {"h.47.ln_2.weight", "blocks.47.ln2.weight", false},
      {"h.47.ln_2.bias", "blocks.47.ln2.bias", false},
      {"h.5.mlp.c_fc.weight", "blocks.5.mlp.fc.weight", true},
      {"h.5.mlp.c_fc.bias", "blocks.5.mlp.fc.bias", false},
      {"h.5.mlp.c_proj.weight", "blocks.5.mlp.proj.weight", true},
      {"h.5.mlp.c_proj.bias", "blocks.5.mlp.proj.bias", false},
      {"transformer.ln_f.weight", "ln_f.weight", false},
      {"ln_f.bias", "ln_f.bias", false},
  };
  for (const auto &c : cases) {
    const std::optional<Gpt2NameMapping> mapping = MapHuggingFaceGpt2Name(c.hf);
    ASSERT_TRUE(mapping.has_value()) << c.hf;
    EXPECT_EQ(mapping->name, c.ours) << c.hf;
    EXPECT_EQ(mapping->transpose, c.transpose) << c.hf;
    EXPECT_FALSE(IsIgnoredHuggingFaceGpt2Name(c.hf)) << c.hf;
  }
}

TEST(NameMapTest, BuffersAndTiedHeadAreIgnoredAndUnknownNamesUnmapped) {
  for (const char *name : {"transformer.h.0.attn.bias", "h.7.attn.masked_bias",
                           "lm_head.weight"}) {
    EXPECT_FALSE(MapHuggingFaceGpt2Name(name).has_value()) << name;
    EXPECT_TRUE(IsIgnoredHuggingFaceGpt2Name(name)) << name;
  }
  for (const char *name :
       {"transformer.h.0.attn.rotary.weight", "h.01.ln_1.weight",
        "h.-1.ln_1.weight", "h..ln_1.weight", "h.1", "blocks.0.ln1.weight",
        "transformer.transformer.wte.weight", "wte.bias", ""}) {
    EXPECT_FALSE(MapHuggingFaceGpt2Name(name).has_value()) << name;
    EXPECT_FALSE(IsIgnoredHuggingFaceGpt2Name(name)) << name;
  }
}

TEST(NameMapTest, ReverseMapInvertsTheForwardMapForEveryParameter) {
  const auto parameters = Gpt2ParameterShapes(kDims);
  EXPECT_EQ(parameters.size(), 2u + 12u * 2u + 2u);
  std::set<std::string> names;
  for (const auto &[ours, shape] : parameters) {
    EXPECT_TRUE(names.insert(ours).second) << "duplicate " << ours;
    const std::optional<Gpt2NameMapping> hf = MapToHuggingFaceGpt2Name(ours);
    ASSERT_TRUE(hf.has_value()) << ours;
    const std::optional<Gpt2NameMapping> back =
        MapHuggingFaceGpt2Name(hf->name);
    ASSERT_TRUE(back.has_value()) << hf->name;
    EXPECT_EQ(back->name, ours);
    EXPECT_EQ(back->transpose, hf->transpose);
  }
  EXPECT_EQ(parameters[2].first, "blocks.0.ln1.weight");
  EXPECT_EQ(parameters[4].second, (Shape{24, 8}));  // blocks.0.attn.qkv.weight
  EXPECT_FALSE(MapToHuggingFaceGpt2Name("blocks.0.attn.c_attn.weight"));
}

TEST(LoadTest, TransposesConv1DWeightsAndMapsEveryTensor) {
  const std::vector<HfTensor> hf = SyntheticHfTensors(kDims);
  const std::string path = TestPath("gpt2.safetensors");
  WriteHfFile(path, hf, "transformer.", /*with_buffers=*/true);

  absl::StatusOr<Gpt2Dims> dims = InferHuggingFaceGpt2Dims(path);
  ASSERT_TRUE(dims.ok()) << dims.status();
  EXPECT_EQ(dims->num_layers, 2);
  EXPECT_EQ(dims->channels, 8);
  EXPECT_EQ(dims->vocab_size, 11);
  EXPECT_EQ(dims->max_positions, 5);

  Gpt2LoadOptions options;
  options.expected = kDims;
  absl::StatusOr<std::map<std::string, Tensor>> loaded = LoadAll(path, options);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectMatchesHf(*loaded, hf, DType::kF32);
  // One hand-checked element: qkv.weight (3C, C) row 9, column 2 is HF
  // c_attn.weight (C, 3C) row 2, column 9.
  const Tensor &qkv = loaded->at("blocks.1.attn.qkv.weight");
  const HfTensor &c_attn = hf[2 + 12 + 2];  // h.1.attn.c_attn.weight
  ASSERT_EQ(c_attn.name, "h.1.attn.c_attn.weight");
  EXPECT_EQ(qkv.data_as<float>()[9 * 8 + 2], c_attn.values[2 * 24 + 9]);
}

TEST(LoadTest, GPT2ModelFilesWithoutPrefixLoadToBf16) {
  const std::vector<HfTensor> hf = SyntheticHfTensors(kDims);
  const std::string path = TestPath("gpt2.safetensors");
  WriteHfFile(path, hf, "", /*with_buffers=*/false);
  Gpt2LoadOptions options;
  options.dtype = DType::kBF16;
  absl::StatusOr<std::map<std::string, Tensor>> loaded = LoadAll(path, options);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectMatchesHf(*loaded, hf, DType::kBF16);
}

TEST(LoadTest, PadsALargerModelVocabularyWithZeroRows) {
  const std::vector<HfTensor> hf = SyntheticHfTensors(kDims);
  const std::string path = TestPath("gpt2.safetensors");
  WriteHfFile(path, hf, "transformer.", /*with_buffers=*/true);
  Gpt2LoadOptions options;
  options.expected = kDims;
  options.expected->vocab_size = 16;
  absl::StatusOr<std::map<std::string, Tensor>> loaded = LoadAll(path, options);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Tensor &wte = loaded->at("embed.wte");
  ASSERT_EQ(wte.shape(), (Shape{16, 8}));
  const std::vector<float> values = Floats(wte);
  for (int64_t e = 0; e < 16 * 8; ++e) {
    EXPECT_EQ(values[e], e < 11 * 8 ? hf[0].values[e] : 0.0f) << e;
  }
}

// Runs the loader expecting failure before any tensor reaches the visitor.
void ExpectLoadRejected(const std::string &path, const Gpt2LoadOptions &options,
                        const std::vector<std::string> &expected_texts) {
  int visits = 0;
  absl::Status status = LoadHuggingFaceGpt2(
      path,
      [&visits](const std::string &, const Tensor &) {
        ++visits;
        return absl::OkStatus();
      },
      options);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(visits, 0) << "problems must be found before loading anything";
  EXPECT_TRUE(absl::StrContains(status.message(), path)) << status;
  for (const std::string &text : expected_texts) {
    EXPECT_TRUE(absl::StrContains(status.message(), text))
        << status << "\nexpected: " << text;
  }
}

TEST(LoadTest, ReportsMissingParameters) {
  const std::string path = TestPath("gpt2.safetensors");
  WriteHfFile(path, SyntheticHfTensors(kDims), "transformer.", true,
              /*skip=*/"h.1.mlp.c_fc.bias");
  Gpt2LoadOptions options;
  options.expected = kDims;
  ExpectLoadRejected(
      path, options,
      {"1 missing parameters", "blocks.1.mlp.fc.bias", "h.1.mlp.c_fc.bias"});
}

TEST(LoadTest, ReportsUnexpectedTensors) {
  const std::string path = TestPath("gpt2.safetensors");
  WriteHfFile(path, SyntheticHfTensors(kDims), "transformer.", true, "",
              {{"transformer.h.0.attn.rotary.weight", {2}, {1, 2}}});
  ExpectLoadRejected(
      path, {},
      {"1 unexpected tensors", "\"transformer.h.0.attn.rotary.weight\""});
}

TEST(LoadTest, ReportsAWeightNotInConv1DLayout) {
  // A c_attn.weight saved as (3C, C) (already Linear layout) must not be
  // loaded silently: same element count, wrong layout.
  std::vector<HfTensor> hf = SyntheticHfTensors(kDims);
  hf[4].shape = {24, 8};
  ASSERT_EQ(hf[4].name, "h.0.attn.c_attn.weight");
  const std::string path = TestPath("gpt2.safetensors");
  WriteHfFile(path, hf, "transformer.", true);
  ExpectLoadRejected(path, {},
                     {"\"transformer.h.0.attn.c_attn.weight\" is [24, 8], "
                      "expected [8, 24] (HF Conv1D layout"});
}

TEST(LoadTest, ReportsDimsThatDifferFromTheModel) {
  const std::string path = TestPath("gpt2.safetensors");
  WriteHfFile(path, SyntheticHfTensors(kDims), "transformer.", true);
  Gpt2LoadOptions options;
  options.expected = kDims;
  options.expected->num_layers = 3;
  ExpectLoadRejected(
      path, options,
      {"the file has 2 layers", "the model has 3", "blocks.2.ln1.weight"});
}

TEST(LoadTest, VisitorErrorsStopTheLoadAndNameTheParameter) {
  const std::string path = TestPath("gpt2.safetensors");
  WriteHfFile(path, SyntheticHfTensors(kDims), "", false);
  int visits = 0;
  absl::Status status = LoadHuggingFaceGpt2(
      path, [&visits](const std::string &name, const Tensor &) {
        ++visits;
        return name == "embed.wpe" ? absl::ResourceExhaustedError("no room")
                                   : absl::OkStatus();
      });
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(status.message(), "embed.wpe")) << status;
  EXPECT_EQ(visits, 2);
}

TEST(ExportTest, ExportThenLoadGivesBackTheHfFileExactly) {
  const std::vector<HfTensor> hf = SyntheticHfTensors(kDims);
  const std::string original = TestPath("original.safetensors");
  WriteHfFile(original, hf, "transformer.", true);
  // Load into a padded vocabulary, export dropping the padding.
  Gpt2Dims padded = kDims;
  padded.vocab_size = 16;
  Gpt2LoadOptions options;
  options.expected = padded;
  absl::StatusOr<std::map<std::string, Tensor>> ours =
      LoadAll(original, options);
  ASSERT_TRUE(ours.ok()) << ours.status();

  const std::string exported = TestPath("exported.safetensors");
  Gpt2ExportOptions export_options;
  export_options.vocab_size = 11;
  export_options.metadata = {{"step", "42"}};
  ASSERT_TRUE(ExportHuggingFaceGpt2(
                  exported, padded,
                  [&ours](const std::string &name) -> absl::StatusOr<Tensor> {
                    return ours->at(name);
                  },
                  export_options)
                  .ok());

  absl::StatusOr<std::unique_ptr<safetensors::Reader>> reader =
      safetensors::Reader::Open(exported);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->metadata().at("format"), "pt");
  EXPECT_EQ((*reader)->metadata().at("step"), "42");
  ASSERT_EQ((*reader)->tensors().size(), hf.size());  // no lm_head, no buffers
  for (const HfTensor &tensor : hf) {
    const std::string name = "transformer." + tensor.name;
    absl::StatusOr<Tensor> read = (*reader)->ReadTensor(name);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->shape(), tensor.shape) << name;
    EXPECT_EQ(Floats(*read), tensor.values) << name;
  }
}

TEST(ExportTest, RejectsASourceTensorOfTheWrongShape) {
  const std::string path = TestPath("exported.safetensors");
  absl::Status status = ExportHuggingFaceGpt2(
      path, kDims, [](const std::string &name) -> absl::StatusOr<Tensor> {
        // Right shapes except HF's layout for one qkv weight.
        Shape shape;
        for (const auto &[ours, our_shape] : Gpt2ParameterShapes(kDims)) {
          if (ours == name) shape = our_shape;
        }
        if (name == "blocks.1.attn.qkv.weight") shape = {8, 24};
        return Tensor::Zeros(shape, DType::kF32, Device::Cpu());
      });
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(
      absl::StrContains(status.message(), "parameter blocks.1.attn.qkv.weight"))
      << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "[24, 8]")) << status;
  EXPECT_FALSE(safetensors::Reader::Open(path).ok())
      << "a failed export must leave no file";
}

}  // namespace
}  // namespace nn
}  // namespace ze
