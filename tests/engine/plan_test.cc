// The memory plan zero/plan.h computes without allocating (what
// tools/ze_estimate --model and train_gpt --dry_run print) equals the plan
// the engine reports after Initialize, for every stage and offload choice,
// at this job's world size; and its paper figure is the ZeRO paper's.
#include "zero/plan.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "config/config.h"
#include "engine/engine.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"
#include "zero/memory_estimate.h"

namespace ze {
namespace {

using enginetest::Comm;
using enginetest::World;

// A directory for offload_param nvme's swap file (one per rank: a rank's
// file name is its own, but the directory is shared by the test's ranks).
std::string NvmeDirectory() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp != nullptr ? tmp : "/tmp";
}

struct Case {
  int stage;
  std::string offload;  // JSON inside zero_optimization, or ""
};

std::string ConfigJson(const Case& c) {
  return absl::StrCat(
      R"({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true},)",
      R"("optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},)",
      R"("zero_optimization": {"stage": )", c.stage,
      R"(, "reduce_bucket_size": 900)", c.offload, "}}");
}

TEST(PlanTest, PlanWithoutAllocatingEqualsTheEnginesPlan) {
  const std::vector<Case> cases = {
      {0, ""},
      {1, ""},
      {1, R"(, "offload_optimizer": {"device": "cpu", "pin_memory": true})"},
      {2, ""},
      {2, R"(, "offload_optimizer": {"device": "cpu", "ratio": 0.5})"},
      {3, ""},
      {3,
       R"(, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"})"},
      // The parameters on NVMe (the first buckets kept in CPU memory), the
      // swap buffers pinned.
      {3,
       absl::StrCat(
           R"(, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "nvme", "nvme_path": ")",
           NvmeDirectory(),
           R"(", "pin_memory": true, "buffer_count": 2, "max_in_cpu": 600})")},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(ConfigJson(c));
    auto config = config::LoadConfigString(ConfigJson(c), World());
    ASSERT_TRUE(config.ok()) << config.status();
    // Shapes only for the plan; a real model for the engine.
    auto shapes = enginetest::MakeGpt(enginetest::SmallGpt(), DType::kBF16,
                                      /*materialize=*/false);
    ASSERT_TRUE(shapes.ok());
    auto planned = zero::PlanMemory(**shapes, *config, World());
    ASSERT_TRUE(planned.ok()) << planned.status();
    auto model = enginetest::MakeGpt(enginetest::SmallGpt(), DType::kBF16);
    ASSERT_TRUE(model.ok());
    auto engine = engine::Initialize(*model, ConfigJson(c), Comm());
    ASSERT_TRUE(engine.ok()) << engine.status();
    const zero::MemoryBreakdown& actual = (*engine)->memory_breakdown();
    EXPECT_EQ(planned->parameter_elements, actual.parameter_elements);
    EXPECT_EQ(planned->model_weight_bytes, actual.model_weight_bytes);
    EXPECT_EQ(planned->gradient_bytes, actual.gradient_bytes);
    EXPECT_EQ(planned->master_weight_bytes, actual.master_weight_bytes);
    EXPECT_EQ(planned->optimizer_state_bytes, actual.optimizer_state_bytes);
    EXPECT_EQ(planned->device_bytes, actual.device_bytes);
    EXPECT_EQ(planned->host_bytes, actual.host_bytes);
    EXPECT_EQ(planned->pinned_host_bytes, actual.pinned_host_bytes);
    EXPECT_EQ(planned->staging_bytes, actual.staging_bytes);
    EXPECT_DOUBLE_EQ(planned->paper_bytes, actual.paper_bytes);
    // The paper's figure for mixed-precision Adam, and the plan at or above
    // it (the layout pads buckets; zero:memory_estimate_test checks the
    // padded figure exactly).
    const double psi = static_cast<double>(planned->parameter_elements);
    const double n = World();
    const double paper[] = {16 * psi, 4 * psi + 12 * psi / n,
                            2 * psi + 14 * psi / n, 16 * psi / n};
    EXPECT_NEAR(planned->paper_bytes, paper[c.stage], 1e-6 * paper[c.stage]);
    EXPECT_GE(static_cast<double>(planned->total_bytes()),
              planned->paper_bytes - 16);
  }
}

}  // namespace
}  // namespace ze

int main(int argc, char** argv) {
  return ze::enginetest::RunAllTests(argc, argv);
}
