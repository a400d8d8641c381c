// CUDA launchers for the elementwise and reduction kernels in core/ops.h.
// Host-only header: plain C++ code includes it; elementwise.cu implements it.
//
// Every launcher queues work on `stream` (a cudaStream_t as void*) and returns
// the cudaError_t of the launch as int (0 = success). Pointers are device
// memory; `dtype` is a ze::DType value. Nothing here synchronises.
#ifndef ZE_CORE_CUDA_ELEMENTWISE_H_
#define ZE_CORE_CUDA_ELEMENTWISE_H_

#include <cstdint>

namespace ze {
namespace cuda {

// dst[i] = value, rounded to dtype.
int LaunchFill(void* dst, int dtype, int64_t count, float value, void* stream);
// dst[i] = (dst_dtype) src[i]; src and dst must not partially overlap.
int LaunchCast(const void* src, int src_dtype, void* dst, int dst_dtype,
               int64_t count, void* stream);
// out[i] = a[i] * alpha + b[i] * beta, all in f32, rounded to out's dtype.
// `out` may alias `a` or `b` exactly.
int LaunchAxpby(const void* a, int a_dtype, float alpha, const void* b,
                int b_dtype, float beta, void* out, int out_dtype,
                int64_t count, void* stream);
// x[i] *= factor (in place).
int LaunchScale(void* x, int dtype, int64_t count, float factor, void* stream);
// *result_f32 += sum_i x[i]^2, accumulated in f32 in an order fixed by
// `count` alone (not the GPU's size, nor run to run): SumOfSquaresBlocks(count)
// blocks each write one partial into `partials` (device, at least that
// many floats, used on `stream` until the work completes), then one block
// adds them in order.
inline constexpr int kMaxReductionBlocks = 1024;
int SumOfSquaresBlocks(int64_t count);
int LaunchSumOfSquares(const void* x, int dtype, int64_t count, float* partials,
                       float* result_f32, void* stream);
// *flag_f32 = 1 if any x[i] is inf or NaN; left unchanged otherwise.
int LaunchHasInfOrNan(const void* x, int dtype, int64_t count, float* flag_f32,
                      void* stream);

}  // namespace cuda
}  // namespace ze

#endif  // ZE_CORE_CUDA_ELEMENTWISE_H_
