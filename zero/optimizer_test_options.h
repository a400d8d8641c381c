// The optimizer variants both optimizer tests run: the CPU kernel against a
// double reference (optimizer_test) and the CUDA kernel against the CPU one
// (optimizer_cuda_test). Test-only.
#ifndef ZE_ZERO_OPTIMIZER_TEST_OPTIONS_H_
#define ZE_ZERO_OPTIMIZER_TEST_OPTIONS_H_

#include "zero/optimizer.h"

namespace ze {
namespace zero {

struct OptimizerVariants {
  OptimizerOptions adam;      // L2 weight decay 0.01
  OptimizerOptions adamw;     // decoupled weight decay 0.1
  OptimizerOptions sgd;       // momentum 0.9, weight decay 0.01
  OptimizerOptions nesterov;  // sgd, Nesterov
  OptimizerOptions dampened;  // sgd, dampening 0.3
  OptimizerOptions plain;     // SGD without momentum or decay
};

inline OptimizerVariants TestOptimizers() {
  OptimizerVariants v;
  v.adam.type = OptimizerType::kAdam;
  v.adam.weight_decay = 0.01f;
  v.adamw.type = OptimizerType::kAdamW;
  v.adamw.weight_decay = 0.1f;
  v.sgd.type = OptimizerType::kSgd;
  v.sgd.momentum = 0.9f;
  v.sgd.weight_decay = 0.01f;
  v.nesterov = v.sgd;
  v.nesterov.nesterov = true;
  v.dampened = v.sgd;
  v.dampened.dampening = 0.3f;
  v.plain.type = OptimizerType::kSgd;
  return v;
}

}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_OPTIMIZER_TEST_OPTIONS_H_
