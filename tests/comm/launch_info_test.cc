// Where each rank sits, from MPI's shared-memory split: alone (rank 0 of 1,
// no MPI) and under mpirun on this one host, where every rank must have a
// distinct local rank below local_size == world size, agreeing with Open
// MPI's OMPI_COMM_WORLD_LOCAL_* variables, and the split must decide the
// same when those variables are absent (as under launchers that set none)
// and win when they contradict it; one rank's refusal fails every rank.
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "comm/bootstrap.h"
#include "comm/factory.h"
#include "core/ops.h"
#include "gtest/gtest.h"

namespace ze {
namespace comm {
namespace {

int EnvInt(const char *name) {
  const char *text = std::getenv(name);
  int value = -1;
  if (text == nullptr || !absl::SimpleAtoi(text, &value)) return -1;
  return value;
}

std::unique_ptr<Communicator> CpuCommunicator() {
  CommOptions options;
  options.device = "cpu";
  options.backend = "mpi";
  absl::StatusOr<std::unique_ptr<Communicator>> comm =
      CreateCommunicator(options);
  EXPECT_TRUE(comm.ok()) << comm.status();
  return comm.ok() ? std::move(*comm) : nullptr;
}

// Every rank's `value` (exact in f32: small integers), in rank order.
std::vector<float> GatherFromEveryRank(Communicator &comm, float value) {
  Stream stream;
  const int n = comm.world_size();
  absl::StatusOr<Tensor> mine =
      FromHostFloats({value}, {1}, DType::kF32, Device::Cpu(), stream);
  absl::StatusOr<Tensor> all = FromHostFloats(
      std::vector<float>(n, -1), {n}, DType::kF32, Device::Cpu(), stream);
  EXPECT_TRUE(mine.ok() && all.ok());
  absl::StatusOr<Work> work = comm.AllGather(*mine, *all, stream);
  EXPECT_TRUE(work.ok()) << work.status();
  EXPECT_TRUE(work->Wait().ok());
  return *ToHostFloats(*all, stream);
}

TEST(LaunchInfoTest, LocalRanksFromTheMpiSplitAreConsistent) {
  absl::StatusOr<LaunchInfo> info = DiscoverLaunchInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  std::unique_ptr<Communicator> comm = CpuCommunicator();
  ASSERT_NE(comm, nullptr);
  EXPECT_FALSE(info->host.empty());
  EXPECT_EQ(comm->rank(), info->rank);
  EXPECT_EQ(comm->world_size(), info->world_size);
  EXPECT_EQ(comm->local_rank(), info->local_rank);
  EXPECT_EQ(comm->local_size(), info->local_size);
  EXPECT_GE(info->local_rank, 0);
  EXPECT_LT(info->local_rank, info->local_size);
  // Every rank of this test runs on this one host.
  EXPECT_EQ(info->local_size, info->world_size);
  if (info->launched) {
    EXPECT_EQ(info->local_source, LocalRankSource::kMpiSharedMemorySplit);
    if (EnvInt("OMPI_COMM_WORLD_LOCAL_SIZE") >= 0) {
      EXPECT_EQ(info->local_rank, EnvInt("OMPI_COMM_WORLD_LOCAL_RANK"));
      EXPECT_EQ(info->local_size, EnvInt("OMPI_COMM_WORLD_LOCAL_SIZE"));
    }
  } else {
    EXPECT_EQ(info->local_source, LocalRankSource::kSingleProcess);
    EXPECT_EQ(info->world_size, 1);
  }
  std::vector<float> local_ranks =
      GatherFromEveryRank(*comm, static_cast<float>(comm->local_rank()));
  std::sort(local_ranks.begin(), local_ranks.end());
  for (int i = 0; i < comm->world_size(); ++i) {
    EXPECT_EQ(local_ranks[i], static_cast<float>(i)) << "local ranks repeat";
  }
}

TEST(LaunchInfoTest, SplitDecidesWithoutTheLaunchersLocalVariables) {
  const char *names[] = {"OMPI_COMM_WORLD_LOCAL_RANK",
                         "OMPI_COMM_WORLD_LOCAL_SIZE"};
  const int expected_rank = EnvInt(names[0]);
  const int expected_size = EnvInt(names[1]);
  if (expected_size < 0) GTEST_SKIP() << "not under Open MPI's mpirun";
  for (const char *name : names) unsetenv(name);
  absl::StatusOr<LaunchInfo> assumed = LaunchInfoFromEnvironment();
  absl::StatusOr<LaunchInfo> info = DiscoverLaunchInfo();
  std::unique_ptr<Communicator> comm = CpuCommunicator();
  setenv(names[0], std::to_string(expected_rank).c_str(), 1);
  setenv(names[1], std::to_string(expected_size).c_str(), 1);
  ASSERT_TRUE(assumed.ok()) << assumed.status();
  EXPECT_EQ(assumed->local_source, LocalRankSource::kAssumedOneHost);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->local_source, LocalRankSource::kMpiSharedMemorySplit);
  EXPECT_EQ(info->local_rank, expected_rank);
  EXPECT_EQ(info->local_size, expected_size);
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(comm->local_rank(), expected_rank);
  EXPECT_EQ(comm->local_size(), expected_size);
}

TEST(LaunchInfoTest, LauncherVariablesThatContradictTheSplitAreRefused) {
  const char *names[] = {"OMPI_COMM_WORLD_LOCAL_RANK",
                         "OMPI_COMM_WORLD_LOCAL_SIZE"};
  const int real_rank = EnvInt(names[0]);
  const int real_size = EnvInt(names[1]);
  if (real_size < 2) GTEST_SKIP() << "needs 2 or more ranks under mpirun";
  // As if every rank were alone on its host: valid on its own, but MPI's
  // split sees all of them here, and it is the split that is believed.
  setenv(names[0], "0", 1);
  setenv(names[1], "1", 1);
  CommOptions options;
  options.device = "cpu";
  absl::StatusOr<std::unique_ptr<Communicator>> comm =
      CreateCommunicator(options);
  setenv(names[0], std::to_string(real_rank).c_str(), 1);
  setenv(names[1], std::to_string(real_size).c_str(), 1);
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string expected =
      "MPI's shared-memory split says local rank " + std::to_string(real_rank) +
      " of " + std::to_string(real_size) +
      " but the launcher's environment says local rank 0 of 1";
  EXPECT_NE(comm.status().message().find(expected), std::string::npos)
      << comm.status();
}

// Run by run_pmix_only.sh: mpirun's ranks with Open MPI's OMPI_COMM_WORLD_*
// variables removed, so only PMIx's remain, as under Slurm's
// `srun --mpi=pmix`. They must still form one world of the launched size,
// not each train alone as a world of one.
TEST(LaunchInfoTest, APmixOnlyLaunchFormsOneWorld) {
  const int expected_size = EnvInt("ZE_TEST_EXPECTED_WORLD_SIZE");
  if (expected_size < 0) GTEST_SKIP() << "not started by run_pmix_only.sh";
  ASSERT_EQ(std::getenv("OMPI_COMM_WORLD_SIZE"), nullptr);
  absl::StatusOr<LaunchInfo> from_environment = LaunchInfoFromEnvironment();
  ASSERT_TRUE(from_environment.ok()) << from_environment.status();
  EXPECT_TRUE(from_environment->launched);
  EXPECT_EQ(from_environment->rank, EnvInt("PMIX_RANK"));
  std::unique_ptr<Communicator> comm = CpuCommunicator();
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(comm->world_size(), expected_size);
  EXPECT_EQ(comm->rank(), EnvInt("PMIX_RANK"));
  std::vector<float> ranks =
      GatherFromEveryRank(*comm, static_cast<float>(comm->rank()));
  for (int i = 0; i < comm->world_size(); ++i) {
    EXPECT_EQ(ranks[i], static_cast<float>(i));
  }
}

TEST(LaunchInfoTest, OneRanksRefusalFailsEveryRank) {
  absl::StatusOr<LaunchInfo> info = DiscoverLaunchInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  if (info->world_size < 2) GTEST_SKIP() << "needs 2 or more ranks";
  // Only the last rank gets a setting it must refuse; the others' own
  // checks pass, and they must not go on into a backend without it.
  const int refusing = info->world_size - 1;
  if (info->rank == refusing) setenv("ZE_ALLOW_GPU_SHARING", "maybe", 1);
  CommOptions options;
  options.device = "cpu";
  absl::StatusOr<std::unique_ptr<Communicator>> comm =
      CreateCommunicator(options);
  unsetenv("ZE_ALLOW_GPU_SHARING");
  ASSERT_FALSE(comm.ok());
  if (info->rank == refusing) {
    EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(comm.status().message().find("ZE_ALLOW_GPU_SHARING=\"maybe\""),
              std::string::npos)
        << comm.status();
  } else {
    EXPECT_EQ(comm.status().code(), absl::StatusCode::kFailedPrecondition);
    const std::string expected = "CreateCommunicator failed on rank " +
                                 std::to_string(refusing) +
                                 " (its error is in its output); rank " +
                                 std::to_string(info->rank) + " on host ";
    EXPECT_NE(comm.status().message().find(expected), std::string::npos)
        << comm.status();
  }
}

}  // namespace
}  // namespace comm
}  // namespace ze
