// The pipeline layout's groups under mpirun: for every number of stages
// that divides the world, each rank's pipeline and data-parallel groups
// hold the ranks the layout says, reduce within themselves only, and carry
// point-to-point messages between neighbouring stages.
#include <memory>
#include <vector>

#include "comm/factory.h"
#include "core/ops.h"
#include "core/status.h"
#include "gtest/gtest.h"
#include "pipeline/layout.h"

namespace ze {
namespace pipeline {
namespace {

comm::Communicator *g_world = nullptr;

Tensor Scalar(float value) {
  absl::StatusOr<Tensor> t =
      FromHostFloats({value}, {1}, DType::kF32, Device::Cpu(), Stream());
  ZE_CHECK_OK(t.status());
  return *t;
}

float Read(const Tensor &t) { return (*ToHostFloats(t, Stream()))[0]; }

TEST(PipelineGroups, EveryDivisorOfTheWorld) {
  const int world = g_world->world_size();
  const int me = g_world->rank();
  for (int stages = 1; stages <= world; ++stages) {
    if (world % stages != 0) continue;
    SCOPED_TRACE(testing::Message() << stages << " stages, rank " << me);
    absl::StatusOr<PipelineLayout> layout =
        PipelineLayout::Create(world, stages, "pipeline.stages");
    ASSERT_TRUE(layout.ok());
    absl::StatusOr<PipelineGroups> groups =
        CreatePipelineGroups(*g_world, *layout);
    ASSERT_TRUE(groups.ok()) << groups.status();
    comm::Communicator &pipe = *groups->pipeline;
    comm::Communicator &data = *groups->data_parallel;
    ASSERT_EQ(pipe.world_size(), stages);
    ASSERT_EQ(pipe.rank(), layout->StageOf(me));
    ASSERT_EQ(data.world_size(), layout->data_parallel);
    ASSERT_EQ(data.rank(), layout->DataParallelIndexOf(me));

    // Sums of world ranks: each group's own members only.
    float pipe_sum = 0, data_sum = 0;
    for (int s = 0; s < stages; ++s) {
      pipe_sum += layout->RankAt(s, layout->DataParallelIndexOf(me));
    }
    for (int d = 0; d < layout->data_parallel; ++d) {
      data_sum += layout->RankAt(layout->StageOf(me), d);
    }
    Tensor a = Scalar(me), b = Scalar(me);
    ASSERT_TRUE(
        pipe.AllReduce(a, a, comm::ReduceOp::kSum, Stream())->Wait().ok());
    ASSERT_TRUE(
        data.AllReduce(b, b, comm::ReduceOp::kSum, Stream())->Wait().ok());
    EXPECT_EQ(Read(a), pipe_sum);
    EXPECT_EQ(Read(b), data_sum);

    // The tied pair: first and last stage of this replica.
    const int stage = layout->StageOf(me);
    if (stages > 1 && (stage == 0 || stage == stages - 1)) {
      ASSERT_NE(groups->tied, nullptr);
      ASSERT_EQ(groups->tied->world_size(), 2);
      EXPECT_EQ(groups->tied->rank(), stage == 0 ? 0 : 1);
      Tensor c = Scalar(me);
      ASSERT_TRUE(groups->tied->AllReduce(c, c, comm::ReduceOp::kSum, Stream())
                      ->Wait()
                      .ok());
      const int dp = layout->DataParallelIndexOf(me);
      EXPECT_EQ(Read(c),
                layout->RankAt(0, dp) + layout->RankAt(stages - 1, dp));
    } else {
      EXPECT_EQ(groups->tied, nullptr);
    }

    // An activation down the pipeline: stage s receives s - 1's world rank.
    if (stages > 1) {
      std::vector<comm::Work> sends;
      Tensor out = Scalar(me);
      Tensor in = Scalar(-1);
      if (pipe.rank() + 1 < stages) {
        absl::StatusOr<comm::Work> send =
            pipe.Send(out, pipe.rank() + 1, Stream());
        ASSERT_TRUE(send.ok()) << send.status();
        sends.push_back(*send);
      }
      if (pipe.rank() > 0) {
        ASSERT_TRUE(pipe.Recv(in, pipe.rank() - 1, Stream())->Wait().ok());
        EXPECT_EQ(Read(in), layout->RankAt(pipe.rank() - 1,
                                           layout->DataParallelIndexOf(me)));
      }
      for (comm::Work &send : sends) ASSERT_TRUE(send.Wait().ok());
    }
  }
}

}  // namespace
}  // namespace pipeline
}  // namespace ze

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ze::comm::CommOptions options;
  options.device = "cpu";
  absl::StatusOr<std::unique_ptr<ze::comm::Communicator>> world =
      ze::comm::CreateCommunicator(options);
  ZE_CHECK_OK(world.status());
  ze::pipeline::g_world = world->get();
  const int result = RUN_ALL_TESTS();
  ZE_CHECK_OK((*world)->Barrier());
  world->reset();
  return result;
}
