// StepCoefficients: what one optimizer step's element update needs, derived
// once on the host (FlatOptimizer and CpuOptimizer, from the options and
// the step's arguments). Plain C++ with no dependencies, so the CUDA
// kernel's translation unit (nvcc) includes it too.
#ifndef ZE_OFFLOAD_STEP_COEFFICIENTS_H_
#define ZE_OFFLOAD_STEP_COEFFICIENTS_H_

namespace ze {
namespace offload {

// The per-step f32 coefficients every element of an optimizer step uses,
// whichever kernel evaluates them: the CPU optimizer's
// (offload/cpu_optimizer.h) and the CUDA one (zero/optimizer_kernels.h),
// which both take this struct as it is. (Its field list is declared
// boilerplate: one line a coefficient.)
struct StepCoefficients {
  bool is_sgd = false;
  float grad_scale = 1.0f;
  float l2 = 0.0f;
  float decay_factor = 1.0f;
  float neg_step_size = 0.0f;
  // Adam, AdamW
  float beta1 = 0.0f;
  float one_minus_beta1 = 1.0f;
  float beta2 = 0.0f;
  float one_minus_beta2 = 1.0f;
  float eps = 0.0f;
  float inv_sqrt_bias_correction2 = 1.0f;
  // SGD
  float momentum = 0.0f;
  float one_minus_dampening = 1.0f;
  bool has_momentum_buffer = false;
  bool nesterov = false;
  bool first_step = false;
};

}  // namespace offload
}  // namespace ze

#endif  // ZE_OFFLOAD_STEP_COEFFICIENTS_H_
