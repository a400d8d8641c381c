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

TEST(FormatGiBOrMiBTest, GiBFromOneGiBOn) {
  EXPECT_EQ(FormatGiBOrMiB(0), "0.0 MiB");
  EXPECT_EQ(FormatGiBOrMiB(1.5 * 1024 * 1024), "1.5 MiB");
  EXPECT_EQ(FormatGiBOrMiB(1023.0 * 1024 * 1024), "1023.0 MiB");
  EXPECT_EQ(FormatGiBOrMiB(1024.0 * 1024 * 1024), "1.0 GiB");
  EXPECT_EQ(FormatGiBOrMiB(5.5 * 1024 * 1024 * 1024), "5.5 GiB");
}

TEST(MemoryBreakdownTest, TotalExcludesStagingAndPlacement) {
  // A bit of its own per field, so the total shows which ones count: the
  // first four (1 + 2 + 4 + 8), not staging (16) or host (32).
  MemoryBreakdown memory;
  int64_t bit = 1;
  for (int64_t* field :
       {&memory.model_weight_bytes, &memory.gradient_bytes,
        &memory.master_weight_bytes, &memory.optimizer_state_bytes,
        &memory.staging_bytes, &memory.host_bytes}) {
    *field = bit;
    bit *= 2;
  }
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
