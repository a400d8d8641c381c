// The world sizes in-process tests run at: a parameterised suite over 1-4
// ranks (threads of one process, comm/in_process.h), its instances named
// w1 ... w4. Test-only (gtest).
//
//   class ReducerTest : public testing::TestWithParam<int> {};
//   ZE_IN_PROCESS_WORLDS(ReducerTest);
//   TEST_P(ReducerTest, ...) { const int world = GetParam(); ... }
#ifndef ZE_COMM_IN_PROCESS_WORLDS_H_
#define ZE_COMM_IN_PROCESS_WORLDS_H_

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ze {
namespace comm {

// "w" and the world size: the instance's name.
inline std::string WorldName(const ::testing::TestParamInfo<int>& info) {
  return absl::StrCat("w", info.param);
}

}  // namespace comm
}  // namespace ze

#define ZE_IN_PROCESS_WORLDS(suite)                                      \
  INSTANTIATE_TEST_SUITE_P(Worlds, suite, ::testing::Values(1, 2, 3, 4), \
                           ::ze::comm::WorldName)

#endif  // ZE_COMM_IN_PROCESS_WORLDS_H_
