// Test values for the partition's doors (partition_import_test,
// partition_export_test): a small PartitionState on the CPU and a source
// whose every element says which kind, parameter and index it is.
#ifndef ZE_ZERO_PARTITION_TEST_VALUES_H_
#define ZE_ZERO_PARTITION_TEST_VALUES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/ops.h"
#include "core/status.h"
#include "core/tensor.h"
#include "zero/partition_state.h"

namespace ze {
namespace zero {
namespace testing_values {

// Parameters a [30], then b [11] and c [7], in two buckets of at most 40
// elements, partitioned over `world`; bf16 weights, AdamW (arrays "master",
// "exp_avg", "exp_avg_sq"), `trainable` per bucket (empty: all).
inline absl::StatusOr<std::unique_ptr<PartitionState>> MakeState(
    int stage, int world = 1, int rank = 0, std::vector<bool> trainable = {}) {
  LayoutOptions layout_options;
  layout_options.bucket_max_elements = 40;
  layout_options.world_size = world;
  ZE_ASSIGN_OR_RETURN(PartitionedLayout layout,
                      PartitionedLayout::Build({{"a", 30}, {"b", 11}, {"c", 7}},
                                               layout_options));
  PartitionStateOptions options;
  options.stage = stage;
  options.rank = rank;
  options.model_dtype = DType::kBF16;
  options.optimizer.type = OptimizerType::kAdamW;
  options.trainable = std::move(trainable);
  const Stream& stream = Stream::Default(Device::Cpu());
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<PartitionState> state,
                      PartitionState::Create(layout, options, stream));
  ZE_RETURN_IF_ERROR(state->AllocateTrainingState(stream));
  return state;
}

// Kind `kind` of parameter `name` at element i: small integers, exact in
// bf16, distinct per kind and parameter.
inline float Value(const std::string& kind, const std::string& name,
                   int64_t i) {
  const float base = kind == "weights"   ? 0
                     : kind == "master"  ? 50
                     : kind == "exp_avg" ? 100
                                         : 150;
  return base + static_cast<float>(name[0] - 'a') * 31 + static_cast<float>(i);
}

// An ImportSource of Value.
inline absl::Status FillFrom(const std::string& kind, const std::string& name,
                             int64_t begin, const Tensor& destination) {
  ZE_ASSIGN_OR_RETURN(Tensor values, Tensor::Empty({destination.numel()},
                                                   DType::kF32, Device::Cpu()));
  for (int64_t i = 0; i < destination.numel(); ++i) {
    values.data_as<float>()[i] = Value(kind, name, begin + i);
  }
  return CopyConverting(values, destination, Stream::Default(Device::Cpu()));
}

inline std::vector<float> Floats(const Tensor& tensor) {
  return ToHostFloats(tensor, Stream::Default(Device::Cpu())).value();
}

}  // namespace testing_values
}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_PARTITION_TEST_VALUES_H_
