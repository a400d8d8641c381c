// The element-wise optimizer update of the CUDA kernel (the CPU one is
// offload/cpu_optimizer.h's RunStepKernel, which evaluates the same).
// Host-only header (plain C++; the .cu file includes it too).
//
// FlatOptimizer (optimizer.h) turns its options and StepArgs into the
// per-step coefficients (offload::StepCoefficients, the struct the CPU
// kernels take too) once on the host, in double precision, so the kernels
// only evaluate, for every element i, in f32:
//
//   g = grad[i] * grad_scale
//   Adam/AdamW:
//     g = fma(l2, p, g)                          (l2 = 0 for AdamW)
//     m = fma(beta1, m, one_minus_beta1 * g)
//     v = fma(beta2, v, (one_minus_beta2 * g) * g)
//     denom = fma(sqrt(v), inv_sqrt_bias_correction2, eps)
//     p = p * decay_factor                       (1 - lr wd for AdamW, else 1)
//     p = fma(neg_step_size, m / denom, p)       (neg_step_size = -lr / (1 -
//     b1^t))
//   SGD:
//     g = fma(l2, p, g)
//     if momentum buffer: buf = first_step ? g : fma(momentum, buf,
//     one_minus_dampening * g)
//                         g = nesterov ? fma(momentum, buf, g) : buf
//     p = fma(neg_step_size, g, p)               (neg_step_size = -lr)
//   out[i] = p rounded to out_dtype (when out is given)
//
// The CPU (AVX2) and CUDA kernels evaluate exactly this sequence with the
// same fused operations and IEEE sqrt/division, so they agree bit for bit.
#ifndef ZE_ZERO_OPTIMIZER_KERNELS_H_
#define ZE_ZERO_OPTIMIZER_KERNELS_H_

#include <cstdint>

#include "offload/step_coefficients.h"

namespace ze {
namespace zero {

// Sentinel for "no model-weight output".
constexpr int kNoOutput = -1;

// CPU: updates master[0, count) in place. state0/state1 are exp_avg and
// exp_avg_sq (Adam) or the momentum buffer and null (SGD; both null without
// momentum). grads has grad_dtype (a ze::DType value: f32, bf16, f16); out
// (may be null when out_dtype is kNoOutput) receives the rounded weights.
// Single-threaded; vectorised 8 wide. Never fails.

namespace cuda {

// The optimizer state of one launch (device memory): exp_avg / the
// momentum buffer and exp_avg_sq from the range's first element, stored as
// `format` says (an offload::MomentFormat value: f32; bf16; 8-bit codes,
// int8 m and uint8 v, with one f32 step per block of each in step0 /
// step1 from the range's first block). `first_index`: the range's first
// element in the optimizer's state (the stochastic rounding's counter; a
// multiple of offload::kMomentBlock for 8-bit, whose ranges cover whole
// blocks or end the state).
struct Moments {
  void* state0 = nullptr;
  void* state1 = nullptr;
  float* step0 = nullptr;
  float* step1 = nullptr;
  int format = 0;
  int64_t first_index = 0;
};

// CUDA: the same update queued on `stream` (a cudaStream_t as void*); all
// pointers device memory. Compressed moments are decoded, updated in f32
// and encoded in the same pass as offload/moment_codec.h says (8-bit: one
// thread block per block of 256). Returns the cudaError_t of the launch as
// int.
int LaunchOptimizerStep(const offload::StepCoefficients& coefficients,
                        float* master, const Moments& moments,
                        const void* grads, int grad_dtype, void* out,
                        int out_dtype, int64_t count, void* stream);

// CUDA: the same update of an exact 16+16 master (core/dtype.h's
// Bf16Split): the master weight i is JoinBf16Split(master_hi[i],
// master_lo[i]); both halves are rewritten with the updated value's split,
// master_hi being the bf16 model weights. Equals the f32-master update bit
// for bit (offload::StepBuffers::master_lo is the CPU form).
int LaunchSplitMasterStep(const offload::StepCoefficients& coefficients,
                          uint16_t* master_hi, uint16_t* master_lo,
                          const Moments& moments, const void* grads,
                          int grad_dtype, int64_t count, void* stream);

}  // namespace cuda
}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_OPTIMIZER_KERNELS_H_
