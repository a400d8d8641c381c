// ActivationOffload on the CPU (the same code the GPU runs; copies are
// memcpy there): the ring and prefetch order of a LIFO backward, saves
// during a recomputation staying put, host buffers reused from step to
// step, errors, and through Module: a GPT and a Llama decoder with every
// block checkpointed give bit for bit the losses and gradients with and
// without the offload.
#include "nn/activation_offload.h"

#include <cstring>
#include <memory>
#include <vector>

#include "core/ops.h"
#include "gtest/gtest.h"
#include "nn/decoder.h"
#include "nn/gpt.h"
#include "nn/module.h"
#include "nn/test_util.h"

namespace ze {
namespace nn {
namespace {

using testing::RandomIds;
using testing::RandomTensor;
using testing::Values;

std::shared_ptr<ActivationOffload> MakeOffload(int ring_slots = 2) {
  ActivationOffloadOptions options;
  options.ring_slots = ring_slots;
  absl::StatusOr<std::shared_ptr<ActivationOffload>> offload =
      ActivationOffload::Create(Device::Cpu(), options);
  EXPECT_TRUE(offload.ok()) << offload.status();
  return *offload;
}

bool SameBytes(const Tensor &a, const Tensor &b) {
  return a.nbytes() == b.nbytes() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// Four layers' inputs saved in forward, restored in reverse. The newest
// stays on the device (backward wants it first); each restore starts the
// copy back of the one before it into a free ring slot, as long as one is
// free (the layer that used it has dropped it).
TEST(ActivationOffloadTest, RestoresPrefetchOneAheadThroughTheRing) {
  std::shared_ptr<ActivationOffload> offload = MakeOffload(2);
  const Stream stream;
  std::vector<Tensor> inputs;
  std::vector<int64_t> tickets;
  for (int i = 0; i < 4; ++i) {
    inputs.push_back(RandomTensor({2, 3, 4}, 10 + i));
    tickets.push_back(offload->Save(inputs.back(), stream).value());
  }
  EXPECT_EQ(offload->stats().offloaded, 4);
  EXPECT_EQ(offload->held(), 4);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(offload->OnDevice(tickets[i]));
  EXPECT_TRUE(offload->OnDevice(tickets[3]));
  // What comes back is the host copy, not the caller's buffer: changing it
  // after Save changes nothing.
  const Tensor original2 = testing::CopyToCpuF32(inputs[2]);
  ASSERT_TRUE(Fill(inputs[2], 0.0f, stream).ok());

  // Layer 3: the kept input itself; layer 2's starts coming back.
  Tensor restored3 = offload->Restore(tickets[3], stream).value();
  EXPECT_EQ(restored3.data(), inputs[3].data());
  EXPECT_EQ(offload->stats().kept_newest, 1);
  EXPECT_EQ(offload->stats().prefetched, 0);
  EXPECT_TRUE(offload->OnDevice(tickets[2]));
  EXPECT_FALSE(offload->OnDevice(tickets[1]));
  restored3 = Tensor();  // layer 3's backward is done

  // Layer 2: prefetched; layer 1 goes into the other slot.
  const Tensor restored2 = offload->Restore(tickets[2], stream).value();
  EXPECT_TRUE(SameBytes(restored2, original2));
  EXPECT_NE(restored2.data(), inputs[2].data());
  EXPECT_EQ(offload->stats().prefetched, 1);
  EXPECT_TRUE(offload->OnDevice(tickets[1]));

  // Layer 1 while layer 2's input is still held: both slots are taken
  // (restored2 and restored1), so layer 0 is not prefetched...
  const Tensor restored1 = offload->Restore(tickets[1], stream).value();
  EXPECT_TRUE(SameBytes(restored1, inputs[1]));
  EXPECT_EQ(offload->stats().prefetched, 2);
  EXPECT_FALSE(offload->OnDevice(tickets[0]));
  EXPECT_NE(restored1.data(), restored2.data());

  // ... and its restore finds no free slot: a fresh buffer, same bytes.
  const Tensor restored0 = offload->Restore(tickets[0], stream).value();
  EXPECT_TRUE(SameBytes(restored0, inputs[0]));
  EXPECT_EQ(offload->stats().ring_misses, 1);
  EXPECT_EQ(offload->stats().ring_slots_allocated, 2);
  EXPECT_EQ(offload->stats().ring_bytes,
            2 * static_cast<int64_t>(inputs[0].nbytes()));
  EXPECT_EQ(offload->stats().restored, 4);
  EXPECT_EQ(offload->held(), 0);
}

// One slot: a prefetch goes only into a free slot; when it was skipped,
// the restore copies on demand into the slot once its reader freed it.
TEST(ActivationOffloadTest, OneSlotPrefetchesOnlyIntoAFreeSlot) {
  std::shared_ptr<ActivationOffload> offload = MakeOffload(1);
  const Stream stream;
  const Tensor a = RandomTensor({5}, 1), b = RandomTensor({5}, 2),
               c = RandomTensor({5}, 3);
  const int64_t ta = offload->Save(a, stream).value();
  const int64_t tb = offload->Save(b, stream).value();
  const int64_t tc = offload->Save(c, stream).value();
  EXPECT_EQ(offload->Restore(tc, stream).value().data(), c.data());
  EXPECT_TRUE(offload->OnDevice(tb));  // into the one slot
  Tensor rb = offload->Restore(tb, stream).value();
  EXPECT_TRUE(SameBytes(rb, b));
  EXPECT_FALSE(offload->OnDevice(ta));  // the slot is rb's
  rb = Tensor();
  EXPECT_TRUE(SameBytes(offload->Restore(ta, stream).value(), a));
  EXPECT_EQ(offload->stats().prefetched, 1);
  EXPECT_EQ(offload->stats().ring_misses, 0);
  EXPECT_EQ(offload->stats().ring_slots_allocated, 1);
}

// The newest input is kept only until the next Save.
TEST(ActivationOffloadTest, OnlyTheNewestInputStaysOnTheDevice) {
  std::shared_ptr<ActivationOffload> offload = MakeOffload();
  const Stream stream;
  std::vector<int64_t> tickets;
  for (int i = 0; i < 3; ++i) {
    const Tensor input = RandomTensor({4}, i);
    tickets.push_back(offload->Save(input, stream).value());
    for (int j = 0; j <= i; ++j) {
      EXPECT_EQ(offload->OnDevice(tickets[j]), j == i) << i << " " << j;
    }
  }
}

// A save between the first restore and the last (a checkpointed module
// inside a checkpointed one, saving during the outer recomputation) keeps
// the tensor itself; the next forward offloads again.
TEST(ActivationOffloadTest, SavesDuringBackwardStayOnTheDevice) {
  std::shared_ptr<ActivationOffload> offload = MakeOffload();
  const Stream stream;
  const Tensor outer0 = RandomTensor({4}, 1), outer1 = RandomTensor({4}, 2);
  const int64_t t0 = offload->Save(outer0, stream).value();
  const int64_t t1 = offload->Save(outer1, stream).value();
  const Tensor r1 = offload->Restore(t1, stream).value();
  const Tensor inner = RandomTensor({4}, 3);
  const int64_t ti = offload->Save(inner, stream).value();
  EXPECT_EQ(offload->stats().offloaded, 2);
  EXPECT_EQ(offload->Restore(ti, stream).value().data(), inner.data());
  EXPECT_TRUE(SameBytes(offload->Restore(t0, stream).value(), outer0));
  const int64_t next = offload->Save(inner, stream).value();
  EXPECT_EQ(offload->stats().offloaded, 3);
  offload->Discard(next);
  EXPECT_EQ(offload->held(), 0);
}

// Saved-state slots (a pipeline's 1F1B, nn/module.h): two forwards' inputs
// held at once, each in its slot. The older one's backward (slot 1) starts
// while slot 2's are held: its first input is fetched on demand (the
// newest kept is slot 2's), and the prefetch is slot 1's own previous
// layer, not slot 2's newest held. A save in slot 1 during its backward is
// a recomputation's and stays on the device, while a forward's save in
// another slot meanwhile is offloaded (one backward under way elsewhere
// does not make every save a recomputation's).
TEST(ActivationOffloadTest, EachSlotHasItsOwnBackwardAndPrefetchOrder) {
  std::shared_ptr<ActivationOffload> offload = MakeOffload(2);
  const Stream stream;
  std::vector<std::vector<Tensor>> inputs(3);
  std::vector<std::vector<int64_t>> tickets(3);
  for (int slot : {1, 2}) {
    const SavedStateSlot in(slot);
    for (int layer = 0; layer < 2; ++layer) {
      inputs[slot].push_back(RandomTensor({2, 3}, 10 * slot + layer));
      tickets[slot].push_back(
          offload->Save(inputs[slot].back(), stream).value());
    }
  }
  EXPECT_EQ(offload->stats().offloaded, 4);
  EXPECT_TRUE(offload->OnDevice(tickets[2][1]));  // the newest
  EXPECT_FALSE(offload->OnDevice(tickets[1][1]));

  const Tensor r11 = offload->Restore(tickets[1][1], stream).value();
  EXPECT_TRUE(SameBytes(r11, inputs[1][1]));
  EXPECT_EQ(offload->stats().kept_newest, 0);
  EXPECT_TRUE(offload->OnDevice(tickets[1][0]));   // slot 1's next
  EXPECT_FALSE(offload->OnDevice(tickets[2][0]));  // not slot 2's
  {
    const SavedStateSlot in(1);
    const Tensor inner = RandomTensor({2, 3}, 99);
    const int64_t ti = offload->Save(inner, stream).value();
    EXPECT_EQ(offload->stats().offloaded, 4);
    EXPECT_EQ(offload->Restore(ti, stream).value().data(), inner.data());
  }
  {
    const SavedStateSlot in(3);
    const int64_t t3 = offload->Save(RandomTensor({2, 3}, 30), stream).value();
    EXPECT_EQ(offload->stats().offloaded, 5);
    offload->Discard(t3);
  }
  EXPECT_TRUE(
      SameBytes(offload->Restore(tickets[1][0], stream).value(), inputs[1][0]));
  EXPECT_EQ(offload->stats().prefetched, 1);
  for (int layer : {1, 0}) {
    EXPECT_TRUE(SameBytes(offload->Restore(tickets[2][layer], stream).value(),
                          inputs[2][layer]));
  }
  EXPECT_EQ(offload->held(), 0);
  // Every slot's backward is over: a forward's save is offloaded again.
  const int64_t next = offload->Save(RandomTensor({2, 3}, 4), stream).value();
  EXPECT_EQ(offload->stats().offloaded, 6);
  offload->Discard(next);
}

// Host buffers go back to a pool: a second step of the same shapes
// allocates no host memory.
TEST(ActivationOffloadTest, HostBuffersAreReusedAcrossSteps) {
  std::shared_ptr<ActivationOffload> offload = MakeOffload();
  const Stream stream;
  int64_t after_first = 0;
  for (int step = 0; step < 3; ++step) {
    std::vector<int64_t> tickets;
    for (int i = 0; i < 3; ++i) {
      tickets.push_back(
          offload->Save(RandomTensor({8, 2}, step * 3 + i), stream).value());
    }
    for (int i = 2; i >= 0; --i) {
      ASSERT_TRUE(offload->Restore(tickets[i], stream).ok());
    }
    if (step == 0) after_first = offload->stats().host_bytes;
  }
  EXPECT_EQ(after_first, 3 * 8 * 2 * 4);
  EXPECT_EQ(offload->stats().host_bytes, after_first);
}

TEST(ActivationOffloadTest, Errors) {
  ActivationOffloadOptions options;
  options.ring_slots = 0;
  absl::StatusOr<std::shared_ptr<ActivationOffload>> bad =
      ActivationOffload::Create(Device::Cpu(), options);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("ring_slots"), std::string::npos);

  std::shared_ptr<ActivationOffload> offload = MakeOffload();
  const Stream stream;
  const int64_t ticket = offload->Save(RandomTensor({3}, 1), stream).value();
  offload->Discard(ticket);
  offload->Discard(ticket);  // no-op
  EXPECT_EQ(offload->Restore(ticket, stream).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(offload->held(), 0);
}

// ---------------------------------------------------- through Module

struct Batch {
  Tensor tokens;   // (B, T) i32
  Tensor targets;  // (B, T) i32
};

struct Run {
  float loss = 0;
  std::vector<std::vector<float>> grads;
};

// Two forward/backward passes (the second accumulating), so host buffers
// and ring slots are reused once.
Run Train(LossModel &model, const Batch &batch) {
  const Stream stream;
  Run run;
  for (int pass = 0; pass < 2; ++pass) {
    run.loss = model.ForwardLoss(batch.tokens, batch.targets, stream).value();
    EXPECT_TRUE(model.BackwardLoss(1.0f, stream).ok());
  }
  for (Parameter *parameter : model.Parameters()) {
    run.grads.push_back(Values(parameter->grad()));
  }
  return run;
}

void InstallOffload(Module &model,
                    const std::shared_ptr<ActivationOffload> &offload) {
  for (Module *module : model.Modules())
    module->set_activation_offload(offload);
}

void ExpectIdentical(const Run &a, const Run &b) {
  EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof(float)), 0)
      << a.loss << " against " << b.loss;
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    ASSERT_EQ(a.grads[i].size(), b.grads[i].size());
    EXPECT_EQ(0, std::memcmp(a.grads[i].data(), b.grads[i].data(),
                             a.grads[i].size() * sizeof(float)))
        << "parameter " << i;
  }
}

TEST(ActivationOffloadModelTest, GptGradientsAreBitIdentical) {
  GptConfig config;
  config.num_layers = 3;
  config.num_heads = 2;
  config.channels = 16;
  config.vocab_size = 37;
  config.max_seq_len = 8;
  config.activation_checkpointing = true;
  const Batch batch{RandomIds({2, 8}, 1, 37), RandomIds({2, 8}, 2, 37)};
  std::unique_ptr<GptModel> plain = GptModel::Create(config, {}).value();
  std::unique_ptr<GptModel> offloaded = GptModel::Create(config, {}).value();
  std::shared_ptr<ActivationOffload> offload = MakeOffload();
  InstallOffload(*offloaded, offload);
  ExpectIdentical(Train(*offloaded, batch), Train(*plain, batch));
  // Every block's input went out, twice; the last block's was still on the
  // device when backward began, the others' had been prefetched.
  EXPECT_EQ(offload->stats().offloaded, 2 * 3);
  EXPECT_EQ(offload->stats().restored, 2 * 3);
  EXPECT_EQ(offload->stats().kept_newest, 2);
  EXPECT_EQ(offload->stats().prefetched, 2 * 2);
  EXPECT_EQ(offload->stats().ring_misses, 0);
  EXPECT_EQ(offload->held(), 0);
}

TEST(ActivationOffloadModelTest, LlamaGradientsAreBitIdentical) {
  DecoderConfig config;
  config.family = DecoderFamily::kLlama;
  config.num_layers = 3;
  config.vocab_size = 37;
  config.hidden_size = 32;
  config.intermediate_size = 48;
  config.head_dim = 8;
  config.activation_checkpointing = true;
  const Batch batch{RandomIds({2, 8}, 3, 37), RandomIds({2, 8}, 4, 37)};
  std::unique_ptr<DecoderModel> plain =
      DecoderModel::Create(config, {}).value();
  std::unique_ptr<DecoderModel> offloaded =
      DecoderModel::Create(config, {}).value();
  std::shared_ptr<ActivationOffload> offload = MakeOffload();
  InstallOffload(*offloaded, offload);
  ExpectIdentical(Train(*offloaded, batch), Train(*plain, batch));
  EXPECT_EQ(offload->stats().offloaded, 2 * 3);
  EXPECT_EQ(offload->stats().prefetched, 2 * 2);
}

// An abandoned forward (ClearSavedState) gives its tickets back.
TEST(ActivationOffloadModelTest, ClearSavedStateDiscardsOffloadedInputs) {
  GptConfig config;
  config.num_layers = 2;
  config.num_heads = 2;
  config.channels = 16;
  config.vocab_size = 37;
  config.max_seq_len = 8;
  config.activation_checkpointing = true;
  std::unique_ptr<GptModel> model = GptModel::Create(config, {}).value();
  std::shared_ptr<ActivationOffload> offload = MakeOffload();
  InstallOffload(*model, offload);
  const Stream stream;
  ASSERT_TRUE(model
                  ->ForwardLoss(RandomIds({1, 8}, 1, 37),
                                RandomIds({1, 8}, 2, 37), stream)
                  .ok());
  EXPECT_EQ(offload->held(), 2);
  model->ClearSavedState();
  EXPECT_EQ(offload->held(), 0);
}

}  // namespace
}  // namespace nn
}  // namespace ze
