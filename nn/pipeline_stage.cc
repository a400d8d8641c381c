#include "nn/pipeline_stage.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ze {
namespace nn {

TiedTableCopy::TiedTableCopy(const std::string &parameter_name, int64_t rows,
                             int64_t columns, DType dtype, const Device &device,
                             const Initializer &initializer)
    : Module("TiedTableCopy") {
  table_ = RegisterParameter(parameter_name, {rows, columns}, dtype, device,
                             initializer);
}

absl::StatusOr<Tensor> TiedTableCopy::ForwardImpl(const Tensor &,
                                                  const Stream &) {
  return absl::FailedPreconditionError(
      "the last pipeline stage's copy of a tied table is read by the head "
      "only");
}

absl::StatusOr<Tensor> TiedTableCopy::BackwardImpl(const Tensor &,
                                                   const Stream &stream) {
  return ForwardImpl(Tensor(), stream);
}

absl::StatusOr<std::unique_ptr<InterleavedStages>> InterleavedStages::Create(
    std::vector<std::unique_ptr<LossModel>> chunks) {
  if (chunks.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "InterleavedStages: a rank of the interleaved schedule holds 2 or "
        "more stages, got ",
        chunks.size()));
  }
  std::unique_ptr<InterleavedStages> whole(new InterleavedStages());
  std::set<std::string> names;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const std::string which = absl::StrCat("InterleavedStages: chunk ", c);
    if (chunks[c] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(which, " is null"));
    }
    auto *stage = dynamic_cast<PipelineStage *>(chunks[c].get());
    if (stage == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(which, " (", chunks[c]->type_name(),
                       ") is not a pipeline stage (nn::PipelineStage)"));
    }
    if (c > 0) {
      const PipelineStage &before = *whole->stages_.back();
      if (stage->num_pipeline_layers() != before.num_pipeline_layers()) {
        return absl::InvalidArgumentError(absl::StrCat(
            which, " is a stage of a model of ", stage->num_pipeline_layers(),
            " pipeline layers, chunk 0 of one of ",
            whole->stages_[0]->num_pipeline_layers()));
      }
      if (stage->first_layer() < before.last_layer()) {
        return absl::InvalidArgumentError(
            absl::StrCat(which, " holds layers [", stage->first_layer(), ", ",
                         stage->last_layer(), "), which do not follow chunk ",
                         c - 1, "'s [", before.first_layer(), ", ",
                         before.last_layer(), "): chunks go in model order"));
      }
      if (chunks[c]->device() != chunks[0]->device() ||
          chunks[c]->dtype() != chunks[0]->dtype()) {
        return absl::InvalidArgumentError(
            absl::StrCat(which, " is on ", chunks[c]->device().ToString(),
                         " in ", DTypeName(chunks[c]->dtype()), ", chunk 0 on ",
                         chunks[0]->device().ToString(), " in ",
                         DTypeName(chunks[0]->dtype())));
      }
    }
    // Unnamed children share one namespace: a name twice would make two
    // parameters one in every by-name lookup (checkpoints, the strategy).
    for (Parameter *parameter : chunks[c]->Parameters()) {
      if (!names.insert(parameter->name()).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(which, " has a parameter named '", parameter->name(),
                         "' as an earlier chunk does"));
      }
    }
    whole->stages_.push_back(stage);
    whole->models_.push_back(chunks[c].get());
  }
  for (std::unique_ptr<LossModel> &chunk : chunks) {
    whole->RegisterUnnamedChild(std::move(chunk));
  }
  return whole;
}

absl::Status InterleavedStages::NotRunAsOne(const char *op) const {
  std::string layers;
  for (const PipelineStage *stage : stages_) {
    absl::StrAppend(&layers, layers.empty() ? "" : ", ", "[",
                    stage->first_layer(), ", ", stage->last_layer(), ")");
  }
  return absl::FailedPreconditionError(absl::StrCat(
      op, ": this model is a pipeline rank's stages (layers ", layers, " of ",
      stages_[0]->num_pipeline_layers(),
      "); the pipeline runs each through ForwardStage/BackwardStage"));
}

absl::StatusOr<float> InterleavedStages::ForwardLoss(const Tensor &,
                                                     const Tensor &,
                                                     const Stream &) {
  return NotRunAsOne("InterleavedStages::ForwardLoss");
}

absl::Status InterleavedStages::BackwardLoss(float, const Stream &) {
  return NotRunAsOne("InterleavedStages::BackwardLoss");
}

absl::StatusOr<Tensor> InterleavedStages::ForwardImpl(const Tensor &,
                                                      const Stream &) {
  return NotRunAsOne("InterleavedStages::Forward");
}

absl::StatusOr<Tensor> InterleavedStages::BackwardImpl(const Tensor &,
                                                       const Stream &) {
  return NotRunAsOne("InterleavedStages::Backward");
}

std::vector<PipelineStage *> PipelineStagesOf(Module &model) {
  if (auto *chunks = dynamic_cast<InterleavedStages *>(&model)) {
    std::vector<PipelineStage *> stages;
    for (int c = 0; c < chunks->num_chunks(); ++c) {
      stages.push_back(chunks->chunk(c));
    }
    return stages;
  }
  if (auto *stage = dynamic_cast<PipelineStage *>(&model)) return {stage};
  return {};
}

absl::Status CheckPipelineLayers(const char *options, int first_layer,
                                 int last_layer, int count,
                                 const std::string &layers) {
  const int last = last_layer < 0 ? count : last_layer;
  if (first_layer < 0 || first_layer >= last || last > count) {
    return absl::InvalidArgumentError(absl::StrCat(
        options, ": pipeline layers [first_layer, last_layer) = [", first_layer,
        ", ", last_layer, ") must be a non-empty range within the model's ",
        count, " (", layers, ")"));
  }
  return absl::OkStatus();
}

absl::Status NotWholeModelError(const char *op, const PipelineStage &stage) {
  return absl::FailedPreconditionError(absl::StrCat(
      op, ": this model is a pipeline stage (layers [", stage.first_layer(),
      ", ", stage.last_layer(), ") of ", stage.num_pipeline_layers(),
      "); the pipeline runs it through ForwardStage/BackwardStage"));
}

}  // namespace nn
}  // namespace ze
