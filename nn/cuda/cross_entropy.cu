// Cross-entropy forward and backward over logits rows (nn/cuda/kernels.h):
// one read of a row for its logsumexp.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "nn/cuda/cuda_common.cuh"
#include "nn/cuda/kernels.h"
#include "nn/cuda/kernels_common.cuh"

namespace ze {
namespace nn {
namespace cuda_kernels {
namespace {

// ------------------------------------------------------------ CrossEntropy
// Online (max, sum of exp) per thread, merged across the block: one read of
// the row's first `classes` elements computes their logsumexp.
template <typename T, int VEC>
__device__ float RowLogSumExp(const T* row, int64_t classes, float* scratch) {
  float m = -INFINITY, s = 0.0f;
  const int64_t vec_end = (classes / VEC) * VEC;
  for (int64_t c = threadIdx.x * VEC; c < vec_end; c += blockDim.x * VEC) {
    float v[VEC];
    LoadFloats<T, VEC>(row + c, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      if (v[k] > m) {
        s = s * __expf(m - v[k]) + 1.0f;
        m = v[k];
      } else {
        s += __expf(v[k] - m);
      }
    }
  }
  for (int64_t c = vec_end + threadIdx.x; c < classes; c += blockDim.x) {
    const float v = ToFloat(row[c]);
    if (v > m) {
      s = s * __expf(m - v) + 1.0f;
      m = v;
    } else {
      s += __expf(v - m);
    }
  }
  const float block_max = BlockMax(m, scratch);
  const float scaled = m == -INFINITY ? 0.0f : s * __expf(m - block_max);
  const float total = BlockSum(scaled, scratch);
  return block_max + logf(total);
}

template <typename T, int VEC>
__global__ void CrossEntropyForwardKernel(const T* __restrict__ logits,
                                          const int32_t* __restrict__ targets,
                                          float* losses, float* logsumexp,
                                          int64_t vocab, int64_t classes) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int32_t target = targets[row];
  if (target < 0) {
    if (threadIdx.x == 0) {
      losses[row] = 0.0f;
      if (logsumexp != nullptr) logsumexp[row] = 0.0f;
    }
    return;
  }
  const T* r = logits + row * vocab;
  const float lse = RowLogSumExp<T, VEC>(r, classes, scratch);
  if (threadIdx.x == 0) {
    const int64_t t = target >= classes ? classes - 1 : target;
    losses[row] = lse - ToFloat(r[t]);
    if (logsumexp != nullptr) logsumexp[row] = lse;
  }
}

// The softmax cross-entropy's gradient at one logit of a counted row (its
// target >= 0): scale * (exp(logit - lse) - onehot) in the first `classes`
// columns, 0 from there on (padding). Both backward kernels' arithmetic.
__device__ __forceinline__ float SoftmaxGradient(float logit, float lse,
                                                 int64_t column, int32_t target,
                                                 int64_t classes, float scale) {
  return column < classes
             ? scale * (__expf(logit - lse) - (column == target ? 1.0f : 0.0f))
             : 0.0f;
}

// One block per row of a (rows, width) slice of logits whose column c is
// the vocabulary's column `offset + c`: the softmax gradient from the
// row's logsumexp (no pass over the rest of the row). grad may alias
// logits: each element is read and written by one thread.
template <typename T, int VEC>
__global__ void CrossEntropySliceBackwardKernel(
    const T* logits, const float* __restrict__ logsumexp,
    const int32_t* __restrict__ targets, float scale, T* grad, int64_t width,
    int64_t offset, int64_t classes) {
  const int64_t row = blockIdx.x;
  const int32_t target = targets[row];
  const T* r = logits + row * width;
  T* g = grad + row * width;
  const float lse = logsumexp[row];
  auto value = [&](float v, int64_t column) {
    return target >= 0 ? SoftmaxGradient(v, lse, column, target, classes, scale)
                       : 0.0f;
  };
  const int64_t vec_end = (width / VEC) * VEC;
  for (int64_t c = threadIdx.x * VEC; c < vec_end; c += blockDim.x * VEC) {
    float v[VEC];
    LoadFloats<T, VEC>(r + c, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] = value(v[k], offset + c + k);
    StoreFloats<T, VEC>(g + c, v);
  }
  for (int64_t c = vec_end + threadIdx.x; c < width; c += blockDim.x) {
    g[c] = FromFloat<T>(value(ToFloat(r[c]), offset + c));
  }
}

// grad may alias logits: every element is read (for the logsumexp) before
// any is written (BlockSum syncs), then read and written by one thread.
template <typename T, int VEC>
__global__ void CrossEntropyBackwardKernel(const T* logits,
                                           const int32_t* __restrict__ targets,
                                           float scale, T* grad, int64_t vocab,
                                           int64_t classes) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int32_t target = targets[row];
  const T* r = logits + row * vocab;
  T* g = grad + row * vocab;
  const int64_t vec_end = (vocab / VEC) * VEC;
  if (target < 0) {
    for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
      g[c] = FromFloat<T>(0.0f);
    }
    return;
  }
  const float lse = RowLogSumExp<T, VEC>(r, classes, scratch);
  // Columns from `classes` on are padding: no gradient.
  for (int64_t c = threadIdx.x * VEC; c < vec_end; c += blockDim.x * VEC) {
    float v[VEC];
    LoadFloats<T, VEC>(r + c, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      v[k] = SoftmaxGradient(v[k], lse, c + k, target, classes, scale);
    }
    StoreFloats<T, VEC>(g + c, v);
  }
  for (int64_t c = vec_end + threadIdx.x; c < vocab; c += blockDim.x) {
    g[c] = FromFloat<T>(
        SoftmaxGradient(ToFloat(r[c]), lse, c, target, classes, scale));
  }
}

}  // namespace

int LaunchCrossEntropyForward(const void* logits, const int32_t* targets,
                              float* losses, float* logsumexp, int64_t rows,
                              int64_t vocab, int64_t classes, int dtype,
                              void* stream) {
  if (rows == 0) return 0;
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int kVec = 16 / sizeof(T);
    auto s = static_cast<cudaStream_t>(stream);
    if (vocab % kVec == 0 && Aligned(logits, 16)) {
      CrossEntropyForwardKernel<T, kVec>
          <<<static_cast<unsigned>(rows), 512, 0, s>>>(
              static_cast<const T*>(logits), targets, losses, logsumexp, vocab,
              classes);
    } else {
      CrossEntropyForwardKernel<T, 1>
          <<<static_cast<unsigned>(rows), 512, 0, s>>>(
              static_cast<const T*>(logits), targets, losses, logsumexp, vocab,
              classes);
    }
    return LastError();
  });
}

int LaunchCrossEntropySliceBackward(const void* logits, const float* logsumexp,
                                    const int32_t* targets, float scale,
                                    void* grad, int64_t rows, int64_t width,
                                    int64_t offset, int64_t classes, int dtype,
                                    void* stream) {
  if (rows == 0 || width == 0) return 0;
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int kVec = 16 / sizeof(T);
    auto s = static_cast<cudaStream_t>(stream);
    if (width % kVec == 0 && Aligned(logits, 16) && Aligned(grad, 16)) {
      CrossEntropySliceBackwardKernel<T, kVec>
          <<<static_cast<unsigned>(rows), 256, 0, s>>>(
              static_cast<const T*>(logits), logsumexp, targets, scale,
              static_cast<T*>(grad), width, offset, classes);
    } else {
      CrossEntropySliceBackwardKernel<T, 1>
          <<<static_cast<unsigned>(rows), 256, 0, s>>>(
              static_cast<const T*>(logits), logsumexp, targets, scale,
              static_cast<T*>(grad), width, offset, classes);
    }
    return LastError();
  });
}

int LaunchCrossEntropyBackward(const void* logits, const int32_t* targets,
                               float scale, void* grad, int64_t rows,
                               int64_t vocab, int64_t classes, int dtype,
                               void* stream) {
  if (rows == 0) return 0;
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int kVec = 16 / sizeof(T);
    auto s = static_cast<cudaStream_t>(stream);
    if (vocab % kVec == 0 && Aligned(logits, 16) && Aligned(grad, 16)) {
      CrossEntropyBackwardKernel<T, kVec>
          <<<static_cast<unsigned>(rows), 512, 0, s>>>(
              static_cast<const T*>(logits), targets, scale,
              static_cast<T*>(grad), vocab, classes);
    } else {
      CrossEntropyBackwardKernel<T, 1>
          <<<static_cast<unsigned>(rows), 512, 0, s>>>(
              static_cast<const T*>(logits), targets, scale,
              static_cast<T*>(grad), vocab, classes);
    }
    return LastError();
  });
}

}  // namespace cuda_kernels
}  // namespace nn
}  // namespace ze
