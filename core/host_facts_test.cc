#include "core/host_facts.h"

#include <map>
#include <string>

#include "gtest/gtest.h"

namespace ze {
namespace {

// ReadHostFacts over a fixed environment.
HostFacts ReadFrom(const std::map<std::string, std::string>& environment) {
  return ReadHostFacts([&environment](const char* name) -> const char* {
    auto found = environment.find(name);
    return found == environment.end() ? nullptr : found->second.c_str();
  });
}

TEST(HostFactsTest, UnsetEnvironmentGivesDefaults) {
  const HostFacts facts = ReadFrom({});
  EXPECT_EQ(facts.omp_num_threads, 0);
  EXPECT_FALSE(facts.checkpoint_staging_limit.has_value());
}

TEST(HostFactsTest, OmpNumThreadsMustBeAPositiveInteger) {
  EXPECT_EQ(ReadFrom({{"OMP_NUM_THREADS", "6"}}).omp_num_threads, 6);
  for (const char* bad : {"0", "-2", "four", "", "3x"}) {
    EXPECT_EQ(ReadFrom({{"OMP_NUM_THREADS", bad}}).omp_num_threads, 0) << bad;
  }
}

TEST(HostFactsTest, StagingLimitIsReadAsBytes) {
  EXPECT_EQ(
      ReadFrom({{"ZE_CHECKPOINT_STAGING_LIMIT", "0"}}).checkpoint_staging_limit,
      std::optional<int64_t>(0));
  EXPECT_EQ(ReadFrom({{"ZE_CHECKPOINT_STAGING_LIMIT", "1073741824"}})
                .checkpoint_staging_limit,
            std::optional<int64_t>(int64_t{1} << 30));
  // As strtoll: leading digits, none read as 0 (the two-pass load).
  EXPECT_EQ(ReadFrom({{"ZE_CHECKPOINT_STAGING_LIMIT", "12MiB"}})
                .checkpoint_staging_limit,
            std::optional<int64_t>(12));
}

}  // namespace
}  // namespace ze
