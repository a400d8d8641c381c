// GradientReducer at 1-4 ranks, as threads of one process (comm/in_process.h):
// for each kind (stage 0's all-reduce, stage 1's in-place reduce-scatter,
// stages 2-3's reduce-scatter into the partition) this rank's reduced
// gradients are the sum over ranks of every rank's inputs, also when cast to
// communication_data_type, prescaled, or accumulated over a window.
//
// Inputs are small integers (halves when prescaled), so every sum is exact
// in f32 and bf16 and the expected values need no tolerance.
#include "zero/gradient_reducer.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/in_process.h"
#include "comm/in_process_worlds.h"
#include "core/ops.h"
#include "core/status.h"
#include "gtest/gtest.h"
#include "zero/partition_state.h"

namespace ze {
namespace zero {
namespace {

// Rank r's gradient at element i of a bucket (padding included), window
// pass `pass`: an integer in [-5, 5].
float Gradient(int rank, int64_t i, int pass) {
  return static_cast<float>((i * 7 + rank * 3 + pass * 5) % 11) - 5.0f;
}

struct Case {
  ReductionKind kind;
  int stage;
  DType model_dtype;
  DType communication_dtype;
  bool prescale;
  int passes;  // reductions of each bucket in the window
  std::string name;
};

// Two buckets of odd sizes (53 elements does not divide by 3 or 4).
absl::StatusOr<PartitionedLayout> Layout(int world) {
  LayoutOptions options;
  options.world_size = world;
  options.bucket_max_elements = 100;
  return PartitionedLayout::Build({{"a", 53}, {"b", 40}, {"c", 21}}, options);
}

absl::Status RunCase(const Case& test, comm::Communicator& comm) {
  const int world = comm.world_size();
  const int rank = comm.rank();
  const Stream stream;  // the CPU's
  ZE_ASSIGN_OR_RETURN(const PartitionedLayout layout, Layout(world));
  if (layout.num_buckets() != 2) {
    return absl::InternalError(layout.DebugString());
  }
  PartitionStateOptions options;
  options.stage = test.stage;
  options.rank = rank;
  options.model_dtype = test.model_dtype;
  options.optimizer.type = OptimizerType::kSgd;
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<PartitionState> state,
                      PartitionState::Create(layout, options, stream));
  ZE_RETURN_IF_ERROR(state->AllocateTrainingState(stream));
  GradientReducerOptions reducer_options;
  reducer_options.kind = test.kind;
  reducer_options.communication_dtype = test.communication_dtype;
  reducer_options.prescale = test.prescale;
  reducer_options.predivide_factor = 2.0;
  std::vector<int> finished;
  GradientReducer reducer(reducer_options, state.get(), &comm, &stream, &stream,
                          [&](int bucket) {
                            finished.push_back(bucket);
                            return absl::OkStatus();
                          });
  const bool to_partition =
      test.kind == ReductionKind::kReduceScatterToPartition;
  // Kept alive until on_finished, as the strategies do.
  std::vector<Tensor> gradients;
  for (int pass = 0; pass < test.passes; ++pass) {
    // Backward's order: the last bucket first.
    for (int b = layout.num_buckets() - 1; b >= 0; --b) {
      const int64_t padded = layout.bucket(b).padded_elements;
      std::vector<float> values(padded);
      for (int64_t i = 0; i < padded; ++i) values[i] = Gradient(rank, i, pass);
      // Stages 0-1 reduce the replicated buffer; later stages a bucket of
      // their own.
      Tensor bucket_gradients;
      if (to_partition) {
        ZE_ASSIGN_OR_RETURN(
            bucket_gradients,
            Tensor::Empty({padded}, test.model_dtype, Device::Cpu()));
        gradients.push_back(bucket_gradients);
      } else {
        bucket_gradients = state->FullGradients(b);
      }
      ZE_ASSIGN_OR_RETURN(Tensor filled,
                          FromHostFloats(values, {padded}, test.model_dtype,
                                         Device::Cpu(), stream));
      ZE_RETURN_IF_ERROR(Copy(filled, bucket_gradients, stream));
      ZE_RETURN_IF_ERROR(reducer.Issue(b, bucket_gradients));
    }
  }
  ZE_RETURN_IF_ERROR(reducer.FinishAll());
  if (!reducer.idle()) return absl::InternalError("not idle after FinishAll");
  if (to_partition && finished.size() != static_cast<size_t>(2 * test.passes)) {
    return absl::InternalError(
        absl::StrCat("on_finished ran ", finished.size(), " times"));
  }
  for (int b = 0; b < layout.num_buckets(); ++b) {
    const BucketLayout& bucket = layout.bucket(b);
    // Stage 0 reduces the whole bucket; later stages this rank's slice.
    const int64_t begin = test.stage == 0 ? 0 : rank * bucket.slice_elements;
    ZE_ASSIGN_OR_RETURN(std::vector<float> got,
                        ToHostFloats(state->OwnGradients(b), stream));
    for (size_t i = 0; i < got.size(); ++i) {
      float want = 0;
      for (int pass = 0; pass < test.passes; ++pass) {
        for (int r = 0; r < world; ++r) {
          want += Gradient(r, begin + i, pass) / (test.prescale ? 2.0f : 1.0f);
        }
      }
      if (got[i] != want) {
        return absl::InternalError(
            absl::StrCat("bucket ", b, " element ", begin + i, ": ", got[i],
                         ", want ", want, " (the sum over ", world, " ranks)"));
      }
    }
  }
  return absl::OkStatus();
}

class GradientReducerTest : public testing::TestWithParam<int> {};

ZE_IN_PROCESS_WORLDS(GradientReducerTest);

TEST_P(GradientReducerTest, ReducedGradientsAreTheSumOverRanks) {
  const std::vector<Case> cases = {
      {ReductionKind::kAllReduce, 0, DType::kF32, DType::kF32, false, 1,
       "stage 0 all-reduce"},
      {ReductionKind::kAllReduce, 0, DType::kBF16, DType::kF32, true, 1,
       "stage 0, bf16 sent as f32, prescaled"},
      {ReductionKind::kReduceScatterInPlace, 1, DType::kF32, DType::kF32, false,
       1, "stage 1 in-place reduce-scatter"},
      {ReductionKind::kReduceScatterInPlace, 1, DType::kF32, DType::kBF16,
       false, 1, "stage 1, f32 sent as bf16"},
      {ReductionKind::kReduceScatterToPartition, 2, DType::kF32, DType::kF32,
       false, 1, "stage 2 into the partition"},
      {ReductionKind::kReduceScatterToPartition, 2, DType::kBF16, DType::kBF16,
       false, 3, "stage 2, three passes accumulate"},
      {ReductionKind::kReduceScatterToPartition, 3, DType::kF32, DType::kBF16,
       true, 2, "stage 3, cast, prescaled, two passes"},
  };
  for (const Case& test : cases) {
    const std::vector<absl::Status> statuses = comm::RunInProcess(
        GetParam(),
        [&](comm::Communicator& comm) { return RunCase(test, comm); });
    for (size_t r = 0; r < statuses.size(); ++r) {
      EXPECT_TRUE(statuses[r].ok())
          << test.name << ", rank " << r << ": " << statuses[r];
    }
  }
}

}  // namespace
}  // namespace zero
}  // namespace ze
