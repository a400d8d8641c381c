#include "zero/grad_clip.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace ze {
namespace zero {

absl::StatusOr<GradClip> ComputeGradClip(double global_sum_of_squares,
                                         double loss_scale, double max_norm) {
  if (!(loss_scale > 0.0) || !std::isfinite(loss_scale)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient clipping: loss_scale must be positive, got ", loss_scale));
  }
  if (!(max_norm >= 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient_clipping must be >= 0 (0: off), got ", max_norm));
  }
  GradClip clip;
  if (!std::isfinite(global_sum_of_squares)) {
    clip.finite = false;
    clip.norm = global_sum_of_squares;  // inf or NaN, for the log
    clip.clip_coefficient = 0.0;
    clip.grad_scale = 0.0f;
    return clip;
  }
  clip.norm = std::sqrt(std::max(0.0, global_sum_of_squares)) / loss_scale;
  if (max_norm > 0.0) {
    clip.clip_coefficient =
        std::min(1.0, max_norm / (clip.norm + kClipEpsilon));
  }
  clip.grad_scale = static_cast<float>(clip.clip_coefficient / loss_scale);
  return clip;
}

double SumPartials(const std::vector<float>& partial_sums) {
  double total = 0.0;
  for (float partial : partial_sums) total += partial;
  return total;
}

}  // namespace zero
}  // namespace ze
