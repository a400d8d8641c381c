// Elementwise and reduction operations on tensors, on CPU and CUDA.
//
// Each takes the stream to queue work on. On the CPU the work is done when
// the call returns; on CUDA it is queued and the caller synchronises (or
// records an event) before reading results on the host. Arithmetic is f32
// whatever the storage dtype; results are rounded to nearest even.
//
// Errors: InvalidArgument when element counts or devices disagree (naming
// both tensors); the CUDA launch error otherwise.
#ifndef ZE_CORE_OPS_H_
#define ZE_CORE_OPS_H_

#include "absl/status/status.h"
#include "core/stream.h"
#include "core/tensor.h"

namespace ze {

// dst[:] = value.
absl::Status Fill(const Tensor& dst, float value, const Stream& stream);

// dst[:] = src[:], converting dtype. Any device pair works; a transfer
// between host and device requires equal dtypes (convert on one side first)
// and is asynchronous on `stream` when the host side is pinned memory.
absl::Status Copy(const Tensor& src, const Tensor& dst, const Stream& stream);

// dst = src for any pair of devices and float dtypes: a transfer between
// host and device with differing dtypes converts on the source's side first
// into a temporary (Copy needs equal dtypes for a transfer), then waits for
// the transfer on `stream` so the temporary may die; otherwise it is Copy.
absl::Status CopyConverting(const Tensor& src, const Tensor& dst,
                            const Stream& stream);

// out = alpha * a + beta * b. `out` may be `a` or `b` (in place).
absl::Status Axpby(float alpha, const Tensor& a, float beta, const Tensor& b,
                   const Tensor& out, const Stream& stream);
// out = a + b.
inline absl::Status Add(const Tensor& a, const Tensor& b, const Tensor& out,
                        const Stream& stream) {
  return Axpby(1.0f, a, 1.0f, b, out, stream);
}

// x *= factor.
absl::Status Scale(const Tensor& x, float factor, const Stream& stream);

// result (an f32 tensor of one element on x's device) += sum(x^2).
// Accumulating lets a caller sum over many tensors before one read back. On
// a GPU the f32 summation order is fixed by x's size alone (no atomics), so
// the result repeats bit for bit across runs and GPUs; the CPU sums in
// double.
absl::Status SumOfSquares(const Tensor& x, const Tensor& result,
                          const Stream& stream);

// flag (an f32 tensor of one element on x's device) is set to 1 when any
// element of x is inf or NaN, and left unchanged otherwise.
absl::Status HasInfOrNan(const Tensor& x, const Tensor& flag,
                         const Stream& stream);

// Copies a tensor's values to a host vector of f32 (synchronising `stream`).
// For tests and small reads.
absl::StatusOr<std::vector<float>> ToHostFloats(const Tensor& x,
                                                const Stream& stream);

// A new tensor on `device` with `dtype`, holding `values` (rounded).
absl::StatusOr<Tensor> FromHostFloats(const std::vector<float>& values,
                                      const Shape& shape, DType dtype,
                                      const Device& device,
                                      const Stream& stream);

}  // namespace ze

#endif  // ZE_CORE_OPS_H_
