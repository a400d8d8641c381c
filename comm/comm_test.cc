// Single-process tests: bootstrap parsing and reconciliation with MPI, the
// device/backend decision (GPU sharing), timeout resolution, equal slices,
// the recent-collectives ring, argument validation, and the local backend.
// Multi-rank behaviour is tested under mpirun in tests/comm/.
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "comm/equal_slices.h"
#include "comm/factory.h"
#include "comm/recent_collectives.h"
#include "core/ops.h"
#include "gtest/gtest.h"

namespace ze {
namespace comm {
namespace {

std::function<const char *(const char *)> Env(
    const std::map<std::string, std::string> &vars) {
  return [vars](const char *name) -> const char * {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(BootstrapTest, NoLauncherIsRankZeroOfOne) {
  absl::StatusOr<LaunchInfo> info = ParseLaunchInfo(Env({}));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->launched);
  EXPECT_EQ(info->rank, 0);
  EXPECT_EQ(info->world_size, 1);
}

TEST(BootstrapTest, ReadsOpenMpiVariables) {
  absl::StatusOr<LaunchInfo> info =
      ParseLaunchInfo(Env({{"OMPI_COMM_WORLD_SIZE", "4"},
                           {"OMPI_COMM_WORLD_RANK", "3"},
                           {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                           {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->launched);
  EXPECT_EQ(info->rank, 3);
  EXPECT_EQ(info->world_size, 4);
  EXPECT_EQ(info->local_rank, 1);
  EXPECT_EQ(info->local_size, 2);
}

TEST(BootstrapTest, RejectsBadValuesNamingTheVariable) {
  absl::StatusOr<LaunchInfo> info = ParseLaunchInfo(
      Env({{"OMPI_COMM_WORLD_SIZE", "two"}, {"OMPI_COMM_WORLD_RANK", "0"}}));
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(info.status().message().find("OMPI_COMM_WORLD_SIZE"),
            std::string::npos);
  info = ParseLaunchInfo(
      Env({{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "2"}}));
  ASSERT_FALSE(info.ok());
  EXPECT_NE(info.status().message().find("OMPI_COMM_WORLD_RANK=2"),
            std::string::npos);
}

TEST(BootstrapTest, EnvironmentLocalRankIsOnlyACrossCheckSource) {
  absl::StatusOr<LaunchInfo> info =
      ParseLaunchInfo(Env({{"OMPI_COMM_WORLD_SIZE", "4"},
                           {"OMPI_COMM_WORLD_RANK", "3"},
                           {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                           {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->local_source, LocalRankSource::kEnvironment);
  // Without both local variables nothing is guessed from one of them: the
  // job is assumed to be on one host until MPI's split says otherwise.
  info = ParseLaunchInfo(Env({{"OMPI_COMM_WORLD_SIZE", "4"},
                              {"OMPI_COMM_WORLD_RANK", "3"},
                              {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}}));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->local_source, LocalRankSource::kAssumedOneHost);
  EXPECT_EQ(info->local_rank, 3);
  EXPECT_EQ(info->local_size, 4);
}

TEST(BootstrapTest, ReadsHydraVariablesWhenOpenMpiIsAbsent) {
  absl::StatusOr<LaunchInfo> info =
      ParseLaunchInfo(Env({{"PMI_SIZE", "6"},
                           {"PMI_RANK", "5"},
                           {"MPI_LOCALRANKID", "2"},
                           {"MPI_LOCALNRANKS", "3"}}));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->launched);
  EXPECT_EQ(info->rank, 5);
  EXPECT_EQ(info->world_size, 6);
  EXPECT_EQ(info->local_rank, 2);
  EXPECT_EQ(info->local_size, 3);
  // Open MPI's variables win when both sets are present.
  info = ParseLaunchInfo(Env({{"PMI_SIZE", "6"},
                              {"PMI_RANK", "5"},
                              {"OMPI_COMM_WORLD_SIZE", "2"},
                              {"OMPI_COMM_WORLD_RANK", "1"}}));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->world_size, 2);
  info = ParseLaunchInfo(Env({{"PMI_RANK", "0"}}));
  ASSERT_FALSE(info.ok());
  EXPECT_NE(info.status().message().find("PMI_SIZE"), std::string::npos)
      << info.status();
}

TEST(BootstrapTest, ReadsAPmixLaunchWhenNeitherMpiLauncherIsThere) {
  // Slurm's srun --mpi=pmix: PMIx's rank, the step's size from Slurm.
  absl::StatusOr<LaunchInfo> info =
      ParseLaunchInfo(Env({{"PMIX_RANK", "5"},
                           {"SLURM_PROCID", "5"},
                           {"SLURM_STEP_NUM_TASKS", "8"}}));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->launched);
  EXPECT_EQ(info->rank, 5);
  EXPECT_EQ(info->world_size, 8);
  EXPECT_EQ(info->local_source, LocalRankSource::kAssumedOneHost);
  // PMIx alone exports no size: MPI will supply it.
  info = ParseLaunchInfo(Env({{"PMIX_RANK", "2"}}));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->launched);
  EXPECT_EQ(info->rank, 2);
  EXPECT_EQ(info->world_size, 0);
  // Open MPI's mpirun sets PMIX_RANK too; its own variables are read.
  info = ParseLaunchInfo(Env({{"PMIX_RANK", "1"},
                              {"OMPI_COMM_WORLD_SIZE", "3"},
                              {"OMPI_COMM_WORLD_RANK", "1"}}));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->world_size, 3);
  // A Slurm batch script's own environment (no PMIx rank) is no launch.
  info = ParseLaunchInfo(
      Env({{"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "8"}}));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->launched);
  // Inconsistent variables are named.
  info = ParseLaunchInfo(Env({{"PMIX_RANK", "3"}, {"SLURM_PROCID", "1"}}));
  ASSERT_FALSE(info.ok());
  EXPECT_NE(info.status().message().find("PMIX_RANK=3 but SLURM_PROCID=1"),
            std::string::npos)
      << info.status();
  info =
      ParseLaunchInfo(Env({{"PMIX_RANK", "4"}, {"SLURM_STEP_NUM_TASKS", "4"}}));
  ASSERT_FALSE(info.ok());
  EXPECT_NE(info.status().message().find("PMIX_RANK=4 is not below "
                                         "SLURM_STEP_NUM_TASKS=4"),
            std::string::npos)
      << info.status();
  info = ParseLaunchInfo(Env({{"PMIX_RANK", "x"}}));
  ASSERT_FALSE(info.ok());
  EXPECT_NE(info.status().message().find("PMIX_RANK=\"x\""), std::string::npos)
      << info.status();
}

TEST(BootstrapTest, RejectsMoreLocalRanksThanRanks) {
  absl::StatusOr<LaunchInfo> info =
      ParseLaunchInfo(Env({{"OMPI_COMM_WORLD_SIZE", "2"},
                           {"OMPI_COMM_WORLD_RANK", "0"},
                           {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                           {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}}));
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(info.status().message().find("OMPI_COMM_WORLD_LOCAL_SIZE=3"),
            std::string::npos)
      << info.status();
}

MpiPlacement Placement(int rank, int world_size, int local_rank,
                       int local_size) {
  MpiPlacement placement;
  placement.rank = rank;
  placement.world_size = world_size;
  placement.local_rank = local_rank;
  placement.local_size = local_size;
  placement.host = "node7";
  return placement;
}

TEST(BootstrapTest, MpiSplitIsAuthoritative) {
  // A launcher that names no local rank: assumed one host until MPI says
  // rank 3 is local rank 1 of 2 on node7.
  absl::StatusOr<LaunchInfo> env = ParseLaunchInfo(
      Env({{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "3"}}));
  ASSERT_TRUE(env.ok()) << env.status();
  absl::StatusOr<LaunchInfo> info =
      ReconcileLaunchInfo(*env, Placement(3, 4, 1, 2));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->rank, 3);
  EXPECT_EQ(info->world_size, 4);
  EXPECT_EQ(info->local_rank, 1);
  EXPECT_EQ(info->local_size, 2);
  EXPECT_EQ(info->local_source, LocalRankSource::kMpiSharedMemorySplit);
  EXPECT_EQ(info->host, "node7");
  EXPECT_TRUE(info->launched);
}

TEST(BootstrapTest, EnvironmentThatDisagreesWithMpiIsAnError) {
  absl::StatusOr<LaunchInfo> env =
      ParseLaunchInfo(Env({{"OMPI_COMM_WORLD_SIZE", "4"},
                           {"OMPI_COMM_WORLD_RANK", "3"},
                           {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                           {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_TRUE(ReconcileLaunchInfo(*env, Placement(3, 4, 1, 2)).ok());
  // Every process a singleton: a program linked against another MPI.
  absl::StatusOr<LaunchInfo> info =
      ReconcileLaunchInfo(*env, Placement(0, 1, 0, 1));
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(info.status().message().find(
                "on host node7: MPI says rank 0 of 1 but the launcher's "
                "environment says rank 3 of 4"),
            std::string::npos)
      << info.status();
  info = ReconcileLaunchInfo(*env, Placement(3, 4, 3, 4));
  ASSERT_FALSE(info.ok());
  EXPECT_NE(info.status().message().find(
                "rank 3 on host node7: MPI's shared-memory split says local "
                "rank 3 of 4 but the launcher's environment says local rank 1 "
                "of 2"),
            std::string::npos)
      << info.status();
}

TEST(BootstrapTest, MpiSuppliesTheSizeAPmixLaunchDoesNotGive) {
  absl::StatusOr<LaunchInfo> env = ParseLaunchInfo(Env({{"PMIX_RANK", "2"}}));
  ASSERT_TRUE(env.ok()) << env.status();
  absl::StatusOr<LaunchInfo> info =
      ReconcileLaunchInfo(*env, Placement(2, 3, 2, 3));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->rank, 2);
  EXPECT_EQ(info->world_size, 3);
  EXPECT_EQ(info->local_size, 3);
  // A singleton MPI (another MPI library than the launcher's) on rank 2.
  info = ReconcileLaunchInfo(*env, Placement(0, 1, 0, 1));
  ASSERT_FALSE(info.ok());
  EXPECT_NE(info.status().message().find(
                "MPI says rank 0 of 1 but the launcher's environment says "
                "rank 2 of (size not given)"),
            std::string::npos)
      << info.status();
  // With Slurm's size, a singleton is caught on rank 0 too.
  env =
      ParseLaunchInfo(Env({{"PMIX_RANK", "0"}, {"SLURM_STEP_NUM_TASKS", "4"}}));
  ASSERT_TRUE(env.ok()) << env.status();
  info = ReconcileLaunchInfo(*env, Placement(0, 1, 0, 1));
  ASSERT_FALSE(info.ok());
  EXPECT_NE(info.status().message().find("rank 0 of 4"), std::string::npos)
      << info.status();
}

TEST(BootstrapTest, GpuSharingFromOptionThenEnvironment) {
  EXPECT_TRUE(*ResolveAllowGpuSharing(true, Env({})));
  EXPECT_FALSE(
      *ResolveAllowGpuSharing(false, Env({{"ZE_ALLOW_GPU_SHARING", "1"}})));
  EXPECT_FALSE(*ResolveAllowGpuSharing(std::nullopt, Env({})));
  for (const char *yes : {"1", "true", "TRUE"}) {
    EXPECT_TRUE(*ResolveAllowGpuSharing(std::nullopt,
                                        Env({{"ZE_ALLOW_GPU_SHARING", yes}})))
        << yes;
  }
  for (const char *no : {"0", "false", ""}) {
    EXPECT_FALSE(*ResolveAllowGpuSharing(std::nullopt,
                                         Env({{"ZE_ALLOW_GPU_SHARING", no}})))
        << no;
  }
  absl::StatusOr<bool> bad = ResolveAllowGpuSharing(
      std::nullopt, Env({{"ZE_ALLOW_GPU_SHARING", "yes"}}));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("ZE_ALLOW_GPU_SHARING=\"yes\""),
            std::string::npos)
      << bad.status();
}

// A rank of a launched job as CreateCommunicator sees it after MPI's split.
LaunchInfo OnHost(int local_rank, int local_size) {
  LaunchInfo info;
  info.rank = 10 + local_rank;
  info.world_size = 16;
  info.local_rank = local_rank;
  info.local_size = local_size;
  info.launched = true;
  info.local_source = LocalRankSource::kMpiSharedMemorySplit;
  info.host = "gpu-07";
  return info;
}

TEST(PlanCommunicatorTest, OneGpuPerRankGetsNccl) {
  for (int local_rank = 0; local_rank < 4; ++local_rank) {
    absl::StatusOr<CommPlan> plan = PlanCommunicator(
        OnHost(local_rank, 4), /*device_count=*/8, "auto", "auto", false);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->device, Device::Cuda(local_rank));
    EXPECT_EQ(plan->backend, "nccl");
  }
  absl::StatusOr<CommPlan> plan =
      PlanCommunicator(OnHost(1, 2), 2, "cuda", "mpi", false);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->device, Device::Cuda(1));
  EXPECT_EQ(plan->backend, "mpi");
}

TEST(PlanCommunicatorTest, SharedGpuIsRefusedOnEveryRankUnlessAsked) {
  for (const char *device : {"auto", "cuda"}) {
    for (const char *backend : {"auto", "mpi"}) {
      for (int local_rank = 0; local_rank < 3; ++local_rank) {
        // 3 ranks, 2 GPUs: even local rank 1, alone on cuda:1, refuses, so
        // the whole host fails the same way.
        absl::StatusOr<CommPlan> plan = PlanCommunicator(
            OnHost(local_rank, 3), /*device_count=*/2, device, backend, false);
        ASSERT_FALSE(plan.ok()) << device << " " << backend;
        EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
        const std::string message(plan.status().message());
        for (const std::string &expected :
             {absl::StrCat("rank ", 10 + local_rank, " on host gpu-07: "),
              std::string("3 ranks on this host (counted by "
                          "MPI_COMM_TYPE_SHARED split) but 2 visible GPUs"),
              absl::StrCat("this is local rank ", local_rank,
                           " on cuda:", local_rank % 2),
              std::string("ZE_ALLOW_GPU_SHARING=1"),
              std::string("CommOptions.allow_gpu_sharing")}) {
          EXPECT_NE(message.find(expected), std::string::npos)
              << expected << " not in: " << message;
        }
        plan = PlanCommunicator(OnHost(local_rank, 3), 2, device, backend,
                                /*allow_gpu_sharing=*/true);
        ASSERT_TRUE(plan.ok()) << plan.status();
        EXPECT_EQ(plan->device, Device::Cuda(local_rank % 2));
        EXPECT_EQ(plan->backend, "mpi");
      }
    }
  }
  absl::StatusOr<CommPlan> plan =
      PlanCommunicator(OnHost(1, 2), 1, "cuda", "auto", false);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("but 1 visible GPU,"),
            std::string::npos)
      << plan.status();
}

TEST(PlanCommunicatorTest, NcclRefusesSharedGpusEvenWhenSharingIsAllowed) {
  for (bool allow : {false, true}) {
    absl::StatusOr<CommPlan> plan =
        PlanCommunicator(OnHost(0, 2), 1, "cuda", "nccl", allow);
    ASSERT_FALSE(plan.ok());
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(plan.status().message().find(
                  "CommOptions.backend \"nccl\" needs one GPU per rank: rank "
                  "10 on host gpu-07: 2 ranks on this host"),
              std::string::npos)
        << plan.status();
    EXPECT_NE(plan.status().message().find("NCCL refuses"), std::string::npos);
  }
}

TEST(PlanCommunicatorTest, CpuNeverChecksGpus) {
  for (int device_count : {0, 1, 8}) {
    absl::StatusOr<CommPlan> plan =
        PlanCommunicator(OnHost(5, 6), device_count, "cpu", "auto", false);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_TRUE(plan->device.is_cpu());
    EXPECT_EQ(plan->backend, "mpi");
  }
  // No GPU visible: "auto" is the CPU, however many ranks share the host.
  absl::StatusOr<CommPlan> plan =
      PlanCommunicator(OnHost(5, 6), 0, "auto", "auto", false);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->device.is_cpu());
  plan = PlanCommunicator(OnHost(0, 2), 1, "cpu", "nccl", true);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find(
                "needs CUDA tensors; rank 10 on host gpu-07 uses cpu"),
            std::string::npos)
      << plan.status();
}

TEST(PlanCommunicatorTest, SingleProcessNeedsNoMpi) {
  LaunchInfo alone;
  alone.host = "laptop";
  absl::StatusOr<CommPlan> plan =
      PlanCommunicator(alone, 0, "auto", "auto", false);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->backend, "local");
  plan = PlanCommunicator(alone, 1, "auto", "auto", false);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->device, Device::Cuda(0));
  EXPECT_EQ(plan->backend, "nccl");
  plan = PlanCommunicator(alone, 1, "cuda", "mpi", false);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->backend, "local");
}

TEST(PlanCommunicatorTest, RejectsUnknownNamesAndMissingGpus) {
  absl::StatusOr<CommPlan> plan =
      PlanCommunicator(OnHost(0, 1), 1, "gpu", "auto", false);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("\"gpu\""), std::string::npos);
  plan = PlanCommunicator(OnHost(0, 1), 1, "auto", "gloo", false);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("\"gloo\""), std::string::npos);
  plan = PlanCommunicator(OnHost(0, 1), 0, "cuda", "auto", false);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(plan.status().message().find(
                "rank 10 on host gpu-07 sees no CUDA device"),
            std::string::npos)
      << plan.status();
}

TEST(BootstrapTest, DeviceIndexWrapsAroundTheGpus) {
  EXPECT_EQ(DeviceIndexForRank(0, 1), 0);
  EXPECT_EQ(DeviceIndexForRank(3, 1), 0);
  EXPECT_EQ(DeviceIndexForRank(5, 4), 1);
  EXPECT_EQ(DeviceIndexForRank(2, 0), -1);
}

TEST(BootstrapTest, TimeoutFromOptionThenEnvironmentThenDefault) {
  EXPECT_EQ(*ResolveTimeoutSeconds(3, Env({{"ZE_COMM_TIMEOUT_SECONDS", "7"}})),
            3);
  EXPECT_EQ(
      *ResolveTimeoutSeconds(0, Env({{"ZE_COMM_TIMEOUT_SECONDS", "7.5"}})),
      7.5);
  EXPECT_EQ(*ResolveTimeoutSeconds(0, Env({})), 600);
  absl::StatusOr<double> bad =
      ResolveTimeoutSeconds(0, Env({{"ZE_COMM_TIMEOUT_SECONDS", "-1"}}));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("ZE_COMM_TIMEOUT_SECONDS"),
            std::string::npos);
}

TEST(EqualSlicesTest, PadsUnevenTotals) {
  EqualSlices s = EqualSlices::Make(53, 3);
  EXPECT_EQ(s.slice, 18);
  EXPECT_EQ(s.padded_total(), 54);
  EXPECT_EQ(s.offset(2), 36);
  EXPECT_EQ(s.valid_count(0), 18);
  EXPECT_EQ(s.valid_count(2), 17);
  // More ranks than elements: trailing ranks own only padding.
  s = EqualSlices::Make(2, 4);
  EXPECT_EQ(s.slice, 1);
  EXPECT_EQ(s.valid_count(1), 1);
  EXPECT_EQ(s.valid_count(3), 0);
  // Alignment rounds each slice up.
  s = EqualSlices::Make(53, 3, 8);
  EXPECT_EQ(s.slice, 24);
  EXPECT_EQ(s.valid_count(2), 5);
  EXPECT_EQ(EqualSlices::Make(0, 3).padded_total(), 0);
}

TEST(RecentCollectivesTest, KeepsTheLastRecordsInOrder) {
  RecentCollectives recent(/*rank=*/2, /*capacity=*/3);
  for (int i = 0; i < 5; ++i) {
    CollectiveRecord record;
    record.kind = CollectiveKind::kAllReduce;
    record.count = 53 + i;
    record.dtype = DType::kBF16;
    EXPECT_EQ(recent.Issue(record), static_cast<uint64_t>(i + 1));
  }
  recent.MarkCompleted(4);
  recent.MarkFailed(5);
  const std::string dump = recent.Dump();
  EXPECT_EQ(dump.find("#2"), std::string::npos) << dump;
  EXPECT_NE(dump.find("rank 2: all_reduce(sum) #3: 55 x bf16 PENDING"),
            std::string::npos)
      << dump;
  EXPECT_NE(dump.find("#4: 56 x bf16 completed"), std::string::npos) << dump;
  EXPECT_NE(dump.find("#5: 57 x bf16 FAILED"), std::string::npos) << dump;
  EXPECT_LT(dump.find("#3"), dump.find("#5"));
  EXPECT_EQ(recent.next(), 6u);
}

class LocalCommTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CommOptions options;
    options.device = "cpu";
    absl::StatusOr<std::unique_ptr<Communicator>> comm =
        CreateCommunicator(options);
    ASSERT_TRUE(comm.ok()) << comm.status();
    comm_ = std::move(*comm);
  }
  Tensor Make(const std::vector<float> &values, DType dtype = DType::kF32) {
    return *FromHostFloats(values, {static_cast<int64_t>(values.size())}, dtype,
                           Device::Cpu(), stream_);
  }
  std::vector<float> Read(const Tensor &t) { return *ToHostFloats(t, stream_); }

  std::unique_ptr<Communicator> comm_;
  Stream stream_;
};

TEST_F(LocalCommTest, AProcessWithoutLauncherIsAWorldOfOne) {
  EXPECT_EQ(comm_->rank(), 0);
  EXPECT_EQ(comm_->world_size(), 1);
  EXPECT_STREQ(comm_->backend_name(), "local");
  EXPECT_EQ(comm_->timeout_seconds(), 600);
}

TEST_F(LocalCommTest, CollectivesOfOneRankCopy) {
  Tensor in = Make({1.5f, -2, 3}, DType::kBF16);
  Tensor out = Make({0, 0, 0}, DType::kBF16);
  absl::StatusOr<Work> work =
      comm_->AllReduce(in, out, ReduceOp::kAverage, stream_);
  ASSERT_TRUE(work.ok()) << work.status();
  ASSERT_TRUE(work->Wait().ok());
  EXPECT_EQ(Read(out), (std::vector<float>{1.5f, -2, 3}));
  Tensor gathered = Make({0, 0, 0}, DType::kBF16);
  ASSERT_TRUE(comm_->AllGather(in, gathered, stream_)->Wait().ok());
  EXPECT_EQ(Read(gathered), (std::vector<float>{1.5f, -2, 3}));
  ASSERT_TRUE(comm_->Broadcast(in, 0, stream_)->Wait().ok());
  ASSERT_TRUE(comm_->Barrier().ok());
  EXPECT_EQ(comm_->next_sequence_number(), 5u);
  EXPECT_NE(
      comm_->DumpRecentCollectives().find("all_gather #2: 3 x bf16 completed"),
      std::string::npos)
      << comm_->DumpRecentCollectives();
}

TEST_F(LocalCommTest, RejectsMismatchedArgumentsNamingThem) {
  Tensor a = Make({1, 2, 3});
  Tensor b = Make({1, 2});
  absl::StatusOr<Work> work = comm_->AllReduce(a, b, ReduceOp::kSum, stream_);
  ASSERT_FALSE(work.ok());
  EXPECT_EQ(work.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(work.status().message().find("all_reduce on rank 0"),
            std::string::npos)
      << work.status();
  work = comm_->AllReduce(a, Make({1, 2, 3}, DType::kF16), ReduceOp::kSum,
                          stream_);
  EXPECT_EQ(work.status().code(), absl::StatusCode::kInvalidArgument);
  work =
      comm_->AllReduce(a.Slice(0, 2), a.Slice(1, 2), ReduceOp::kSum, stream_);
  EXPECT_NE(work.status().message().find("partially overlap"),
            std::string::npos)
      << work.status();
  work = comm_->Broadcast(a, 1, stream_);
  EXPECT_NE(work.status().message().find("root 1 is outside"),
            std::string::npos)
      << work.status();
  // A failed validation consumes no sequence number.
  EXPECT_EQ(comm_->next_sequence_number(), 1u);
}

// A world of one splits into a world of one and has no peer to send to.
TEST_F(LocalCommTest, SplitsIntoItselfAndHasNoPointToPoint) {
  absl::StatusOr<std::unique_ptr<Communicator>> group = comm_->Split(3, 0);
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ((*group)->world_size(), 1);
  EXPECT_STREQ((*group)->backend_name(), "local");
  Tensor t = Make({1, 2});
  ASSERT_TRUE((*group)->AllReduce(t, t, ReduceOp::kSum, stream_)->Wait().ok());
  EXPECT_EQ(comm_->Split(-2, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<Work> send = comm_->Send(t, 0, stream_);
  EXPECT_EQ(send.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(send.status().message().find("no point-to-point"),
            std::string::npos)
      << send.status();
}

TEST(FactoryTest, RejectsUnknownChoices) {
  CommOptions options;
  options.backend = "gloo";
  options.device = "cpu";
  absl::StatusOr<std::unique_ptr<Communicator>> comm =
      CreateCommunicator(options);
  ASSERT_FALSE(comm.ok());
  EXPECT_NE(comm.status().message().find("\"gloo\""), std::string::npos);
  options.backend = "nccl";
  comm = CreateCommunicator(options);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace comm
}  // namespace ze
