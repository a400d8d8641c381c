#include "zero/partition_state.h"

#include <algorithm>
#include <limits>
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
  }
  return "?";
}

std::vector<Placement> ChooseOptimizerPlacement(
    const PartitionedLayout& layout, const std::vector<bool>& trainable,
    double ratio) {
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
    placement[b] = Placement::kHost;
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
    int64_t& packed = optimizer_placement_[b] == Placement::kHost
                          ? host_master
                          : device_master;
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
      if (state->trainable_[b] &&
          state->optimizer_placement_[b] != Placement::kHost) {
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
  int64_t host_elements = 0;
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    (optimizer_placement_[b] == Placement::kHost ? host_elements
                                                 : device_elements) +=
        own_elements(b);
  }
  if (!master_aliases_weights()) {
    ZE_ASSIGN_OR_RETURN(device_master_, Allocate(device_elements, DType::kF32,
                                                 Placement::kDevice, stream));
    ZE_ASSIGN_OR_RETURN(host_master_, Allocate(host_elements, DType::kF32,
                                               Placement::kHost, stream));
  }
  if (host_elements > 0) {
    ZE_ASSIGN_OR_RETURN(
        host_staging_,
        Allocate(host_elements, options_.model_dtype, Placement::kHost, stream,
                 /*transferred=*/true));
    if (options_.delayed_update) {
      if (options_.weights_placement != Placement::kDevice) {
        return absl::InvalidArgumentError(
            "PartitionState: a delayed update needs the weights on the device");
      }
      ZE_ASSIGN_OR_RETURN(delayed_weights_,
                          Allocate(host_elements, options_.model_dtype,
                                   Placement::kDevice, stream));
    }
    offload::CpuExecutionOptions execution;
    execution.num_threads = options_.host_threads;
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
      if (optimizer_placement_[b] != Placement::kHost) continue;
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
    if (!master_aliases_weights()) {
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
  const Tensor& master = optimizer_placement_[bucket] == Placement::kHost
                             ? host_master_
                             : device_master_;
  return master.Slice(master_offsets_[bucket], own_elements(bucket));
}

Tensor PartitionState::PartitionMaster(int bucket, int64_t partition_offset,
                                       int64_t count) const {
  return OwnMaster(bucket).Slice(
      partition_offset - layout_.bucket(bucket).partition_offset, count);
}

int64_t PartitionState::optimizer_step_count() const {
  if (host_optimizer_ != nullptr) return host_optimizer_->step_count();
  for (const auto& optimizer : optimizers_) {
    if (optimizer != nullptr) return optimizer->step_count();
  }
  return 0;
}

PartitionState::~PartitionState() {
  if (pending_.worker.joinable()) pending_.worker.join();
}

absl::Status PartitionState::UpdateWeights(const StepArgs& step_args,
                                           const Stream& stream) {
  ZE_RETURN_IF_ERROR(FinishUpdate(stream));
  // Checked before anything changes, so a bad lr fails the whole step.
  ZE_RETURN_IF_ERROR(offload::ComputeStepCoefficients(
                         options_.optimizer, optimizer_step_count(), step_args,
                         /*has_momentum_buffer=*/false)
                         .status());
  if (host_optimizer_ != nullptr) {
    // Start the gradients' trip to the host first, in the order the worker
    // takes them: the device buckets' kernels below run while they travel.
    ZE_ASSIGN_OR_RETURN(Event gradients_final, Event::Create(options_.device));
    ZE_RETURN_IF_ERROR(gradients_final.Record(stream));
    const Stream& down = to_host_stream_ ? *to_host_stream_ : stream;
    ZE_RETURN_IF_ERROR(gradients_final.StreamWait(down));
    for (int b = layout_.num_buckets() - 1; b >= 0; --b) {
      if (!trainable_[b] || optimizer_placement_[b] != Placement::kHost) {
        continue;
      }
      Tensor gradients = OwnGradients(b);
      Tensor staging = host_staging_.Slice(master_offsets_[b], own_elements(b));
      for (int64_t chunk = num_chunks(b) - 1; chunk >= 0; --chunk) {
        const int64_t begin = chunk * options_.chunk_elements;
        const int64_t count =
            std::min(options_.chunk_elements, own_elements(b) - begin);
        ZE_RETURN_IF_ERROR(Copy(gradients.Slice(begin, count),
                                staging.Slice(begin, count), down));
        ZE_RETURN_IF_ERROR(gradients_on_host_[b][chunk].Record(down));
      }
    }
    // Gradients are zeroed or overwritten on `stream` after the step: not
    // before they are copied.
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
  if (host_optimizer_ != nullptr) {
    pending_.written_from.assign(layout_.num_buckets(),
                                 std::numeric_limits<int64_t>::max());
    pending_.failed = false;
    pending_.status = absl::OkStatus();
    pending_.worker = std::thread([this, step_args] {
      absl::Status status = UpdateHostBuckets(step_args);
      std::lock_guard<std::mutex> lock(pending_.mutex);
      pending_.status = status;
      pending_.failed = !status.ok();
      pending_.progress.notify_all();
    });
  }
  return absl::OkStatus();
}

absl::Status PartitionState::UpdateHostBuckets(const StepArgs& step_args) {
  if (options_.device.is_cuda()) {
    ZE_RETURN_IF_ERROR(SetCurrentDevice(options_.device));
  }
  const bool weights_on_host = options_.weights_placement == Placement::kHost;
  const Stream up = to_device_stream_ ? *to_device_stream_ : Stream();
  // Model order: buckets from the highest index down, each from its end
  // (layouts are in reverse model order), chunk by chunk.
  for (int b = layout_.num_buckets() - 1; b >= 0; --b) {
    if (!trainable_[b] || optimizer_placement_[b] != Placement::kHost) {
      continue;
    }
    Tensor staging = host_staging_.Slice(master_offsets_[b], own_elements(b));
    Tensor master = OwnMaster(b);
    Tensor weights = OwnWeights(b);
    // The 16-bit result goes straight into host weights, or over the
    // gradients in the staging buffer (each element's gradient is read
    // before its weight is written), from where it is uploaded.
    Tensor out = weights_on_host
                     ? (master_aliases_weights() ? Tensor() : weights)
                     : staging;
    for (int64_t chunk = num_chunks(b) - 1; chunk >= 0; --chunk) {
      const int64_t begin = chunk * options_.chunk_elements;
      const int64_t count =
          std::min(options_.chunk_elements, own_elements(b) - begin);
      ZE_RETURN_IF_ERROR(gradients_on_host_[b][chunk].Synchronize());
      Tensor grads = staging.Slice(begin, count);
      Tensor out_chunk = out.defined() ? out.Slice(begin, count) : Tensor();
      ZE_RETURN_IF_ERROR(host_optimizer_->StepRange(
          master_offsets_[b] + begin, count, master.data_as<float>() + begin,
          grads.data(), grads.dtype(), step_args,
          out_chunk.defined() ? out_chunk.data() : nullptr,
          options_.model_dtype));
      if (!weights_on_host) {
        Tensor destination =
            options_.delayed_update
                ? delayed_weights_.Slice(master_offsets_[b] + begin, count)
                : weights.Slice(begin, count);
        ZE_RETURN_IF_ERROR(Copy(grads, destination, up));
        ZE_RETURN_IF_ERROR(weights_uploaded_[b][chunk].Record(up));
      }
      std::lock_guard<std::mutex> lock(pending_.mutex);
      pending_.written_from[b] = begin;
      pending_.progress.notify_all();
    }
  }
  host_optimizer_->AdvanceStep();
  return absl::OkStatus();
}

absl::Status PartitionState::WaitForWeights(int bucket, const Stream& stream,
                                            int64_t own_begin) {
  if (!pending_.worker.joinable() ||
      optimizer_placement_[bucket] != Placement::kHost || !trainable_[bucket] ||
      options_.delayed_update) {
    return absl::OkStatus();
  }
  const int64_t chunk =
      std::max<int64_t>(0, std::min(own_begin, own_elements(bucket) - 1) /
                               options_.chunk_elements);
  {
    std::unique_lock<std::mutex> lock(pending_.mutex);
    pending_.progress.wait(lock, [&] {
      return pending_.written_from[bucket] <= chunk * options_.chunk_elements ||
             pending_.failed;
    });
    if (pending_.written_from[bucket] > chunk * options_.chunk_elements) {
      return pending_.status;
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

absl::Status PartitionState::FinishUpdate(const Stream& stream) {
  if (!pending_.worker.joinable()) return absl::OkStatus();
  pending_.worker.join();
  if (options_.weights_placement == Placement::kDevice && to_device_stream_) {
    ZE_ASSIGN_OR_RETURN(Event uploaded, Event::Create(options_.device));
    ZE_RETURN_IF_ERROR(uploaded.Record(*to_device_stream_));
    ZE_RETURN_IF_ERROR(uploaded.StreamWait(stream));
  }
  ZE_RETURN_IF_ERROR(pending_.status);
  if (options_.delayed_update) {
    // The delayed update takes effect now.
    for (int b = 0; b < layout_.num_buckets(); ++b) {
      if (!trainable_[b] || optimizer_placement_[b] != Placement::kHost) {
        continue;
      }
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

absl::Status CopyConverting(const Tensor& src, const Tensor& dst,
                            const Stream& stream) {
  const bool transfer = src.device() != dst.device();
  if (!transfer || src.dtype() == dst.dtype()) return Copy(src, dst, stream);
  // A transfer needs equal dtypes: convert on the source's side first.
  ZE_ASSIGN_OR_RETURN(Tensor converted,
                      Tensor::Empty(src.shape(), dst.dtype(), src.device()));
  ZE_RETURN_IF_ERROR(Copy(src, converted, stream));
  ZE_RETURN_IF_ERROR(Copy(converted, dst, stream));
  return stream.Synchronize();  // `converted` dies here
}

}  // namespace zero
}  // namespace ze
