// NCCL point-to-point, sub-communicators and a pipeline over them, on a
// machine with one GPU per rank (run_nccl_test.sh launches 2 ranks, or 4
// with 4 GPUs, and skips with fewer than 2: NCCL refuses two ranks on one
// GPU). Every rank holds two worlds over the same ranks and GPUs: nccl and
// mpi (which stages device memory through the host); the pipeline trains
// on each and the nccl run must give the mpi run's losses and weights.
//
//   nccl_mpi   (under mpirun, one rank per GPU)
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/factory.h"
#include "core/ops.h"
#include "core/status.h"
#include "engine/engine.h"
#include "gtest/gtest.h"
#include "nn/gpt.h"
#include "nn/pipeline_stage.h"
#include "pipeline/layout.h"
#include "pipeline/partition.h"
#include "tests/engine/engine_test_util.h"

namespace ze {
namespace {

std::shared_ptr<comm::Communicator> g_nccl;
std::shared_ptr<comm::Communicator> g_mpi;
Stream *g_stream = nullptr;

const DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

// Small integers: exact in every dtype.
std::vector<float> Values(int rank, int message, int64_t count) {
  std::vector<float> values(count);
  for (int64_t i = 0; i < count; ++i) {
    values[i] = static_cast<float>((rank * 7 + message * 3 + i) % 61);
  }
  return values;
}

Tensor Make(const std::vector<float> &values, DType dtype) {
  absl::StatusOr<Tensor> t =
      FromHostFloats(values, {static_cast<int64_t>(values.size())}, dtype,
                     g_stream->device(), *g_stream);
  ZE_CHECK_OK(t.status());
  return *t;
}

std::vector<float> Read(const Tensor &t) {
  absl::StatusOr<std::vector<float>> values = ToHostFloats(t, *g_stream);
  ZE_CHECK_OK(values.status());
  return *values;
}

TEST(NcclPointToPoint, Reported) {
  EXPECT_STREQ(g_nccl->backend_name(), "nccl");
  EXPECT_TRUE(g_nccl->supports_point_to_point());
  EXPECT_TRUE(g_nccl->sends_wait_for_receiver());
  EXPECT_FALSE(g_nccl->accepts_host_tensors());
}

// Around the ring, every dtype: two sends to the next rank and two
// receives from the previous one in ONE group (how a rank exchanging with
// its neighbours must post them over nccl), matched in issue order, odd
// sizes; the receives' output read on the caller's stream after
// StreamWait (the group ran on the communicator's own stream).
TEST(NcclPointToPoint, RingGroupedSendsAndReceivesEveryDType) {
  const int n = g_nccl->world_size(), rank = g_nccl->rank();
  const int next = (rank + 1) % n, previous = (rank + n - 1) % n;
  for (DType dtype : kDTypes) {
    std::vector<Tensor> in;
    std::vector<comm::CollectiveOp> ops;
    for (int k = 0; k < 2; ++k) {
      ops.push_back(
          comm::CollectiveOp::Send(Make(Values(rank, k, 37 + k), dtype), next));
    }
    for (int k = 0; k < 2; ++k) {
      in.push_back(Make(std::vector<float>(37 + k, -1), dtype));
      ops.push_back(comm::CollectiveOp::Recv(in.back(), previous));
    }
    absl::StatusOr<comm::Work> work = g_nccl->Coalesced(ops, *g_stream);
    ASSERT_TRUE(work.ok()) << work.status();
    ASSERT_TRUE(work->StreamWait(*g_stream).ok());
    for (int k = 0; k < 2; ++k) {
      EXPECT_EQ(Read(in[k]), Read(Make(Values(previous, k, 37 + k), dtype)))
          << DTypeName(dtype) << " message " << k << " on rank " << rank;
    }
    ASSERT_TRUE(work->Wait().ok());
  }
  EXPECT_NE(g_nccl->DumpRecentCollectives().find("recv(from "),
            std::string::npos);
}

// Separate Send and Recv calls (each its own group) around the ring in an
// order that cannot deadlock with blocking sends: even ranks send first,
// odd ranks receive first. The receive is waited for before the send.
TEST(NcclPointToPoint, RingSeparateCallsOrderedByParity) {
  const int n = g_nccl->world_size(), rank = g_nccl->rank();
  const int next = (rank + 1) % n, previous = (rank + n - 1) % n;
  Tensor out = Make(Values(rank, 5, 1000), DType::kF32);
  Tensor in = Make(std::vector<float>(1000, -1), DType::kF32);
  absl::StatusOr<comm::Work> send, receive;
  if (rank % 2 == 0) {
    send = g_nccl->Send(out, next, *g_stream);
    receive = g_nccl->Recv(in, previous, *g_stream);
  } else {
    receive = g_nccl->Recv(in, previous, *g_stream);
    send = g_nccl->Send(out, next, *g_stream);
  }
  ASSERT_TRUE(send.ok()) << send.status();
  ASSERT_TRUE(receive.ok()) << receive.status();
  ASSERT_TRUE(receive->Wait().ok());
  ASSERT_TRUE(send->Wait().ok());
  EXPECT_EQ(Read(in), Values(previous, 5, 1000));
}

// Refused before anything is queued, naming the operation and the peer;
// the communicator stays usable.
TEST(NcclPointToPoint, BadPeersAndMixedGroupsAreRefused) {
  Tensor t = Make({1, 2}, DType::kF32);
  absl::StatusOr<comm::Work> self = g_nccl->Send(t, g_nccl->rank(), *g_stream);
  EXPECT_EQ(self.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(self.status().message().find("peer"), std::string::npos)
      << self.status();
  EXPECT_EQ(g_nccl->Recv(t, g_nccl->world_size(), *g_stream).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<comm::Work> mixed =
      g_nccl->Coalesced({comm::CollectiveOp::AllReduce(t, t),
                         comm::CollectiveOp::Send(
                             t, (g_nccl->rank() + 1) % g_nccl->world_size())},
                        *g_stream);
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mixed.status().message().find("send(to "), std::string::npos)
      << mixed.status();
  ASSERT_TRUE(g_nccl->Barrier().ok());
}

// Split by rank parity, ranked by descending world rank: an all-reduce and
// a grouped exchange within each group; then one group of everyone,
// reversed; a negative color on one rank fails Split on every rank.
TEST(NcclSplit, GroupsByColorWithCollectivesAndMessagesInEach) {
  const int n = g_nccl->world_size(), rank = g_nccl->rank();
  for (const bool by_parity : {true, false}) {
    SCOPED_TRACE(by_parity ? "by parity" : "one group, reversed");
    const int color = by_parity ? rank % 2 : 0;
    absl::StatusOr<std::unique_ptr<comm::Communicator>> group =
        g_nccl->Split(color, -rank);
    ASSERT_TRUE(group.ok()) << group.status();
    EXPECT_STREQ((*group)->backend_name(), "nccl");
    std::vector<int> members;  // world ranks, by descending rank
    for (int r = n - 1; r >= 0; --r) {
      if (!by_parity || r % 2 == rank % 2) members.push_back(r);
    }
    ASSERT_EQ((*group)->world_size(), static_cast<int>(members.size()));
    ASSERT_EQ(members[(*group)->rank()], rank);
    float expected = 0;
    for (int r : members) expected += static_cast<float>(r);
    Tensor sum = Make({static_cast<float>(rank)}, DType::kF32);
    absl::StatusOr<comm::Work> reduce =
        (*group)->AllReduce(sum, sum, comm::ReduceOp::kSum, *g_stream);
    ASSERT_TRUE(reduce.ok()) << reduce.status();
    ASSERT_TRUE(reduce->Wait().ok());
    EXPECT_EQ(Read(sum)[0], expected);
    const int size = (*group)->world_size();
    if (size > 1) {
      const int next = ((*group)->rank() + 1) % size;
      const int previous = ((*group)->rank() + size - 1) % size;
      Tensor out = Make({static_cast<float>(rank)}, DType::kF32);
      Tensor in = Make({-1}, DType::kF32);
      absl::StatusOr<comm::Work> both =
          (*group)->Coalesced({comm::CollectiveOp::Send(out, next),
                               comm::CollectiveOp::Recv(in, previous)},
                              *g_stream);
      ASSERT_TRUE(both.ok()) << both.status();
      ASSERT_TRUE(both->Wait().ok());
      EXPECT_EQ(Read(in)[0], static_cast<float>(members[previous]));
    }
  }
  absl::StatusOr<std::unique_ptr<comm::Communicator>> refused =
      g_nccl->Split(rank == 0 ? -1 : 0, 0);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("rank 0 passed -1"),
            std::string::npos)
      << refused.status();
  ASSERT_TRUE(g_nccl->Barrier().ok());
}

// A 2-stage GPT pipeline (x world/2 data-parallel) trained over nccl and
// over mpi from the same seed and samples: the same losses and weights.
// The messages are exact copies either way; the reductions differ only in
// NCCL's summation order over 2 ranks (none at 2 ranks).
struct Trained {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> weights;
};

absl::StatusOr<Trained> TrainPipeline(
    const std::shared_ptr<comm::Communicator> &world,
    const std::string &schedule, int zero_stage) {
  constexpr int kStages = 2, kAccumulation = 4, kMicro = 2, kSteps = 3;
  const nn::GptConfig config = enginetest::SmallGpt(/*channels=*/16, 3);
  ZE_ASSIGN_OR_RETURN(pipeline::PipelineLayout layout,
                      pipeline::PipelineLayout::Create(
                          world->world_size(), kStages, "pipeline.stages"));
  ZE_ASSIGN_OR_RETURN(std::vector<pipeline::LayerRange> ranges,
                      pipeline::PartitionLayers(config.PipelineLayerWeights(),
                                                kStages, "parameters"));
  const pipeline::LayerRange mine = ranges[layout.StageOf(world->rank())];
  nn::GptOptions options;
  options.seed = 1234;
  options.device = world->device();
  options.first_layer = mine.first;
  options.last_layer = mine.last;
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<nn::GptModel> model,
                      nn::GptModel::Create(config, options));
  const std::string json = absl::StrCat(
      R"({"train_micro_batch_size_per_gpu": )", kMicro,
      R"(, "gradient_accumulation_steps": )", kAccumulation,
      R"(, "optimizer": {"type": "AdamW", "params": {"lr": 0.002}})",
      R"(, "zero_optimization": {"stage": )", zero_stage,
      R"(}, "pipeline": {"stages": )", kStages, R"(, "schedule": ")", schedule,
      R"("}})");
  ZE_ASSIGN_OR_RETURN(
      std::unique_ptr<engine::Engine> engine,
      engine::Initialize(std::shared_ptr<nn::LossModel>(std::move(model)), json,
                         world));
  const int replicas = engine->communicator().world_size();
  const int replica = engine->communicator().rank();
  Trained trained;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<std::vector<int32_t>> tokens(kAccumulation),
        targets(kAccumulation);
    std::vector<std::pair<Tensor, Tensor>> batches;
    for (int m = 0; m < kAccumulation; ++m) {
      tokens[m].resize(kMicro * enginetest::kSeqLen);
      targets[m].resize(kMicro * enginetest::kSeqLen);
      for (int i = 0; i < kMicro; ++i) {
        const int64_t sample =
            ((int64_t{step} * kAccumulation + m) * replicas + replica) *
                kMicro +
            i;
        enginetest::FillSample(sample, &tokens[m][i * enginetest::kSeqLen],
                               &targets[m][i * enginetest::kSeqLen]);
      }
      batches.emplace_back(
          Tensor::Wrap(tokens[m].data(), {kMicro, enginetest::kSeqLen},
                       DType::kI32, Device::Cpu()),
          Tensor::Wrap(targets[m].data(), {kMicro, enginetest::kSeqLen},
                       DType::kI32, Device::Cpu()));
    }
    ZE_ASSIGN_OR_RETURN(engine::StepReport report, engine->TrainBatch(batches));
    trained.losses.push_back(report.loss);
  }
  for (const std::string &name : engine->ParameterNames()) {
    ZE_ASSIGN_OR_RETURN(trained.weights[name],
                        engine->GatherMasterWeights(name));
  }
  return trained;
}

TEST(NcclPipeline, TwoStagesTrainAsOverMpi) {
  for (const char *schedule : {"1f1b", "gpipe", "zb_h1"}) {
    for (int zero_stage : {1, 3}) {
      SCOPED_TRACE(testing::Message() << schedule << ", ZeRO " << zero_stage
                                      << ", rank " << g_nccl->rank());
      absl::StatusOr<Trained> over_nccl =
          TrainPipeline(g_nccl, schedule, zero_stage);
      ASSERT_TRUE(over_nccl.ok()) << over_nccl.status();
      absl::StatusOr<Trained> over_mpi =
          TrainPipeline(g_mpi, schedule, zero_stage);
      ASSERT_TRUE(over_mpi.ok()) << over_mpi.status();
      ASSERT_FALSE(over_nccl->weights.empty());
      // Bit for bit at 2 ranks (no data-parallel sums); at 4, NCCL's and
      // MPI's 2-rank sums may round apart.
      const double tolerance = g_nccl->world_size() == 2 ? 0.0 : 1e-6;
      enginetest::ExpectRunsClose(over_nccl->losses, over_nccl->weights,
                                  over_mpi->losses, over_mpi->weights,
                                  tolerance);
    }
  }
}

// The interleaved schedule relies on eager sends (pipeline::
// CheckBlockingMessages): refused over nccl by name on every rank, not hung.
TEST(NcclPipeline, InterleavedIsRefusedByName) {
  const int stages = 2;
  const nn::GptConfig config = enginetest::SmallGpt(16, 3);
  absl::StatusOr<pipeline::PipelineLayout> layout =
      pipeline::PipelineLayout::Create(g_nccl->world_size(), stages,
                                       "pipeline.stages");
  ASSERT_TRUE(layout.ok());
  absl::StatusOr<std::vector<pipeline::LayerRange>> ranges =
      pipeline::PartitionLayers(config.PipelineLayerWeights(), stages * 2,
                                "parameters");
  ASSERT_TRUE(ranges.ok()) << ranges.status();
  std::vector<std::unique_ptr<nn::LossModel>> chunks;
  for (int c = 0; c < 2; ++c) {
    const pipeline::LayerRange mine =
        (*ranges)[layout->StageOf(g_nccl->rank()) + c * stages];
    nn::GptOptions options;
    options.seed = 1234;
    options.device = g_nccl->device();
    options.first_layer = mine.first;
    options.last_layer = mine.last;
    absl::StatusOr<std::unique_ptr<nn::GptModel>> chunk =
        nn::GptModel::Create(config, options);
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    chunks.push_back(std::move(*chunk));
  }
  absl::StatusOr<std::unique_ptr<nn::InterleavedStages>> model =
      nn::InterleavedStages::Create(std::move(chunks));
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<std::unique_ptr<engine::Engine>> engine = engine::Initialize(
      std::shared_ptr<nn::LossModel>(std::move(*model)),
      R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
          "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
          "zero_optimization": {"stage": 1},
          "pipeline": {"stages": 2, "schedule": "interleaved_1f1b",
                       "stages_per_rank": 2}})",
      g_nccl);
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("sends wait for their receiver"),
            std::string::npos)
      << engine.status();
}

}  // namespace
}  // namespace ze

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ze::comm::CommOptions options;
  options.device = "cuda";
  options.backend = "nccl";
  absl::StatusOr<std::unique_ptr<ze::comm::Communicator>> nccl =
      ze::comm::CreateCommunicator(options);
  if (!nccl.ok()) {
    // The wrapper skips machines with fewer than 2 GPUs before starting
    // this; here a failure is a failure.
    std::fprintf(stderr, "CreateCommunicator(nccl): %s\n",
                 nccl.status().ToString().c_str());
    return 1;
  }
  options.backend = "mpi";
  absl::StatusOr<std::unique_ptr<ze::comm::Communicator>> mpi =
      ze::comm::CreateCommunicator(options);
  if (!mpi.ok()) {
    std::fprintf(stderr, "CreateCommunicator(mpi): %s\n",
                 mpi.status().ToString().c_str());
    return 1;
  }
  ze::g_nccl = std::move(*nccl);
  ze::g_mpi = std::move(*mpi);
  absl::StatusOr<ze::Stream> stream = ze::Stream::Create(ze::g_nccl->device());
  ZE_CHECK_OK(stream.status());
  ze::g_stream = &*stream;
  std::printf("rank %d of %d: nccl and mpi on %s\n", ze::g_nccl->rank(),
              ze::g_nccl->world_size(),
              ze::g_nccl->device().ToString().c_str());
  const int result = RUN_ALL_TESTS();
  // Every rank finishes before anyone tears MPI down.
  ZE_CHECK_OK(ze::g_mpi->Barrier());
  ze::g_nccl.reset();
  ze::g_mpi.reset();
  return result;
}
