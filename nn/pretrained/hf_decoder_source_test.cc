// HuggingFaceDecoderSource: the reader's parameters under our names, with
// the interface Engine::LoadWeights reads (the engine-level load is in
// //tests/engine:hf_decoder_parity_test).
#include "nn/pretrained/hf_decoder_source.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/safetensors/format.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace ze {
namespace nn {
namespace {

std::string FixtureDir(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"),
                      "/zero_engine/nn/pretrained/testdata/", name);
}

TEST(HfDecoderSourceTest, ReadsEveryParameterWholeAndByRangeUnderOurNames) {
  for (const char* fixture : {"llama", "qwen2_sharded", "qwen3"}) {
    SCOPED_TRACE(fixture);
    auto source = HuggingFaceDecoderSource::Open(FixtureDir(fixture));
    ASSERT_TRUE(source.ok()) << source.status();
    const safetensors::TensorSource& tensors = **source;
    EXPECT_NE(tensors.description().find(FixtureDir(fixture)),
              std::string::npos);
    EXPECT_EQ(tensors.Find("model.embed_tokens.weight"), nullptr)
        << "Hugging Face names are not ours";
    for (const auto& [name, shape] : (*source)->config().ParameterShapes()) {
      SCOPED_TRACE(name);
      const safetensors::TensorInfo* info = tensors.Find(name);
      ASSERT_NE(info, nullptr);
      EXPECT_EQ(info->shape, shape);
      absl::StatusOr<Tensor> whole = tensors.ReadTensor(name);
      ASSERT_TRUE(whole.ok()) << whole.status();
      EXPECT_EQ(whole->shape(), shape);
      ASSERT_EQ(whole->nbytes(), info->num_bytes());
      // A rank's slice: the middle third, in the file's dtype.
      const int64_t count = info->num_elements() / 3;
      const int64_t begin = count;
      absl::StatusOr<Tensor> part =
          Tensor::Empty({count}, whole->dtype(), Device::Cpu());
      ASSERT_TRUE(part.ok());
      ASSERT_TRUE(tensors.ReadRange(name, begin, count, *part).ok());
      const size_t element = SizeOf(whole->dtype());
      EXPECT_EQ(
          std::memcmp(part->data(),
                      static_cast<const char*>(whole->data()) + begin * element,
                      count * element),
          0);
    }
    EXPECT_EQ(tensors.Find("layers.99.attn.q_proj.weight"), nullptr);
    absl::StatusOr<Tensor> missing = tensors.ReadTensor("no.such.weight");
    EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
    EXPECT_NE(missing.status().message().find("no.such.weight"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace nn
}  // namespace ze
