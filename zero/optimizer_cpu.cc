// CPU optimizer step: offload/'s kernel (offload/cpu_optimizer.h), the one
// CPU implementation of the Adam, AdamW and SGD updates (AVX-512, AVX2 or
// scalar by the CPU, which agree bit for bit; the CUDA kernel evaluates the
// same f32 operations). One thread: FlatOptimizer's CPU slices are the
// engine's per-bucket partitions, stepped one after another.
#include "core/dtype.h"
#include "offload/cpu_optimizer.h"
#include "zero/optimizer_kernels.h"

namespace ze {
namespace zero {

void CpuOptimizerStep(const OptimizerCoefficients& coefficients, float* master,
                      float* state0, float* state1, const void* grads,
                      int grad_dtype, void* out, int out_dtype, int64_t count) {
  static const offload::SimdPath path = offload::BestSimdPath();
  offload::StepCoefficients kernel;
  kernel.is_sgd = coefficients.kind == kKernelSgd;
  kernel.grad_scale = coefficients.grad_scale;
  kernel.l2 = coefficients.l2;
  kernel.decay_factor = coefficients.decay_factor;
  kernel.neg_step_size = coefficients.neg_step_size;
  kernel.beta1 = coefficients.beta1;
  kernel.one_minus_beta1 = coefficients.one_minus_beta1;
  kernel.beta2 = coefficients.beta2;
  kernel.one_minus_beta2 = coefficients.one_minus_beta2;
  kernel.eps = coefficients.eps;
  kernel.inv_sqrt_bias_correction2 = coefficients.inv_sqrt_bias_correction2;
  kernel.momentum = coefficients.momentum;
  kernel.one_minus_dampening = coefficients.one_minus_dampening;
  kernel.has_momentum_buffer = coefficients.has_momentum_buffer != 0;
  kernel.nesterov = coefficients.nesterov != 0;
  kernel.first_step = coefficients.first_step != 0;
  offload::StepBuffers buffers;
  buffers.master = master;
  buffers.state0 = state0;
  buffers.state1 = state1;
  buffers.grads = grads;
  // The kernels' dtype codes are ze::DType's values (0 f32, 1 bf16, 2 f16).
  buffers.grad_dtype = static_cast<DType>(grad_dtype);
  buffers.out = out_dtype == kNoOutput ? nullptr : out;
  buffers.out_dtype =
      out_dtype == kNoOutput ? DType::kBF16 : static_cast<DType>(out_dtype);
  buffers.count = count;
  offload::RunStepKernel(path, kernel, buffers);
}

}  // namespace zero
}  // namespace ze
