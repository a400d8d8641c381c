#include "tests/engine/hf_fixtures.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace ze {
namespace enginetest {

const std::vector<std::string>& HfFixtureNames() {
  static const std::vector<std::string> names = {"llama", "mistral", "qwen2",
                                                 "qwen2_sharded", "qwen3"};
  return names;
}

std::string HfFixtureDir(const std::string& name) {
  const char* root = std::getenv("TEST_SRCDIR");
  return absl::StrCat(root != nullptr ? root : ".",
                      "/zero_engine/nn/pretrained/testdata/", name);
}

nlohmann::json ReadHfReference(const std::string& name) {
  const std::string path = HfFixtureDir(name) + "/reference.json";
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::abort();
  }
  return nlohmann::json::parse(text.str());
}

Tensor TokenRows(const nlohmann::json& table, int64_t begin, int64_t count) {
  const int64_t length = static_cast<int64_t>(table[0].size());
  Tensor tensor =
      Tensor::Empty({count, length}, DType::kI32, Device::Cpu()).value();
  int32_t* data = tensor.data_as<int32_t>();
  for (int64_t r = 0; r < count; ++r) {
    for (int64_t t = 0; t < length; ++t) {
      data[r * length + t] = table[begin + r][t].get<int32_t>();
    }
  }
  return tensor;
}

std::string HfTrainingConfig(const nlohmann::json& train, int64_t batch,
                             int world, int stage, bool offload_optimizer,
                             bool offload_param, bool bf16) {
  nlohmann::json zero = {{"stage", stage}};
  if (offload_optimizer) zero["offload_optimizer"] = {{"device", "cpu"}};
  if (offload_param) zero["offload_param"] = {{"device", "cpu"}};
  zero["reduce_bucket_size"] = 4096;
  zero["stage3_prefetch_bucket_size"] = 4096;
  zero["stage3_param_persistence_threshold"] = 0;
  nlohmann::json config = {
      {"train_batch_size", batch},
      {"train_micro_batch_size_per_gpu", batch / world},
      {"gradient_accumulation_steps", 1},
      {"gradient_clipping", 0.0},
      {"optimizer",
       {{"type", "AdamW"},
        {"params",
         {{"lr", train["lr"]},
          {"betas", train["betas"]},
          {"eps", train["eps"]},
          {"weight_decay", train["weight_decay"]}}}}},
      {"zero_optimization", zero},
  };
  if (bf16) config["bf16"] = {{"enabled", true}};
  return config.dump();
}

}  // namespace enginetest
}  // namespace ze
