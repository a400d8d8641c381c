// The plan (zero/plan.h) as a table: over stage x offload_optimizer device
// x ratio x world size (and offload_param where it is allowed), what is
// partitioned, where the weights, gradients, master weights and moments
// live, and that the bytes add up: a partitioned quantity's per-rank bytes
// times the world cover the whole, a replicated one is whole on every rank,
// offloaded bytes are counted on the host (or NVMe) and not on the device.
// Shapes only: nothing is allocated, so every case runs in microseconds.
#include "zero/plan.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "config/config.h"
#include "gtest/gtest.h"
#include "nn/gpt.h"
#include "offload/swapped_weights.h"

namespace ze {
namespace zero {
namespace {

using config::OffloadDevice;

// Adam's moments, and the f32 master weights of bf16 training, per element.
constexpr int64_t kMomentBytes = 8;
constexpr int64_t kMasterBytes = 4;
constexpr int64_t kWeightBytes = 2;  // bf16
constexpr int64_t kSubGroupSize = 1000;
// Stage 3 keeps buckets under kPersistence elements gathered while their
// total stays within kModelPersistence: small enough that the cap bites.
constexpr int64_t kPersistence = 100;
constexpr int64_t kModelPersistence = 80;

struct Case {
  int stage = 0;
  OffloadDevice device = OffloadDevice::kNone;
  double ratio = 1.0;
  int world = 1;
  bool offload_param = false;

  std::string Json() const {
    std::string offload;
    if (device != OffloadDevice::kNone) {
      offload = absl::StrCat(
          R"(, "offload_optimizer": {"device": ")",
          device == OffloadDevice::kCpu ? "cpu" : "nvme",
          R"(", "nvme_path": "/tmp/ze_plan_test", "pin_memory": true,)",
          R"( "ratio": )", ratio, "}");
    }
    if (offload_param) offload += R"(, "offload_param": {"device": "cpu"})";
    return absl::StrCat(
        R"({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true},)",
        R"("optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},)",
        R"("zero_optimization": {"stage": )", stage,
        R"(, "reduce_bucket_size": 900, "sub_group_size": )", kSubGroupSize,
        R"(, "allgather_bucket_size": 700, "overlap_comm": true,)",
        R"( "stage3_param_persistence_threshold": )", kPersistence,
        R"(, "stage3_model_persistence_threshold": )", kModelPersistence,
        R"(, "stage3_prefetch_bucket_size": 3000,)",
        R"( "stage3_max_live_parameters": 5000,)",
        R"( "stage3_max_reuse_distance": 7000)", offload, "}}");
  }
  // What config/ refuses at load: offload at stage 0, NVMe below stage 3.
  bool refused() const {
    return (stage == 0 && device != OffloadDevice::kNone) ||
           (device == OffloadDevice::kNvme && stage != 3);
  }
};

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (int stage = 0; stage <= 3; ++stage) {
    for (OffloadDevice device :
         {OffloadDevice::kNone, OffloadDevice::kCpu, OffloadDevice::kNvme}) {
      for (double ratio : {1.0, 0.5}) {
        for (int world = 1; world <= 3; ++world) {
          Case c{stage, device, ratio, world, false};
          cases.push_back(c);
          // offload_param needs stage 3; the optimizer may be anywhere:
          // on the host, on NVMe, split by ratio, or all on the device
          // (no offload_optimizer, where ratio means nothing).
          if (stage == 3 && (device != OffloadDevice::kNone || ratio == 1.0)) {
            c.offload_param = true;
            cases.push_back(c);
          }
        }
      }
    }
  }
  return cases;
}

std::unique_ptr<nn::GptModel> Shapes() {
  nn::GptConfig gpt;
  gpt.num_layers = 2;
  gpt.num_heads = 2;
  gpt.channels = 16;
  gpt.vocab_size = 61;  // odd sizes, so slices need padding
  gpt.max_seq_len = 8;
  nn::GptOptions options;
  options.dtype = DType::kBF16;
  options.materialize = false;
  absl::StatusOr<std::unique_ptr<nn::GptModel>> model =
      nn::GptModel::Create(gpt, options);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(model).value() : nullptr;
}

TEST(PlanTableTest, PlacementAndBytesOverStageOffloadRatioAndWorld) {
  std::unique_ptr<nn::GptModel> model = Shapes();
  ASSERT_NE(model, nullptr);
  int64_t model_elements = 0;
  for (nn::Parameter* parameter : model->Parameters()) {
    model_elements += parameter->numel();
  }
  int planned = 0;
  for (const Case& c : AllCases()) {
    SCOPED_TRACE(absl::StrCat("world ", c.world, ": ", c.Json()));
    absl::StatusOr<config::Config> config =
        config::LoadConfigString(c.Json(), c.world, "table.json");
    if (c.refused()) {
      ASSERT_FALSE(config.ok());
      EXPECT_NE(config.status().message().find(
                    "zero_optimization.offload_optimizer.device"),
                absl::string_view::npos)
          << config.status();
      continue;
    }
    ASSERT_TRUE(config.ok()) << config.status();
    HostFacts host;
    host.omp_num_threads = 3;
    absl::StatusOr<Plan> built = BuildPlan(*model, *config, c.world, host);
    ASSERT_TRUE(built.ok()) << built.status();
    const Plan& plan = *built;
    ++planned;

    // What is partitioned.
    EXPECT_EQ(plan.policy.partition_optimizer, c.stage >= 1);
    EXPECT_EQ(plan.policy.partition_gradients, c.stage >= 2);
    EXPECT_EQ(plan.policy.partition_parameters, c.stage == 3);
    EXPECT_EQ(plan.state.stage, c.stage);

    // The layout covers every trainable parameter once, at this world size.
    const PartitionedLayout& layout = plan.layout.layout;
    EXPECT_EQ(layout.world_size(), c.world);
    EXPECT_EQ(plan.layout.trainable_elements, model_elements);
    EXPECT_EQ(layout.total_param_elements(), model_elements);
    EXPECT_EQ(static_cast<int>(plan.layout.params.size()), layout.num_params());
    EXPECT_EQ(layout.padded_total_elements(),
              c.world * layout.partition_elements());
    EXPECT_EQ(plan.layout.bucket_zero_read_first, c.stage == 3);
    EXPECT_EQ(plan.state.bucket_zero_read_first, c.stage == 3);
    ASSERT_GT(layout.num_buckets(), 1);

    // Where each bucket's master weights and moments live.
    const bool offloaded = c.device != OffloadDevice::kNone;
    EXPECT_EQ(plan.cpu_optimizer, offloaded);
    const Placement away =
        c.device == OffloadDevice::kNvme ? Placement::kNvme : Placement::kHost;
    int64_t own_total = 0;
    int64_t own_away = 0;
    bool device_seen = false;
    if (!offloaded) {
      EXPECT_TRUE(plan.state.optimizer_placement.empty());
    } else {
      ASSERT_EQ(static_cast<int>(plan.state.optimizer_placement.size()),
                layout.num_buckets());
    }
    // In the order gradients are final in backward: bucket 0 first at
    // stages 0-2, last at stage 3 (model order).
    for (int i = 0; i < layout.num_buckets(); ++i) {
      const int b = c.stage == 3 ? layout.num_buckets() - 1 - i : i;
      const int64_t own = plan.policy.partition_optimizer
                              ? layout.bucket(b).slice_elements
                              : layout.bucket(b).padded_elements;
      own_total += own;
      if (!offloaded) continue;
      const Placement where = plan.state.optimizer_placement[b];
      EXPECT_TRUE(where == Placement::kDevice || where == away) << b;
      if (where == away) {
        // The offloaded buckets come first in that order (the last
        // layers': their update starts earliest and the next forward reads
        // them last).
        EXPECT_FALSE(device_seen) << "bucket " << b << " offloaded after one "
                                  << "kept on the device";
        own_away += own;
      } else {
        device_seen = true;
      }
    }
    if (offloaded) {
      // At least `ratio` of the state offloaded, and no bucket more than
      // that needs.
      EXPECT_GE(static_cast<double>(own_away), c.ratio * own_total);
      if (c.ratio == 1.0) {
        EXPECT_EQ(own_away, own_total);
      } else {
        EXPECT_LT(own_away, own_total);
      }
      EXPECT_EQ(plan.state.chunk_elements, kSubGroupSize);
      EXPECT_EQ(plan.state.host_threads, 3);  // the host facts' OMP threads
      EXPECT_TRUE(plan.state.pin_memory);
    } else {
      EXPECT_EQ(plan.state.host_threads, 0);
    }
    // The weights: on the host with offload_param, else on the device.
    EXPECT_EQ(plan.state.weights_placement,
              c.offload_param ? Placement::kHost : Placement::kDevice);

    // Bytes per rank: partitioned quantities hold this rank's slices, and
    // the world's slices cover the whole; replicated ones the whole.
    const MemoryBreakdown& memory = plan.memory;
    const int64_t slices = layout.partition_elements();
    const int64_t whole = layout.padded_total_elements();
    EXPECT_EQ(memory.parameter_elements, model_elements);
    EXPECT_EQ(
        memory.model_weight_bytes,
        kWeightBytes * (plan.policy.partition_parameters ? slices : whole));
    EXPECT_EQ(
        memory.gradient_bytes,
        kWeightBytes * (plan.policy.partition_gradients ? slices : whole));
    EXPECT_EQ(memory.master_weight_bytes, kMasterBytes * own_total);
    EXPECT_EQ(memory.optimizer_state_bytes, kMomentBytes * own_total);
    EXPECT_EQ(own_total, plan.policy.partition_optimizer ? slices : whole);
    const auto covers = [&](int64_t per_rank, int64_t element_bytes,
                            bool partitioned, const char* what) {
      if (partitioned) {
        EXPECT_GE(per_rank * c.world, element_bytes * model_elements) << what;
        EXPECT_LT(per_rank * (c.world - 1), element_bytes * model_elements)
            << what << " is not divided among the ranks";
      } else {
        EXPECT_GE(per_rank, element_bytes * model_elements) << what;
      }
    };
    covers(memory.model_weight_bytes, kWeightBytes,
           plan.policy.partition_parameters, "weights");
    covers(memory.gradient_bytes, kWeightBytes, plan.policy.partition_gradients,
           "gradients");
    covers(memory.master_weight_bytes, kMasterBytes,
           plan.policy.partition_optimizer, "master weights");
    covers(memory.optimizer_state_bytes, kMomentBytes,
           plan.policy.partition_optimizer, "moments");

    // Offloaded bytes are on the host (or NVMe), never on the device.
    const int64_t swapped = (kMasterBytes + kMomentBytes) * own_away;
    const int64_t host_weights =
        c.offload_param ? memory.model_weight_bytes : 0;
    EXPECT_EQ(memory.staging_bytes, kWeightBytes * own_away);
    EXPECT_EQ(memory.device_bytes,
              memory.total_bytes() - swapped - host_weights);
    EXPECT_GE(memory.device_bytes, 0);
    if (c.device == OffloadDevice::kNvme) {
      EXPECT_EQ(memory.nvme_bytes, swapped);
      // Only the swap buffers, the staging and offloaded weights on the
      // host: less than the swapped state itself.
      EXPECT_GT(memory.host_bytes, memory.staging_bytes + host_weights);
      EXPECT_LE(memory.host_bytes - memory.staging_bytes - host_weights,
                (kMasterBytes + kMomentBytes) * plan.state.nvme.buffer_count *
                    kSubGroupSize);
    } else {
      EXPECT_EQ(memory.nvme_bytes, 0);
      EXPECT_EQ(memory.host_bytes, swapped + memory.staging_bytes +
                                       host_weights + memory.speculation_bytes);
    }
    // Speculation's backup: every host element's master and moments where
    // an update can begin during backward (cpu, weights on the device or
    // in host memory), none elsewhere.
    const bool speculates = c.device == OffloadDevice::kCpu;
    EXPECT_EQ(plan.state.speculation_elements, speculates ? own_away : 0);
    EXPECT_EQ(memory.speculation_bytes, speculates ? swapped : 0);
    EXPECT_EQ(memory.pinned_host_bytes,
              plan.state.pin_memory ? memory.staging_bytes + host_weights : 0);
    // Part by part: the master and moments of the device buckets on the
    // device, the others' on the host or NVMe; the weights on the device
    // or, with offload_param, the host; the identities of MemoryBreakdown.
    const int64_t kept = (kMasterBytes + kMomentBytes) * (own_total - own_away);
    EXPECT_EQ(memory.device_optimizer_bytes, kept);
    EXPECT_EQ(memory.host_optimizer_bytes,
              c.device == OffloadDevice::kCpu ? swapped : 0);
    EXPECT_EQ(memory.nvme_optimizer_bytes,
              c.device == OffloadDevice::kNvme ? swapped : 0);
    EXPECT_EQ(memory.device_weight_bytes,
              c.offload_param ? 0 : memory.model_weight_bytes);
    EXPECT_EQ(memory.host_weight_bytes, host_weights);
    EXPECT_EQ(memory.nvme_weight_bytes, 0);
    EXPECT_EQ(memory.device_optimizer_bytes + memory.host_optimizer_bytes +
                  memory.nvme_optimizer_bytes,
              memory.master_weight_bytes + memory.optimizer_state_bytes);
    EXPECT_EQ(memory.device_bytes, memory.device_weight_bytes +
                                       memory.gradient_bytes +
                                       memory.device_optimizer_bytes);
    EXPECT_EQ(memory.host_bytes,
              memory.host_optimizer_bytes + memory.host_weight_bytes +
                  memory.staging_bytes + memory.swap_buffer_bytes +
                  memory.speculation_bytes);
    EXPECT_EQ(memory.nvme_bytes,
              memory.nvme_optimizer_bytes + memory.nvme_weight_bytes);
    if (c.offload_param && offloaded && c.ratio < 1.0) {
      // offload_param with part of the optimizer on the device (issue 28):
      // the device keeps that part and the gradients, nothing of the
      // weights; the report names both tiers of the optimizer.
      EXPECT_GT(kept, 0);
      EXPECT_EQ(memory.device_bytes, memory.gradient_bytes + kept);
      const std::string text = memory.ToString();
      EXPECT_NE(text.find("master weights and optimizer state: device "),
                std::string::npos)
          << text;
      EXPECT_NE(
          text.find(c.device == OffloadDevice::kCpu ? " + host " : " + NVMe "),
          std::string::npos)
          << text;
    }
    if (offloaded && c.ratio == 1.0) {
      // The whole optimizer step on the CPU: only weights (unless
      // offloaded too) and gradients stay on the device.
      EXPECT_EQ(memory.device_bytes,
                memory.gradient_bytes +
                    (c.offload_param ? 0 : memory.model_weight_bytes));
    }

    // How the strategy runs: the reduction by the policy, the keys it
    // would otherwise read itself, and stage 3's persistence and fetch
    // limits.
    EXPECT_EQ(plan.reducer.kind,
              c.stage == 0   ? ReductionKind::kAllReduce
              : c.stage == 1 ? ReductionKind::kReduceScatterInPlace
                             : ReductionKind::kReduceScatterToPartition);
    EXPECT_TRUE(plan.overlap_comm);
    EXPECT_EQ(plan.allgather_bucket_elements, 700);
    if (c.stage == 3) {
      ASSERT_EQ(static_cast<int>(plan.persistent.size()), layout.num_buckets());
      int64_t kept = 0;
      int kept_buckets = 0;
      int capped_buckets = 0;
      for (int b = 0; b < layout.num_buckets(); ++b) {
        int64_t elements = 0;
        for (int i = layout.bucket(b).first_param;
             i < layout.bucket(b).end_param; ++i) {
          elements += layout.param(i).numel;
        }
        if (plan.persistent[b]) {
          EXPECT_LT(elements, kPersistence) << b;
          kept += elements;
          ++kept_buckets;
        } else if (elements < kPersistence) {
          // Small enough, but the model's cap was reached.
          EXPECT_GT(kept + elements, kModelPersistence) << b;
          ++capped_buckets;
        }
      }
      EXPECT_LE(kept, kModelPersistence);
      EXPECT_GT(kept_buckets, 0);
      EXPECT_GT(capped_buckets, 0);
      EXPECT_EQ(plan.fetch.prefetch_bucket_elements, 3000);
      EXPECT_EQ(plan.fetch.max_live_elements, 5000);
      EXPECT_EQ(plan.fetch.max_reuse_distance, 7000);
    } else {
      EXPECT_TRUE(plan.persistent.empty());
    }

    // The paper's figure: 16 Psi, 4 Psi + 12 Psi / N, 2 Psi + 14 Psi / N,
    // 16 Psi / N for mixed-precision Adam.
    const double psi = static_cast<double>(model_elements);
    const double n = c.world;
    const double paper[] = {16 * psi, 4 * psi + 12 * psi / n,
                            2 * psi + 14 * psi / n, 16 * psi / n};
    EXPECT_NEAR(memory.paper_bytes, paper[c.stage], 1e-9 * paper[c.stage]);
    EXPECT_GE(static_cast<double>(memory.total_bytes()), memory.paper_bytes);
  }
  // Every combination config/ accepts was planned: stages 1-3 with cpu and
  // stage 3 with nvme, both ratios, the no-offload rows, and offload_param
  // with each of those at stage 3 (and without offload_optimizer).
  EXPECT_EQ(planned, 4 * 2 * 3 + 3 * 2 * 3 + 1 * 2 * 3 + (1 + 2 * 2) * 3);
}

// PlanMemory is the plan's memory part: what ze_estimate and --dry_run
// print is what the strategy allocates by.
TEST(PlanTableTest, PlanMemoryIsThePlansMemory) {
  std::unique_ptr<nn::GptModel> model = Shapes();
  ASSERT_NE(model, nullptr);
  const Case c{2, OffloadDevice::kCpu, 0.5, 3, false};
  absl::StatusOr<config::Config> config =
      config::LoadConfigString(c.Json(), c.world);
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<Plan> plan = BuildPlan(*model, *config, c.world);
  absl::StatusOr<MemoryBreakdown> memory = PlanMemory(*model, *config, c.world);
  ASSERT_TRUE(plan.ok() && memory.ok());
  EXPECT_EQ(memory->ToString(), plan->memory.ToString());
  EXPECT_EQ(memory->device_bytes, plan->memory.device_bytes);
  EXPECT_EQ(memory->host_bytes, plan->memory.host_bytes);
  // Without host facts the CPU optimizer's threads are left to the
  // strategy (this rank's share of the host).
  EXPECT_EQ(plan->state.host_threads, 0);
}

// offload_param nvme: the weights' placement and swap settings come from
// the keys with DeepSpeed's meaning, and the bytes add up: the buckets
// max_in_cpu keeps are host bytes (pinned with pin_memory), the rest are
// NVMe bytes, the swap buffers (buffer_count of the largest swapped slice)
// pinned host bytes; nothing of the weights stays on the device. A slice
// larger than buffer_size is refused by key.
TEST(PlanTableTest, NvmeParametersCountDiskAndPinnedBuffers) {
  std::unique_ptr<nn::GptModel> model = Shapes();
  ASSERT_NE(model, nullptr);
  for (int world = 1; world <= 3; ++world) {
    for (int64_t max_in_cpu : {int64_t{0}, int64_t{1500}, int64_t{1} << 40}) {
      // ratio 0.5: half the optimizer on the device, its buckets' weights
      // in the swap file all the same.
      for (double ratio : {1.0, 0.5}) {
        SCOPED_TRACE(absl::StrCat("world ", world, " max_in_cpu ", max_in_cpu,
                                  " ratio ", ratio));
        Case c{3, OffloadDevice::kNvme, ratio, world, false};
        std::string json = c.Json();
        json.insert(
            json.rfind("}}"),
            absl::StrCat(R"(, "offload_param": {"device": "nvme", )",
                         R"("nvme_path": "/tmp/p", "pin_memory": true, )",
                         R"("buffer_count": 3, "max_in_cpu": )", max_in_cpu,
                         "}"));
        absl::StatusOr<config::Config> config =
            config::LoadConfigString(json, world);
        ASSERT_TRUE(config.ok()) << config.status();
        absl::StatusOr<Plan> plan = BuildPlan(*model, *config, world);
        ASSERT_TRUE(plan.ok()) << plan.status();
        const PartitionedLayout& layout = plan->layout.layout;
        EXPECT_EQ(plan->state.weights_placement, Placement::kNvme);
        EXPECT_EQ(plan->state.weights_nvme.nvme.directory, "/tmp/p");
        EXPECT_EQ(plan->state.weights_nvme.buffer_count, 3);
        EXPECT_EQ(plan->state.weights_max_in_cpu, max_in_cpu);
        const std::vector<bool> resident =
            ChooseResidentWeights(layout, max_in_cpu);
        int64_t kept = 0, swapped = 0, largest = 0;
        for (int b = 0; b < layout.num_buckets(); ++b) {
          const int64_t slice = layout.bucket(b).slice_elements;
          (resident[b] ? kept : swapped) += slice;
          if (!resident[b]) largest = std::max(largest, slice);
        }
        EXPECT_LE(kept, max_in_cpu);
        EXPECT_EQ(kept + swapped, layout.partition_elements());
        if (max_in_cpu == 0) EXPECT_EQ(kept, 0);
        if (max_in_cpu == int64_t{1} << 40) EXPECT_EQ(swapped, 0);
        if (max_in_cpu == 1500) EXPECT_GT(kept, 0);
        const MemoryBreakdown& memory = plan->memory;
        int64_t away = 0;
        for (int b = 0; b < layout.num_buckets(); ++b) {
          if (plan->state.optimizer_placement[b] == Placement::kNvme) {
            away += layout.bucket(b).slice_elements;
          }
        }
        if (ratio == 1.0) EXPECT_EQ(away, layout.partition_elements());
        const int64_t state = (kMasterBytes + kMomentBytes) * away;
        const int64_t on_device = (kMasterBytes + kMomentBytes) *
                                  (layout.partition_elements() - away);
        EXPECT_EQ(memory.nvme_bytes, state + kWeightBytes * swapped);
        EXPECT_EQ(memory.nvme_optimizer_bytes, state);
        EXPECT_EQ(memory.nvme_weight_bytes, kWeightBytes * swapped);
        EXPECT_EQ(memory.host_weight_bytes, kWeightBytes * kept);
        // The weights are off the device: only the gradients (and the
        // optimizer of the buckets kept there) stay there.
        EXPECT_EQ(memory.device_bytes, memory.gradient_bytes + on_device);
        EXPECT_EQ(memory.device_optimizer_bytes, on_device);
        EXPECT_EQ(memory.device_weight_bytes, 0);
        offload::SwappedWeightsOptions swap = plan->state.weights_nvme;
        swap.element_bytes = kWeightBytes;
        const int64_t buffers =
            3 * offload::SwappedWeights::BufferBytes(swap, largest);
        EXPECT_EQ(memory.pinned_host_bytes,
                  memory.staging_bytes + kWeightBytes * kept + buffers);
        // Host memory: what the same run holds with the weights in CPU
        // memory (offload_param cpu), less the swapped weights, plus the
        // swap buffers.
        std::string on_cpu = c.Json();
        on_cpu.insert(on_cpu.rfind("}}"),
                      R"(, "offload_param": {"device": "cpu"})");
        absl::StatusOr<config::Config> cpu_config =
            config::LoadConfigString(on_cpu, world);
        ASSERT_TRUE(cpu_config.ok()) << cpu_config.status();
        absl::StatusOr<Plan> cpu_plan = BuildPlan(*model, *cpu_config, world);
        ASSERT_TRUE(cpu_plan.ok()) << cpu_plan.status();
        EXPECT_EQ(memory.host_bytes, cpu_plan->memory.host_bytes -
                                         kWeightBytes * swapped + buffers);
        EXPECT_EQ(memory.total_bytes(), cpu_plan->memory.total_bytes());
        EXPECT_EQ(memory.swap_buffer_bytes,
                  cpu_plan->memory.swap_buffer_bytes + buffers);
      }
    }
  }
  // A swap buffer smaller than a swapped bucket's slice: refused by key.
  Case c{3, OffloadDevice::kCpu, 1.0, 1, false};
  std::string json = c.Json();
  json.insert(json.rfind("}}"),
              R"(, "offload_param": {"device": "nvme", "nvme_path": "/tmp/p", )"
              R"("max_in_cpu": 0, "buffer_size": 5})");
  absl::StatusOr<config::Config> config = config::LoadConfigString(json, 1);
  ASSERT_TRUE(config.ok()) << config.status();
  absl::Status refused = BuildPlan(*model, *config, 1).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(
      refused.message().find("zero_optimization.offload_param.buffer_size 5"),
      std::string::npos)
      << refused;
}

// offload_optimizer at stages 1-2 on a model of >= 2^24 elements: the
// layout's buckets are at most 1/16 of the model where reduce_bucket_size
// would give fewer, and the startup line says so; without offload, with
// fine buckets already, at stage 3 or for a small model, the configured
// size stands.
TEST(PlanTableTest, OffloadedLargeModelsGetFineBuckets) {
  nn::GptOptions options;
  options.dtype = DType::kBF16;
  options.materialize = false;
  absl::StatusOr<nn::GptConfig> shape = nn::GptConfig::Preset("1.3B");
  ASSERT_TRUE(shape.ok()) << shape.status();
  absl::StatusOr<std::unique_ptr<nn::GptModel>> large =
      nn::GptModel::Create(*shape, options);
  ASSERT_TRUE(large.ok()) << large.status();
  std::unique_ptr<nn::GptModel> small = Shapes();
  ASSERT_NE(small, nullptr);
  struct Planned {
    int buckets = 0;
    // The largest bucket of more than one parameter (a parameter larger
    // than the bucket size is a bucket of its own).
    int64_t largest = 0;
    int64_t trainable = 0;
    std::optional<std::string> note;
  };
  const auto plan_of = [](nn::LossModel& model, int stage,
                          const std::string& bucket_size, bool offload) {
    const std::string json = absl::StrCat(
        R"({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true},)",
        R"( "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},)",
        R"( "zero_optimization": {"stage": )", stage,
        R"(, "reduce_bucket_size": )", bucket_size,
        offload ? R"(, "offload_optimizer": {"device": "cpu"}}})" : "}}");
    Planned planned;
    absl::StatusOr<config::Config> config = config::LoadConfigString(json, 2);
    EXPECT_TRUE(config.ok()) << config.status();
    if (!config.ok()) return planned;
    absl::StatusOr<Plan> plan = BuildPlan(model, *config, 2);
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!plan.ok()) return planned;
    planned.buckets = plan->layout.layout.num_buckets();
    for (int b = 0; b < planned.buckets; ++b) {
      const BucketLayout& bucket = plan->layout.layout.bucket(b);
      if (bucket.end_param - bucket.first_param > 1) {
        planned.largest = std::max(planned.largest, bucket.content_elements);
      }
    }
    planned.trainable = plan->layout.trainable_elements;
    planned.note = OffloadBucketsNote(*plan, *config);
    return planned;
  };
  // 1.3B at 5e8-element buckets: 3 without offload, 16 with it.
  const Planned plain = plan_of(**large, 2, "500000000", false);
  EXPECT_EQ(plain.buckets, 3);
  EXPECT_FALSE(plain.note.has_value());
  const Planned fine = plan_of(**large, 2, "500000000", true);
  ASSERT_GE(fine.trainable, kFineOffloadBucketsMinElements);
  EXPECT_GE(fine.buckets, kOffloadBuckets);
  EXPECT_LE(fine.largest,
            (fine.trainable + kOffloadBuckets - 1) / kOffloadBuckets);
  ASSERT_TRUE(fine.note.has_value());
  EXPECT_NE(fine.note->find(absl::StrCat(fine.buckets, " buckets")),
            std::string::npos)
      << *fine.note;
  EXPECT_NE(fine.note->find("reduce_bucket_size's 500000000"),
            std::string::npos)
      << *fine.note;
  // Stage 1 too.
  EXPECT_GE(plan_of(**large, 1, "500000000", true).buckets, kOffloadBuckets);
  // Already finer: kept.
  const Planned kept = plan_of(**large, 2, "50000000", true);
  EXPECT_LE(kept.largest, 50000000);
  EXPECT_FALSE(kept.note.has_value());
  // GPT-2 124M: one 5e8 bucket would hold it whole.
  absl::StatusOr<nn::GptConfig> small_shape = nn::GptConfig::Preset("124M");
  ASSERT_TRUE(small_shape.ok()) << small_shape.status();
  absl::StatusOr<std::unique_ptr<nn::GptModel>> gpt2 =
      nn::GptModel::Create(*small_shape, options);
  ASSERT_TRUE(gpt2.ok()) << gpt2.status();
  const Planned gpt2_fine = plan_of(**gpt2, 2, "500000000", true);
  // (Its 38.6 M-element token table is a bucket of its own.)
  EXPECT_GE(gpt2_fine.buckets, kOffloadBuckets / 2);
  EXPECT_LE(gpt2_fine.largest,
            (gpt2_fine.trainable + kOffloadBuckets - 1) / kOffloadBuckets);
  EXPECT_TRUE(gpt2_fine.note.has_value());
  // A small model, however few its buckets.
  const Planned tiny = plan_of(*small, 2, "500000000", true);
  EXPECT_EQ(tiny.buckets, 1);
  EXPECT_FALSE(tiny.note.has_value());
}

// The CPU/GPU split is the plan's where offload_optimizer.split_update
// asks for it and it can be (stages 2-3, cpu, f32 master and moments,
// weights on the device); off by default.
TEST(PlanTableTest, SplitUpdateFollowsTheKey) {
  std::unique_ptr<nn::GptModel> model = Shapes();
  ASSERT_NE(model, nullptr);
  const auto split = [&](int stage, const std::string& offload) {
    absl::StatusOr<config::Config> config = config::LoadConfigString(
        absl::StrCat(
            R"({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": )",
            R"(true}, "optimizer": {"type": "AdamW", "params": {"lr": )",
            R"(1e-3}}, "zero_optimization": {"stage": )", stage,
            R"(, "offload_optimizer": {"device": "cpu")", offload, "}}}"),
        1);
    EXPECT_TRUE(config.ok()) << config.status();
    if (!config.ok()) return false;
    absl::StatusOr<Plan> plan = BuildPlan(*model, *config, 1);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() && plan->state.split_update;
  };
  EXPECT_FALSE(split(2, ""));
  EXPECT_FALSE(split(3, ""));
  EXPECT_TRUE(split(2, R"(, "split_update": true)"));
  EXPECT_TRUE(split(3, R"(, "split_update": true)"));
  EXPECT_FALSE(split(2, R"(, "split_update": false)"));
  // Stage 1 keeps whole gradients: nothing to split.
  EXPECT_FALSE(split(1, R"(, "split_update": true)"));
}

// offload_optimizer.ratio "auto": the smallest ratio on the grid whose plan
// (with stage 3's gathered weights) fits the bytes allowed; ratio 1 with
// fits false when none does; a budget that holds everything says so and
// still offloads the key's smallest share.
TEST(PlanTableTest, SmallestFittingOffloadRatioIsTheFirstThatFits) {
  std::unique_ptr<nn::GptModel> model = Shapes();
  ASSERT_NE(model, nullptr);
  for (const int stage : {1, 2, 3}) {
    for (const int world : {1, 2, 3}) {
      SCOPED_TRACE(absl::StrCat("stage ", stage, ", world ", world));
      absl::StatusOr<config::Config> config = config::LoadConfigString(
          absl::StrCat(
              R"({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": )",
              R"(true}, "optimizer": {"type": "AdamW", "params": {"lr": )",
              R"(1e-3}}, "zero_optimization": {"stage": )", stage,
              R"(, "reduce_bucket_size": 300, "offload_optimizer": )",
              R"({"device": "cpu", "ratio": "auto"}}})"),
          world);
      ASSERT_TRUE(config.ok()) << config.status();
      // The device bytes of each grid ratio, planned one by one.
      std::vector<int64_t> bytes;
      for (int step = 0; step <= kAutoRatioSteps; ++step) {
        config::Config at = *config;
        at.zero_optimization.offload_optimizer.ratio =
            static_cast<double>(step) / kAutoRatioSteps;
        absl::StatusOr<Plan> plan = BuildPlan(*model, at, world);
        ASSERT_TRUE(plan.ok()) << plan.status();
        bytes.push_back(plan->memory.device_bytes +
                        GatheredWeightBytes(*plan, world) +
                        GradientBucketTransientBytes(*plan, at, world));
        if (step > 0) EXPECT_LE(bytes[step], bytes[step - 1]) << step;
      }
      ASSERT_LT(bytes.back(), bytes.front());  // the ratio moves something

      absl::StatusOr<AutoRatioPlan> roomy = SmallestFittingOffloadRatio(
          *model, *config, world, HostFacts(), bytes.front());
      ASSERT_TRUE(roomy.ok()) << roomy.status();
      EXPECT_TRUE(roomy->fits);
      EXPECT_TRUE(roomy->everything_fits);
      EXPECT_DOUBLE_EQ(roomy->ratio, 1.0 / kAutoRatioSteps);

      absl::StatusOr<AutoRatioPlan> none = SmallestFittingOffloadRatio(
          *model, *config, world, HostFacts(), bytes.back() - 1);
      ASSERT_TRUE(none.ok()) << none.status();
      EXPECT_FALSE(none->fits);
      EXPECT_FALSE(none->everything_fits);
      EXPECT_DOUBLE_EQ(none->ratio, 1.0);
      EXPECT_EQ(none->device_bytes + none->gradient_bucket_bytes, bytes.back());

      // Just under each distinct size: the first step below it is chosen.
      for (int step = 1; step <= kAutoRatioSteps; ++step) {
        if (bytes[step] == bytes[step - 1]) continue;
        absl::StatusOr<AutoRatioPlan> chosen = SmallestFittingOffloadRatio(
            *model, *config, world, HostFacts(), bytes[step - 1] - 1);
        ASSERT_TRUE(chosen.ok()) << chosen.status();
        int expected = step;
        while (expected > 1 && bytes[expected - 1] == bytes[step]) --expected;
        EXPECT_TRUE(chosen->fits);
        EXPECT_FALSE(chosen->everything_fits);
        EXPECT_DOUBLE_EQ(chosen->ratio,
                         static_cast<double>(expected) / kAutoRatioSteps);
        EXPECT_EQ(chosen->device_bytes + chosen->gradient_bucket_bytes,
                  bytes[step]);
      }
    }
  }
}

// The gradient buckets' transient bytes: nothing at stages 0-1, nor at
// stage 2 on one rank without a cast (the partition takes the layers'
// gradients, every micro-batch; under prescale_gradients only the
// first); otherwise the largest bucket's full gradients
// kMaxReductionsInFlight + 2 times, and its slice kMaxReductionsInFlight +
// 1 times where the reduction accumulates or casts.
TEST(PlanTableTest, GradientBucketTransientBytesFollowTheReducer) {
  std::unique_ptr<nn::GptModel> model = Shapes();
  ASSERT_NE(model, nullptr);
  struct Case {
    int stage;
    int world;
    int accumulation;
    const char* communication;  // communication_data_type, or ""
    bool prescale;
    bool buffers;
    bool slices;
  };
  for (const Case& c : {Case{0, 2, 4, "", false, false, false},
                        Case{1, 2, 4, "", false, false, false},
                        Case{2, 1, 1, "", false, false, false},
                        Case{2, 1, 4, "", false, false, false},
                        Case{2, 1, 1, "", true, false, false},
                        Case{2, 1, 4, "", true, true, true},
                        Case{2, 1, 1, "fp32", false, true, true},
                        Case{2, 2, 1, "", false, true, false},
                        Case{2, 3, 3, "", false, true, true},
                        Case{3, 1, 1, "", false, true, false},
                        Case{3, 2, 2, "", false, true, true}}) {
    SCOPED_TRACE(absl::StrCat("stage ", c.stage, ", world ", c.world,
                              ", accumulation ", c.accumulation, " ",
                              c.communication, c.prescale ? " prescale" : ""));
    const std::string communication =
        *c.communication == '\0'
            ? ""
            : absl::StrCat(R"(, "communication_data_type": ")", c.communication,
                           R"(")");
    absl::StatusOr<config::Config> config = config::LoadConfigString(
        absl::StrCat(
            R"({"train_micro_batch_size_per_gpu": 2, "prescale_gradients": )",
            c.prescale ? "true" : "false",
            R"(, "gradient_accumulation_steps": )", c.accumulation,
            R"(, "bf16": {"enabled": true}, "optimizer": {"type": "AdamW", )",
            R"("params": {"lr": 1e-3}}, "zero_optimization": {"stage": )",
            c.stage, R"(, "reduce_bucket_size": 300})", communication, "}"),
        c.world);
    ASSERT_TRUE(config.ok()) << config.status();
    absl::StatusOr<Plan> plan = BuildPlan(*model, *config, c.world);
    ASSERT_TRUE(plan.ok()) << plan.status();
    int64_t padded = 0, slice = 0;
    for (int b = 0; b < plan->layout.layout.num_buckets(); ++b) {
      padded = std::max(padded, plan->layout.layout.bucket(b).padded_elements);
      slice = std::max(slice, plan->layout.layout.bucket(b).slice_elements);
    }
    const int64_t wire = *c.communication == '\0' ? 2 : 4;
    const int64_t in_flight = static_cast<int64_t>(kMaxReductionsInFlight);
    EXPECT_EQ(GradientBucketTransientBytes(*plan, *config, c.world),
              (c.buffers ? (in_flight + 2) * padded * 2 : 0) +
                  (c.slices ? (in_flight + 1) * slice * wire : 0));
  }
}

// Stage 3's gathers need their own device buffers except at one rank with
// the partition on the device (served in place): bounded by the live
// parameters and a prefetch bucket, and by the model.
TEST(PlanTableTest, GatheredWeightBytesFollowTheFetchBound) {
  std::unique_ptr<nn::GptModel> model = Shapes();
  ASSERT_NE(model, nullptr);
  const auto gathered = [&](int stage, int world, const std::string& extra) {
    absl::StatusOr<config::Config> config = config::LoadConfigString(
        absl::StrCat(
            R"({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": )",
            R"(true}, "optimizer": {"type": "AdamW", "params": {"lr": )",
            R"(1e-3}}, "zero_optimization": {"stage": )", stage, extra, "}}"),
        world);
    EXPECT_TRUE(config.ok()) << config.status();
    if (!config.ok()) return int64_t{-1};
    absl::StatusOr<Plan> plan = BuildPlan(*model, *config, world);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? GatheredWeightBytes(*plan, world) : int64_t{-1};
  };
  const int64_t elements = model->config().NumParameters();
  EXPECT_EQ(gathered(2, 2, ""), 0);
  EXPECT_EQ(gathered(3, 1, ""), 0);
  EXPECT_EQ(gathered(3, 2, ""), elements * kWeightBytes);
  EXPECT_EQ(gathered(3, 1,
                     R"(, "offload_param": {"device": "cpu"}, )"
                     R"("offload_optimizer": {"device": "cpu"})"),
            elements * kWeightBytes);
  EXPECT_EQ(gathered(3, 3,
                     R"(, "stage3_max_live_parameters": 100, )"
                     R"("stage3_prefetch_bucket_size": 50)"),
            150 * kWeightBytes);
}

// Speculation's backup, unset, is every host element's where the host has
// room, and shrinks to half of this rank's share of MemAvailable left after
// the rest of its planned host memory where it has not; an explicit
// speculation_buffer_size is taken as given.
TEST(PlanTableTest, SpeculationBackupDefaultFitsTheHost) {
  std::unique_ptr<nn::GptModel> model = Shapes();
  ASSERT_NE(model, nullptr);
  const Case c{2, OffloadDevice::kCpu, 1.0, 1, false};
  absl::StatusOr<config::Config> config =
      config::LoadConfigString(c.Json(), c.world);
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<Plan> unbounded = BuildPlan(*model, *config, c.world);
  ASSERT_TRUE(unbounded.ok()) << unbounded.status();
  const int64_t all = unbounded->state.speculation_elements;
  ASSERT_GT(all, 0);
  const int64_t per_element = unbounded->memory.speculation_bytes / all;
  const int64_t rest =
      unbounded->memory.host_bytes - unbounded->memory.speculation_bytes;

  HostFacts roomy;
  roomy.memory_available_bytes = int64_t{1} << 40;
  roomy.local_ranks = 2;
  absl::StatusOr<Plan> plan = BuildPlan(*model, *config, c.world, roomy);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->state.speculation_elements, all);

  // Room for 10 elements' backup in this rank's share of two.
  HostFacts tight;
  tight.local_ranks = 2;
  tight.memory_available_bytes = 2 * (rest + 2 * 10 * per_element);
  plan = BuildPlan(*model, *config, c.world, tight);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->state.speculation_elements, 10);
  EXPECT_EQ(plan->memory.speculation_bytes, 10 * per_element);

  // No room at all: no speculation, not a negative backup.
  tight.memory_available_bytes = rest / 2;
  plan = BuildPlan(*model, *config, c.world, tight);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->state.speculation_elements, 0);

  // Explicit: as given, whatever the host.
  std::string json = c.Json();
  const std::string key = R"("offload_optimizer": {)";
  ASSERT_NE(json.find(key), std::string::npos) << json;
  json.replace(json.find(key), key.size(),
               key + R"( "speculation_buffer_size": 7,)");
  config = config::LoadConfigString(json, c.world);
  ASSERT_TRUE(config.ok()) << config.status() << json;
  plan = BuildPlan(*model, *config, c.world, tight);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->state.speculation_elements, 7);
}

}  // namespace
}  // namespace zero
}  // namespace ze
