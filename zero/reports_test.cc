// zero/reports.h: the memory plan's one-line summary (what Initialize logs
// and ze_estimate prints) and its GiB formatting.
#include "zero/reports.h"

#include "gtest/gtest.h"

namespace ze {
namespace zero {
namespace {

TEST(FormatGiBTest, ThreeDecimals) {
  EXPECT_EQ(FormatGiB(0), "0.000 GiB");
  EXPECT_EQ(FormatGiB(int64_t{3} << 29), "1.500 GiB");
}

TEST(MemoryBreakdownTest, TotalExcludesStagingAndPlacement) {
  MemoryBreakdown memory;
  memory.model_weight_bytes = 1;
  memory.gradient_bytes = 2;
  memory.master_weight_bytes = 4;
  memory.optimizer_state_bytes = 8;
  memory.staging_bytes = 16;
  memory.host_bytes = 32;
  EXPECT_EQ(memory.total_bytes(), 15);
}

TEST(MemoryBreakdownTest, PlacementOnlyWithHostState) {
  MemoryBreakdown memory;
  memory.parameter_elements = 7;
  memory.model_weight_bytes = int64_t{1} << 30;
  const std::string device_only = memory.ToString();
  EXPECT_NE(device_only.find("Psi=7 parameters"), std::string::npos);
  EXPECT_NE(device_only.find("weights 1.000 GiB"), std::string::npos);
  EXPECT_EQ(device_only.find("host"), std::string::npos) << device_only;
  memory.host_bytes = int64_t{1} << 30;
  memory.nvme_bytes = int64_t{1} << 31;
  const std::string offloaded = memory.ToString();
  EXPECT_NE(offloaded.find("host 1.000 GiB"), std::string::npos) << offloaded;
  EXPECT_NE(offloaded.find("NVMe 2.000 GiB"), std::string::npos) << offloaded;
}

}  // namespace
}  // namespace zero
}  // namespace ze
