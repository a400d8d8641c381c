// Per-rank model-state memory for ZeRO stages 0-3 (ZeRO paper, section 3/5).
//
// With Psi parameters, N ranks and K bytes of optimizer state per parameter:
//
//   mixed precision (16-bit params and grads; the optimizer holds f32
//   master weights plus its moments, K = 4 + state, 12 for Adam):
//     stage 0: 2Psi + 2Psi + K Psi               = 16 Psi        (Adam)
//     stage 1: 2Psi + 2Psi + K Psi / N           = 4 Psi + 12 Psi / N
//     stage 2: 2Psi + (2 + K) Psi / N            = 2 Psi + 14 Psi / N
//     stage 3: (2 + 2 + K) Psi / N               = 16 Psi / N
//
//   f32 training (the f32 params are the master weights: no extra copy, so
//   K = state only, 8 for Adam):
//     stage 0: 4Psi + 4Psi + 8Psi                = 16 Psi
//     stage 1: 4Psi + 4Psi + 8Psi / N            = 8 Psi + 8 Psi / N
//     stage 2: 4Psi + 12 Psi / N
//     stage 3: 16 Psi / N
//
// SGD with momentum has state 4 (K = 8 mixed, 4 f32); plain SGD 0 (K = 4
// mixed: the master weights; 0 in f32).
//
// Excluded, as in the paper: activations (zero/activation_estimate.h),
// communication buckets (stage 2's in-flight reduce buckets, stage 3's
// gathered parameters) and allocator rounding. EstimateModelStateBytes adds
// this project's layout padding: replicated quantities use the padded total,
// partitioned ones the padded partition (flat_layout.h).
#ifndef ZE_ZERO_MEMORY_ESTIMATE_H_
#define ZE_ZERO_MEMORY_ESTIMATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/config.h"
#include "zero/flat_layout.h"
#include "zero/stage_policy.h"

namespace ze {
namespace zero {

// Precision is config::TrainingPrecision: bf16 and fp16 are "mixed" above
// (16-bit weights and gradients, f32 master), fp32 is "f32 training".
using config::TrainingPrecision;

// Bytes one rank holds.
struct ModelStateBytes {
  int64_t params = 0;
  int64_t grads = 0;
  int64_t optimizer_states = 0;  // master weights (mixed) + moments
  int64_t master_weights = 0;    // the f32 master part of optimizer_states
  int64_t total() const { return params + grads + optimizer_states; }
  // "params 1.50 GiB, grads 0.09 GiB, optimizer states 0.56 GiB, total ...".
  std::string ToString() const;
};

// The formulas above for `psi` parameters over `world_size` ranks, with a
// partitioned quantity taking ceil(psi / N) elements per rank (no layout
// padding). `optimizer_state_bytes_per_element`: StateBytesPerElement from
// optimizer.h (8 for Adam). Fails with InvalidArgument for a stage outside
// 0-3, psi < 0, world_size < 1 or negative state bytes.
absl::StatusOr<ModelStateBytes> PaperModelStateBytes(
    int64_t psi, int world_size, int stage, TrainingPrecision precision,
    int64_t optimizer_state_bytes_per_element);

// The same for the real layout (world size from it), padding included: what
// the allocator will see for model state. Errors as above.
absl::StatusOr<ModelStateBytes> EstimateModelStateBytes(
    const PartitionedLayout& layout, int stage, TrainingPrecision precision,
    int64_t optimizer_state_bytes_per_element);

}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_MEMORY_ESTIMATE_H_
