// Multi-rank collective tests, run by mpirun (see BUILD.bazel): every rank
// runs the same gtest cases on one communicator and checks exact values.
//
//   collectives_mpi_test --device=cpu|cuda --backend=auto|mpi|nccl
//
// Inputs are small integers, so sums over up to 4 ranks are exact in bf16
// and f16, and every expected value is computed here independently: the
// reduction in f32, rounded once to the dtype. Only NCCL's average (which
// may scale before summing) gets a tolerance.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/collective_test_values.h"
#include "comm/equal_slices.h"
#include "comm/factory.h"
#include "core/ops.h"
#include "core/status.h"
#include "gtest/gtest.h"

namespace ze {
namespace comm {
namespace {

Communicator *g_comm = nullptr;
Stream *g_stream = nullptr;
std::string g_backend_flag = "auto";

const DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kF16};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin,
                         ReduceOp::kAverage};

float Value(int r, int64_t i) { return CollectiveTestValue(r, i); }

// The reduction of Value(r, i) over all ranks, rounded once.
float Expected(ReduceOp op, DType dtype, int64_t i) {
  return ExpectedReduction(op, dtype, g_comm->world_size(), i);
}

float Tolerance(ReduceOp op, float expected) {
  if (op == ReduceOp::kAverage &&
      std::string(g_comm->backend_name()) == "nccl") {
    return 1e-2f * std::max(1.0f, std::fabs(expected));
  }
  return 0.0f;
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

std::vector<float> RankValues(int r, int64_t offset, int64_t count) {
  std::vector<float> values(count);
  for (int64_t i = 0; i < count; ++i) values[i] = Value(r, offset + i);
  return values;
}

std::string Label(DType dtype, ReduceOp op, int64_t count, bool in_place) {
  return std::string(DTypeName(dtype)) + " " + ReduceOpName(op) + " count " +
         std::to_string(count) + (in_place ? " in place" : " out of place") +
         " rank " + std::to_string(g_comm->rank());
}

TEST(Collectives, AllReduceEveryDTypeOpSizeAndPlacement) {
  const int n = g_comm->world_size();
  for (DType dtype : kDTypes) {
    for (ReduceOp op : kOps) {
      for (int64_t count : {int64_t{1}, int64_t{53}, int64_t{7 * n + 1}}) {
        for (bool in_place : {false, true}) {
          Tensor input = Make(RankValues(g_comm->rank(), 0, count), dtype);
          Tensor output =
              in_place ? input : Make(std::vector<float>(count, 99), dtype);
          absl::StatusOr<Work> work =
              g_comm->AllReduce(input, output, op, *g_stream);
          ASSERT_TRUE(work.ok()) << work.status();
          ASSERT_TRUE(work->Wait().ok());
          const std::vector<float> got = Read(output);
          for (int64_t i = 0; i < count; ++i) {
            const float want = Expected(op, dtype, i);
            ASSERT_NEAR(got[i], want, Tolerance(op, want))
                << Label(dtype, op, count, in_place) << " element " << i;
          }
          if (!in_place) {
            EXPECT_EQ(Read(input), RankValues(g_comm->rank(), 0, count))
                << "input changed: " << Label(dtype, op, count, in_place);
          }
        }
      }
    }
  }
}

TEST(Collectives, ReduceScatterEveryDTypeOpSizeAndPlacement) {
  const int n = g_comm->world_size();
  const int me = g_comm->rank();
  for (DType dtype : kDTypes) {
    for (ReduceOp op : kOps) {
      for (int64_t count : {int64_t{1}, int64_t{18}}) {
        for (bool in_place : {false, true}) {
          Tensor input = Make(RankValues(me, 0, n * count), dtype);
          Tensor output = in_place ? input.Slice(me * count, count)
                                   : Make(std::vector<float>(count, 99), dtype);
          absl::StatusOr<Work> work =
              g_comm->ReduceScatter(input, output, op, *g_stream);
          ASSERT_TRUE(work.ok()) << work.status();
          ASSERT_TRUE(work->StreamWait(*g_stream).ok());
          const std::vector<float> got = Read(output);
          for (int64_t i = 0; i < count; ++i) {
            const float want = Expected(op, dtype, me * count + i);
            ASSERT_NEAR(got[i], want, Tolerance(op, want))
                << Label(dtype, op, count, in_place) << " element " << i;
          }
        }
      }
    }
  }
}

TEST(Collectives, AllGatherEveryDTypeSizeAndPlacement) {
  const int n = g_comm->world_size();
  const int me = g_comm->rank();
  for (DType dtype : kDTypes) {
    for (int64_t count : {int64_t{1}, int64_t{18}}) {
      for (bool in_place : {false, true}) {
        std::vector<float> initial(n * count, 99);
        if (in_place) {
          for (int64_t i = 0; i < count; ++i)
            initial[me * count + i] = Value(me, i);
        }
        Tensor output = Make(initial, dtype);
        Tensor input = in_place ? output.Slice(me * count, count)
                                : Make(RankValues(me, 0, count), dtype);
        absl::StatusOr<Work> work = g_comm->AllGather(input, output, *g_stream);
        ASSERT_TRUE(work.ok()) << work.status();
        ASSERT_TRUE(work->Wait().ok());
        const std::vector<float> got = Read(output);
        for (int r = 0; r < n; ++r) {
          for (int64_t i = 0; i < count; ++i) {
            ASSERT_EQ(got[r * count + i], Value(r, i))
                << Label(dtype, ReduceOp::kSum, count, in_place)
                << " from rank " << r << " element " << i;
          }
        }
      }
    }
  }
}

TEST(Collectives, BroadcastFromEveryRoot) {
  const int n = g_comm->world_size();
  for (DType dtype : kDTypes) {
    for (int root = 0; root < n; ++root) {
      Tensor tensor = g_comm->rank() == root
                          ? Make(RankValues(root, 0, 53), dtype)
                          : Make(std::vector<float>(53, 0), dtype);
      absl::StatusOr<Work> work = g_comm->Broadcast(tensor, root, *g_stream);
      ASSERT_TRUE(work.ok()) << work.status();
      ASSERT_TRUE(work->Wait().ok());
      EXPECT_EQ(Read(tensor), RankValues(root, 0, 53))
          << DTypeName(dtype) << " root " << root;
    }
  }
}

// Totals that do not divide by the world size, through padded equal slices.
TEST(Collectives, UnevenTotalsThroughEqualSlices) {
  const int n = g_comm->world_size();
  const int me = g_comm->rank();
  for (DType dtype : kDTypes) {
    for (int64_t total : {int64_t{53}, int64_t{5}, int64_t{2}}) {
      const EqualSlices slices = EqualSlices::Make(total, n);
      // Reduce-scatter of a padded buffer: padding stays zero.
      std::vector<float> padded(slices.padded_total(), 0);
      for (int64_t i = 0; i < total; ++i) padded[i] = Value(me, i);
      Tensor input = Make(padded, dtype);
      Tensor shard = Make(std::vector<float>(slices.slice, 99), dtype);
      ASSERT_TRUE(g_comm->ReduceScatter(input, shard, ReduceOp::kSum, *g_stream)
                      ->Wait()
                      .ok());
      std::vector<float> got = Read(shard);
      for (int64_t i = 0; i < slices.slice; ++i) {
        const float want =
            i < slices.valid_count(me)
                ? Expected(ReduceOp::kSum, dtype, slices.offset(me) + i)
                : 0.0f;
        ASSERT_EQ(got[i], want) << DTypeName(dtype) << " total " << total
                                << " rank " << me << " element " << i;
      }
      // All-gather of each rank's slice back into the padded whole.
      Tensor whole = Make(std::vector<float>(slices.padded_total(), 99), dtype);
      ASSERT_TRUE(g_comm->AllGather(shard, whole, *g_stream)->Wait().ok());
      got = Read(whole);
      for (int64_t i = 0; i < total; ++i) {
        ASSERT_EQ(got[i], Expected(ReduceOp::kSum, dtype, i))
            << DTypeName(dtype) << " total " << total << " element " << i;
      }
      for (int64_t i = total; i < slices.padded_total(); ++i) {
        ASSERT_EQ(got[i], 0.0f) << "padding element " << i;
      }
    }
  }
}

TEST(Collectives, CoalescedGroupOfMixedOperations) {
  const int n = g_comm->world_size();
  const int me = g_comm->rank();
  Tensor reduce_in = Make(RankValues(me, 0, 53), DType::kBF16);
  Tensor reduce_out = Make(std::vector<float>(53, 99), DType::kBF16);
  Tensor scatter_in = Make(RankValues(me, 0, n * 5), DType::kF16);
  Tensor scatter_out = scatter_in.Slice(me * 5, 5);
  Tensor gather_in = Make(RankValues(me, 0, 3), DType::kF32);
  Tensor gather_out = Make(std::vector<float>(n * 3, 99), DType::kF32);
  Tensor broadcast =
      Make(me == n - 1 ? RankValues(me, 0, 4) : std::vector<float>(4, 0),
           DType::kF32);
  const uint64_t first = g_comm->next_sequence_number();
  absl::StatusOr<Work> work = g_comm->Coalesced(
      {CollectiveOp::AllReduce(reduce_in, reduce_out, ReduceOp::kMax),
       CollectiveOp::ReduceScatter(scatter_in, scatter_out, ReduceOp::kSum),
       CollectiveOp::AllGather(gather_in, gather_out),
       CollectiveOp::Broadcast(broadcast, n - 1)},
      *g_stream);
  ASSERT_TRUE(work.ok()) << work.status();
  EXPECT_EQ(work->sequence_number(), first);
  EXPECT_EQ(g_comm->next_sequence_number(), first + 4);
  ASSERT_TRUE(work->Wait().ok());
  std::vector<float> got = Read(reduce_out);
  for (int64_t i = 0; i < 53; ++i) {
    ASSERT_EQ(got[i], Expected(ReduceOp::kMax, DType::kBF16, i)) << i;
  }
  got = Read(scatter_out);
  for (int64_t i = 0; i < 5; ++i) {
    ASSERT_EQ(got[i], Expected(ReduceOp::kSum, DType::kF16, me * 5 + i)) << i;
  }
  got = Read(gather_out);
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < 3; ++i) ASSERT_EQ(got[r * 3 + i], Value(r, i));
  }
  EXPECT_EQ(Read(broadcast), RankValues(n - 1, 0, 4));
}

TEST(Collectives, OutstandingWorkWaitedOutOfOrder) {
  std::vector<Tensor> tensors;
  std::vector<Work> works;
  for (int k = 0; k < 6; ++k) {
    tensors.push_back(Make(RankValues(g_comm->rank(), k, 17), DType::kF32));
    absl::StatusOr<Work> work = g_comm->AllReduce(
        tensors.back(), tensors.back(), ReduceOp::kSum, *g_stream);
    ASSERT_TRUE(work.ok()) << work.status();
    works.push_back(*work);
  }
  for (int k = 5; k >= 0; --k) {
    ASSERT_TRUE(works[k].Wait().ok());
    const std::vector<float> got = Read(tensors[k]);
    for (int64_t i = 0; i < 17; ++i) {
      ASSERT_EQ(got[i], Expected(ReduceOp::kSum, DType::kF32, k + i));
    }
  }
  // Polling a completed Work says so.
  absl::StatusOr<bool> done = works[0].Poll();
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);
}

TEST(Collectives, EveryRankAgreesOnSequenceNumbersAfterBarrier) {
  ASSERT_TRUE(g_comm->Barrier().ok());
  const int n = g_comm->world_size();
  // Sequence numbers stay far below 2^24, so f32 carries them exactly.
  const float mine = static_cast<float>(g_comm->next_sequence_number());
  Tensor all = Make(std::vector<float>(n, 0), DType::kF32);
  ASSERT_TRUE(g_comm->AllGather(Make({mine}, DType::kF32), all, *g_stream)
                  ->Wait()
                  .ok());
  for (float other : Read(all)) EXPECT_EQ(other, mine);
  EXPECT_NE(g_comm->DumpRecentCollectives().find("completed"),
            std::string::npos);
  EXPECT_EQ(g_comm->DumpRecentCollectives().find("PENDING"), std::string::npos)
      << g_comm->DumpRecentCollectives();
}

// Point-to-point around a ring: each rank sends two messages of every dtype
// to the next rank and receives from the previous one; messages between two
// ranks arrive in issue order. The receive is waited on before the send, as
// a pipeline does (sends stay in flight while it waits for its input).
TEST(PointToPoint, RingInIssueOrderEveryDType) {
  if (!g_comm->supports_point_to_point()) {
    absl::StatusOr<Work> refused = g_comm->Send(
        Make({1}, DType::kF32), (g_comm->rank() + 1) % 2, *g_stream);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnimplemented);
    GTEST_SKIP() << g_comm->backend_name() << " has no point-to-point";
  }
  if (g_comm->world_size() < 2) GTEST_SKIP() << "no peer in a world of one";
  const int n = g_comm->world_size();
  const int next = (g_comm->rank() + 1) % n;
  const int previous = (g_comm->rank() + n - 1) % n;
  // Where a send blocks until received (nccl), every rank sending first
  // would deadlock: odd ranks receive first there.
  const bool receive_first =
      g_comm->sends_wait_for_receiver() && g_comm->rank() % 2 == 1;
  for (DType dtype : kDTypes) {
    std::vector<Tensor> sent, received;
    std::vector<Work> sends, receives;
    for (int k = 0; k < 2; ++k) {
      sent.push_back(Make(RankValues(g_comm->rank(), 10 * k, 37), dtype));
      received.push_back(Make(std::vector<float>(37, -1), dtype));
    }
    auto post_sends = [&]() {
      for (int k = 0; k < 2; ++k) {
        absl::StatusOr<Work> send = g_comm->Send(sent[k], next, *g_stream);
        ASSERT_TRUE(send.ok()) << send.status();
        sends.push_back(*send);
      }
    };
    if (!receive_first) post_sends();
    for (int k = 0; k < 2; ++k) {
      absl::StatusOr<Work> receive =
          g_comm->Recv(received[k], previous, *g_stream);
      ASSERT_TRUE(receive.ok()) << receive.status();
      receives.push_back(*receive);
    }
    if (receive_first) post_sends();
    for (int k = 1; k >= 0; --k) {
      ASSERT_TRUE(receives[k].Wait().ok());
      EXPECT_EQ(Read(received[k]),
                Read(Make(RankValues(previous, 10 * k, 37), dtype)))
          << DTypeName(dtype) << " message " << k;
    }
    for (Work &send : sends) ASSERT_TRUE(send.Wait().ok());
  }
  // A send and a receive issued as one group (a pipeline's "send my output,
  // receive the next input").
  Tensor out = Make(RankValues(g_comm->rank(), 5, 3), DType::kF32);
  Tensor in = Make({0, 0, 0}, DType::kF32);
  absl::StatusOr<Work> both = g_comm->Coalesced(
      {CollectiveOp::Send(out, next), CollectiveOp::Recv(in, previous)},
      *g_stream);
  ASSERT_TRUE(both.ok()) << both.status();
  ASSERT_TRUE(both->Wait().ok());
  EXPECT_EQ(Read(in), RankValues(previous, 5, 3));
  EXPECT_NE(g_comm->DumpRecentCollectives().find("recv(from "),
            std::string::npos);
}

TEST(PointToPoint, BadPeersAreRefused) {
  if (!g_comm->supports_point_to_point()) GTEST_SKIP();
  Tensor t = Make({1}, DType::kF32);
  EXPECT_EQ(g_comm->Send(t, g_comm->rank(), *g_stream).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g_comm->Recv(t, g_comm->world_size(), *g_stream).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Two groups by rank parity, ranked by descending world rank: each group's
// collectives and point-to-point stay within it.
TEST(Split, GroupsByColorRankedByKey) {
  absl::StatusOr<std::unique_ptr<Communicator>> group =
      g_comm->Split(g_comm->rank() % 2, -g_comm->rank());
  if (!group.ok() &&
      group.status().code() == absl::StatusCode::kUnimplemented) {
    GTEST_SKIP() << group.status();
  }
  ASSERT_TRUE(group.ok()) << group.status();
  const int n = g_comm->world_size();
  std::vector<int> members;  // world ranks of my group, by descending rank
  for (int r = n - 1; r >= 0; --r) {
    if (r % 2 == g_comm->rank() % 2) members.push_back(r);
  }
  ASSERT_EQ((*group)->world_size(), static_cast<int>(members.size()));
  ASSERT_EQ(members[(*group)->rank()], g_comm->rank());
  // Sum of the members' world ranks.
  float expected = 0;
  for (int r : members) expected += static_cast<float>(r);
  Tensor sum = Make({static_cast<float>(g_comm->rank())}, DType::kF32);
  ASSERT_TRUE(
      (*group)->AllReduce(sum, sum, ReduceOp::kSum, *g_stream)->Wait().ok());
  EXPECT_EQ(Read(sum)[0], expected);
  if ((*group)->world_size() > 1) {
    const int size = (*group)->world_size();
    const int next = ((*group)->rank() + 1) % size;
    const int previous = ((*group)->rank() + size - 1) % size;
    Tensor out = Make({static_cast<float>(g_comm->rank())}, DType::kF32);
    Tensor in = Make({-1}, DType::kF32);
    // One group: every rank sends before it receives (blocking sends,
    // nccl, need the group; mpi takes it too).
    absl::StatusOr<Work> both = (*group)->Coalesced(
        {CollectiveOp::Send(out, next), CollectiveOp::Recv(in, previous)},
        *g_stream);
    ASSERT_TRUE(both.ok()) << both.status();
    ASSERT_TRUE(both->Wait().ok());
    EXPECT_EQ(Read(in)[0], static_cast<float>(members[previous]));
  }
  // The parent still works, with its own sequence numbers.
  ASSERT_TRUE(g_comm->Barrier().ok());
  EXPECT_EQ(g_comm->Split(-1, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A group of one rank (a pipeline's data-parallel group at one replica):
// every collective leaves its input, in place or copied, in every dtype,
// and the group keeps the parent's backend.
TEST(Split, GroupsOfOneRankCopyTheirInputs) {
  absl::StatusOr<std::unique_ptr<Communicator>> alone =
      g_comm->Split(g_comm->rank(), 0);
  if (!alone.ok() &&
      alone.status().code() == absl::StatusCode::kUnimplemented) {
    GTEST_SKIP() << alone.status();
  }
  ASSERT_TRUE(alone.ok()) << alone.status();
  Communicator &group = **alone;
  ASSERT_EQ(group.world_size(), 1);
  EXPECT_STREQ(group.backend_name(), g_comm->backend_name());
  const float r = static_cast<float>(g_comm->rank());
  for (DType dtype : kDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
      Tensor in_place = Make({r + 1.5f, -2.0f, 3.25f}, dtype);
      ASSERT_TRUE(
          group.AllReduce(in_place, in_place, op, *g_stream)->Wait().ok());
      EXPECT_EQ(Read(in_place), (std::vector<float>{r + 1.5f, -2.0f, 3.25f}));
      Tensor input = Make({r, 7.0f}, dtype);
      Tensor output = Make({0.0f, 0.0f}, dtype);
      ASSERT_TRUE(group.AllReduce(input, output, op, *g_stream)->Wait().ok());
      EXPECT_EQ(Read(output), (std::vector<float>{r, 7.0f}));
      Tensor scattered = Make({0.0f, 0.0f}, dtype);
      ASSERT_TRUE(
          group.ReduceScatter(input, scattered, op, *g_stream)->Wait().ok());
      EXPECT_EQ(Read(scattered), (std::vector<float>{r, 7.0f}));
    }
    Tensor input = Make({r, 0.5f}, dtype);
    Tensor gathered = Make({0.0f, 0.0f}, dtype);
    ASSERT_TRUE(group.AllGather(input, gathered, *g_stream)->Wait().ok());
    EXPECT_EQ(Read(gathered), (std::vector<float>{r, 0.5f}));
    ASSERT_TRUE(group.Broadcast(input, 0, *g_stream)->Wait().ok());
    EXPECT_EQ(Read(input), (std::vector<float>{r, 0.5f}));
  }
  ASSERT_TRUE(group.Barrier().ok());
  ASSERT_TRUE(g_comm->Barrier().ok());
}

}  // namespace
}  // namespace comm
}  // namespace ze

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ze::comm::CommOptions options;
  options.device = "cpu";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--device=", 0) == 0) options.device = arg.substr(9);
    if (arg.rfind("--backend=", 0) == 0) options.backend = arg.substr(10);
  }
  absl::StatusOr<std::unique_ptr<ze::comm::Communicator>> comm =
      ze::comm::CreateCommunicator(options);
  if (!comm.ok()) {
    // No skipping here: a launch NCCL cannot serve (more ranks than GPUs) is
    // the wrappers' to skip before starting this (run_nccl_all_gpus.sh).
    std::fprintf(stderr, "CreateCommunicator: %s\n",
                 comm.status().ToString().c_str());
    return 1;
  }
  ze::Stream stream;
  if ((*comm)->device().is_cuda() && options.device != "cpu") {
    absl::StatusOr<ze::Stream> created = ze::Stream::Create((*comm)->device());
    ZE_CHECK_OK(created.status());
    stream = *created;
  }
  ze::comm::g_comm = comm->get();
  ze::comm::g_stream = &stream;
  std::printf("rank %d of %d: backend %s, tensors on %s\n", (*comm)->rank(),
              (*comm)->world_size(), (*comm)->backend_name(),
              stream.device().ToString().c_str());
  const int result = RUN_ALL_TESTS();
  // Everyone finishes before anyone tears down MPI.
  ZE_CHECK_OK((*comm)->Barrier());
  comm->reset();
  return result;
}
