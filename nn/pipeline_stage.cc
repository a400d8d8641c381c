#include "nn/pipeline_stage.h"

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
