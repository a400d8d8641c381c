#include "zero/strategy.h"

#include <algorithm>
#include <thread>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/ops.h"
#include "core/status.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "zero/partition_export.h"
#include "zero/partition_import.h"
#include "zero/strategy_checkpoint.h"

namespace ze {
namespace zero {

ZeroStrategy::~ZeroStrategy() {
  for (auto& [module, handle] : hooks_) module->RemoveHook(handle);
}

void ZeroStrategy::AddHook(nn::Module* module, nn::HookKind kind,
                           nn::Hook hook) {
  if (kind == nn::HookKind::kPreForward || kind == nn::HookKind::kPreBackward) {
    const bool forward = kind == nn::HookKind::kPreForward;
    hook = [this, forward, hook = std::move(hook)](
               nn::Module& called, const Stream& stream) -> absl::Status {
      if (phase_ == Phase::kIdle) {
        // RunHooks names the module in front of this.
        return absl::FailedPreconditionError(absl::StrCat(
            forward ? "Forward" : "Backward", " called on rank ", rank(),
            " outside the engine; after engine::Initialize the model runs "
            "through the engine only (engine->Forward / Backward, "
            "EvalForward, Generate; GatherParameters to read full weights)"));
      }
      return hook(called, stream);
    };
  }
  hooks_.emplace_back(module, module->AddHook(kind, std::move(hook)));
}

absl::Status ZeroStrategy::AnnotateAllocationError(
    const absl::Status& status) const {
  return absl::Status(
      status.code(),
      absl::StrCat("model state does not fit on rank ", rank(), " (",
                   device().ToString(), "): ZeRO stage ",
                   context_.plan->state.stage, " needs ", memory().device_bytes,
                   " bytes per rank",
                   memory().host_bytes > 0
                       ? absl::StrCat(" on the device and ",
                                      memory().host_bytes, " in host memory")
                       : "",
                   " (", memory().ToString(), "): ", status.message()));
}

absl::Status ZeroStrategy::RequireIdle(const char* what) const {
  if (phase_ == Phase::kIdle) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(what, " on rank ", rank(), ": not between micro-steps (",
                   phase_ == Phase::kBackward  ? "inside backward"
                   : phase_ == Phase::kForward ? "inside a forward"
                                               : "inside an evaluation",
                   ")"));
}

absl::StatusOr<offload::UpdateJoined> ZeroStrategy::RequireCheckpointable(
    const char* what) {
  ZE_RETURN_IF_ERROR(RequireIdle(what));
  if (HasOpenScope()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " on rank ", rank(),
                     ": a GatherParameters scope is open; release it first"));
  }
  return partition_->FinishUpdate(stream());
}

StateCheckpoint ZeroStrategy::checkpoint() {
  StateCheckpoint::Access access;
  access.partition = partition_.get();
  access.stream = context_.compute_stream;
  access.rank = rank();
  access.require_checkpointable = [this](const char* what) {
    return RequireCheckpointable(what);
  };
  access.on_state_loaded = [this] { return OnStateLoaded(); };
  return StateCheckpoint(std::move(access));
}

absl::Status ZeroStrategy::CheckLoadable(
    const safetensors::TensorSource& reader,
    const std::vector<nn::Parameter*>& parameters) const {
  for (const nn::Parameter* parameter : parameters) {
    const std::string name = parameter->name();
    const safetensors::TensorInfo* info = reader.Find(name);
    if (info == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("LoadWeights on rank ", rank(), ": parameter '", name,
                       "' is not in ", reader.description()));
    }
    if (info->shape != parameter->shape()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LoadWeights on rank ", rank(), ": parameter '", name, "' is ",
          ShapeToString(parameter->shape()), " but ", reader.description(),
          " has ", ShapeToString(info->shape)));
    }
    ZE_RETURN_IF_ERROR(safetensors::DTypeOf(info->dtype).status());
  }
  return absl::OkStatus();
}

absl::Status ZeroStrategy::ImportWeights(
    const safetensors::TensorSource& reader,
    const offload::UpdateJoined& joined) {
  // Every kind ("weights", "master") is the file's values.
  const ImportSource source = [&reader](
                                  const std::string& /*kind*/,
                                  const std::string& name, int64_t param_begin,
                                  const Tensor& destination) -> absl::Status {
    ZE_ASSIGN_OR_RETURN(const DType file_dtype,
                        safetensors::DTypeOf(reader.Find(name)->dtype));
    if (file_dtype == destination.dtype()) {
      return reader.ReadRange(name, param_begin, destination.numel(),
                              destination);
    }
    ZE_ASSIGN_OR_RETURN(Tensor host, Tensor::Empty({destination.numel()},
                                                   file_dtype, Device::Cpu()));
    ZE_RETURN_IF_ERROR(
        reader.ReadRange(name, param_begin, destination.numel(), host));
    return CopyConverting(host, destination, Stream::Default(Device::Cpu()));
  };
  return ImportState(*partition_, joined, 0, partition_->num_buckets(),
                     /*arrays=*/1, source, stream());
}

absl::Status ZeroStrategy::ImportScope(const std::vector<int>& indices,
                                       const std::vector<Tensor>& values,
                                       const offload::UpdateJoined& joined) {
  if (indices.empty()) return absl::OkStatus();
  // Host copies by name (what the source is asked for), and the filter.
  std::unordered_map<std::string, Tensor> host;
  std::vector<bool> selected(layout().num_params(), false);
  for (size_t i = 0; i < indices.size(); ++i) {
    Tensor& copy = host[layout().param(indices[i]).name];
    if (copy.defined()) continue;
    ZE_ASSIGN_OR_RETURN(copy, Tensor::Empty({values[i].numel()},
                                            values[i].dtype(), Device::Cpu()));
    ZE_RETURN_IF_ERROR(Copy(values[i].Flat(), copy, stream()));
    selected[indices[i]] = true;
  }
  ZE_RETURN_IF_ERROR(stream().Synchronize());
  // Every kind ("weights", "master") is the modifier's values, converted.
  const ImportSource source = [&host](const std::string& /*kind*/,
                                      const std::string& name,
                                      int64_t param_begin,
                                      const Tensor& destination) {
    return CopyConverting(host.at(name).Slice(param_begin, destination.numel()),
                          destination, Stream::Default(Device::Cpu()));
  };
  return ImportState(*partition_, joined, 0, partition_->num_buckets(),
                     /*arrays=*/1, source, stream(),
                     [&selected](int index) { return selected[index]; });
}

PartitionStateOptions ZeroStrategy::RankPartitionStateOptions() const {
  PartitionStateOptions options = context_.plan->state;
  options.rank = rank();
  options.job_rank = context_.job_rank;
  options.device = device();
  if (context_.plan->cpu_optimizer) {
    // This host's cores, shared by its ranks (each pins its workers into
    // its own share); on a GPU one per rank is left to the engine's thread,
    // which launches the next forward's kernels while the CPU step runs.
    const int host_cpus =
        static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const CpuShare share = PlanCpuShare(
        AllowedCpuCount(), host_cpus, comm().local_rank(), comm().local_size());
    if (share.narrowed_by_launcher()) {
      ZE_LOG(WARNING) << "the launcher bound this process to " << share.count
                      << " of the host's " << host_cpus << " CPUs ("
                      << comm().local_size()
                      << (comm().local_size() == 1 ? " rank" : " ranks")
                      << " here), so the CPU optimizer runs on " << share.count
                      << "; mpirun --bind-to none lets it use "
                      << share.even_count;
    }
    // OMP_NUM_THREADS, when set, already chose the threads (Plan::state).
    if (options.host_threads == 0) {
      options.host_threads =
          std::max(1, device().is_cuda() ? share.count - 1 : share.count);
    }
    options.host_first_cpu = share.first_cpu;
  }
  options.annotate_allocation_error = [this](const absl::Status& status) {
    return AnnotateAllocationError(status);
  };
  return options;
}

BoundaryStepContext ZeroStrategy::MakeBoundaryStepContext() const {
  BoundaryStepContext step;
  step.config = context_.config;
  step.comm = context_.comm;
  step.stream = context_.compute_stream;
  step.training = context_.training;
  step.partition = partition_.get();
  step.step_number = *context_.global_steps + 1;
  step.pipeline = context_.pipeline;
  step.gradients_counted_elsewhere = &context_.gradients_counted_elsewhere;
  return step;
}

absl::Status ZeroStrategy::SumGradientsWith(
    const std::vector<nn::Parameter*>& parameters, comm::Communicator& other) {
  const auto all_reduce = [this](comm::Communicator& group,
                                 const Tensor& values) -> absl::Status {
    ZE_ASSIGN_OR_RETURN(
        comm::Work work,
        group.AllReduce(values, values, comm::ReduceOp::kSum, stream()));
    return work.Wait();
  };
  for (nn::Parameter* parameter : parameters) {
    if (!partition_->policy().partition_gradients) {
      const Tensor& grad = parameter->grad();
      if (!grad.defined()) {
        return absl::FailedPreconditionError(
            absl::StrCat("pipeline step: tied parameter ", parameter->name(),
                         " has no gradient"));
      }
      ZE_RETURN_IF_ERROR(all_reduce(other, grad));
      continue;
    }
    // The rank's piece of the reduced gradient.
    ZE_ASSIGN_OR_RETURN(const int index, layout().FindParam(parameter->name()));
    int64_t param_begin = 0;
    const Tensor piece = partition_->OwnGradientsOf(index, &param_begin);
    const Tensor gradients =
        partition_->OwnGradients(layout().placement(index).bucket);
    ZE_ASSIGN_OR_RETURN(
        Tensor whole,
        Tensor::Zeros({layout().placement(index).numel}, gradients.dtype(),
                      gradients.device(), stream()));
    const Tensor piece_in_whole =
        piece.defined() ? whole.Slice(param_begin, piece.numel()) : Tensor();
    if (piece.defined()) {
      ZE_RETURN_IF_ERROR(Copy(piece, piece_in_whole, stream()));
    }
    // Disjoint pieces, zeros elsewhere: the sum is the whole gradient.
    ZE_RETURN_IF_ERROR(all_reduce(comm(), whole));
    ZE_RETURN_IF_ERROR(all_reduce(other, whole));
    if (piece.defined()) {
      ZE_RETURN_IF_ERROR(Copy(piece_in_whole, piece, stream()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> ZeroStrategy::GatherMasterWeights(
    const std::string& name) {
  ZE_ASSIGN_OR_RETURN(int index, partition_->layout().FindParam(name));
  ZE_ASSIGN_OR_RETURN(const offload::UpdateJoined joined,
                      partition_->FinishUpdate(stream()));
  return GatherMaster(*partition_, joined, index, comm(), stream());
}

std::vector<std::string> ZeroStrategy::ParameterNames() const {
  std::vector<std::string> names;
  for (nn::Parameter* parameter : context_.model->Parameters()) {
    if (parameter->requires_grad()) names.push_back(parameter->name());
  }
  std::reverse(names.begin(), names.end());
  return names;
}

}  // namespace zero
}  // namespace ze
