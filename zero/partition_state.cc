#include "zero/partition_state.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/ops.h"
#include "core/status.h"

namespace ze {
namespace zero {

const char* PlacementName(Placement placement) {
  switch (placement) {
    case Placement::kDevice:
      return "device";
    case Placement::kHost:
      return "host";
    case Placement::kNvme:
      return "nvme";
  }
  return "?";
}

std::vector<Placement> ChooseOptimizerPlacement(
    const PartitionedLayout& layout, const std::vector<bool>& trainable,
    double ratio, Placement offloaded) {
  auto is_trainable = [&](int b) {
    return trainable.empty() || trainable[static_cast<size_t>(b)];
  };
  int64_t total = 0;
  for (int b = 0; b < layout.num_buckets(); ++b) {
    if (is_trainable(b)) total += layout.bucket(b).padded_elements;
  }
  std::vector<Placement> placement(layout.num_buckets(), Placement::kDevice);
  const double wanted = ratio * static_cast<double>(total);
  int64_t on_host = 0;
  for (int b = 0; b < layout.num_buckets(); ++b) {
    if (!is_trainable(b) || static_cast<double>(on_host) >= wanted) continue;
    placement[b] = offloaded;
    on_host += layout.bucket(b).padded_elements;
  }
  return placement;
}

PartitionState::PartitionState(const PartitionedLayout& layout,
                               const PartitionStateOptions& options)
    : layout_(layout), options_(options) {
  trainable_ = options_.trainable.empty()
                   ? std::vector<bool>(layout_.num_buckets(), true)
                   : options_.trainable;
  optimizer_placement_ =
      options_.optimizer_placement.empty()
          ? std::vector<Placement>(layout_.num_buckets(), Placement::kDevice)
          : options_.optimizer_placement;
  master_aliases_weights_ = options_.model_dtype == DType::kF32;
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    if (optimizer_placement_[b] != options_.weights_placement) {
      master_aliases_weights_ = false;
    }
  }
  int64_t offset = 0;
  int64_t device_master = 0;
  int64_t host_master = 0;
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    bucket_offsets_.push_back(offset);
    offset += layout_.bucket(b).padded_elements;
    int64_t& packed = offloaded(b) ? host_master : device_master;
    master_offsets_.push_back(packed);
    packed += own_elements(b);
  }
  gradients_current_.assign(layout_.num_buckets(), false);
  options_.chunk_elements =
      std::max<int64_t>(1, std::min(options_.chunk_elements,
                                    PartitionStateOptions::kMaxChunkElements));
}

int64_t PartitionState::own_elements(int bucket) const {
  return updates_whole_buckets() ? layout_.bucket(bucket).padded_elements
                                 : layout_.bucket(bucket).slice_elements;
}

absl::StatusOr<Tensor> PartitionState::Allocate(int64_t elements, DType dtype,
                                                Placement placement,
                                                const Stream& stream,
                                                bool transferred) const {
  absl::StatusOr<Tensor> tensor;
  if (placement == Placement::kHost) {
    Allocator* allocator = HostMemory();
    if (transferred && options_.pin_memory && options_.device.is_cuda()) {
      // What the device copies from and to (weights, staging): pinned, so
      // the copies are asynchronous and at full speed.
      allocator = PinnedHostMemory();
    }
    tensor = Tensor::Zeros({elements}, dtype, Device::Cpu(), allocator);
  } else {
    tensor = Tensor::Zeros({elements}, dtype, options_.device, stream);
  }
  if (!tensor.ok() && options_.annotate_allocation_error) {
    return options_.annotate_allocation_error(tensor.status());
  }
  return tensor;
}

absl::StatusOr<std::unique_ptr<PartitionState>> PartitionState::Create(
    const PartitionedLayout& layout, const PartitionStateOptions& options,
    const Stream& stream) {
  std::unique_ptr<PartitionState> state(new PartitionState(layout, options));
  if (options.weights_placement == Placement::kHost) {
    if (options.stage != 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          "PartitionState: weights in host memory need stage 3, not stage ",
          options.stage));
    }
    for (int b = 0; b < layout.num_buckets(); ++b) {
      if (state->trainable_[b] && !state->offloaded(b)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "PartitionState: weights in host memory need every trainable "
            "bucket's optimizer on the host; bucket ",
            b, "'s is on the device"));
      }
    }
  }
  const int64_t elements = state->weights_replicated()
                               ? layout.padded_total_elements()
                               : layout.partition_elements();
  ZE_ASSIGN_OR_RETURN(state->weights_,
                      state->Allocate(elements, options.model_dtype,
                                      options.weights_placement, stream,
                                      /*transferred=*/true));
  return state;
}

absl::Status PartitionState::AllocateTrainingState(const Stream& stream) {
  const int64_t padded = layout_.padded_total_elements();
  const int64_t partition = layout_.partition_elements();
  ZE_ASSIGN_OR_RETURN(
      gradients_, Allocate(gradients_replicated() ? padded : partition,
                           options_.model_dtype, Placement::kDevice, stream));
  int64_t device_elements = 0;
  int64_t offloaded_elements = 0;  // host or NVMe: staged through the host
  int64_t host_elements = 0;       // master and state in host memory
  std::vector<int64_t> swapped_chunks;
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    if (!offloaded(b)) {
      device_elements += own_elements(b);
      continue;
    }
    offloaded_elements += own_elements(b);
    if (optimizer_placement_[b] == Placement::kHost) {
      host_elements += own_elements(b);
    } else if (trainable_[b]) {
      first_swapped_chunk_.resize(layout_.num_buckets(), -1);
      first_swapped_chunk_[b] = static_cast<int>(swapped_chunks.size());
      for (int64_t chunk = 0; chunk < num_chunks(b); ++chunk) {
        swapped_chunks.push_back(chunk_span(b, chunk).count);
      }
    }
  }
  if (!master_aliases_weights()) {
    ZE_ASSIGN_OR_RETURN(device_master_, Allocate(device_elements, DType::kF32,
                                                 Placement::kDevice, stream));
    ZE_ASSIGN_OR_RETURN(host_master_, Allocate(host_elements, DType::kF32,
                                               Placement::kHost, stream));
  }
  if (!swapped_chunks.empty()) {
    // Master weights and moments of every NVMe bucket, chunk by chunk.
    offload::SwappedStateOptions swap = options_.nvme;
    swap.file_name =
        absl::StrCat("zero_engine_rank", options_.rank, "_optimizer_state.swp");
    swap.arrays =
        1 + static_cast<int>(StateBytesPerElement(options_.optimizer) /
                             sizeof(float));
    options_.nvme.arrays = swap.arrays;
    ZE_ASSIGN_OR_RETURN(swapped_,
                        offload::SwappedState::Create(swap, swapped_chunks));
  }
  if (offloaded_elements > 0) {
    ZE_ASSIGN_OR_RETURN(
        host_staging_,
        Allocate(offloaded_elements, options_.model_dtype, Placement::kHost,
                 stream, /*transferred=*/true));
    if (options_.delayed_update) {
      if (options_.weights_placement != Placement::kDevice) {
        return absl::InvalidArgumentError(
            "PartitionState: a delayed update needs the weights on the device");
      }
      ZE_ASSIGN_OR_RETURN(delayed_weights_,
                          Allocate(offloaded_elements, options_.model_dtype,
                                   Placement::kDevice, stream));
    }
    offload::CpuExecutionOptions execution;
    execution.num_threads = options_.host_threads;
    execution.first_cpu = options_.host_first_cpu;
    absl::StatusOr<std::unique_ptr<offload::CpuOptimizer>> optimizer =
        offload::CpuOptimizer::Create(options_.optimizer, host_elements,
                                      execution);
    if (!optimizer.ok()) {
      return options_.annotate_allocation_error
                 ? options_.annotate_allocation_error(optimizer.status())
                 : optimizer.status();
    }
    host_optimizer_ = std::move(optimizer).value();
    if (options_.device.is_cuda()) {
      ZE_ASSIGN_OR_RETURN(to_host_stream_, Stream::Create(options_.device));
      ZE_ASSIGN_OR_RETURN(to_device_stream_, Stream::Create(options_.device));
    }
    gradients_on_host_.resize(layout_.num_buckets());
    weights_uploaded_.resize(layout_.num_buckets());
    for (int b = 0; b < layout_.num_buckets(); ++b) {
      if (!offloaded(b)) continue;
      for (int64_t chunk = 0; chunk < num_chunks(b); ++chunk) {
        ZE_ASSIGN_OR_RETURN(Event down, Event::Create(options_.device));
        ZE_ASSIGN_OR_RETURN(Event up, Event::Create(options_.device));
        gradients_on_host_[b].push_back(std::move(down));
        weights_uploaded_[b].push_back(std::move(up));
      }
    }
  }
  optimizers_.resize(layout_.num_buckets());
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    if (!trainable_[b]) continue;
    if (optimizer_placement_[b] == Placement::kDevice) {
      absl::StatusOr<std::unique_ptr<FlatOptimizer>> optimizer =
          FlatOptimizer::Create(options_.optimizer, own_elements(b),
                                options_.device);
      if (!optimizer.ok()) {
        return options_.annotate_allocation_error
                   ? options_.annotate_allocation_error(optimizer.status())
                   : optimizer.status();
      }
      optimizers_[b] = std::move(optimizer).value();
    }
    if (optimizer_placement_[b] == Placement::kNvme) {
      // The initial master weights go to the swap file chunk by chunk (the
      // moments start at zero).
      Tensor weights = OwnWeights(b);
      for (int64_t chunk = 0; chunk < num_chunks(b); ++chunk) {
        const auto [begin, count] = chunk_span(b, chunk);
        ZE_ASSIGN_OR_RETURN(Tensor master,
                            Tensor::Empty({count}, DType::kF32, Device::Cpu()));
        ZE_RETURN_IF_ERROR(
            CopyConverting(weights.Slice(begin, count), master, stream));
        ZE_RETURN_IF_ERROR(stream.Synchronize());
        ZE_RETURN_IF_ERROR(swapped_->Initialize(
            first_swapped_chunk_[b] + static_cast<int>(chunk),
            master.data_as<float>()));
      }
    } else if (!master_aliases_weights()) {
      // Onto the host (offload) this converts on the device first.
      ZE_RETURN_IF_ERROR(CopyConverting(OwnWeights(b), OwnMaster(b), stream));
    }
  }
  if (host_optimizer_ != nullptr) ZE_RETURN_IF_ERROR(stream.Synchronize());
  return absl::OkStatus();
}

Tensor PartitionState::FullWeights(int bucket) const {
  return weights_.Slice(bucket_offsets_[bucket],
                        layout_.bucket(bucket).padded_elements);
}

Tensor PartitionState::FullGradients(int bucket) const {
  return gradients_.Slice(bucket_offsets_[bucket],
                          layout_.bucket(bucket).padded_elements);
}

Tensor PartitionState::OwnWeights(int bucket) const {
  const BucketLayout& layout = layout_.bucket(bucket);
  if (updates_whole_buckets()) return FullWeights(bucket);
  if (weights_replicated()) {
    return weights_.Slice(
        bucket_offsets_[bucket] + options_.rank * layout.slice_elements,
        layout.slice_elements);
  }
  return weights_.Slice(layout.partition_offset, layout.slice_elements);
}

Tensor PartitionState::OwnMaster(int bucket) const {
  if (master_aliases_weights()) return OwnWeights(bucket);
  if (optimizer_placement_[bucket] == Placement::kNvme) return Tensor();
  const Tensor& master = optimizer_placement_[bucket] == Placement::kHost
                             ? host_master_
                             : device_master_;
  return master.Slice(master_offsets_[bucket], own_elements(bucket));
}

offload::NvmeStore::Counters PartitionState::nvme_counters() const {
  if (swapped_ == nullptr) return offload::NvmeStore::Counters();
  return swapped_->store().counters();
}

absl::Status PartitionState::WriteMaster(int bucket, int64_t partition_offset,
                                         const Tensor& values,
                                         const Stream& stream) {
  const int64_t begin =
      partition_offset - layout_.bucket(bucket).partition_offset;
  if (optimizer_placement_[bucket] != Placement::kNvme) {
    return CopyConverting(
        values, OwnMaster(bucket).Slice(begin, values.numel()), stream);
  }
  ZE_ASSIGN_OR_RETURN(
      Tensor host, Tensor::Empty({values.numel()}, DType::kF32, Device::Cpu()));
  ZE_RETURN_IF_ERROR(CopyConverting(values, host, stream));
  ZE_RETURN_IF_ERROR(stream.Synchronize());
  return SwappedRange(bucket, /*array=*/0, begin, values.numel(),
                      host.data_as<float>(), /*write=*/true);
}

absl::Status PartitionState::SwappedRange(int bucket, int array,
                                          int64_t own_begin, int64_t count,
                                          float* data, bool write) const {
  // Chunk by chunk: a range may straddle chunks.
  int64_t done = 0;
  while (done < count) {
    const int64_t at = own_begin + done;
    const int64_t chunk = at / options_.chunk_elements;
    const int64_t within = at - chunk * options_.chunk_elements;
    const int64_t piece =
        std::min(count - done, options_.chunk_elements - within);
    const int index = first_swapped_chunk_[bucket] + static_cast<int>(chunk);
    ZE_RETURN_IF_ERROR(
        write ? swapped_->Write(index, array, within, piece, data + done)
              : swapped_->Read(index, array, within, piece, data + done));
    done += piece;
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> PartitionState::ReadSwappedMaster(int bucket) const {
  ZE_ASSIGN_OR_RETURN(Tensor master, Tensor::Empty({own_elements(bucket)},
                                                   DType::kF32, Device::Cpu()));
  ZE_RETURN_IF_ERROR(SwappedRange(bucket, /*array=*/0, 0, own_elements(bucket),
                                  master.data_as<float>(), /*write=*/false));
  return master;
}

int64_t PartitionState::optimizer_step_count() const {
  if (host_optimizer_ != nullptr) return host_optimizer_->step_count();
  for (const auto& optimizer : optimizers_) {
    if (optimizer != nullptr) return optimizer->step_count();
  }
  return 0;
}

PartitionState::~PartitionState() {
  {
    // An update begun early whose step never came (a failed backward) is
    // still waiting for buckets: release it.
    std::lock_guard<std::mutex> lock(pending_.mutex);
    pending_.closed = true;
    pending_.progress.notify_all();
  }
  if (pending_.worker.joinable()) pending_.worker.join();
}

absl::Status PartitionState::SendGradientsDown(int bucket,
                                               const Stream& stream) {
  const Stream& down = to_host_stream_ ? *to_host_stream_ : stream;
  ZE_ASSIGN_OR_RETURN(Event gradients_final, Event::Create(options_.device));
  ZE_RETURN_IF_ERROR(gradients_final.Record(stream));
  ZE_RETURN_IF_ERROR(gradients_final.StreamWait(down));
  Tensor gradients = OwnGradients(bucket);
  Tensor staging =
      host_staging_.Slice(master_offsets_[bucket], own_elements(bucket));
  // From the bucket's end: the order the worker takes the chunks in.
  for (int64_t chunk = num_chunks(bucket) - 1; chunk >= 0; --chunk) {
    const auto [begin, count] = chunk_span(bucket, chunk);
    ZE_RETURN_IF_ERROR(
        Copy(gradients.Slice(begin, count), staging.Slice(begin, count), down));
    ZE_RETURN_IF_ERROR(gradients_on_host_[bucket][chunk].Record(down));
  }
  handed_to_worker_[bucket] = true;
  std::lock_guard<std::mutex> lock(pending_.mutex);
  pending_.ready.push_back(bucket);
  pending_.progress.notify_all();
  return absl::OkStatus();
}

void PartitionState::StartWorker(const StepArgs& step_args, bool begun_early) {
  pending_.written_from.assign(layout_.num_buckets(),
                               std::numeric_limits<int64_t>::max());
  pending_.ready.clear();
  pending_.taken.clear();
  pending_.begun_early = begun_early;
  pending_.closed = false;
  pending_.failed = false;
  pending_.status = absl::OkStatus();
  handed_to_worker_.assign(layout_.num_buckets(), false);
  pending_.worker = std::thread([this, step_args] {
    absl::Status status = UpdateHostBuckets(step_args);
    std::lock_guard<std::mutex> lock(pending_.mutex);
    pending_.status = status;
    pending_.failed = !status.ok();
    pending_.progress.notify_all();
  });
}

bool PartitionState::CanBeginEarly() const {
  return host_optimizer_ != nullptr && swapped_ == nullptr &&
         !options_.delayed_update &&
         options_.weights_placement == Placement::kDevice;
}

absl::Status PartitionState::BeginUpdate(const StepArgs& step_args,
                                         const Stream& stream) {
  if (!CanBeginEarly()) return absl::OkStatus();
  ZE_RETURN_IF_ERROR(FinishUpdate(stream));
  ZE_RETURN_IF_ERROR(offload::ComputeStepCoefficients(
                         options_.optimizer, optimizer_step_count(), step_args,
                         /*has_momentum_buffer=*/false)
                         .status());
  early_args_ = step_args;
  StartWorker(step_args, /*begun_early=*/true);
  return absl::OkStatus();
}

absl::Status PartitionState::GradientsFinal(int bucket, const Stream& stream) {
  if (!early_args_ || !trainable_[bucket] || !offloaded(bucket) ||
      handed_to_worker_[bucket]) {
    return absl::OkStatus();
  }
  return SendGradientsDown(bucket, stream);
}

absl::Status PartitionState::UpdateWeights(const StepArgs& step_args,
                                           const Stream& stream) {
  if (early_args_) {
    // The worker started during backward with the arguments known then;
    // the boundary step must have computed the same ones.
    if (early_args_->lr != step_args.lr ||
        early_args_->grad_scale != step_args.grad_scale) {
      return absl::InternalError(absl::StrCat(
          "offloaded update begun during backward with lr ", early_args_->lr,
          " and grad_scale ", early_args_->grad_scale,
          ", but the boundary step has lr ", step_args.lr, " and grad_scale ",
          step_args.grad_scale));
    }
  } else {
    ZE_RETURN_IF_ERROR(FinishUpdate(stream));
  }
  // Checked before anything changes, so a bad lr fails the whole step.
  ZE_RETURN_IF_ERROR(offload::ComputeStepCoefficients(
                         options_.optimizer, optimizer_step_count(), step_args,
                         /*has_momentum_buffer=*/false)
                         .status());
  if (host_optimizer_ != nullptr) {
    if (!early_args_) StartWorker(step_args, /*begun_early=*/false);
    // Buckets not handed over yet travel now, in the order the forward
    // reads them (the worker's order); the device buckets' kernels below
    // run while they travel.
    std::vector<int> forward_order(layout_.num_buckets());
    std::iota(forward_order.begin(), forward_order.end(), 0);
    std::sort(forward_order.begin(), forward_order.end(), [this](int a, int b) {
      return ForwardReadPosition(a) < ForwardReadPosition(b);
    });
    for (int b : forward_order) {
      if (!trainable_[b] || !offloaded(b) || handed_to_worker_[b]) continue;
      ZE_RETURN_IF_ERROR(SendGradientsDown(b, stream));
    }
    {
      std::lock_guard<std::mutex> lock(pending_.mutex);
      pending_.closed = true;
      pending_.progress.notify_all();
    }
    early_args_.reset();
    // Gradients are zeroed or overwritten on `stream` after the step: not
    // before they are copied.
    const Stream& down = to_host_stream_ ? *to_host_stream_ : stream;
    ZE_ASSIGN_OR_RETURN(Event copied, Event::Create(options_.device));
    ZE_RETURN_IF_ERROR(copied.Record(down));
    ZE_RETURN_IF_ERROR(copied.StreamWait(stream));
  }
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    if (!trainable_[b] || optimizer_placement_[b] != Placement::kDevice) {
      continue;
    }
    ZE_RETURN_IF_ERROR(optimizers_[b]->Step(
        OwnMaster(b), OwnGradients(b), step_args, stream,
        master_aliases_weights() ? Tensor() : OwnWeights(b)));
  }
  return absl::OkStatus();
}

namespace {
double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}
}  // namespace

PartitionState::OffloadTimes PartitionState::offload_times() const {
  std::lock_guard<std::mutex> lock(const_cast<std::mutex&>(pending_.mutex));
  return pending_.times;
}

std::vector<int> PartitionState::last_update_order() const {
  std::lock_guard<std::mutex> lock(const_cast<std::mutex&>(pending_.mutex));
  return pending_.taken;
}

absl::Status PartitionState::UpdateHostBuckets(const StepArgs& step_args) {
  const auto worker_start = std::chrono::steady_clock::now();
  struct Record {
    PendingUpdate& pending;
    std::chrono::steady_clock::time_point start;
    ~Record() {
      std::lock_guard<std::mutex> lock(pending.mutex);
      ++pending.times.updates;
      pending.times.worker_seconds += SecondsSince(start);
    }
  } record{pending_, worker_start};
  if (options_.device.is_cuda()) {
    ZE_RETURN_IF_ERROR(SetCurrentDevice(options_.device));
  }
  // Buckets as they are handed over (all at once in the forward's reading
  // order, or, begun early, as backward finishes them), each from its end,
  // chunk by chunk. Handed over all at once: in that order. Begun early,
  // while more may come: the newest whose first chunk has landed (else the
  // oldest, whose copy lands first), so that what is left
  // when backward ends is, besides the first layers (final last), the
  // layers the next forward reads last. Once every bucket is handed over:
  // the one the next forward reads first. The next forward then follows the
  // update and, when the update ends, has few layers left to run.
  auto next_bucket = [this]() -> int {
    std::unique_lock<std::mutex> lock(pending_.mutex);
    pending_.progress.wait(
        lock, [&] { return !pending_.ready.empty() || pending_.closed; });
    if (pending_.ready.empty()) return -1;
    const size_t chosen = ChooseBucketToUpdate(
        pending_.ready, pending_.closed, pending_.begun_early,
        [this](int b) {
          return gradients_on_host_[b][num_chunks(b) - 1].Query();
        },
        [this](int b) { return ForwardReadPosition(b); });
    const int bucket = pending_.ready[chosen];
    pending_.ready.erase(pending_.ready.begin() + chosen);
    pending_.taken.push_back(bucket);
    return bucket;
  };
  if (swapped_ != nullptr) {
    // NVMe is never begun early: every bucket is handed over at once.
    std::vector<std::pair<int, int64_t>> order;  // (bucket, chunk)
    for (int b = next_bucket(); b >= 0; b = next_bucket()) {
      for (int64_t chunk = num_chunks(b) - 1; chunk >= 0; --chunk) {
        order.emplace_back(b, chunk);
      }
    }
    // NVMe: each chunk's master and moments are read in ahead of the step
    // and written back behind it.
    std::vector<int> swapped_order;
    for (const auto& [b, chunk] : order) {
      swapped_order.push_back(first_swapped_chunk_[b] +
                              static_cast<int>(chunk));
    }
    size_t next = 0;
    ZE_RETURN_IF_ERROR(swapped_->Update(
        swapped_order, [&](int, float* const* arrays) -> absl::Status {
          const auto [b, chunk] = order[next++];
          return UpdateSwappedChunk(b, chunk, step_args, arrays[0],
                                    swapped_arrays() > 1 ? arrays[1] : nullptr,
                                    swapped_arrays() > 2 ? arrays[2] : nullptr);
        }));
  } else {
    // Host memory: the chunks as one stream of tiles over the CPU
    // optimizer's threads, which go on to the next chunk while the last
    // tiles of the one before still run (a chunk at a time would idle all
    // but one thread at each chunk's end). Chunk k is range k.
    std::mutex order_mutex;
    std::vector<std::pair<int, int64_t>> order;  // (bucket, chunk)
    int bucket = -1;
    int64_t next_chunk = -1;
    const auto stream_start = std::chrono::steady_clock::now();
    const double waited_before = [this] {
      std::lock_guard<std::mutex> lock(pending_.mutex);
      return pending_.times.gradient_wait_seconds;
    }();
    const absl::Status status = host_optimizer_->StepRanges(
        step_args,
        [&](offload::RangeToUpdate* range) -> absl::StatusOr<bool> {
          // Any of the CPU optimizer's threads may ask; the events it
          // queries and waits for are the device's.
          if (options_.device.is_cuda()) {
            ZE_RETURN_IF_ERROR(SetCurrentDevice(options_.device));
          }
          if (next_chunk < 0) {
            bucket = next_bucket();
            if (bucket < 0) return false;
            next_chunk = num_chunks(bucket) - 1;
          }
          const int64_t chunk = next_chunk--;
          ZE_RETURN_IF_ERROR(WaitForHostGradients(bucket, chunk));
          *range = ChunkRange(bucket, chunk);
          std::lock_guard<std::mutex> lock(order_mutex);
          order.emplace_back(bucket, chunk);
          return true;
        },
        [&](int64_t index) -> absl::Status {
          std::pair<int, int64_t> chunk;
          {
            std::lock_guard<std::mutex> lock(order_mutex);
            chunk = order[index];
          }
          return ChunkUpdated(chunk.first, chunk.second);
        });
    {
      // The stream's span less its waits for gradients.
      std::lock_guard<std::mutex> lock(pending_.mutex);
      pending_.times.optimizer_seconds +=
          SecondsSince(stream_start) -
          (pending_.times.gradient_wait_seconds - waited_before);
    }
    ZE_RETURN_IF_ERROR(status);
  }
  host_optimizer_->AdvanceStep();
  return absl::OkStatus();
}

size_t ChooseBucketToUpdate(const std::deque<int>& ready, bool handed_over_all,
                            bool begun_early,
                            const std::function<bool(int)>& landed,
                            const std::function<int(int)>& forward_position) {
  if (handed_over_all) {
    size_t first_read = 0;
    for (size_t i = 1; i < ready.size(); ++i) {
      if (forward_position(ready[i]) < forward_position(ready[first_read])) {
        first_read = i;
      }
    }
    return first_read;
  }
  if (begun_early) {
    for (size_t i = ready.size(); i-- > 0;) {
      if (landed(ready[i])) return i;
    }
  }
  return 0;
}

int PartitionState::ForwardReadPosition(int bucket) const {
  return options_.bucket_zero_read_first ? bucket
                                         : layout_.num_buckets() - 1 - bucket;
}

absl::Status PartitionState::WaitForHostGradients(int bucket, int64_t chunk) {
  const auto wait_start = std::chrono::steady_clock::now();
  ZE_RETURN_IF_ERROR(gradients_on_host_[bucket][chunk].Synchronize());
  std::lock_guard<std::mutex> lock(pending_.mutex);
  pending_.times.gradient_wait_seconds += SecondsSince(wait_start);
  return absl::OkStatus();
}

offload::RangeToUpdate PartitionState::ChunkRange(int bucket,
                                                  int64_t chunk) const {
  const auto [begin, count] = chunk_span(bucket, chunk);
  Tensor grads = host_staging_.Slice(master_offsets_[bucket] + begin, count);
  offload::RangeToUpdate range;
  range.state_offset = master_offsets_[bucket] + begin;
  range.count = count;
  // NVMe buckets: the caller's swap buffer instead.
  if (optimizer_placement_[bucket] == Placement::kHost) {
    range.master_weights = OwnMaster(bucket).data_as<float>() + begin;
  }
  range.grads = grads.data();
  range.grad_dtype = grads.dtype();
  // The 16-bit result goes straight into host weights, or over the
  // gradients in the staging buffer (each element's gradient is read before
  // its weight is written), from where it is uploaded.
  if (options_.weights_placement != Placement::kHost) {
    range.out = grads.data();
  } else if (!master_aliases_weights()) {
    range.out = OwnWeights(bucket).Slice(begin, count).data();
  }
  range.out_dtype = options_.model_dtype;
  return range;
}

absl::Status PartitionState::ChunkUpdated(int bucket, int64_t chunk) {
  const auto [begin, count] = chunk_span(bucket, chunk);
  if (options_.weights_placement != Placement::kHost) {
    // Any thread of the CPU optimizer's may run this.
    if (options_.device.is_cuda()) {
      ZE_RETURN_IF_ERROR(SetCurrentDevice(options_.device));
    }
    const Stream up = to_device_stream_ ? *to_device_stream_ : Stream();
    Tensor destination =
        options_.delayed_update
            ? delayed_weights_.Slice(master_offsets_[bucket] + begin, count)
            : OwnWeights(bucket).Slice(begin, count);
    ZE_RETURN_IF_ERROR(
        Copy(host_staging_.Slice(master_offsets_[bucket] + begin, count),
             destination, up));
    ZE_RETURN_IF_ERROR(weights_uploaded_[bucket][chunk].Record(up));
  }
  std::lock_guard<std::mutex> lock(pending_.mutex);
  pending_.written_from[bucket] = begin;
  pending_.progress.notify_all();
  return absl::OkStatus();
}

absl::Status PartitionState::UpdateSwappedChunk(int bucket, int64_t chunk,
                                                const StepArgs& step_args,
                                                float* master, float* state0,
                                                float* state1) {
  ZE_RETURN_IF_ERROR(WaitForHostGradients(bucket, chunk));
  const offload::RangeToUpdate range = ChunkRange(bucket, chunk);
  const auto step_start = std::chrono::steady_clock::now();
  ZE_RETURN_IF_ERROR(host_optimizer_->StepExternal(
      range.count, master, state0, state1, range.grads, range.grad_dtype,
      step_args, range.out, range.out_dtype));
  {
    std::lock_guard<std::mutex> lock(pending_.mutex);
    pending_.times.optimizer_seconds += SecondsSince(step_start);
  }
  return ChunkUpdated(bucket, chunk);
}

absl::Status PartitionState::WaitForWeights(int bucket, const Stream& stream,
                                            int64_t own_begin) {
  if (!pending_.worker.joinable() || !offloaded(bucket) ||
      !trainable_[bucket] || options_.delayed_update || early_args_) {
    return absl::OkStatus();
  }
  const int64_t chunk =
      std::max<int64_t>(0, std::min(own_begin, own_elements(bucket) - 1) /
                               options_.chunk_elements);
  const int64_t chunk_begin = chunk_span(bucket, chunk).begin;
  {
    const auto wait_start = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(pending_.mutex);
    pending_.progress.wait(lock, [&] {
      return pending_.written_from[bucket] <= chunk_begin || pending_.failed;
    });
    pending_.times.engine_wait_seconds += SecondsSince(wait_start);
    if (pending_.written_from[bucket] > chunk_begin) {
      // The update failed before this chunk. Not an error here: a forward
      // on one rank failing alone would leave the others waiting in a
      // collective. The next boundary step's FinishUpdate reports it on
      // every rank, before anything else is updated.
      return absl::OkStatus();
    }
  }
  if (options_.weights_placement == Placement::kDevice) {
    // The upload stream runs in order: this chunk's event covers the
    // chunks written before it too.
    return weights_uploaded_[bucket][chunk].StreamWait(stream);
  }
  return absl::OkStatus();
}

absl::Status PartitionState::WaitForParameter(int index, const Stream& stream) {
  const ParamPlacement& place = layout_.placement(index);
  int64_t begin = place.offset;
  if (!updates_whole_buckets()) {
    begin -= options_.rank * layout_.bucket(place.bucket).slice_elements;
  }
  return WaitForWeights(place.bucket, stream, std::max<int64_t>(0, begin));
}

int64_t PartitionState::num_chunks(int bucket) const {
  return std::max<int64_t>(
      1, (own_elements(bucket) + options_.chunk_elements - 1) /
             options_.chunk_elements);
}

PartitionState::ChunkSpan PartitionState::chunk_span(int bucket,
                                                     int64_t chunk) const {
  ChunkSpan span;
  span.begin = chunk * options_.chunk_elements;
  span.count =
      std::min(options_.chunk_elements, own_elements(bucket) - span.begin);
  return span;
}

absl::Status PartitionState::FinishUpdate(const Stream& stream) {
  // An update begun early is this step's, not a previous one: it runs on
  // until UpdateWeights has handed over every bucket.
  if (!pending_.worker.joinable() || early_args_) return absl::OkStatus();
  const auto join_start = std::chrono::steady_clock::now();
  pending_.worker.join();
  {
    std::lock_guard<std::mutex> lock(pending_.mutex);
    pending_.times.engine_wait_seconds += SecondsSince(join_start);
  }
  if (options_.weights_placement == Placement::kDevice && to_device_stream_) {
    ZE_ASSIGN_OR_RETURN(Event uploaded, Event::Create(options_.device));
    ZE_RETURN_IF_ERROR(uploaded.Record(*to_device_stream_));
    ZE_RETURN_IF_ERROR(uploaded.StreamWait(stream));
  }
  ZE_RETURN_IF_ERROR(pending_.status);
  if (options_.delayed_update) {
    // The delayed update takes effect now.
    for (int b = 0; b < layout_.num_buckets(); ++b) {
      if (!trainable_[b] || !offloaded(b)) continue;
      ZE_RETURN_IF_ERROR(
          Copy(delayed_weights_.Slice(master_offsets_[b], own_elements(b)),
               OwnWeights(b), stream));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> PartitionState::WeightsForGather(int bucket,
                                                        const Stream& stream) {
  ZE_RETURN_IF_ERROR(WaitForWeights(bucket, stream));
  Tensor own = OwnWeights(bucket);
  if (options_.weights_placement == Placement::kDevice ||
      !options_.device.is_cuda()) {
    return own;
  }
  if (!to_device_stream_) {
    ZE_ASSIGN_OR_RETURN(to_device_stream_, Stream::Create(options_.device));
  }
  const Stream& up = *to_device_stream_;
  // Allocated for `stream` (the gather's), written on `up`: recorded there
  // too, so the block is reused only after both.
  ZE_ASSIGN_OR_RETURN(Tensor uploaded,
                      Tensor::Empty(own.shape(), own.dtype(), options_.device));
  ZE_ASSIGN_OR_RETURN(Event ready, Event::Create(options_.device));
  ZE_RETURN_IF_ERROR(ready.Record(stream));
  ZE_RETURN_IF_ERROR(ready.StreamWait(up));
  ZE_RETURN_IF_ERROR(Copy(own, uploaded, up));
  ZE_RETURN_IF_ERROR(uploaded.RecordStream(up));
  ZE_ASSIGN_OR_RETURN(Event done, Event::Create(options_.device));
  ZE_RETURN_IF_ERROR(done.Record(up));
  ZE_RETURN_IF_ERROR(done.StreamWait(stream));
  return uploaded;
}

Tensor PartitionState::OwnGradients(int bucket) const {
  const BucketLayout& layout = layout_.bucket(bucket);
  if (updates_whole_buckets()) return FullGradients(bucket);
  if (gradients_replicated()) {
    return gradients_.Slice(
        bucket_offsets_[bucket] + options_.rank * layout.slice_elements,
        layout.slice_elements);
  }
  return gradients_.Slice(layout.partition_offset, layout.slice_elements);
}

absl::Status PartitionState::ResetGradients(const Stream& stream) {
  std::fill(gradients_current_.begin(), gradients_current_.end(), false);
  if (gradients_replicated()) return Fill(gradients_, 0.0f, stream);
  return absl::OkStatus();
}

absl::Status PartitionState::ZeroStaleGradients(const Stream& stream) {
  if (gradients_replicated()) return absl::OkStatus();
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    if (!trainable_[b] || gradients_current_[b]) continue;
    // No backward in this window reached the bucket: its gradient is 0.
    ZE_RETURN_IF_ERROR(Fill(OwnGradients(b), 0.0f, stream));
    gradients_current_[b] = true;
  }
  return absl::OkStatus();
}

void PartitionState::set_optimizer_step_count(int64_t count) {
  if (host_optimizer_ != nullptr) host_optimizer_->set_step_count(count);
  for (auto& optimizer : optimizers_) {
    if (optimizer != nullptr) optimizer->set_step_count(count);
  }
}

std::vector<std::string> PartitionState::StateArrayNames() const {
  std::vector<std::string> names = {"master"};
  // The device optimizer's own names, whatever the placement: the host and
  // swap-file arrays hold the same quantities in the same order.
  absl::StatusOr<std::unique_ptr<FlatOptimizer>> probe =
      FlatOptimizer::Create(options_.optimizer, 0, Device::Cpu());
  if (probe.ok()) {
    for (const NamedStateTensor& state : (*probe)->StateTensors()) {
      names.push_back(state.name);
    }
  }
  return names;
}

PartitionSlice PartitionState::OwnRange(int bucket) const {
  if (updates_whole_buckets()) {
    return PartitionSlice{options_.rank, 0,
                          layout_.bucket(bucket).padded_elements};
  }
  return layout_.BucketSlice(bucket, options_.rank);
}

Tensor PartitionState::CheckpointWeights(int bucket,
                                         int64_t* bucket_begin) const {
  if (weights_replicated()) {
    *bucket_begin = 0;
    return FullWeights(bucket);
  }
  *bucket_begin = layout_.BucketSlice(bucket, options_.rank).begin;
  return OwnWeights(bucket);
}

absl::Status PartitionState::ReadOwnState(int bucket, int array,
                                          int64_t own_begin, const Tensor& out,
                                          const Stream& stream) const {
  const int64_t count = out.numel();
  if (own_begin < 0 || own_begin + count > own_elements(bucket) || array < 0 ||
      array >= static_cast<int>(StateArrayNames().size())) {
    return absl::OutOfRangeError(
        absl::StrCat("ReadOwnState: array ", array, " elements [", own_begin,
                     ", ", own_begin + count, ") of bucket ", bucket, " (",
                     own_elements(bucket), " own elements)"));
  }
  if (!trainable_[bucket]) {
    if (array == 0) {
      ZE_RETURN_IF_ERROR(CopyConverting(
          OwnWeights(bucket).Slice(own_begin, count), out, stream));
      return stream.Synchronize();
    }
    return Fill(out, 0.0f, Stream::Default(Device::Cpu()));
  }
  switch (optimizer_placement_[bucket]) {
    case Placement::kNvme:
      return SwappedRange(bucket, array, own_begin, count, out.data_as<float>(),
                          /*write=*/false);
    case Placement::kHost:
      if (array == 0) {
        std::memcpy(out.data_as<float>(),
                    OwnMaster(bucket).data_as<float>() + own_begin,
                    count * sizeof(float));
      } else {
        std::memcpy(out.data_as<float>(),
                    HostStateArray(array) + master_offsets_[bucket] + own_begin,
                    count * sizeof(float));
      }
      return absl::OkStatus();
    case Placement::kDevice:
      break;
  }
  const Tensor source =
      array == 0 ? OwnMaster(bucket)
                 : optimizers_[bucket]->StateTensors()[array - 1].tensor;
  ZE_RETURN_IF_ERROR(
      CopyConverting(source.Slice(own_begin, count), out, stream));
  return stream.Synchronize();
}

absl::Status PartitionState::WriteOwnState(int bucket, int array,
                                           int64_t own_begin,
                                           const Tensor& values,
                                           const Stream& stream) {
  const int64_t count = values.numel();
  if (own_begin < 0 || own_begin + count > own_elements(bucket) || array < 0 ||
      array >= static_cast<int>(StateArrayNames().size())) {
    return absl::OutOfRangeError(
        absl::StrCat("WriteOwnState: array ", array, " elements [", own_begin,
                     ", ", own_begin + count, ") of bucket ", bucket, " (",
                     own_elements(bucket), " own elements)"));
  }
  if (!trainable_[bucket]) return absl::OkStatus();
  switch (optimizer_placement_[bucket]) {
    case Placement::kNvme:
      return SwappedRange(bucket, array, own_begin, count,
                          const_cast<float*>(values.data_as<float>()),
                          /*write=*/true);
    case Placement::kHost:
      if (array == 0) {
        ZE_RETURN_IF_ERROR(CopyConverting(
            values, OwnMaster(bucket).Slice(own_begin, count), stream));
        return stream.Synchronize();
      }
      std::memcpy(HostStateArray(array) + master_offsets_[bucket] + own_begin,
                  values.data_as<float>(), count * sizeof(float));
      return absl::OkStatus();
    case Placement::kDevice:
      break;
  }
  const Tensor target =
      array == 0 ? OwnMaster(bucket)
                 : optimizers_[bucket]->StateTensors()[array - 1].tensor;
  ZE_RETURN_IF_ERROR(
      CopyConverting(values, target.Slice(own_begin, count), stream));
  return stream.Synchronize();
}

float* PartitionState::HostStateArray(int array) const {
  // The CPU optimizer's arrays in StateArrayNames order after "master".
  if (array == 1) {
    return host_optimizer_->exp_avg() != nullptr
               ? host_optimizer_->exp_avg()
               : host_optimizer_->momentum_buffer();
  }
  return host_optimizer_->exp_avg_sq();
}

Tensor PartitionState::MasterPiece(int index, int64_t* begin) const {
  const ParamPlacement& place = layout_.placement(index);
  if (updates_whole_buckets()) {
    *begin = 0;
    return OwnMaster(place.bucket).Slice(place.offset, place.numel);
  }
  // This rank owns [rank * slice, (rank + 1) * slice) of the bucket; the
  // parameter lies at [offset, offset + numel).
  const int64_t slice = layout_.bucket(place.bucket).slice_elements;
  const int64_t rank = options_.rank;
  const int64_t low = std::max<int64_t>(place.offset, rank * slice);
  const int64_t high =
      std::min<int64_t>(place.offset + place.numel, (rank + 1) * slice);
  if (high <= low) return Tensor();
  *begin = low - place.offset;
  return OwnMaster(place.bucket).Slice(low - rank * slice, high - low);
}

absl::StatusOr<std::vector<float>> PartitionState::GatherMaster(
    int index, comm::Communicator& comm, const Stream& stream) const {
  const ParamPlacement& place = layout_.placement(index);
  const BucketLayout& layout = layout_.bucket(place.bucket);
  ZE_ASSIGN_OR_RETURN(Tensor full, Tensor::Empty({layout.padded_elements},
                                                 DType::kF32, options_.device));
  // The master slice is f32 in every mode (in f32 training it is the
  // weights themselves), so it gathers as it is.
  Tensor own = OwnMaster(place.bucket);
  if (optimizer_placement_[place.bucket] == Placement::kNvme) {
    ZE_ASSIGN_OR_RETURN(own, ReadSwappedMaster(place.bucket));
  }
  if (own.device() != options_.device) {
    // An offloaded slice: collectives work on the model's device.
    ZE_ASSIGN_OR_RETURN(
        Tensor on_device,
        Tensor::Empty(own.shape(), own.dtype(), options_.device));
    ZE_RETURN_IF_ERROR(Copy(own, on_device, stream));
    own = on_device;
  }
  if (updates_whole_buckets() || comm.world_size() == 1) {
    ZE_RETURN_IF_ERROR(Copy(own, full, stream));
  } else {
    ZE_ASSIGN_OR_RETURN(comm::Work work, comm.AllGather(own, full, stream));
    ZE_RETURN_IF_ERROR(work.Wait());
  }
  ZE_ASSIGN_OR_RETURN(std::vector<float> values, ToHostFloats(full, stream));
  return std::vector<float>(values.begin() + place.offset,
                            values.begin() + place.offset + place.numel);
}

}  // namespace zero
}  // namespace ze
