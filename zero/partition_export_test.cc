// The export on the CPU, over PartitionStates without an engine: what a
// sink receives (every kind of every piece, in order, from where the state
// lives), what a sink's error and an unknown kind do, a frozen bucket's
// f32 master, and GatherMaster's consolidated values at 1-3 ranks (threads
// of one process, comm/in_process.h) for stages 0, 1 and 3.
#include "zero/partition_export.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/in_process.h"
#include "core/ops.h"
#include "core/status.h"
#include "gtest/gtest.h"
#include "zero/partition_import.h"
#include "zero/partition_test_values.h"

namespace ze {
namespace zero {
namespace {

using testing_values::FillFrom;
using testing_values::MakeState;
using testing_values::Value;

// Imports every kind of FillFrom's values into this rank's ranges.
absl::Status ImportAll(PartitionState& state) {
  const Stream& stream = Stream::Default(Device::Cpu());
  ZE_ASSIGN_OR_RETURN(const offload::UpdateJoined joined,
                      state.FinishUpdate(stream));
  return ImportState(state, joined, 0, state.num_buckets(),
                     static_cast<int>(state.StateArrayNames().size()), FillFrom,
                     stream);
}

TEST(PartitionExportTest, SinkGetsEveryKindOfEveryPieceInOrder) {
  std::unique_ptr<PartitionState> state = MakeState(1, 1, 0).value();
  ASSERT_TRUE(ImportAll(*state).ok());
  const Stream& stream = Stream::Default(Device::Cpu());
  const offload::UpdateJoined joined = state->FinishUpdate(stream).value();
  const std::vector<ExportKind> kinds = ExportKinds(*state);
  ASSERT_EQ(kinds.size(), 4u);  // master, exp_avg, exp_avg_sq, weights
  EXPECT_EQ(kinds.back().name, "weights");
  EXPECT_EQ(kinds.back().dtype, DType::kBF16);
  const std::vector<ParamShard> pieces = state->layout().RankShards(0);
  std::vector<std::string> order;
  std::map<std::string, std::vector<float>> received;  // kind:name
  ExportTimes times;
  const absl::Status status = ExportState(
      *state, joined, pieces, kinds,
      [&](const ExportKind& kind, const ParamShard& piece,
          const Tensor& values) -> absl::Status {
        const std::string name = state->layout().param(piece.param_index).name;
        order.push_back(absl::StrCat(kind.name, ":", name));
        ZE_ASSIGN_OR_RETURN(
            std::vector<float> floats,
            ToHostFloats(values, Stream::Default(Device::Cpu())));
        std::vector<float>& into = received[order.back()];
        into.insert(into.end(), floats.begin(), floats.end());
        return absl::OkStatus();
      },
      stream, &times);
  ASSERT_TRUE(status.ok()) << status;
  std::vector<std::string> expected_order;
  for (const ParamShard& piece : pieces) {
    for (const ExportKind& kind : kinds) {
      expected_order.push_back(absl::StrCat(
          kind.name, ":", state->layout().param(piece.param_index).name));
    }
  }
  EXPECT_EQ(order, expected_order);
  for (const auto& [key, values] : received) {
    const std::string kind = key.substr(0, key.find(':'));
    const std::string name = key.substr(key.find(':') + 1);
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_EQ(values[i], Value(kind, name, static_cast<int64_t>(i))) << key;
    }
  }
  EXPECT_FALSE(times.pinned);  // the CPU's state: ordinary host memory
}

TEST(PartitionExportTest, SinkErrorStopsTheExportAndIsReturned) {
  std::unique_ptr<PartitionState> state = MakeState(0, 1, 0).value();
  const Stream& stream = Stream::Default(Device::Cpu());
  const offload::UpdateJoined joined = state->FinishUpdate(stream).value();
  int calls = 0;
  const absl::Status status = ExportState(
      *state, joined, state->layout().RankShards(0), ExportKinds(*state),
      [&](const ExportKind&, const ParamShard&, const Tensor&) {
        ++calls;
        return absl::DataLossError("disk full");
      },
      stream);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_EQ(calls, 1);
}

TEST(PartitionExportTest, UnknownKindIsNamed) {
  std::unique_ptr<PartitionState> state = MakeState(0, 1, 0).value();
  const Stream& stream = Stream::Default(Device::Cpu());
  const offload::UpdateJoined joined = state->FinishUpdate(stream).value();
  const absl::Status status = ExportState(
      *state, joined, state->layout().RankShards(0), {{"momentum_buffer"}},
      [](const ExportKind&, const ParamShard&, const Tensor&) {
        return absl::OkStatus();
      },
      stream);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("momentum_buffer"), std::string::npos);
}

// A frozen bucket's "master" is its f32 copy: its weights' values at
// first, then what an import gave it, finer than its bf16 weights.
TEST(PartitionExportTest, FrozenBucketExportsItsF32MasterCopy) {
  std::unique_ptr<PartitionState> state =
      MakeState(3, 1, 0, {true, false}).value();
  const Stream& stream = Stream::Default(Device::Cpu());
  comm::RunInProcess(1, [&](comm::Communicator& comm) -> absl::Status {
    const int b = state->layout().FindParam("b").value();
    {
      const offload::UpdateJoined joined = state->FinishUpdate(stream).value();
      EXPECT_EQ(GatherMaster(*state, joined, b, comm, stream).value(),
                std::vector<float>(11, 0.0f));  // the zeroed weights
    }
    const ImportSource finer = [](const std::string& kind,
                                  const std::string& name, int64_t begin,
                                  const Tensor& destination) -> absl::Status {
      ZE_RETURN_IF_ERROR(FillFrom(kind, name, begin, destination));
      if (kind != "master") return absl::OkStatus();
      for (int64_t i = 0; i < destination.numel(); ++i) {
        destination.data_as<float>()[i] += 0.125f;  // not a bf16 value here
      }
      return absl::OkStatus();
    };
    const offload::UpdateJoined joined = state->FinishUpdate(stream).value();
    EXPECT_TRUE(ImportState(*state, joined, 0, 2, 1, finer, stream).ok());
    const std::vector<float> master =
        GatherMaster(*state, joined, b, comm, stream).value();
    for (int64_t i = 0; i < 11; ++i) {
      EXPECT_EQ(master[i], Value("master", "b", i) + 0.125f) << i;
    }
    return absl::OkStatus();
  });
}

// Every rank imports its own ranges, then gathers every parameter's master:
// each must see the whole of it, whoever holds which part.
TEST(PartitionExportTest, GatherMasterConsolidatesEveryRanksShare) {
  for (const int stage : {0, 1, 3}) {
    for (int world = 1; world <= 3; ++world) {
      const std::vector<absl::Status> statuses = comm::RunInProcess(
          world, [&](comm::Communicator& comm) -> absl::Status {
            ZE_ASSIGN_OR_RETURN(std::unique_ptr<PartitionState> state,
                                MakeState(stage, world, comm.rank()));
            ZE_RETURN_IF_ERROR(ImportAll(*state));
            const Stream& stream = Stream::Default(Device::Cpu());
            ZE_ASSIGN_OR_RETURN(const offload::UpdateJoined joined,
                                state->FinishUpdate(stream));
            for (int p = 0; p < state->layout().num_params(); ++p) {
              const ParamSpec& param = state->layout().param(p);
              ZE_ASSIGN_OR_RETURN(
                  const std::vector<float> master,
                  GatherMaster(*state, joined, p, comm, stream));
              std::vector<float> expected(param.numel);
              for (int64_t i = 0; i < param.numel; ++i) {
                expected[i] = Value("master", param.name, i);
              }
              if (master != expected) {
                return absl::InternalError(absl::StrCat(
                    "stage ", stage, " world ", world, " rank ", comm.rank(),
                    ": parameter ", param.name, " differs"));
              }
            }
            return absl::OkStatus();
          });
      for (const absl::Status& status : statuses) {
        EXPECT_TRUE(status.ok()) << status;
      }
    }
  }
}

}  // namespace
}  // namespace zero
}  // namespace ze
