// Global gradient norm and the clip coefficient, PyTorch/DeepSpeed style.
//
// Each rank sums the squares of the gradient elements it owns (its partition
// under stage 1/2/3; under stage 0 every rank holds everything after the
// all-reduce, so rank r sums only its layout partition, RankPartition(r), or
// a single rank's full sum is used without reduction). The engine all-reduces
// those partial sums (f32) and calls ComputeGradClip once: the norm is then
// the same whatever the stage and world size. Padding elements are zero and
// add nothing.
//
// Gradients are stored multiplied by the loss scale (fp16), so:
//   norm             = sqrt(sum_of_squares) / loss_scale
//   clip_coefficient = min(1, max_norm / (norm + 1e-6))   (PyTorch's
//                      clip_grad_norm_; DeepSpeed's combined_scale is the
//                      same factor), 1 when max_norm == 0 (no clipping)
//   grad_scale       = clip_coefficient / loss_scale
// grad_scale is what FlatOptimizer::Step multiplies every gradient by, so
// unscaling and clipping cost no extra pass.
#ifndef ZE_ZERO_GRAD_CLIP_H_
#define ZE_ZERO_GRAD_CLIP_H_

#include <vector>

#include "absl/status/statusor.h"

namespace ze {
namespace zero {

// PyTorch's clip_grad_norm_ epsilon.
inline constexpr double kClipEpsilon = 1e-6;

struct GradClip {
  double norm = 0.0;              // global L2 norm of the unscaled gradients
  double clip_coefficient = 1.0;  // <= 1
  float grad_scale = 1.0f;        // clip_coefficient / loss_scale
  // False when the sum is inf or NaN: some gradient overflowed. The engine
  // skips the step (and tells the loss scaler); grad_scale is 0 then.
  bool finite = true;
};

// `global_sum_of_squares`: the all-reduced sum of squares of the stored
// gradients over all ranks. `loss_scale` > 0 (1 without fp16). `max_norm`
// >= 0 (DeepSpeed's gradient_clipping; 0 disables clipping).
// Fails with InvalidArgument on a non-positive loss_scale or negative
// max_norm. A non-finite sum is not an error: it reports finite = false.
absl::StatusOr<GradClip> ComputeGradClip(double global_sum_of_squares,
                                         double loss_scale, double max_norm);

// Sums per-rank partial sums in double (for a host-side reduction of
// gathered partials, and for tests).
double SumPartials(const std::vector<float>& partial_sums);

}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_GRAD_CLIP_H_
