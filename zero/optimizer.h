// Optimizers over flat f32 master-weight slices: Adam, AdamW, SGD.
//
// A FlatOptimizer owns the state for one flat range of master weights (a
// rank's partition, see flat_layout.h: master weights, gradients and moments
// share that layout, so one Step updates a whole partition in one pass).
// Step reads the gradient slice (f32, bf16 or f16), multiplies it by
// `grad_scale` first (the combined loss-unscale and clip coefficient),
// updates the f32 master weights and the state in place, and, when given a
// model-weight slice, writes the updated weights rounded to its dtype in the
// same pass (fused copy-back of the 16-bit model weights).
//
// Semantics (PyTorch's, which DeepSpeed's fused kernels share), with t the
// 1-based step count and g = grad * grad_scale:
//   Adam  (L2):        g += wd * p
//                      m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//                      p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) +
//                      eps)
//   AdamW (decoupled): p *= 1 - lr * wd, then the Adam update without L2.
//   SGD:               g += wd * p
//                      buf = g on the first step, else buf = mu buf + (1 -
//                      dampening) g g = nesterov ? g + mu buf : buf;  p -= lr g
//                      (momentum 0: no state, plain p -= lr g)
// Note: DeepSpeed's config type "Adam" means AdamW unless "adam_w_mode" is
// false; mapping the config to kAdam/kAdamW is the engine's job.
//
// CPU: offload/cpu_optimizer.h's kernel (AVX-512, AVX2 or scalar, chosen
// from the CPU; one thread), single pass. CUDA:
// one fused kernel, 4 elements per thread with vector loads when aligned.
// Both evaluate the same f32 expression with the same fused multiply-adds,
// so they agree to rounding of sqrt/division (in practice bit for bit).
#ifndef ZE_ZERO_OPTIMIZER_H_
#define ZE_ZERO_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/allocator.h"
#include "core/device.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "offload/cpu_optimizer.h"

namespace ze {
namespace zero {
namespace cuda {
struct Moments;  // optimizer_kernels.h
}  // namespace cuda

// The optimizer's hyperparameters (OptimizerOptions: type, betas, eps,
// weight decay, SGD's momentum, dampening, nesterov; fixed for the run) and
// per-step arguments (StepArgs: lr, grad_scale = 1 / loss_scale times the
// clip coefficient, OneCycle's beta overrides) are offload/'s: the CPU and
// the device optimizers share one definition, one validation and one
// derivation of the per-step coefficients (offload/cpu_optimizer.h).
using offload::OptimizerOptions;
using offload::OptimizerType;
using offload::OptimizerTypeName;
using offload::StepArgs;

using offload::MomentFormat;

// A state tensor with its checkpoint name.
struct NamedStateTensor {
  std::string name;  // "exp_avg", "exp_avg_sq" or "momentum_buffer"
  // On the optimizer's device, in moment_format()'s storage: f32
  // [num_elements]; bf16 [num_elements]; 8-bit: the codes' bytes in a
  // 2-byte container [ceil(num_elements / 2)] (raw, never read as
  // numbers). ReadState / WriteState convert.
  Tensor tensor;
};

// One optimizer step over `buffers` (pointers in `device`'s memory; an f32
// master, not the 16+16 forms), queued on `stream`: the CPU kernel
// (offload::RunStepKernel) on the calling thread for the CPU, else the CUDA
// kernel (the current device must be `device`). The one dispatch of the
// element update: FlatOptimizer's ranges and offload::HostUpdate's
// device-updated slots (HostUpdateOptions::device_step) both call it, so the
// two are the same arithmetic, bit for bit. `type` names the optimizer in
// errors. InvalidArgument for a 16+16 form; the launch's error.
absl::Status RunStepKernelOn(const Device& device, OptimizerType type,
                             const offload::StepCoefficients& coefficients,
                             const offload::StepBuffers& buffers,
                             const Stream& stream);

class FlatOptimizer {
 public:
  // Allocates zeroed f32 state for `num_elements` master weights on
  // `device` (from `allocator`, default GetAllocator(device)): exp_avg and
  // exp_avg_sq for Adam/AdamW, momentum_buffer for SGD with momentum, none
  // for plain SGD. Fails with InvalidArgument for bad hyperparameters
  // (betas outside [0, 1), eps <= 0, negative weight decay or momentum,
  // nesterov without momentum or with dampening) and with the allocator's
  // ResourceExhausted when the state does not fit.
  // `format_elements` (default num_elements): the size that decides
  // whether 8-bit moments apply (offload::EffectiveMomentFormat): a rank's
  // slice of a bucket passes the whole bucket's, so the format does not
  // change with the world size.
  static absl::StatusOr<std::unique_ptr<FlatOptimizer>> Create(
      const OptimizerOptions& options, int64_t num_elements,
      const Device& device, Allocator* allocator = nullptr,
      int64_t format_elements = -1);

  FlatOptimizer(const FlatOptimizer&) = delete;
  FlatOptimizer& operator=(const FlatOptimizer&) = delete;

  // One update of `master_weights` (f32, num_elements) from `grads` (f32,
  // bf16 or f16, num_elements); if `model_weights` is defined (f32, bf16 or
  // f16, num_elements) it receives the updated weights, rounded to nearest
  // even. All tensors must be on the optimizer's device and must not overlap
  // one another. Queued on `stream` (CUDA: asynchronous, the caller keeps
  // the tensors alive until it completes; CPU: done on return). Increments
  // step_count() when the work is queued.
  // Fails with InvalidArgument (naming the tensor) on a size, dtype or
  // device mismatch, a non-finite lr, or a step_args beta outside [0, 1);
  // with the CUDA launch error otherwise. Nothing is modified on failure.
  absl::Status Step(const Tensor& master_weights, const Tensor& grads,
                    const StepArgs& step_args, const Stream& stream,
                    const Tensor& model_weights = Tensor());

  // Like Step, but updates only state elements [state_offset, state_offset
  // + master_weights.numel()) and does not advance step_count(): for callers
  // that update a partition range by range (f32 training, where a rank's
  // master weights are its slices of each bucket buffer, not one tensor).
  // Call AdvanceStep() once after every range of one step is queued.
  // Fails with InvalidArgument when the range leaves the state, otherwise
  // as Step.
  absl::Status StepRange(int64_t state_offset, const Tensor& master_weights,
                         const Tensor& grads, const StepArgs& step_args,
                         const Stream& stream,
                         const Tensor& model_weights = Tensor());
  void AdvanceStep() { ++step_count_; }

  // StepRange over an exact 16+16 master (bf16.master_weights_16_plus_16,
  // core/dtype.h's Bf16Split): the master weight i is
  // JoinBf16Split(master_hi[i], master_lo[i]). master_hi is the bf16 model
  // weights themselves (bf16, [count]); master_lo the low halves ([count],
  // any 2-byte dtype: raw bits, never read as numbers). Both are rewritten
  // with the updated value's split, so master, state and weights equal an
  // f32 master's StepRange bit for bit, except that the weights round ties
  // away from zero (not to even). Does not advance step_count(). Fails as
  // StepRange (InvalidArgument naming the tensor), also when master_hi is
  // not bf16 or master_lo not 2 bytes an element. Nothing modified on
  // failure. Stream and lifetime as Step.
  absl::Status StepSplitRange(int64_t state_offset, const Tensor& master_hi,
                              const Tensor& master_lo, const Tensor& grads,
                              const StepArgs& step_args, const Stream& stream);

  // The state for checkpoints, in a fixed order; the tensors share storage
  // with the optimizer (writing into them restores state).
  std::vector<NamedStateTensor> StateTensors() const;
  // How the moments are stored (offload::EffectiveMomentFormat).
  MomentFormat moment_format() const { return moment_format_; }
  // Elements [begin, begin + out.numel()) of state array `array` (the
  // StateTensors index) into `out` (host f32): exact from every format.
  // Synchronous. InvalidArgument for another `out` or a range outside the
  // state; copy errors otherwise.
  absl::Status ReadState(int array, int64_t begin, const Tensor& out,
                         const Stream& stream) const;
  // Writes host f32 `values` over those elements (offload::EncodeMoments'
  // rounding: a state read and written back is unchanged). Synchronous.
  // Errors as ReadState.
  absl::Status WriteState(int array, int64_t begin, const Tensor& values,
                          const Stream& stream);

  // Steps taken (Adam's bias correction uses step_count() + 1 next; SGD
  // initialises its buffer when it is 0). Restore with set_step_count.
  int64_t step_count() const { return step_count_; }
  void set_step_count(int64_t count) { step_count_ = count; }

  const OptimizerOptions& options() const { return options_; }
  int64_t num_elements() const { return num_elements_; }
  const Device& device() const { return device_; }

 private:
  FlatOptimizer(const OptimizerOptions& options, int64_t num_elements,
                const Device& device);

  // What StepRange and StepSplitRange share. InvalidArgument unless
  // [state_offset, state_offset + count) lies inside the state (and covers
  // whole blocks of 8-bit moments).
  absl::Status CheckRange(int64_t state_offset, int64_t count) const;
  // The optimizer state from `state_offset` on: Adam's moments, SGD's
  // momentum buffer (null without momentum), null where a kind has none.
  struct StateAt {
    void* state0 = nullptr;
    void* state1 = nullptr;
    float* step0 = nullptr;  // 8-bit: the range's first block's steps
    float* step1 = nullptr;
  };
  StateAt StateFrom(int64_t state_offset) const;
  // The state from state_offset on into the CPU kernel's buffers, or as
  // the CUDA kernel's argument.
  void SetState(const StateAt& state, int64_t state_offset,
                offload::StepBuffers* buffers) const;
  cuda::Moments MomentsOf(const StateAt& state, int64_t state_offset) const;
  // InvalidArgument unless `stream` is on this optimizer's (CUDA) device,
  // which it makes current.
  absl::Status EnterDevice(const Stream& stream) const;

  OptimizerOptions options_;
  int64_t num_elements_;
  Device device_;
  int64_t step_count_ = 0;
  Tensor exp_avg_;          // Adam, AdamW
  Tensor exp_avg_sq_;       // Adam, AdamW
  Tensor momentum_buffer_;  // SGD with momentum
  MomentFormat moment_format_ = MomentFormat::kF32;
  Tensor exp_avg_steps_;  // 8-bit: f32 [ceil(num_elements / 256)]
  Tensor exp_avg_sq_steps_;
  // A host copy of the raw storage of state array `array` that covers
  // elements [begin, begin + values.numel()): from element `low` (a block's
  // start for 8-bit, else begin), `data` in the state tensor's dtype and,
  // for 8-bit, the covered blocks' steps (`steps_data`, else null);
  // `format` says how the data is coded. InvalidArgument unless `values`
  // (what the caller reads into or writes from) is host f32 and its range
  // lies inside the state; nothing copied for an empty range.
  struct HostState {
    int64_t low = 0;
    int64_t high = 0;
    MomentFormat format = MomentFormat::kF32;
    Tensor data;
    Tensor steps;
    float* steps_data() const {
      return steps.defined() ? steps.data_as<float>() : nullptr;
    }
  };
  absl::StatusOr<HostState> StateToHost(int array, int64_t begin,
                                        const Tensor& values,
                                        const Stream& stream) const;
  absl::Status StateFromHost(int array, const HostState& host,
                             const Stream& stream);
};

// Bytes of optimizer state per parameter element held on top of the master
// weights: Adam and AdamW 8 (f32 moments), 4 (bf16) or 2 (8-bit: codes;
// the per-block steps add 8 bytes per 256 elements, which
// offload::OptimizerStateBytes counts), SGD 4 with momentum, else 0.
int64_t StateBytesPerElement(const OptimizerOptions& options);

}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_OPTIMIZER_H_
