// HostUpdate against one CpuOptimizer::Step over the same packed buffers,
// bit for bit: the chunk pipeline, an early start, a delayed update, NVMe
// chunks, and a failing worker. host_update_test runs it on the CPU (the
// "device" is the host: copies are immediate and events complete);
// host_update_cuda_test (gpu-tagged, the same source) with the gradients
// and weights on CUDA device 0, pinned staging and the transfer streams.
#include "offload/host_update.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/allocator.h"
#include "core/dtype.h"
#include "core/ops.h"
#include "gtest/gtest.h"

namespace ze {
namespace offload {
namespace {

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

constexpr int64_t kChunk = 256;
// Two slots (an odd size: a partial last chunk), packed back to back.
const std::vector<int64_t> kSizes = {1000, 777};
constexpr int64_t kTotal = 1777;

OptimizerOptions Adam() {
  OptimizerOptions options;
  options.type = OptimizerType::kAdamW;
  options.weight_decay = 0.01;
  return options;
}

CpuExecutionOptions TwoThreads() {
  CpuExecutionOptions execution;
  execution.num_threads = 2;
  execution.pin_threads = false;
  return execution;
}

StepArgs Args(double lr = 0.01, float grad_scale = 0.5f) {
  StepArgs args;
  args.lr = lr;
  args.grad_scale = grad_scale;
  return args;
}

std::vector<float> Ramp(int64_t n, float base, float step) {
  std::vector<float> values(n);
  for (int64_t i = 0; i < n; ++i) {
    values[i] = base + step * static_cast<float>((i * 37) % 101 - 50);
  }
  return values;
}

// Where the slots' gradients and weights live.
Device ModelDevice() {
#ifdef ZE_HOST_UPDATE_TEST_CUDA
  return Device::Cuda(0);
#else
  return Device::Cpu();
#endif
}

// The caller's stream: what the update orders itself against.
Stream TestStream() { return Stream::Default(ModelDevice()); }

Tensor Make(const std::vector<float>& values, DType dtype,
            const Device& device = Device::Cpu()) {
  absl::StatusOr<Tensor> tensor =
      FromHostFloats(values, {static_cast<int64_t>(values.size())}, dtype,
                     device, TestStream());
  EXPECT_TRUE(tensor.ok()) << tensor.status();
  return *tensor;
}

// Host memory the device copies to and from: pinned with CUDA.
Tensor Staging(int64_t elements) {
  absl::StatusOr<Tensor> tensor =
      Tensor::Zeros({elements}, DType::kBF16, Device::Cpu(),
                    ModelDevice().is_cuda() ? PinnedHostMemory() : nullptr);
  EXPECT_TRUE(tensor.ok()) << tensor.status();
  return *tensor;
}

std::vector<float> Values(const Tensor& tensor) {
  absl::StatusOr<std::vector<float>> values =
      ToHostFloats(tensor, TestStream());
  EXPECT_TRUE(values.ok()) << values.status();
  return *values;
}

// Bit for bit (a NaN equals itself).
void ExpectSameBits(const std::vector<float>& a, const std::vector<float>& b,
                    const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
      << what;
}

// What `steps` whole-buffer steps of one CpuOptimizer give: master and the
// bf16 weights.
struct Expected {
  std::vector<float> master;
  std::vector<float> weights;
};
Expected Reference(int steps, float grad_scale = 0.5f) {
  absl::StatusOr<std::unique_ptr<CpuOptimizer>> optimizer =
      CpuOptimizer::Create(Adam(), kTotal, TwoThreads());
  EXPECT_TRUE(optimizer.ok()) << optimizer.status();
  Tensor master = Make(Ramp(kTotal, 0.25f, 0.01f), DType::kF32);
  Tensor gradients = Make(Ramp(kTotal, 0.0f, 0.003f), DType::kBF16);
  Tensor weights = Make(std::vector<float>(kTotal, 0.0f), DType::kBF16);
  for (int step = 0; step < steps; ++step) {
    EXPECT_TRUE((*optimizer)
                    ->Step(master.data_as<float>(), gradients.data(),
                           DType::kBF16, Args(0.01, grad_scale), weights.data(),
                           DType::kBF16)
                    .ok());
  }
  return Expected{Values(master), Values(weights)};
}

// The packed buffers of two slots and the update over them. Slot s's
// forward_position: 1 - s (the forward reads slot 1 first, as stages 0-2
// read their last bucket first).
struct Rig {
  HostUpdateOptions options;
  std::unique_ptr<CpuOptimizer> optimizer;
  std::unique_ptr<SwappedState> swapped;
  Tensor gradients, staging, master, weights, delayed;
  std::unique_ptr<HostUpdate> update;
};

std::unique_ptr<Rig> MakeRig(bool delayed, bool nvme,
                             int64_t fail_write_request = -1,
                             int64_t speculation_elements = 0, int threads = 2,
                             bool bf16_ties_away = false,
                             std::vector<int> device_slots = {}) {
  auto rig = std::make_unique<Rig>();
  rig->options.device = ModelDevice();
  rig->options.bf16_ties_away = bf16_ties_away;
  rig->options.chunk_elements = kChunk;
  rig->options.speculation_elements = speculation_elements;
  rig->options.delayed_update = delayed;
  if (!device_slots.empty()) {
    // The CPU's kernel stands in for the device's here (the same
    // arithmetic: zero::RunStepKernelOn); the CUDA pair is zero/'s to test.
    rig->options.device_step = [](const StepCoefficients& coefficients,
                                  const StepBuffers& buffers, const Stream&) {
      RunStepKernel(BestSimdPath(), coefficients, buffers);
      return absl::OkStatus();
    };
  }
  const std::vector<float> initial = Ramp(kTotal, 0.25f, 0.01f);
  absl::StatusOr<std::unique_ptr<CpuOptimizer>> optimizer =
      CpuOptimizer::Create(Adam(), nvme ? 0 : kTotal, [threads] {
        CpuExecutionOptions execution = TwoThreads();
        execution.num_threads = threads;
        return execution;
      }());
  EXPECT_TRUE(optimizer.ok()) << optimizer.status();
  rig->optimizer = std::move(optimizer).value();
  rig->gradients =
      Make(Ramp(kTotal, 0.0f, 0.003f), DType::kBF16, ModelDevice());
  rig->staging = Staging(kTotal);
  rig->weights = Make(initial, DType::kBF16, ModelDevice());
  if (delayed) rig->delayed = Make(initial, DType::kBF16, ModelDevice());
  std::vector<int> first_chunk(kSizes.size(), -1);
  if (nvme) {
    SwappedStateOptions swap;
    swap.nvme.directory = TempDir();
    swap.nvme.block_size = 1 << 20;  // one request per chunk record
    swap.nvme.fail_write_request = fail_write_request;
    swap.file_name = "host_update_test.swp";
    swap.arrays = 3;
    swap.buffer_count = 2;
    std::vector<int64_t> chunks;
    for (size_t s = 0; s < kSizes.size(); ++s) {
      first_chunk[s] = static_cast<int>(chunks.size());
      for (int64_t begin = 0; begin < kSizes[s]; begin += kChunk) {
        chunks.push_back(std::min(kChunk, kSizes[s] - begin));
      }
    }
    absl::StatusOr<std::unique_ptr<SwappedState>> swapped =
        SwappedState::Create(swap, chunks);
    EXPECT_TRUE(swapped.ok()) << swapped.status();
    rig->swapped = std::move(swapped).value();
    int64_t at = 0;
    for (int c = 0; c < rig->swapped->num_chunks(); ++c) {
      EXPECT_TRUE(rig->swapped->Initialize(c, initial.data() + at).ok());
      at += rig->swapped->chunk_elements(c);
    }
  } else {
    rig->master = Make(initial, DType::kF32);
  }
  std::vector<HostUpdateSlot> slots;
  int64_t offset = 0;
  for (size_t s = 0; s < kSizes.size(); ++s) {
    HostUpdateSlot slot;
    slot.gradients = rig->gradients.Slice(offset, kSizes[s]);
    slot.staging = rig->staging.Slice(offset, kSizes[s]);
    if (!nvme) slot.master = rig->master.Slice(offset, kSizes[s]);
    slot.state_offset = offset;
    slot.weights = rig->weights.Slice(offset, kSizes[s]);
    if (delayed) slot.delayed = rig->delayed.Slice(offset, kSizes[s]);
    slot.first_swapped_chunk = first_chunk[s];
    slot.forward_position = 1 - static_cast<int>(s);
    slot.update_on_device = std::find(device_slots.begin(), device_slots.end(),
                                      s) != device_slots.end();
    slots.push_back(slot);
    offset += kSizes[s];
  }
  absl::StatusOr<std::unique_ptr<HostUpdate>> update = HostUpdate::Create(
      rig->options, std::move(slots), rig->optimizer.get(), rig->swapped.get());
  EXPECT_TRUE(update.ok()) << update.status();
  rig->update = std::move(update).value();
  return rig;
}

// The master weights wherever they live.
std::vector<float> Master(const Rig& rig) {
  if (rig.swapped == nullptr) return Values(rig.master);
  std::vector<float> master;
  for (int c = 0; c < rig.swapped->num_chunks(); ++c) {
    std::vector<float> chunk(rig.swapped->chunk_elements(c));
    EXPECT_TRUE(rig.swapped->Read(c, 0, 0, chunk.size(), chunk.data()).ok());
    master.insert(master.end(), chunk.begin(), chunk.end());
  }
  return master;
}

// One step handed over at once, joined.
void Step(Rig& rig) {
  const Stream stream = TestStream();
  absl::StatusOr<InFlightUpdate> in_flight =
      rig.update->Start(Args(), /*begun_early=*/false);
  ASSERT_TRUE(in_flight.ok()) << in_flight.status();
  ASSERT_TRUE(in_flight->Close(stream).ok());
  absl::StatusOr<UpdateJoined> joined = in_flight->Join(stream);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_FALSE(in_flight->active());
}

TEST(HostUpdateTest, ChunkPipelineEqualsOneOptimizerStep) {
  std::unique_ptr<Rig> rig = MakeRig(/*delayed=*/false, /*nvme=*/false);
  for (int step = 1; step <= 2; ++step) {
    Step(*rig);
    const Expected expected = Reference(step);
    ExpectSameBits(Master(*rig), expected.master, "master");
    ExpectSameBits(Values(rig->weights), expected.weights, "weights");
    // Handed over at once: the forward's reading order.
    EXPECT_EQ(rig->update->last_order(), (std::vector<int>{1, 0}));
  }
  EXPECT_EQ(rig->optimizer->step_count(), 2);
  const HostUpdateTimes times = rig->update->times();
  EXPECT_EQ(times.updates, 2);
  EXPECT_GE(times.worker_seconds, times.gradient_wait_seconds);
}

TEST(HostUpdateTest, NvmeChunksEqualOneOptimizerStep) {
  std::unique_ptr<Rig> rig = MakeRig(/*delayed=*/false, /*nvme=*/true);
  EXPECT_FALSE(rig->update->CanBeginEarly());
  for (int step = 1; step <= 2; ++step) {
    Step(*rig);
    const Expected expected = Reference(step);
    ExpectSameBits(Master(*rig), expected.master, "master");
    ExpectSameBits(Values(rig->weights), expected.weights, "weights");
  }
}

// Slots handed over during backward, one by one: the same result as at
// once; until Close the weights are not waited for and Join refuses (it
// would wait for slots that never come).
TEST(HostUpdateTest, EarlyStartEqualsAStepHandedOverAtOnce) {
  std::unique_ptr<Rig> rig = MakeRig(/*delayed=*/false, /*nvme=*/false);
  ASSERT_TRUE(rig->update->CanBeginEarly());
  const Stream stream = TestStream();
  for (int step = 1; step <= 2; ++step) {
    absl::StatusOr<InFlightUpdate> in_flight =
        rig->update->Start(Args(), /*begun_early=*/true);
    ASSERT_TRUE(in_flight.ok()) << in_flight.status();
    EXPECT_TRUE(in_flight->open());
    // Backward finishes slot 0 first (stages 0-2: the last layers).
    ASSERT_TRUE(in_flight->HandOver(0, stream).ok());
    ASSERT_TRUE(in_flight->HandOver(0, stream).ok());           // once only
    ASSERT_TRUE(in_flight->WaitForWeights(1, 0, stream).ok());  // no wait
    absl::StatusOr<UpdateJoined> refused = in_flight->Join(stream);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition)
        << refused.status();
    EXPECT_TRUE(in_flight->active());
    ASSERT_TRUE(in_flight->Close(stream).ok());
    EXPECT_FALSE(in_flight->open());
    // Closed: a wait returns once the slot's first chunk is written.
    ASSERT_TRUE(in_flight->WaitForWeights(1, 0, stream).ok());
    absl::StatusOr<UpdateJoined> joined = in_flight->Join(stream);
    ASSERT_TRUE(joined.ok()) << joined.status();
    const Expected expected = Reference(step);
    ExpectSameBits(Master(*rig), expected.master, "master");
    ExpectSameBits(Values(rig->weights), expected.weights, "weights");
  }
}

// A handle dropped while open (a backward that failed before the step)
// releases its worker instead of hanging, and the next update starts.
TEST(HostUpdateTest, AnOpenUpdateDroppedIsReleased) {
  std::unique_ptr<Rig> rig = MakeRig(/*delayed=*/false, /*nvme=*/false);
  const Stream stream = TestStream();
  {
    absl::StatusOr<InFlightUpdate> in_flight =
        rig->update->Start(Args(), /*begun_early=*/true);
    ASSERT_TRUE(in_flight.ok()) << in_flight.status();
    absl::StatusOr<InFlightUpdate> second =
        rig->update->Start(Args(), /*begun_early=*/false);
    EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  }
  absl::StatusOr<InFlightUpdate> again =
      rig->update->Start(Args(), /*begun_early=*/false);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE(again->Close(stream).ok());
  EXPECT_TRUE(again->Join(stream).ok());
}

// Delayed: the worker's uploads go to the second buffer; the weights in use
// change only at Join, to exactly the undelayed result.
TEST(HostUpdateTest, DelayedUpdateReplacesTheWeightsAtJoin) {
  std::unique_ptr<Rig> rig = MakeRig(/*delayed=*/true, /*nvme=*/false);
  EXPECT_FALSE(rig->update->CanBeginEarly());
  const std::vector<float> before = Values(rig->weights);
  const Stream stream = TestStream();
  absl::StatusOr<InFlightUpdate> in_flight =
      rig->update->Start(Args(), /*begun_early=*/false);
  ASSERT_TRUE(in_flight.ok()) << in_flight.status();
  ASSERT_TRUE(in_flight->Close(stream).ok());
  ASSERT_TRUE(in_flight->WaitForWeights(0, 0, stream).ok());  // no wait
  // Let the worker finish (its end counts an update) before looking.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (rig->update->times().updates == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(rig->update->times().updates, 1);
  const Expected expected = Reference(1);
  ExpectSameBits(Values(rig->weights), before, "weights before Join");
  if (!ModelDevice().is_cuda()) {
    // On CUDA the uploads may still be queued on the transfer stream, which
    // only Join orders the caller's stream after.
    ExpectSameBits(Values(rig->delayed), expected.weights, "delayed buffer");
  }
  ASSERT_TRUE(in_flight->Join(stream).ok());
  ExpectSameBits(Values(rig->weights), expected.weights, "weights");
}

// A worker that fails: waits for its weights return at once (not an error
// there), Join returns the error and empties the handle, and the next
// update runs.
TEST(HostUpdateTest, WorkerFailureIsJoinsToReport) {
  std::unique_ptr<Rig> rig = MakeRig(/*delayed=*/false, /*nvme=*/false);
  const Stream stream = TestStream();
  const std::vector<float> master = Master(*rig);
  absl::StatusOr<InFlightUpdate> in_flight =
      rig->update->Start(Args(std::nan("")), /*begun_early=*/false);
  ASSERT_TRUE(in_flight.ok()) << in_flight.status();
  ASSERT_TRUE(in_flight->Close(stream).ok());
  EXPECT_TRUE(in_flight->WaitForWeights(0, 999, stream).ok());
  absl::StatusOr<UpdateJoined> joined = in_flight->Join(stream);
  EXPECT_EQ(joined.status().code(), absl::StatusCode::kInvalidArgument)
      << joined.status();
  EXPECT_NE(joined.status().message().find("lr"), std::string::npos)
      << joined.status();
  EXPECT_FALSE(in_flight->active());
  ExpectSameBits(Master(*rig), master, "master after a refused step");
  Step(*rig);
  ExpectSameBits(Master(*rig), Reference(1).master, "master");
}

// NVMe: a write that fails mid-step names the file and the operation.
TEST(HostUpdateTest, NvmeWriteFailureIsJoinsToReport) {
  // Initialisation writes one request per chunk first; fail the step's
  // third write-back.
  int64_t chunks = 0;
  for (int64_t size : kSizes) chunks += (size + kChunk - 1) / kChunk;
  std::unique_ptr<Rig> rig = MakeRig(/*delayed=*/false, /*nvme=*/true,
                                     /*fail_write_request=*/chunks + 2);
  const Stream stream = TestStream();
  absl::StatusOr<InFlightUpdate> in_flight =
      rig->update->Start(Args(), /*begun_early=*/false);
  ASSERT_TRUE(in_flight.ok()) << in_flight.status();
  ASSERT_TRUE(in_flight->Close(stream).ok());
  absl::StatusOr<UpdateJoined> joined = in_flight->Join(stream);
  EXPECT_EQ(joined.status().code(), absl::StatusCode::kInternal)
      << joined.status();
  EXPECT_NE(joined.status().message().find("host_update_test.swp"),
            std::string::npos)
      << joined.status();
  EXPECT_NE(joined.status().message().find("write"), std::string::npos)
      << joined.status();
}

// Waits (at most 30 s) until the worker's speculation report says `done`.
void AwaitSpeculation(
    const HostUpdate& update,
    const std::function<bool(const SpeculationReport&)>& done) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!done(update.last_speculation()) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(done(update.last_speculation()));
}

constexpr int64_t kAllChunks = 8;  // 1000 and 777 in chunks of 256

// A speculative update begun early on `rig`, `slots` handed over, once
// `until` holds of its report (AwaitSpeculation).
absl::StatusOr<InFlightUpdate> StartSpeculating(
    Rig& rig, const std::vector<int>& slots,
    const std::function<bool(const SpeculationReport&)>& until) {
  const Stream stream = TestStream();
  absl::StatusOr<InFlightUpdate> in_flight =
      rig.update->Start(Args(), /*begun_early=*/true, Speculation());
  if (!in_flight.ok()) return in_flight.status();
  for (int slot : slots) {
    absl::Status handed = in_flight->HandOver(slot, stream);
    if (!handed.ok()) return handed;
  }
  AwaitSpeculation(*rig.update, until);
  return in_flight;
}

// Speculated during backward, then committed: bit for bit the update
// handed over at once (the speculative arguments were the step's).
TEST(HostUpdateTest, CommittedSpeculationEqualsTheExactUpdate) {
  std::unique_ptr<Rig> rig = MakeRig(false, false, -1, kTotal);
  ASSERT_TRUE(rig->update->CanSpeculate());
  const Stream stream = TestStream();
  for (int step = 1; step <= 2; ++step) {
    absl::StatusOr<InFlightUpdate> in_flight =
        rig->update->Start(Args(), /*begun_early=*/true, Speculation());
    ASSERT_TRUE(in_flight.ok()) << in_flight.status();
    EXPECT_TRUE(in_flight->speculating());
    ASSERT_TRUE(in_flight->HandOver(0, stream).ok());
    AwaitSpeculation(*rig->update,
                     [](const SpeculationReport& r) { return r.chunks == 4; });
    ASSERT_TRUE(in_flight->Commit().ok());
    EXPECT_FALSE(in_flight->speculating());
    EXPECT_FALSE(in_flight->Commit().ok());  // decided once
    ASSERT_TRUE(in_flight->Close(stream).ok());
    ASSERT_TRUE(in_flight->Join(stream).ok());
    const SpeculationReport report = rig->update->last_speculation();
    EXPECT_TRUE(report.committed);
    EXPECT_EQ(report.chunks, 4);  // slot 0; slot 1 came after the decision
    EXPECT_EQ(report.elements, 1000);
    const Expected expected = Reference(step);
    ExpectSameBits(Master(*rig), expected.master, "master");
    ExpectSameBits(Values(rig->weights), expected.weights, "weights");
  }
  EXPECT_EQ(rig->optimizer->step_count(), 2);
}

// Speculated, then the step clips: rolled back, the master, state and
// weights are those from before, the step count too, and the exact update
// with the clip factor equals the synchronous one bit for bit.
// Without re-sending the weights (the redo writes them all): the same.
TEST(HostUpdateTest, RolledBackSpeculationIsRedoneExactly) {
  for (bool resend_weights : {true, false}) {
    SCOPED_TRACE(resend_weights ? "weights re-sent"
                                : "weights left to the redo");
    std::unique_ptr<Rig> rig = MakeRig(false, false, -1, kTotal);
    const Stream stream = TestStream();
    const std::vector<float> master = Master(*rig);
    const std::vector<float> weights = Values(rig->weights);
    absl::StatusOr<InFlightUpdate> in_flight = StartSpeculating(
        *rig, {0, 1},
        [](const SpeculationReport& r) { return r.chunks == kAllChunks; });
    ASSERT_TRUE(in_flight.ok()) << in_flight.status();
    absl::StatusOr<UpdateJoined> rolled_back =
        in_flight->Rollback(stream, resend_weights);
    ASSERT_TRUE(rolled_back.ok()) << rolled_back.status();
    EXPECT_FALSE(in_flight->active());
    EXPECT_TRUE(rig->update->last_speculation().rolled_back);
    EXPECT_EQ(rig->optimizer->step_count(), 0);
    ExpectSameBits(Master(*rig), master, "master restored");
    if (resend_weights) {
      ExpectSameBits(Values(rig->weights), weights, "weights re-sent");
    }
    for (float* state :
         {rig->optimizer->exp_avg(), rig->optimizer->exp_avg_sq()}) {
      for (int64_t i = 0; i < kTotal; ++i) ASSERT_EQ(state[i], 0.0f) << i;
    }
    // The exact update: clipped to half.
    absl::StatusOr<InFlightUpdate> exact =
        rig->update->Start(Args(0.01, 0.25f), /*begun_early=*/false);
    ASSERT_TRUE(exact.ok()) << exact.status();
    ASSERT_TRUE(exact->Close(stream).ok());
    ASSERT_TRUE(exact->Join(stream).ok());
    const Expected expected = Reference(1, 0.25f);
    ExpectSameBits(Master(*rig), expected.master, "master");
    ExpectSameBits(Values(rig->weights), expected.weights, "weights");
    EXPECT_FALSE(rig->update->last_speculation().rolled_back);  // a new update
  }
}

// A 16+16 master's offloaded bucket (bf16_ties_away): the weights the
// update uploads and those a rollback re-sends are the master's high halves
// (ties away from zero), not round-to-nearest-even, from masters sitting
// exactly on ties above even bf16 values, where the two differ.
TEST(HostUpdateTest, TiesAwayWeightsInTheUpdateAndTheRollback) {
  std::unique_ptr<Rig> rig =
      MakeRig(false, false, -1, kTotal, 2, /*bf16_ties_away=*/true);
  float* master = rig->master.data_as<float>();
  for (int64_t i = 0; i < kTotal; ++i) {
    master[i] = BitsToFloat((FloatBits(master[i]) & 0xfffe0000u) | 0x8000u);
  }
  const std::vector<float> tied = Values(rig->master);
  auto expect_high_halves = [&](const std::vector<float>& of,
                                const char* what) {
    const std::vector<float> weights = Values(rig->weights);
    for (int64_t i = 0; i < kTotal; ++i) {
      ASSERT_EQ(FloatBits(weights[i]),
                FloatBits(Bf16BitsToFloat(SplitForBf16(of[i]).hi)))
          << what << " element " << i;
    }
  };
  const Stream stream = TestStream();
  absl::StatusOr<InFlightUpdate> in_flight = StartSpeculating(
      *rig, {0, 1},
      [](const SpeculationReport& r) { return r.chunks == kAllChunks; });
  ASSERT_TRUE(in_flight.ok()) << in_flight.status();
  ASSERT_TRUE(in_flight->Rollback(stream, /*resend_weights=*/true).ok());
  ExpectSameBits(Master(*rig), tied, "master restored");
  expect_high_halves(tied, "re-sent");
  // Not what round-to-nearest-even gives: every tie sits above an even
  // bf16, which it would keep.
  EXPECT_NE(Bf16BitsToFloat(FloatToBf16Bits(tied[0])),
            Bf16BitsToFloat(SplitForBf16(tied[0]).hi));
  Step(*rig);
  expect_high_halves(Master(*rig), "updated");
}

// This rank's own gradients exceed the limit: nothing more is speculated
// once the chunks backed up so far show it. One optimizer thread, so the
// first chunk's tile has been summed when the second is asked for: the
// first goes (nothing is summed before it), the second stops. Committed
// anyway (the norm said no clip after all), the update is the exact one.
TEST(HostUpdateTest, SpeculationStopsWhenTheOwnNormExceedsTheLimit) {
  std::unique_ptr<Rig> rig = MakeRig(false, false, -1, kTotal, /*threads=*/1);
  const Stream stream = TestStream();
  Speculation tight;
  tight.sum_of_squares_limit = 1e-12;
  absl::StatusOr<InFlightUpdate> in_flight =
      rig->update->Start(Args(), /*begun_early=*/true, tight);
  ASSERT_TRUE(in_flight.ok()) << in_flight.status();
  ASSERT_TRUE(in_flight->HandOver(0, stream).ok());
  AwaitSpeculation(*rig->update, [](const SpeculationReport& r) {
    return r.stopped_by_norm;
  });
  EXPECT_EQ(rig->update->last_speculation().chunks, 1);
  ASSERT_TRUE(in_flight->Commit().ok());
  ASSERT_TRUE(in_flight->Close(stream).ok());
  ASSERT_TRUE(in_flight->Join(stream).ok());
  const Expected expected = Reference(1);
  ExpectSameBits(Master(*rig), expected.master, "master");
  ExpectSameBits(Values(rig->weights), expected.weights, "weights");
}

// The backup holds one chunk: speculation stops at the second; rolled
// back, only the first is restored and the state is as before.
TEST(HostUpdateTest, SpeculationStopsAtTheBackupBudget) {
  std::unique_ptr<Rig> rig = MakeRig(false, false, -1, kChunk + 10);
  const Stream stream = TestStream();
  const std::vector<float> master = Master(*rig);
  absl::StatusOr<InFlightUpdate> in_flight = StartSpeculating(
      *rig, {0},
      [](const SpeculationReport& r) { return r.stopped_by_budget; });
  ASSERT_TRUE(in_flight.ok()) << in_flight.status();
  EXPECT_EQ(rig->update->last_speculation().chunks, 1);
  EXPECT_FALSE(rig->update->last_speculation().stopped_by_norm);
  ASSERT_TRUE(in_flight->Rollback(stream).ok());
  ExpectSameBits(Master(*rig), master, "master restored");
  Step(*rig);
  ExpectSameBits(Master(*rig), Reference(1).master, "master");
}

// A speculative handle dropped undecided (a failed step) is rolled back.
TEST(HostUpdateTest, ADroppedSpeculationIsRolledBack) {
  std::unique_ptr<Rig> rig = MakeRig(false, false, -1, kTotal);
  const Stream stream = TestStream();
  const std::vector<float> master = Master(*rig);
  {
    absl::StatusOr<InFlightUpdate> in_flight = StartSpeculating(
        *rig, {1}, [](const SpeculationReport& r) { return r.chunks == 4; });
    ASSERT_TRUE(in_flight.ok()) << in_flight.status();
  }
  ExpectSameBits(Master(*rig), master, "master restored");
  EXPECT_EQ(rig->optimizer->step_count(), 0);
}

TEST(HostUpdateTest, SpeculationNeedsAnEarlyStartAndABackup) {
  std::unique_ptr<Rig> rig = MakeRig(false, false);  // no backup
  EXPECT_FALSE(rig->update->CanSpeculate());
  EXPECT_EQ(rig->update->Start(Args(), true, Speculation()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  std::unique_ptr<Rig> backed = MakeRig(false, false, -1, kTotal);
  EXPECT_EQ(backed->update->Start(Args(), false, Speculation()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Not speculative: nothing to commit or roll back.
  absl::StatusOr<InFlightUpdate> plain = backed->update->Start(Args(), true);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->Commit().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(plain->Rollback(TestStream()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(HostUpdate::BackupBytesPerElement(Adam()), 12);
}

#ifndef ZE_HOST_UPDATE_TEST_CUDA
// The CPU/GPU split: slots updated through the device buffers (here with
// the CPU's kernel as the device's) give the CPU update's master, state and
// weights bit for bit, alone or beside CPU-updated slots, over two steps
// (the second reads the state the first sent back down).
TEST(HostUpdateTest, DeviceUpdatedSlotsEqualTheCpuUpdate) {
  for (const std::vector<int>& device_slots :
       {std::vector<int>{1}, std::vector<int>{0, 1}}) {
    SCOPED_TRACE(device_slots.size() == 1 ? "slot 1" : "both slots");
    std::unique_ptr<Rig> rig =
        MakeRig(false, false, -1, 0, 2, false, device_slots);
    for (int step = 1; step <= 2; ++step) {
      Step(*rig);
      const Expected expected = Reference(step);
      ExpectSameBits(Master(*rig), expected.master, "master");
      ExpectSameBits(Values(rig->weights), expected.weights, "weights");
    }
    EXPECT_EQ(rig->optimizer->step_count(), 2);
    EXPECT_GT(rig->update->times().device_seconds, 0.0);
  }
}

// Speculating, a device-updated slot waits for the decision: nothing of it
// changes before, so a rollback restores only the CPU's chunks, and the
// redo (clipped) and a commit both equal the synchronous update. With both
// slots on the device, the device worker holds one at the decision and the
// other is still queued: the redo must update each exactly once (a queue
// left from the rolled-back update once updated it twice).
TEST(HostUpdateTest, DeviceUpdatedSlotsWaitForTheDecision) {
  for (const std::vector<int>& device_slots :
       {std::vector<int>{1}, std::vector<int>{0, 1}}) {
    for (bool commit : {true, false}) {
      SCOPED_TRACE(absl::StrCat(device_slots.size(), " device slot(s), ",
                                commit ? "committed" : "rolled back"));
      std::unique_ptr<Rig> rig =
          MakeRig(false, false, -1, kTotal, 2, false, device_slots);
      const Stream stream = TestStream();
      const std::vector<float> initial = Master(*rig);
      absl::StatusOr<InFlightUpdate> in_flight =
          rig->update->Start(Args(), /*begun_early=*/true, Speculation());
      ASSERT_TRUE(in_flight.ok()) << in_flight.status();
      ASSERT_TRUE(in_flight->HandOver(0, stream).ok());
      ASSERT_TRUE(in_flight->HandOver(1, stream).ok());
      const int64_t first_device_element =
          device_slots.size() == 2 ? 0 : kSizes[0];
      if (device_slots.size() == 1) {
        AwaitSpeculation(*rig->update, [](const SpeculationReport& r) {
          return r.chunks == 4;
        });
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const std::vector<float> before_decision = Master(*rig);
      for (int64_t i = first_device_element; i < kTotal; ++i) {
        ASSERT_EQ(before_decision[i], initial[i])
            << "device slot, element " << i;
      }
      float grad_scale = 0.5f;
      if (commit) {
        ASSERT_TRUE(in_flight->Commit().ok());
        ASSERT_TRUE(in_flight->Close(stream).ok());
        ASSERT_TRUE(in_flight->WaitForGradientsRead(stream).ok());
        ASSERT_TRUE(in_flight->Join(stream).ok());
      } else {
        ASSERT_TRUE(in_flight->Rollback(stream, false).ok());
        ExpectSameBits(Master(*rig), initial, "master restored");
        EXPECT_EQ(rig->optimizer->step_count(), 0);
        grad_scale = 0.25f;
        absl::StatusOr<InFlightUpdate> exact =
            rig->update->Start(Args(0.01, grad_scale), /*begun_early=*/false);
        ASSERT_TRUE(exact.ok()) << exact.status();
        ASSERT_TRUE(exact->Close(stream).ok());
        ASSERT_TRUE(exact->Join(stream).ok());
      }
      const Expected expected = Reference(1, grad_scale);
      ExpectSameBits(Master(*rig), expected.master, "master");
      ExpectSameBits(Values(rig->weights), expected.weights, "weights");
      EXPECT_EQ(rig->optimizer->step_count(), 1);
    }
  }
}
#endif  // ZE_HOST_UPDATE_TEST_CUDA

// The split's rates: each side alone and while the other runs. On a CUDA
// device four positive, finite rates (their sizes are the machine's); on
// the CPU there is no link to measure.
TEST(MeasureUpdateRatesTest, MeasuresEachSideAloneAndShared) {
  absl::StatusOr<std::unique_ptr<CpuOptimizer>> optimizer =
      CpuOptimizer::Create(Adam(), 10, TwoThreads());
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  absl::StatusOr<UpdateRates> rates = MeasureUpdateRates(
      ModelDevice(), optimizer->get(), int64_t{1} << 16, int64_t{1} << 20);
  if (!ModelDevice().is_cuda()) {
    EXPECT_EQ(rates.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(rates.status().message().find("not CUDA"), std::string::npos)
        << rates.status();
    return;
  }
  ASSERT_TRUE(rates.ok()) << rates.status();
  for (double rate :
       {rates->cpu_seconds_per_element, rates->cpu_seconds_per_element_shared,
        rates->link_bytes_per_second, rates->link_bytes_per_second_shared}) {
    EXPECT_GT(rate, 0.0);
    EXPECT_TRUE(std::isfinite(rate));
  }
  // A millisecond an element, or a link under 10 MB/s: surely wrong.
  EXPECT_LT(rates->cpu_seconds_per_element_shared, 1e-3);
  EXPECT_GT(rates->link_bytes_per_second_shared, 1e7);
  EXPECT_EQ((*optimizer)->step_count(), 0);
}

TEST(HostUpdateTest, NothingInFlightJoinsAtOnce) {
  InFlightUpdate none;
  EXPECT_FALSE(none.active());
  EXPECT_TRUE(none.WaitForWeights(0, 0, TestStream()).ok());
  EXPECT_TRUE(none.Join(TestStream()).ok());
}

TEST(HostUpdateTest, BadSlotsAreNamed) {
  absl::StatusOr<std::unique_ptr<CpuOptimizer>> optimizer =
      CpuOptimizer::Create(Adam(), 10, TwoThreads());
  ASSERT_TRUE(optimizer.ok());
  HostUpdateSlot slot;
  slot.gradients = Make(std::vector<float>(10, 0.0f), DType::kBF16);
  slot.staging = Make(std::vector<float>(10, 0.0f), DType::kBF16);
  slot.master = Make(std::vector<float>(10, 0.0f), DType::kF32);
  slot.weights = Make(std::vector<float>(10, 0.0f), DType::kBF16);
  slot.state_offset = 5;  // leaves the optimizer's 10 elements
  absl::Status status =
      HostUpdate::Create(HostUpdateOptions(), {slot}, optimizer->get(), nullptr)
          .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("slot 0"), std::string::npos) << status;
  EXPECT_NE(status.message().find("state_offset"), std::string::npos) << status;
  slot.state_offset = 0;
  slot.first_swapped_chunk = 0;  // swapped, but no SwappedState
  slot.master = Tensor();
  status =
      HostUpdate::Create(HostUpdateOptions(), {slot}, optimizer->get(), nullptr)
          .status();
  EXPECT_NE(status.message().find("SwappedState"), std::string::npos) << status;
  slot.first_swapped_chunk = -1;
  slot.master = Make(std::vector<float>(10, 0.0f), DType::kF32);
  slot.update_on_device = true;  // but no device_step
  status =
      HostUpdate::Create(HostUpdateOptions(), {slot}, optimizer->get(), nullptr)
          .status();
  EXPECT_NE(status.message().find("update_on_device"), std::string::npos)
      << status;
}

// The worker's choice, as a pure function: newest landed during an early
// start, the oldest when none has landed or when not begun early, and the
// forward's first once everything is handed over.
TEST(ChooseBucketToUpdateTest, FollowsTheBackwardThenTheForward) {
  // Stages 0-2: bucket b is read at forward position (5 - 1 - b).
  auto position = [](int b) { return 4 - b; };
  const std::deque<int> ready = {0, 1, 2, 3};  // handed over in this order
  auto landed_up_to = [](int last) {
    return [last](int b) { return b <= last; };
  };
  // Begun early, backward still going: the newest that has landed.
  EXPECT_EQ(ChooseBucketToUpdate(ready, false, true, landed_up_to(2), position),
            2u);
  EXPECT_EQ(ChooseBucketToUpdate(ready, false, true, landed_up_to(3), position),
            3u);
  // None landed yet: the oldest, whose copy lands first.
  EXPECT_EQ(
      ChooseBucketToUpdate(ready, false, true, landed_up_to(-1), position), 0u);
  // Not begun early: handed over in the forward's order, the oldest.
  EXPECT_EQ(
      ChooseBucketToUpdate({4, 3, 2}, false, false, landed_up_to(4), position),
      0u);
  // Everything handed over: the one the next forward reads first.
  EXPECT_EQ(ChooseBucketToUpdate(ready, true, true, landed_up_to(3), position),
            3u);
  EXPECT_EQ(ChooseBucketToUpdate({2, 0, 3, 1}, true, false, landed_up_to(3),
                                 [](int b) { return b; }),
            1u);
}

}  // namespace
}  // namespace offload
}  // namespace ze
