// StepCoefficients: what one optimizer step's element update needs, derived
// once on the host (FlatOptimizer and CpuOptimizer, from the options and
// the step's arguments). Plain C++ with no dependencies, so the CUDA
// kernel's translation unit (nvcc) includes it too.
#ifndef ZE_OFFLOAD_STEP_COEFFICIENTS_H_
#define ZE_OFFLOAD_STEP_COEFFICIENTS_H_

#include <cstdint>

namespace ze {
namespace offload {

// How Adam's moments m and v are stored (offload/moment_codec.h has the
// encodings): f32 (exact, 8 bytes an element), bf16 (4 bytes), or 8-bit
// codes in blocks of kMomentBlock elements with one f32 step per block per
// moment (2 + 8/256 bytes). Every kernel dequantises, updates in f32 and
// requantises in the one element pass.
enum class MomentFormat : int { kF32 = 0, kBf16 = 1, kBlockwise8 = 2 };

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
  // bf16 moments (the storage itself is the kernel's argument): with
  // stochastic_rounding they round with moment_codec.h's StochasticBf16,
  // its noise keyed by round_key_m / round_key_v (RoundingKey of the seed,
  // this step and the moment) and the element's index in the optimizer's
  // state; otherwise to nearest even. 8-bit moments always round the
  // update's codes stochastically, both codes from round_key_m's noise
  // (moment_codec.h's EncodeBlock8Stochastic).
  bool stochastic_rounding = false;
  uint32_t round_key_m = 0;
  uint32_t round_key_v = 0;
};

}  // namespace offload
}  // namespace ze

#endif  // ZE_OFFLOAD_STEP_COEFFICIENTS_H_
