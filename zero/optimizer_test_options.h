// The optimizer variants both optimizer tests run: the CPU kernel against a
// double reference (optimizer_test) and the CUDA kernel against the CPU one
// (optimizer_cuda_test). Test-only.
#ifndef ZE_ZERO_OPTIMIZER_TEST_OPTIONS_H_
#define ZE_ZERO_OPTIMIZER_TEST_OPTIONS_H_

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/ops.h"
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

// What a few steps of a FlatOptimizer with compressed moments leave: the
// master (f32, or the split master joined), the bf16 weights it writes,
// each state array decoded (ReadState) and its raw storage's bytes.
struct MomentsRun {
  std::vector<float> master;
  std::vector<float> weights;
  std::vector<std::vector<float>> decoded;
  std::vector<std::vector<float>> raw;  // raw storage read as its dtype
};

// `steps` steps of `options` over `count` elements on `device` from fixed
// inputs (grads of block-varying scale in `grad_dtype`, some zero);
// `split`: a 16+16 master (StepSplitRange), else f32 with a bf16 output.
// The two optimizer tests compare it across devices and formats.
inline MomentsRun RunFlatOptimizer(const Device& device,
                                   const OptimizerOptions& options,
                                   int64_t count, int steps, DType grad_dtype,
                                   bool split) {
  Stream stream = device.is_cpu() ? Stream() : *Stream::Create(device);
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // bf16 values: the 16+16 master starts from the bf16 weights.
  std::vector<float> initial(count);
  for (float& p : initial) p = Bf16BitsToFloat(FloatToBf16Bits(normal(rng)));
  auto optimizer = FlatOptimizer::Create(options, count, device);
  MomentsRun run;
  if (!optimizer.ok()) return run;
  const Shape shape = {count};
  Tensor master = *FromHostFloats(initial, shape, DType::kF32, device, stream);
  Tensor weights =
      *FromHostFloats(initial, shape, DType::kBF16, device, stream);
  Tensor low = *Tensor::Zeros(shape, DType::kBF16, device, stream);
  for (int s = 0; s < steps; ++s) {
    std::vector<float> g(count);
    for (int64_t i = 0; i < count; ++i) {
      g[i] = (i % 61 == 9 && s > 0)
                 ? 0.0f
                 : normal(rng) *
                       std::ldexp(1.0f,
                                  static_cast<int>((i / 256) % 9 + i % 3) - 6);
    }
    Tensor grads = *FromHostFloats(g, shape, grad_dtype, device, stream);
    StepArgs args;
    args.lr = 1e-2;
    args.grad_scale = 0.5f;
    absl::Status status =
        split
            ? (*optimizer)->StepSplitRange(0, weights, low, grads, args, stream)
            : (*optimizer)->StepRange(0, master, grads, args, stream, weights);
    if (!status.ok()) return MomentsRun();
    (*optimizer)->AdvanceStep();
  }
  run.weights = *ToHostFloats(weights, stream);
  if (split) {
    std::vector<float> hi = run.weights;
    Tensor low_host = *Tensor::Empty(shape, DType::kBF16, Device::Cpu());
    (void)Copy(low, low_host, stream);
    (void)stream.Synchronize();
    run.master.resize(count);
    for (int64_t i = 0; i < count; ++i) {
      run.master[i] = JoinBf16Split(FloatToBf16Bits(hi[i]),
                                    low_host.data_as<uint16_t>()[i]);
    }
  } else {
    run.master = *ToHostFloats(master, stream);
  }
  const std::vector<NamedStateTensor> state = (*optimizer)->StateTensors();
  for (size_t a = 0; a < state.size(); ++a) {
    Tensor out = *Tensor::Empty(shape, DType::kF32, Device::Cpu());
    if (!(*optimizer)->ReadState(static_cast<int>(a), 0, out, stream).ok()) {
      return MomentsRun();
    }
    run.decoded.emplace_back(out.data_as<float>(),
                             out.data_as<float>() + count);
    // bf16 containers of 8-bit codes read as numbers are still their bits'
    // function: equal bits give equal floats (NaN payloads aside).
    run.raw.push_back(*ToHostFloats(state[a].tensor, stream));
  }
  return run;
}

}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_OPTIMIZER_TEST_OPTIONS_H_
