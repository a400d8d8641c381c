// The import on the CPU, over a PartitionState without an engine: what
// lands where (weights, master, optimizer arrays; padding zero), which
// arrays a window leaves alone, frozen buckets' master copies, what an
// error leaves behind, and a filtered (scope release) import writing only
// the parameters it selects.
#include "zero/partition_import.h"

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops.h"
#include "gtest/gtest.h"
#include "zero/partition_test_values.h"

namespace ze {
namespace zero {
namespace {

using testing_values::FillFrom;
using testing_values::Floats;
using testing_values::Value;

// Two buckets (a, then b and c) at world 1.
std::unique_ptr<PartitionState> Make(int stage, std::vector<bool> trainable) {
  return testing_values::MakeState(stage, 1, 0, std::move(trainable)).value();
}

// Bucket b's own elements of array `array`, as the partition holds them.
std::vector<float> OwnArray(PartitionState& state,
                            const offload::UpdateJoined& joined, int b,
                            int array) {
  Tensor out =
      Tensor::Empty({state.OwnRange(b).size()}, DType::kF32, Device::Cpu())
          .value();
  EXPECT_TRUE(state
                  .ReadOwnState(joined, b, array, 0, out,
                                Stream::Default(Device::Cpu()))
                  .ok());
  return Floats(out);
}

// What bucket b's range holds when kind `kind` of every parameter was
// imported: the values at each parameter's offsets, zero in the padding.
std::vector<float> Expected(const PartitionedLayout& layout, int b,
                            const std::string& kind) {
  std::vector<float> expected(layout.bucket(b).padded_elements, 0.0f);
  for (int p = layout.bucket(b).first_param; p < layout.bucket(b).end_param;
       ++p) {
    for (int64_t i = 0; i < layout.placement(p).numel; ++i) {
      expected[layout.placement(p).offset + i] =
          Value(kind, layout.param(p).name, i);
    }
  }
  return expected;
}

TEST(PartitionImportTest, EveryKindLandsAtItsOffsetsWithZeroPadding) {
  std::unique_ptr<PartitionState> state = Make(1, {});
  const Stream& stream = Stream::Default(Device::Cpu());
  const offload::UpdateJoined joined = state->FinishUpdate(stream).value();
  ASSERT_TRUE(ImportState(*state, joined, 0, 2, 3, FillFrom, stream).ok());
  for (int b = 0; b < 2; ++b) {
    int64_t begin = 0;
    EXPECT_EQ(Floats(state->CheckpointWeights(b, &begin)),
              Expected(state->layout(), b, "weights"))
        << b;
    EXPECT_EQ(OwnArray(*state, joined, b, 0),
              Expected(state->layout(), b, "master"));
    EXPECT_EQ(OwnArray(*state, joined, b, 1),
              Expected(state->layout(), b, "exp_avg"));
  }
}

TEST(PartitionImportTest, MasterOnlyLeavesTheOptimizerArrays) {
  std::unique_ptr<PartitionState> state = Make(1, {});
  const Stream& stream = Stream::Default(Device::Cpu());
  const offload::UpdateJoined joined = state->FinishUpdate(stream).value();
  ASSERT_TRUE(ImportState(*state, joined, 0, 2, 1, FillFrom, stream).ok());
  const std::vector<float> zeros(state->OwnRange(1).size(), 0.0f);
  EXPECT_EQ(OwnArray(*state, joined, 1, 0),
            Expected(state->layout(), 1, "master"));
  EXPECT_EQ(OwnArray(*state, joined, 1, 1), zeros);
  EXPECT_EQ(OwnArray(*state, joined, 1, 2), zeros);
}

TEST(PartitionImportTest, PlanListsEachParameterOncePerKindAndCountsBytes) {
  std::unique_ptr<PartitionState> state = Make(1, {});
  absl::StatusOr<ImportWindow> window = PlanImport(*state, 0, 2, 3);
  ASSERT_TRUE(window.ok()) << window.status();
  std::map<std::string, int64_t> elements;  // kind:name -> elements asked
  for (const ImportRead& read : window->reads) {
    elements[absl::StrCat(read.kind, ":", read.name)] +=
        read.destination.numel();
  }
  for (const std::string kind :
       {"weights", "master", "exp_avg", "exp_avg_sq"}) {
    EXPECT_EQ(elements[kind + ":a"], 30) << kind;
    EXPECT_EQ(elements[kind + ":b"], 11) << kind;
    EXPECT_EQ(elements[kind + ":c"], 7) << kind;
  }
  EXPECT_EQ(window->bytes, ImportBytes(*state, 3));
  // Staging, not the state: planning writes nothing.
  const Stream& stream = Stream::Default(Device::Cpu());
  const offload::UpdateJoined joined = state->FinishUpdate(stream).value();
  EXPECT_EQ(OwnArray(*state, joined, 0, 1),
            std::vector<float>(state->OwnRange(0).size(), 0.0f));
}

TEST(PartitionImportTest, SourceErrorLeavesLaterBucketsUntouched) {
  std::unique_ptr<PartitionState> state = Make(1, {});
  const Stream& stream = Stream::Default(Device::Cpu());
  const offload::UpdateJoined joined = state->FinishUpdate(stream).value();
  int64_t begin = 0;
  const std::vector<float> before = Floats(state->CheckpointWeights(1, &begin));
  const ImportSource failing_on_c =
      [](const std::string& kind, const std::string& name, int64_t begin,
         const Tensor& destination) -> absl::Status {
    if (name == "c") return absl::DataLossError("c is unreadable");
    return FillFrom(kind, name, begin, destination);
  };
  const absl::Status status =
      ImportState(*state, joined, 0, 2, 1, failing_on_c, stream);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_EQ(Floats(state->CheckpointWeights(0, &begin)),
            Expected(state->layout(), 0, "weights"));
  // A read of bucket 1 failed, so nothing of it was written.
  EXPECT_EQ(Floats(state->CheckpointWeights(1, &begin)), before);
}

TEST(PartitionImportTest, FrozenBucketGetsItsMasterCopyButNoState) {
  std::unique_ptr<PartitionState> state = Make(3, {true, false});
  const Stream& stream = Stream::Default(Device::Cpu());
  const offload::UpdateJoined joined = state->FinishUpdate(stream).value();
  ASSERT_TRUE(ImportState(*state, joined, 0, 2, 3, FillFrom, stream).ok());
  EXPECT_EQ(Floats(state->OwnMaster(1)),
            Expected(state->layout(), 1, "master"));
  int64_t begin = 0;
  EXPECT_EQ(Floats(state->CheckpointWeights(1, &begin)),
            Expected(state->layout(), 1, "weights"));
}

// A scope release names parameter "b" (bucket 1, beside "c"): only b's
// elements of the weights and master change; c's and the padding keep
// what they held, and the optimizer arrays beyond `arrays` stay.
TEST(PartitionImportTest, FilterWritesOnlyTheSelectedParameters) {
  for (const int stage : {1, 3}) {
    std::unique_ptr<PartitionState> state = Make(stage, {});
    const Stream& stream = Stream::Default(Device::Cpu());
    const offload::UpdateJoined joined = state->FinishUpdate(stream).value();
    // Everything first holds the "exp_avg" pattern (distinct from both the
    // weights and the master values the filtered import brings).
    const ImportSource as_exp_avg = [](const std::string& kind,
                                       const std::string& name, int64_t begin,
                                       const Tensor& destination) {
      return FillFrom("exp_avg", name, begin, destination);
    };
    ASSERT_TRUE(ImportState(*state, joined, 0, 2, 1, as_exp_avg, stream).ok());
    int64_t begin = 0;
    std::vector<float> weights = Floats(state->CheckpointWeights(1, &begin));
    std::vector<float> master = OwnArray(*state, joined, 1, 0);
    const std::vector<float> bucket0 =
        Floats(state->CheckpointWeights(0, &begin));

    const PartitionedLayout& layout = state->layout();
    const int b_index = layout.FindParam("b").value();
    std::atomic<int> reads{0};
    const ImportSource counting =
        [&reads](const std::string& kind, const std::string& name,
                 int64_t begin, const Tensor& destination) {
          ++reads;
          EXPECT_EQ(name, "b");
          return FillFrom(kind, name, begin, destination);
        };
    absl::StatusOr<ImportWindow> window = PlanImport(
        *state, 0, 2, 1, [b_index](int index) { return index == b_index; });
    ASSERT_TRUE(window.ok()) << window.status();
    EXPECT_EQ(window->bytes, 11 * 4 + 11 * 2);  // b's master and weights
    ASSERT_TRUE(ImportState(*state, joined, 0, 2, 1, counting, stream,
                            [b_index](int index) { return index == b_index; })
                    .ok());
    EXPECT_EQ(reads.load(), 2);  // "master" and "weights" of b, once each
    const ParamPlacement& b = layout.placement(b_index);
    for (int64_t i = 0; i < b.numel; ++i) {
      weights[b.offset + i] = Value("weights", "b", i);
      master[b.offset + i] = Value("master", "b", i);
    }
    EXPECT_EQ(Floats(state->CheckpointWeights(1, &begin)), weights) << stage;
    EXPECT_EQ(OwnArray(*state, joined, 1, 0), master) << stage;
    EXPECT_EQ(Floats(state->CheckpointWeights(0, &begin)), bucket0) << stage;
  }
}

}  // namespace
}  // namespace zero
}  // namespace ze
