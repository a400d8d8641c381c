#include "zero/partition_state.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/logging.h"
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
    double ratio, bool bucket_zero_read_first, Placement offloaded) {
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
  const int buckets = layout.num_buckets();
  for (int i = 0; i < buckets; ++i) {
    const int b = bucket_zero_read_first ? buckets - 1 - i : i;
    if (!is_trainable(b) || static_cast<double>(on_host) >= wanted) continue;
    placement[b] = offloaded;
    on_host += layout.bucket(b).padded_elements;
  }
  return placement;
}

std::string SwapFileName(const PartitionStateOptions& options,
                         const std::string& what) {
  const int rank = options.job_rank >= 0 ? options.job_rank : options.rank;
  return absl::StrCat("zero_engine_rank", rank, "_", what, ".swp");
}

std::vector<bool> ChooseResidentWeights(const PartitionedLayout& layout,
                                        int64_t max_in_cpu) {
  std::vector<bool> resident(layout.num_buckets(), false);
  int64_t kept = 0;
  for (int b = 0; b < layout.num_buckets(); ++b) {
    const int64_t elements = layout.bucket(b).slice_elements;
    if (kept + elements > max_in_cpu) break;
    resident[b] = true;
    kept += elements;
  }
  return resident;
}

double UpdateSplit::cpu_seconds() const {
  return static_cast<double>(host_elements - device_elements) *
         (device_elements > 0 ? rates.cpu_seconds_per_element_shared
                              : rates.cpu_seconds_per_element);
}

double UpdateSplit::device_seconds() const {
  const double link = device_elements < host_elements
                          ? rates.link_bytes_per_second_shared
                          : rates.link_bytes_per_second;
  return link > 0
             ? static_cast<double>(device_elements * state_bytes_per_element) /
                   link
             : 0;
}

std::string UpdateSplit::ToString() const {
  const double share = host_elements > 0
                           ? 100.0 * static_cast<double>(device_elements) /
                                 static_cast<double>(host_elements)
                           : 0;
  return absl::StrFormat(
      "device updates %d of %d host elements (%.1f%%): CPU %.1f ms, link "
      "%.1f ms (CPU %.3f ns/element alone, %.3f while the link streams; "
      "link %.1f GB/s each way alone, %.1f while the CPU updates; %d bytes "
      "of state per element; measured)",
      device_elements, host_elements, share, cpu_seconds() * 1e3,
      device_seconds() * 1e3, rates.cpu_seconds_per_element * 1e9,
      rates.cpu_seconds_per_element_shared * 1e9,
      rates.link_bytes_per_second / 1e9,
      rates.link_bytes_per_second_shared / 1e9, state_bytes_per_element);
}

UpdateSplit ChooseUpdateSplit(const std::vector<int64_t>& host_elements,
                              const std::vector<int>& forward_position,
                              int64_t state_bytes_per_element,
                              const offload::UpdateRates& rates) {
  UpdateSplit split;
  split.on_device.assign(host_elements.size(), false);
  split.state_bytes_per_element = state_bytes_per_element;
  split.rates = rates;
  for (int64_t elements : host_elements) split.host_elements += elements;
  if (!(rates.cpu_seconds_per_element > 0) ||
      !(rates.cpu_seconds_per_element_shared > 0) ||
      !(rates.link_bytes_per_second > 0) ||
      !(rates.link_bytes_per_second_shared > 0)) {
    return split;
  }
  std::vector<size_t> order(host_elements.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return forward_position[a] < forward_position[b];
  });
  // Every prefix of that order, not a greedy walk: the first bucket moved
  // also slows the CPU's whole part to its shared rate, so it may lose
  // where two or three win.
  const auto later_side = [](const UpdateSplit& candidate) {
    return std::max(candidate.cpu_seconds(), candidate.device_seconds());
  };
  UpdateSplit best = split;
  for (size_t b : order) {
    if (host_elements[b] == 0) continue;
    split.device_elements += host_elements[b];
    split.on_device[b] = true;
    if (later_side(split) < later_side(best)) best = split;
  }
  return best;
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
  // Weights in a swap file are never the master: the optimizer's master
  // lives in host memory or its own swap file.
  master_aliases_weights_ = options_.model_dtype == DType::kF32 &&
                            options_.weights_placement != Placement::kNvme;
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
  host_slot_.assign(layout_.num_buckets(), -1);
  options_.chunk_elements =
      std::max<int64_t>(1, std::min(options_.chunk_elements,
                                    PartitionStateOptions::kMaxChunkElements));
  // 8-bit moments are updated whole blocks at a time: chunks (and, through
  // the layout's slice alignment, every bucket's state) start on blocks.
  const int64_t granule = offload::MomentGranule(options_.optimizer.moments);
  options_.chunk_elements =
      std::max(granule, options_.chunk_elements / granule * granule);
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
  if (options.split_master) {
    bool supported = options.weights_placement == Placement::kDevice;
    for (Placement placement : options.optimizer_placement) {
      supported = supported && placement != Placement::kNvme;
    }
    if (options.model_dtype != DType::kBF16 || !supported) {
      return absl::InvalidArgumentError(absl::StrCat(
          "PartitionState: a 16+16 master (bf16.master_weights_16_plus_16) "
          "needs bf16 weights (have ",
          DTypeName(options.model_dtype),
          ") on the device, and no NVMe optimizer placement"));
    }
  }
  if (options.optimizer.moments != offload::MomentFormat::kF32) {
    for (Placement placement : options.optimizer_placement) {
      if (placement == Placement::kNvme) {
        return absl::InvalidArgumentError(absl::StrCat(
            "PartitionState: ",
            offload::MomentFormatName(options.optimizer.moments),
            " moments (bf16.bf16_optimizer_states or optimizer.params."
            "blockwise_8bit_moments) are not on NVMe yet: the swap file "
            "holds f32 state"));
      }
    }
  }
  std::unique_ptr<PartitionState> state(new PartitionState(layout, options));
  if (options.weights_placement == Placement::kNvme) {
    ZE_RETURN_IF_ERROR(state->CreateSwappedWeights(stream));
    return state;
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

absl::Status PartitionState::CreateSwappedWeights(const Stream& stream) {
  if (weights_replicated()) {
    return absl::InvalidArgumentError(
        "PartitionState: weights on NVMe (offload_param nvme) need stage 3");
  }
  weights_resident_ =
      ChooseResidentWeights(layout_, options_.weights_max_in_cpu);
  weights_dirty_.assign(layout_.num_buckets(), false);
  // The kept buckets packed in host memory (what the device copies from:
  // pinned with pin_memory); the others one record each in the file.
  std::vector<int64_t> records(layout_.num_buckets(), 0);
  int64_t resident = 0;
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    resident_offsets_.push_back(resident);
    const int64_t elements = layout_.bucket(b).slice_elements;
    if (weights_resident_[b]) {
      resident += elements;
    } else {
      records[b] = elements;
    }
  }
  ZE_ASSIGN_OR_RETURN(weights_,
                      Allocate(resident, options_.model_dtype, Placement::kHost,
                               stream, /*transferred=*/true));
  offload::SwappedWeightsOptions swap = options_.weights_nvme;
  swap.file_name = SwapFileName(options_, "parameters");
  swap.element_bytes = static_cast<int64_t>(SizeOf(options_.model_dtype));
  swap.pin = options_.pin_memory && options_.device.is_cuda();
  swap.nvme.activity = io_activity_;
  absl::StatusOr<std::unique_ptr<offload::SwappedWeights>> swapped =
      offload::SwappedWeights::Create(swap, records);
  if (!swapped.ok()) {
    return absl::Status(
        swapped.status().code(),
        absl::StrCat("rank ", options_.rank,
                     ": zero_optimization.offload_param (nvme): ",
                     swapped.status().message()));
  }
  swapped_weights_ = std::move(swapped).value();
  // The file starts as zeros (fallocate), as allocated weights do.
  return absl::OkStatus();
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
    // A 16+16 master's device part is the remainders alone (2 bytes, raw
    // bits: bf16 is only their container). Zero is exact for the initial
    // bf16 weights: JoinBf16Split(w, 0) == w. Its host part stays f32: with
    // the weights on the device, f32 holds hi's and lo's bits in the same
    // 4 bytes; only the uploaded weights round as hi does.
    ZE_ASSIGN_OR_RETURN(
        device_master_,
        Allocate(device_elements,
                 options_.split_master ? DType::kBF16 : DType::kF32,
                 Placement::kDevice, stream));
    ZE_ASSIGN_OR_RETURN(host_master_, Allocate(host_elements, DType::kF32,
                                               Placement::kHost, stream));
  }
  if (!swapped_chunks.empty()) {
    // Master weights and moments of every NVMe bucket, chunk by chunk.
    offload::SwappedStateOptions swap = options_.nvme;
    swap.file_name = SwapFileName(options_, "optimizer_state");
    swap.arrays =
        1 + static_cast<int>(StateBytesPerElement(options_.optimizer) /
                             sizeof(float));
    options_.nvme.arrays = swap.arrays;
    swap.nvme.activity = io_activity_;
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
    ZE_RETURN_IF_ERROR(ChooseSplit());
    ZE_RETURN_IF_ERROR(CreateHostUpdate());
  }
  optimizers_.resize(layout_.num_buckets());
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    if (trainable_[b] && optimizer_placement_[b] == Placement::kDevice) {
      absl::StatusOr<std::unique_ptr<FlatOptimizer>> optimizer =
          FlatOptimizer::Create(options_.optimizer, own_elements(b),
                                options_.device, nullptr,
                                layout_.bucket(b).padded_elements);
      if (!optimizer.ok()) {
        return options_.annotate_allocation_error
                   ? options_.annotate_allocation_error(optimizer.status())
                   : optimizer.status();
      }
      optimizers_[b] = std::move(optimizer).value();
    }
    if (trainable_[b] && optimizer_placement_[b] == Placement::kNvme) {
      // The initial master weights go to the swap file chunk by chunk (the
      // moments start at zero).
      for (int64_t chunk = 0; chunk < num_chunks(b); ++chunk) {
        const auto [begin, count] = chunk_span(b, chunk);
        ZE_ASSIGN_OR_RETURN(Tensor master,
                            Tensor::Empty({count}, DType::kF32, Device::Cpu()));
        ZE_RETURN_IF_ERROR(ReadOwnWeights(b, begin, master, stream));
        ZE_RETURN_IF_ERROR(stream.Synchronize());
        ZE_RETURN_IF_ERROR(swapped_->Initialize(
            first_swapped_chunk_[b] + static_cast<int>(chunk),
            master.data_as<float>()));
      }
    } else if (!master_aliases_weights() && !split_on_device(b)) {
      // Onto the host (offload) this converts on the device first. A frozen
      // bucket's copy too: it is what its "master" exports (imports may
      // then give it values finer than its 16-bit weights).
      ZE_RETURN_IF_ERROR(ReadOwnWeights(b, 0, OwnMaster(b), stream));
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

Tensor PartitionState::OwnSlice(const Tensor& buffer, bool replicated,
                                int bucket) const {
  const BucketLayout& layout = layout_.bucket(bucket);
  if (updates_whole_buckets()) {
    return buffer.Slice(bucket_offsets_[bucket], layout.padded_elements);
  }
  if (replicated) {
    return buffer.Slice(
        bucket_offsets_[bucket] + options_.rank * layout.slice_elements,
        layout.slice_elements);
  }
  return buffer.Slice(layout.partition_offset, layout.slice_elements);
}

Tensor PartitionState::OwnWeights(int bucket) const {
  if (options_.weights_placement == Placement::kNvme) {
    if (weights_swapped(bucket)) return Tensor();
    return weights_.Slice(resident_offsets_[bucket],
                          layout_.bucket(bucket).slice_elements);
  }
  return OwnSlice(weights_, weights_replicated(), bucket);
}

absl::Status PartitionState::ReadOwnWeights(int bucket, int64_t own_begin,
                                            const Tensor& out,
                                            const Stream& stream) const {
  if (weights_swapped(bucket)) {
    // Stage 3: the own range is the checkpoint range.
    return ReadWeights(bucket, own_begin, out, stream);
  }
  return CopyConverting(OwnWeights(bucket).Slice(own_begin, out.numel()), out,
                        stream);
}

Tensor PartitionState::StagingOf(int bucket) const {
  return host_staging_.Slice(master_offsets_[bucket], own_elements(bucket));
}

offload::NvmeStore::Counters PartitionState::weights_nvme_counters() const {
  if (swapped_weights_ == nullptr) return offload::NvmeStore::Counters();
  return swapped_weights_->store().counters();
}

absl::Status PartitionState::WriteBackWeights(int bucket) {
  const Tensor staged = StagingOf(bucket);
  ZE_ASSIGN_OR_RETURN(char* bytes,
                      swapped_weights_->AcquireForOverwrite(bucket));
  std::memcpy(bytes, staged.data(), staged.nbytes());
  weights_dirty_[bucket] = false;
  return swapped_weights_->Release(bucket, /*dirty=*/true);
}

absl::Status PartitionState::FlushSwappedWeights(bool update_ok) {
  if (swapped_weights_ == nullptr) return absl::OkStatus();
  absl::Status first;
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    if (!weights_dirty_[b]) continue;
    if (!update_ok) {
      // The staged values may be partly gradients: the file keeps the
      // weights from before the failed update.
      weights_dirty_[b] = false;
      continue;
    }
    absl::Status status = WriteBackWeights(b);
    if (first.ok()) first = status;
  }
  absl::Status flushed = swapped_weights_->Flush();
  return first.ok() ? flushed : first;
}

int PartitionState::weights_read_ahead() const {
  if (swapped_weights_ == nullptr) return 0;
  return std::max(1, options_.weights_nvme.buffer_count - 1);
}

bool PartitionState::WantsWeightsRead(int bucket) const {
  return weights_swapped(bucket) && !weights_dirty_[bucket];
}

absl::Status PartitionState::ReadAheadWeights(const std::vector<int>& buckets) {
  if (swapped_weights_ == nullptr) return absl::OkStatus();
  for (int b : buckets) {
    if (!WantsWeightsRead(b)) continue;
    ZE_RETURN_IF_ERROR(swapped_weights_->ReadAhead(b));
  }
  return absl::OkStatus();
}

Tensor PartitionState::OwnMasterLow(int bucket) const {
  if (!split_on_device(bucket)) return Tensor();
  return device_master_.Slice(master_offsets_[bucket], own_elements(bucket));
}

Tensor PartitionState::OwnMaster(int bucket) const {
  if (master_aliases_weights()) return OwnWeights(bucket);
  if (split_on_device(bucket)) return Tensor();
  if (optimizer_placement_[bucket] == Placement::kNvme) return Tensor();
  const Tensor& master = optimizer_placement_[bucket] == Placement::kHost
                             ? host_master_
                             : device_master_;
  return master.Slice(master_offsets_[bucket], own_elements(bucket));
}

offload::NvmeStore::Counters PartitionState::nvme_counters() const {
  offload::NvmeStore::Counters total = weights_nvme_counters();
  if (swapped_ == nullptr) return total;
  const offload::NvmeStore::Counters state = swapped_->store().counters();
  total.bytes_written += state.bytes_written;
  total.bytes_read += state.bytes_read;
  total.write_seconds += state.write_seconds;
  total.read_seconds += state.read_seconds;
  total.busy = state.busy;  // the shared clock: both files' union
  return total;
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

int64_t PartitionState::optimizer_step_count() const {
  if (host_optimizer_ != nullptr) return host_optimizer_->step_count();
  for (const auto& optimizer : optimizers_) {
    if (optimizer != nullptr) return optimizer->step_count();
  }
  return 0;
}

PartitionState::~PartitionState() = default;

absl::Status PartitionState::ChooseSplit() {
  std::vector<int64_t> host_elements(layout_.num_buckets(), 0);
  std::vector<int> forward_position(layout_.num_buckets(), 0);
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    if (trainable_[b] && optimizer_placement_[b] == Placement::kHost) {
      host_elements[b] = own_elements(b);
    }
    forward_position[b] = ForwardReadPosition(b);
  }
  const int64_t state_bytes =
      offload::HostUpdate::BackupBytesPerElement(options_.optimizer);
  if (!options_.update_on_device.empty()) {
    for (int b = 0; b < layout_.num_buckets(); ++b) {
      if (options_.update_on_device.size() !=
              static_cast<size_t>(layout_.num_buckets()) ||
          (options_.update_on_device[b] && host_elements[b] == 0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "PartitionState: update_on_device must have one entry per bucket (",
            layout_.num_buckets(), "), true only for host buckets"));
      }
    }
    update_split_ =
        ChooseUpdateSplit(host_elements, forward_position, state_bytes, {});
    update_split_.on_device = options_.update_on_device;
    for (int b = 0; b < layout_.num_buckets(); ++b) {
      if (update_split_.on_device[b]) {
        update_split_.device_elements += host_elements[b];
      }
    }
    return absl::OkStatus();
  }
  if (!options_.split_update || !options_.device.is_cuda()) {
    return absl::OkStatus();
  }
  // A few tenths of a second: 16 M elements of CPU update on the
  // optimizer's own threads and 64 MiB each way over the link, each alone
  // and each while the other runs.
  ZE_ASSIGN_OR_RETURN(
      const offload::UpdateRates rates,
      offload::MeasureUpdateRates(options_.device, host_optimizer_.get(),
                                  int64_t{1} << 24, int64_t{64} << 20));
  update_split_ =
      ChooseUpdateSplit(host_elements, forward_position, state_bytes, rates);
  return absl::OkStatus();
}

absl::Status PartitionState::CreateHostUpdate() {
  std::vector<offload::HostUpdateSlot> slots;
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    if (!trainable_[b] || !offloaded(b)) continue;
    host_slot_[b] = static_cast<int>(slots.size());
    offload::HostUpdateSlot slot;
    slot.gradients = OwnGradients(b);
    slot.staging = host_staging_.Slice(master_offsets_[b], own_elements(b));
    // NVMe buckets: the swap file holds the master.
    slot.master = OwnMaster(b);
    slot.state_offset = master_offsets_[b];
    // Host weights that are the master themselves (f32) take no write.
    if (weights_swapped(b)) {
      // Swapped weights: the CPU writes them over the gradients in the
      // staging buffer, from where they go back to the swap file.
      slot.weights = slot.staging;
    } else if (options_.weights_placement == Placement::kDevice ||
               !master_aliases_weights()) {
      slot.weights = OwnWeights(b);
    }
    if (options_.delayed_update) {
      slot.delayed =
          delayed_weights_.Slice(master_offsets_[b], own_elements(b));
    }
    if (optimizer_placement_[b] == Placement::kNvme) {
      slot.first_swapped_chunk = first_swapped_chunk_[b];
    }
    slot.forward_position = ForwardReadPosition(b);
    slot.update_on_device =
        !update_split_.on_device.empty() && update_split_.on_device[b];
    slots.push_back(std::move(slot));
  }
  offload::HostUpdateOptions options;
  options.device = options_.device;
  options.chunk_elements = options_.chunk_elements;
  options.weights_on_host = options_.weights_placement != Placement::kDevice;
  options.weights_swapped = options_.weights_placement == Placement::kNvme;
  options.delayed_update = options_.delayed_update;
  options.speculation_elements = options_.speculation_elements;
  options.bf16_ties_away = options_.split_master;
  options.device_step =
      [device = options_.device, type = options_.optimizer.type](
          const offload::StepCoefficients& coefficients,
          const offload::StepBuffers& buffers, const Stream& stream) {
        return RunStepKernelOn(device, type, coefficients, buffers, stream);
      };
  ZE_ASSIGN_OR_RETURN(host_update_, offload::HostUpdate::Create(
                                        options, std::move(slots),
                                        host_optimizer_.get(), swapped_.get()));
  return absl::OkStatus();
}

bool PartitionState::CanBeginEarly() const {
  return host_update_ != nullptr && host_update_->CanBeginEarly();
}

absl::Status PartitionState::BeginUpdate(
    const StepArgs& step_args, const Stream& stream,
    std::optional<offload::Speculation> speculation) {
  if (!CanBeginEarly()) return absl::OkStatus();
  if (speculation.has_value() && !host_update_->CanSpeculate()) {
    return absl::OkStatus();
  }
  ZE_RETURN_IF_ERROR(FinishUpdate(stream).status());
  ZE_RETURN_IF_ERROR(offload::ComputeStepCoefficients(
                         options_.optimizer, optimizer_step_count(), step_args,
                         /*has_momentum_buffer=*/false)
                         .status());
  ZE_ASSIGN_OR_RETURN(in_flight_,
                      host_update_->Start(step_args,
                                          /*begun_early=*/true, speculation));
  early_args_ = step_args;
  return absl::OkStatus();
}

SpeculationOutcome PartitionState::SpeculatedOutcome(bool committed) const {
  if (decided_.chunks == 0) {
    return SpeculationOutcome::kNotSpeculated;
  }
  return committed ? SpeculationOutcome::kCommitted
                   : SpeculationOutcome::kRedone;
}

absl::Status PartitionState::DropSpeculation(const Stream& stream) {
  outcome_ = host_update_ != nullptr ? SpeculationOutcome::kNotSpeculated
                                     : SpeculationOutcome::kNone;
  decided_ = offload::SpeculationReport();
  if (!in_flight_.speculating()) return absl::OkStatus();
  early_args_.reset();
  const absl::Status status = in_flight_.Rollback(stream).status();
  decided_ = host_update_->last_speculation();
  outcome_ = SpeculatedOutcome(/*committed=*/false);
  return status;
}

absl::Status PartitionState::GradientsFinal(int bucket, const Stream& stream) {
  if (!early_args_ || host_slot_[bucket] < 0) return absl::OkStatus();
  return in_flight_.HandOver(host_slot_[bucket], stream);
}

absl::Status PartitionState::UpdateWeights(const StepArgs& step_args,
                                           const Stream& stream) {
  outcome_ = host_update_ != nullptr ? SpeculationOutcome::kNotSpeculated
                                     : SpeculationOutcome::kNone;
  decided_ = offload::SpeculationReport();
  if (early_args_ && in_flight_.speculating()) {
    // The worker started during backward with the arguments of a step that
    // clips nothing: kept when they are the step's, bit for bit (the same
    // update), else undone before the exact update below.
    const bool same = early_args_->lr == step_args.lr &&
                      early_args_->grad_scale == step_args.grad_scale &&
                      early_args_->beta1 == step_args.beta1 &&
                      early_args_->beta2 == step_args.beta2;
    const absl::Status valid =
        offload::ComputeStepCoefficients(options_.optimizer,
                                         optimizer_step_count(), step_args,
                                         /*has_momentum_buffer=*/false)
            .status();
    if (same && valid.ok()) {
      ZE_RETURN_IF_ERROR(in_flight_.Commit());
    } else {
      early_args_.reset();
      // The exact update below writes every host bucket's weights again,
      // so the speculated ones need not be re-sent; a step refused for bad
      // arguments leaves them as they were.
      ZE_RETURN_IF_ERROR(
          in_flight_.Rollback(stream, /*resend_weights=*/!valid.ok()).status());
      ZE_RETURN_IF_ERROR(valid);
    }
    // Decided: nothing more is backed up.
    decided_ = host_update_->last_speculation();
    outcome_ = SpeculatedOutcome(same);
  } else if (early_args_) {
    // An exact early start (no clipping, no overflow check): always kept.
    outcome_ = SpeculationOutcome::kCommitted;
  }
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
    ZE_RETURN_IF_ERROR(FinishUpdate(stream).status());
  }
  // Checked before anything changes, so a bad lr fails the whole step.
  ZE_RETURN_IF_ERROR(offload::ComputeStepCoefficients(
                         options_.optimizer, optimizer_step_count(), step_args,
                         /*has_momentum_buffer=*/false)
                         .status());
  if (host_update_ != nullptr) {
    if (!early_args_) {
      ZE_ASSIGN_OR_RETURN(
          in_flight_, host_update_->Start(step_args, /*begun_early=*/false));
    }
    // From here the staging buffer, not the file, will hold the newest
    // weights of every swapped bucket the update writes.
    for (int b = 0; b < layout_.num_buckets(); ++b) {
      if (weights_swapped(b) && host_slot_[b] >= 0) weights_dirty_[b] = true;
    }
    // Buckets not handed over yet travel now, in the order the forward
    // reads them (the worker's order); the device buckets' kernels below
    // run while they travel. `stream` waits for the copies down.
    ZE_RETURN_IF_ERROR(in_flight_.Close(stream));
    early_args_.reset();
  }
  // Swapped device buckets' writes in flight: as many as there are swap
  // buffers, so the device updates the next bucket while the host waits
  // for the oldest copy.
  std::deque<PendingWeightsWrite> pending;
  const size_t window =
      static_cast<size_t>(std::max(1, options_.weights_nvme.buffer_count));
  absl::Status status;
  for (int b = 0; b < layout_.num_buckets() && status.ok(); ++b) {
    if (!trainable_[b] || optimizer_placement_[b] != Placement::kDevice) {
      continue;
    }
    if (options_.split_master) {
      status =
          optimizers_[b]->StepSplitRange(0, OwnWeights(b), OwnMasterLow(b),
                                         OwnGradients(b), step_args, stream);
      if (status.ok()) optimizers_[b]->AdvanceStep();
    } else if (options_.weights_placement != Placement::kDevice) {
      status =
          OffloadDeviceUpdatedWeights(b, step_args, stream, window, &pending);
    } else {
      status = optimizers_[b]->Step(
          OwnMaster(b), OwnGradients(b), step_args, stream,
          master_aliases_weights() ? Tensor() : OwnWeights(b));
    }
  }
  // Every acquired swap buffer goes back, whatever failed above.
  const absl::Status released = ReleasePendingWeights(0, status.ok(), &pending);
  ZE_RETURN_IF_ERROR(status);
  return released;
}

absl::Status PartitionState::OffloadDeviceUpdatedWeights(
    int bucket, const StepArgs& step_args, const Stream& stream, size_t window,
    std::deque<PendingWeightsWrite>* pending) {
  // The weights are not the master here (the master is on the device, the
  // weights are not), so the kernel writes a separate 16-bit (or f32) copy:
  // into a device buffer of the stream's, reused by its later work only.
  const int64_t elements = own_elements(bucket);
  Tensor updated;
  {
    StreamGuard guard(stream);
    absl::StatusOr<Tensor> buffer =
        Tensor::Empty({elements}, options_.model_dtype, options_.device);
    if (!buffer.ok() && options_.annotate_allocation_error) {
      return options_.annotate_allocation_error(buffer.status());
    }
    ZE_ASSIGN_OR_RETURN(updated, std::move(buffer));
  }
  ZE_RETURN_IF_ERROR(optimizers_[bucket]->Step(
      OwnMaster(bucket), OwnGradients(bucket), step_args, stream, updated));
  if (!weights_swapped(bucket)) {
    // Host memory (offload_param cpu, or kept there by max_in_cpu): the
    // next gather uploads it on a stream ordered after this one's work.
    return Copy(updated, OwnWeights(bucket), stream);
  }
  // Swapped: the new weights replace the record in a swap buffer, the one
  // place its newest bytes may be besides the file (SwappedWeights' cache),
  // so the next gather finds them there or, once written, in the file. Not
  // through the staging buffer: it holds only host buckets (a device
  // bucket's would cost host memory for nothing).
  ZE_RETURN_IF_ERROR(ReleasePendingWeights(window - 1, /*ok=*/true, pending));
  absl::StatusOr<char*> bytes = swapped_weights_->AcquireForOverwrite(bucket);
  if (!bytes.ok()) {
    // The buffer's previous write failed: the file keeps the bucket's
    // weights from before this update, and every rank stops at the next
    // boundary (a rank failing here alone would leave the others in the
    // next forward's all-gathers).
    DeferWeightsError(bucket, "taking a swap buffer for the update of",
                      bytes.status());
    return absl::OkStatus();
  }
  PendingWeightsWrite write;
  write.bucket = bucket;
  absl::Status copied = Copy(
      updated,
      Tensor::Wrap(*bytes, {elements}, options_.model_dtype, Device::Cpu()),
      stream);
  if (copied.ok()) {
    absl::StatusOr<Event> event = Event::Create(options_.device);
    copied = event.status();
    if (event.ok()) {
      write.copied = *std::move(event);
      copied = write.copied.Record(stream);
    }
  }
  // Pending even when the copy failed: ReleasePendingWeights gives the
  // buffer back (clean) on the failed step's way out.
  pending->push_back(std::move(write));
  return copied;
}

absl::Status PartitionState::ReleasePendingWeights(
    size_t keep, bool ok, std::deque<PendingWeightsWrite>* pending) {
  absl::Status first;
  while (pending->size() > keep) {
    PendingWeightsWrite write = std::move(pending->front());
    pending->pop_front();
    // The copy writes the buffer: it must be done before the buffer is
    // released, written to the file or taken for another record.
    absl::Status copied = write.copied.Synchronize();
    const bool dirty = ok && copied.ok();
    absl::Status released = swapped_weights_->Release(write.bucket, dirty);
    if (!dirty) {
      // Partly copied bytes are not the record's: read the file next.
      absl::Status forgotten = swapped_weights_->Forget(write.bucket);
      if (released.ok()) released = forgotten;
    }
    if (!released.ok()) {
      DeferWeightsError(write.bucket, "writing the update of", released);
    }
    if (first.ok()) first = copied;
  }
  return first;
}

void PartitionState::DeferWeightsError(int bucket, const char* what,
                                       const absl::Status& status) {
  if (!deferred_weights_error_.ok()) return;
  ZE_LOG(ERROR) << "rank " << options_.rank << ": offload_param nvme: " << what
                << " bucket " << bucket << "'s weights failed (" << status
                << "); this step fails at its boundary on every rank";
  deferred_weights_error_ = absl::Status(
      status.code(),
      absl::StrCat("rank ", options_.rank,
                   ": zero_optimization.offload_param (nvme): ", what,
                   " bucket ", bucket,
                   "'s weights failed, so this step is not applied: ",
                   status.message()));
}

PartitionState::OffloadTimes PartitionState::offload_times() const {
  return host_update_ != nullptr ? host_update_->times() : OffloadTimes();
}

std::vector<int> PartitionState::last_update_order() const {
  if (host_update_ == nullptr) return {};
  std::vector<int> bucket_of(host_update_->num_slots());
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    if (host_slot_[b] >= 0) bucket_of[host_slot_[b]] = b;
  }
  std::vector<int> order;
  for (int slot : host_update_->last_order()) order.push_back(bucket_of[slot]);
  return order;
}

int PartitionState::ForwardReadPosition(int bucket) const {
  return options_.bucket_zero_read_first ? bucket
                                         : layout_.num_buckets() - 1 - bucket;
}

absl::Status PartitionState::WaitForWeights(int bucket, const Stream& stream,
                                            int64_t own_begin) {
  if (host_slot_[bucket] < 0) return absl::OkStatus();
  return in_flight_.WaitForWeights(host_slot_[bucket], own_begin, stream);
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

absl::StatusOr<offload::UpdateJoined> PartitionState::FinishUpdate(
    const Stream& stream) {
  absl::StatusOr<offload::UpdateJoined> joined = in_flight_.Join(stream);
  absl::Status written = FlushSwappedWeights(joined.ok());
  // A gather since the last join served zeros for weights it could not
  // read (WeightsForGather): reported once, here.
  const absl::Status deferred =
      std::exchange(deferred_weights_error_, absl::OkStatus());
  if (!joined.ok()) return joined.status();
  if (!written.ok()) {
    return absl::Status(
        written.code(),
        absl::StrCat("rank ", options_.rank,
                     ": zero_optimization.offload_param (nvme): writing the "
                     "updated weights back failed: ",
                     written.message()));
  }
  ZE_RETURN_IF_ERROR(deferred);
  return joined;
}

absl::Status PartitionState::FinishPreviousUpdate(const Stream& stream) {
  // An update begun early is this step's, not a previous one: it runs on
  // until UpdateWeights has handed over every bucket.
  if (in_flight_.open()) return absl::OkStatus();
  return FinishUpdate(stream).status();
}

absl::StatusOr<Tensor> PartitionState::WeightsForGather(int bucket,
                                                        const Stream& stream) {
  ZE_RETURN_IF_ERROR(WaitForWeights(bucket, stream));
  if (weights_swapped(bucket)) {
    absl::StatusOr<Tensor> swapped = SwappedWeightsForGather(bucket, stream);
    if (swapped.ok()) return swapped;
    // An I/O error here would stop this rank alone in the middle of a
    // forward, with the other ranks waiting in its all-gather. The gather
    // goes on with zeros instead, and the error is the next FinishUpdate's,
    // which the boundary step reports on every rank before anything is
    // updated (as it does a failed offloaded update): the step's gradients
    // are never applied.
    DeferWeightsError(bucket, "reading", swapped.status());
    return Tensor::Zeros({layout_.bucket(bucket).slice_elements},
                         options_.model_dtype, options_.device, stream);
  }
  Tensor own = OwnWeights(bucket);
  if (options_.weights_placement == Placement::kDevice ||
      !options_.device.is_cuda()) {
    return own;
  }
  std::optional<Event> unused;
  return UploadForGather(own, stream, &unused);
}

absl::StatusOr<Tensor> PartitionState::SwappedWeightsForGather(
    int bucket, const Stream& stream) {
  // The update's new weights from the staging buffer (their write back to
  // the file starts, and goes on while they are uploaded), or the file's
  // through a swap buffer (read ahead, or now).
  Tensor own;
  char* swap_buffer = nullptr;
  bool staged = false;
  if (weights_dirty_[bucket]) {
    if (in_flight_.SlotWritten(host_slot_[bucket])) {
      ZE_RETURN_IF_ERROR(WriteBackWeights(bucket));
      staged = true;
    } else {
      // The update failed before the bucket: the file keeps the weights
      // from before it (Join reports the failure on every rank).
      weights_dirty_[bucket] = false;
    }
  }
  if (staged) {
    // Next written by the next update's gradients, which come after the
    // forward that waits for this gather.
    own = StagingOf(bucket);
  } else {
    ZE_ASSIGN_OR_RETURN(swap_buffer, swapped_weights_->Acquire(bucket));
    own = Tensor::Wrap(swap_buffer, {layout_.bucket(bucket).slice_elements},
                       options_.model_dtype, Device::Cpu());
  }
  // The swap buffer goes back whatever happens below; once a device upload
  // from it is queued, it is reused only after the upload is done.
  std::optional<Event> upload_done;
  const auto release = [&]() -> absl::Status {
    if (swap_buffer == nullptr) return absl::OkStatus();
    std::function<absl::Status()> before_reuse;
    if (upload_done) {
      before_reuse = [done = *upload_done] { return done.Synchronize(); };
    }
    return swapped_weights_->Release(bucket, false, std::move(before_reuse));
  };
  absl::StatusOr<Tensor> result;
  if (options_.device.is_cuda()) {
    result = UploadForGather(own, stream, &upload_done);
  } else {
    // A copy of its own: the gather (or, on one rank, the parameters
    // themselves) reads it after the buffer went to another bucket.
    result = Tensor::Empty(own.shape(), own.dtype(), Device::Cpu());
    if (result.ok()) {
      absl::Status copied = Copy(own, *result, stream);
      if (!copied.ok()) result = copied;
    }
  }
  absl::Status released = release();
  ZE_RETURN_IF_ERROR(result.status());
  ZE_RETURN_IF_ERROR(released);
  return result;
}

absl::StatusOr<Tensor> PartitionState::UploadForGather(
    const Tensor& own, const Stream& stream,
    std::optional<Event>* uploaded_event) {
  if (!gather_upload_stream_) {
    ZE_ASSIGN_OR_RETURN(gather_upload_stream_, Stream::Create(options_.device));
  }
  const Stream& up = *gather_upload_stream_;
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
  *uploaded_event = done;
  return uploaded;
}

Tensor PartitionState::OwnGradients(int bucket) const {
  return OwnSlice(gradients_, gradients_replicated(), bucket);
}

Tensor PartitionState::OwnGradientsOf(int param_index,
                                      int64_t* param_begin) const {
  const ParamPlacement& placement = layout_.placement(param_index);
  const PartitionSlice own = OwnRange(placement.bucket);
  const int64_t begin = std::max(own.begin, placement.offset);
  const int64_t end = std::min(own.end, placement.offset + placement.numel);
  *param_begin = begin - placement.offset;
  if (begin >= end) return Tensor();
  return OwnGradients(placement.bucket).Slice(begin - own.begin, end - begin);
}

absl::Status PartitionState::ResetGradients(const Stream& stream) {
  std::fill(gradients_current_.begin(), gradients_current_.end(), false);
  if (gradients_replicated()) {
    // Device-updated buckets' kernels read the gradients: not before
    // (partitioned gradients are next written by a backward, after a
    // forward that waited for those kernels' weights).
    ZE_RETURN_IF_ERROR(in_flight_.WaitForGradientsRead(stream));
    return Fill(gradients_, 0.0f, stream);
  }
  return absl::OkStatus();
}

absl::Status PartitionState::ZeroStaleGradients(const Stream& stream) {
  if (gradients_replicated()) return absl::OkStatus();
  // Only buckets no backward reached, hence never handed over to the
  // update: no device kernel reads what is zeroed here.
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

PartitionSlice PartitionState::CheckpointWeightsRange(int bucket) const {
  if (weights_replicated()) {
    return PartitionSlice{options_.rank, 0,
                          layout_.bucket(bucket).padded_elements};
  }
  return layout_.BucketSlice(bucket, options_.rank);
}

absl::Status PartitionState::ReadWeights(int bucket, int64_t begin,
                                         const Tensor& out,
                                         const Stream& stream) const {
  const int64_t count = out.numel();
  const int64_t size = CheckpointWeightsRange(bucket).size();
  if (begin < 0 || begin + count > size) {
    return absl::OutOfRangeError(
        absl::StrCat("ReadWeights: elements [", begin, ", ", begin + count,
                     ") of bucket ", bucket, "'s ", size, " weights"));
  }
  if (!weights_swapped(bucket)) {
    int64_t unused = 0;
    ZE_RETURN_IF_ERROR(CopyConverting(
        CheckpointWeights(bucket, &unused).Slice(begin, count), out, stream));
    return stream.Synchronize();
  }
  if (weights_dirty_[bucket]) {
    // Written by an update not joined yet: the staging buffer holds them.
    ZE_RETURN_IF_ERROR(
        CopyConverting(StagingOf(bucket).Slice(begin, count), out, stream));
    return stream.Synchronize();
  }
  ZE_ASSIGN_OR_RETURN(char* bytes, swapped_weights_->Acquire(bucket));
  const Tensor held =
      Tensor::Wrap(bytes, {size}, options_.model_dtype, Device::Cpu());
  absl::Status status = CopyConverting(held.Slice(begin, count), out, stream);
  if (status.ok()) status = stream.Synchronize();
  absl::Status released = swapped_weights_->Release(bucket, false);
  ZE_RETURN_IF_ERROR(status);
  return released;
}

absl::Status PartitionState::WriteWeights(int bucket, int64_t begin,
                                          const Tensor& values,
                                          const Stream& stream) {
  const int64_t count = values.numel();
  const int64_t size = CheckpointWeightsRange(bucket).size();
  if (begin < 0 || begin + count > size) {
    return absl::OutOfRangeError(
        absl::StrCat("WriteWeights: elements [", begin, ", ", begin + count,
                     ") of bucket ", bucket, "'s ", size, " weights"));
  }
  if (!weights_swapped(bucket)) {
    int64_t unused = 0;
    return CopyConverting(
        values, CheckpointWeights(bucket, &unused).Slice(begin, count), stream);
  }
  if (weights_dirty_[bucket]) ZE_RETURN_IF_ERROR(WriteBackWeights(bucket));
  // The whole record (initialisation, a full import) needs no read first.
  const bool whole = begin == 0 && count == size;
  ZE_ASSIGN_OR_RETURN(char* bytes,
                      whole ? swapped_weights_->AcquireForOverwrite(bucket)
                            : swapped_weights_->Acquire(bucket));
  const Tensor held =
      Tensor::Wrap(bytes, {size}, options_.model_dtype, Device::Cpu());
  absl::Status status =
      CopyConverting(values, held.Slice(begin, count), stream);
  if (status.ok()) status = stream.Synchronize();
  // Written back even after a failed copy would be wrong: the buffer may
  // hold part of the values. Dropped instead (the file keeps its record).
  absl::Status released = swapped_weights_->Release(bucket, status.ok());
  if (!status.ok()) {
    swapped_weights_->Forget(bucket).IgnoreError();
    return status;
  }
  ZE_RETURN_IF_ERROR(released);
  // On disk on return: a load's I/O error is the load's.
  return swapped_weights_->Flush();
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

absl::Status PartitionState::ReadOwnState(const offload::UpdateJoined& joined,
                                          int bucket, int array,
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
  if (!trainable_[bucket] && array > 0) {
    return Fill(out, 0.0f, Stream::Default(Device::Cpu()));
  }
  if (array > 0 && out.device().is_cpu() && out.dtype() == DType::kBF16) {
    // bf16 moments saved as they are: read as f32 (exact), then narrowed
    // (exact too: every value is a bf16).
    ZE_ASSIGN_OR_RETURN(Tensor values,
                        Tensor::Empty({count}, DType::kF32, Device::Cpu()));
    ZE_RETURN_IF_ERROR(
        ReadOwnState(joined, bucket, array, own_begin, values, stream));
    for (int64_t i = 0; i < count; ++i) {
      out.data_as<uint16_t>()[i] =
          offload::NearestBf16(values.data_as<float>()[i]);
    }
    return absl::OkStatus();
  }
  if (array == 0 && split_on_device(bucket)) {
    return ReadSplitMaster(bucket, own_begin, out, stream);
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
        ZE_RETURN_IF_ERROR(CheckHostF32(out, "ReadOwnState"));
        host_optimizer_->ReadState(array - 1,
                                   master_offsets_[bucket] + own_begin, count,
                                   out.data_as<float>());
      }
      return absl::OkStatus();
    case Placement::kDevice:
      break;
  }
  if (array > 0) {
    // Decoded from the optimizer's moment format (exact).
    return optimizers_[bucket]->ReadState(array - 1, own_begin, out, stream);
  }
  ZE_RETURN_IF_ERROR(
      CopyConverting(OwnMaster(bucket).Slice(own_begin, count), out, stream));
  return stream.Synchronize();
}

absl::Status PartitionState::WriteOwnState(
    const offload::UpdateJoined& /*joined*/, int bucket, int array,
    int64_t own_begin, const Tensor& values, const Stream& stream) {
  const int64_t count = values.numel();
  if (own_begin < 0 || own_begin + count > own_elements(bucket) || array < 0 ||
      array >= static_cast<int>(StateArrayNames().size())) {
    return absl::OutOfRangeError(
        absl::StrCat("WriteOwnState: array ", array, " elements [", own_begin,
                     ", ", own_begin + count, ") of bucket ", bucket, " (",
                     own_elements(bucket), " own elements)"));
  }
  // A frozen bucket's split master is written too: it is its weights and
  // the remainders, what its "master" exports.
  if (array == 0 && split_on_device(bucket)) {
    return WriteSplitMaster(bucket, own_begin, values, stream);
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
        if (options_.split_master) {
          // The weights are the master's high halves, as the update leaves
          // them (the file's may round ties to even).
          if (!values.device().is_cpu() || values.dtype() != DType::kF32) {
            return absl::InvalidArgumentError(absl::StrCat(
                "WriteOwnState: a 16+16 master is written from host f32, "
                "not ",
                values.DebugString()));
          }
          ZE_ASSIGN_OR_RETURN(
              Tensor hi, Tensor::Empty({count}, DType::kBF16, Device::Cpu()));
          for (int64_t i = 0; i < count; ++i) {
            hi.data_as<uint16_t>()[i] =
                SplitForBf16(values.data_as<float>()[i]).hi;
          }
          ZE_RETURN_IF_ERROR(
              Copy(hi, OwnWeights(bucket).Slice(own_begin, count), stream));
        }
        return stream.Synchronize();
      }
      ZE_RETURN_IF_ERROR(CheckHostF32(values, "WriteOwnState"));
      host_optimizer_->WriteState(array - 1,
                                  master_offsets_[bucket] + own_begin, count,
                                  values.data_as<float>());
      return absl::OkStatus();
    case Placement::kDevice:
      break;
  }
  if (array > 0) {
    // Encoded in the optimizer's moment format (rounded to it).
    return optimizers_[bucket]->WriteState(array - 1, own_begin, values,
                                           stream);
  }
  ZE_RETURN_IF_ERROR(CopyConverting(
      values, OwnMaster(bucket).Slice(own_begin, count), stream));
  return stream.Synchronize();
}

absl::Status PartitionState::ReadSplitMaster(int bucket, int64_t own_begin,
                                             const Tensor& out,
                                             const Stream& stream) const {
  const int64_t count = out.numel();
  if (!out.device().is_cpu() || out.dtype() != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReadOwnState: a 16+16 master is read into host f32, not ",
                     out.DebugString()));
  }
  ZE_ASSIGN_OR_RETURN(Tensor hi,
                      Tensor::Empty({count}, DType::kBF16, Device::Cpu()));
  ZE_ASSIGN_OR_RETURN(Tensor lo,
                      Tensor::Empty({count}, DType::kBF16, Device::Cpu()));
  ZE_RETURN_IF_ERROR(
      Copy(OwnWeights(bucket).Slice(own_begin, count), hi, stream));
  ZE_RETURN_IF_ERROR(
      Copy(OwnMasterLow(bucket).Slice(own_begin, count), lo, stream));
  ZE_RETURN_IF_ERROR(stream.Synchronize());
  const uint16_t* hi_bits = hi.data_as<uint16_t>();
  const uint16_t* lo_bits = lo.data_as<uint16_t>();
  float* values = out.data_as<float>();
  for (int64_t i = 0; i < count; ++i) {
    values[i] = JoinBf16Split(hi_bits[i], lo_bits[i]);
  }
  return absl::OkStatus();
}

absl::Status PartitionState::WriteSplitMaster(int bucket, int64_t own_begin,
                                              const Tensor& values,
                                              const Stream& stream) {
  const int64_t count = values.numel();
  if (!values.device().is_cpu() || values.dtype() != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "WriteOwnState: a 16+16 master is written from host f32, not ",
        values.DebugString()));
  }
  ZE_ASSIGN_OR_RETURN(Tensor hi,
                      Tensor::Empty({count}, DType::kBF16, Device::Cpu()));
  ZE_ASSIGN_OR_RETURN(Tensor lo,
                      Tensor::Empty({count}, DType::kBF16, Device::Cpu()));
  const float* source = values.data_as<float>();
  for (int64_t i = 0; i < count; ++i) {
    const Bf16Split split = SplitForBf16(source[i]);
    hi.data_as<uint16_t>()[i] = split.hi;
    lo.data_as<uint16_t>()[i] = split.lo;
  }
  ZE_RETURN_IF_ERROR(
      Copy(hi, OwnWeights(bucket).Slice(own_begin, count), stream));
  ZE_RETURN_IF_ERROR(
      Copy(lo, OwnMasterLow(bucket).Slice(own_begin, count), stream));
  return stream.Synchronize();  // hi and lo are freed on return
}

absl::Status PartitionState::CheckHostF32(const Tensor& tensor,
                                          const char* what) {
  if (!tensor.device().is_cpu() || tensor.dtype() != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": optimizer state goes through host f32, not ",
                     tensor.DebugString()));
  }
  return absl::OkStatus();
}

}  // namespace zero
}  // namespace ze
