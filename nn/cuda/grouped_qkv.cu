#include <cuda_runtime.h>

#include <type_traits>

#include "nn/cuda/cuda_common.cuh"
#include "nn/cuda/grouped_qkv.h"
#include "nn/cuda/kernels_common.cuh"

namespace ze {
namespace nn {
namespace cuda_kernels {
namespace {

constexpr int kThreads = 256;

// One thread per element of the packed tensor (token, part, head, d).
template <typename T>
__global__ void PackKernel(const T* __restrict__ q, const T* __restrict__ k,
                           const T* __restrict__ v, T* __restrict__ packed,
                           int64_t tokens, int q_heads, int kv_heads,
                           int head_dim) {
  const int64_t row = static_cast<int64_t>(q_heads) * head_dim;  // C
  const int64_t total = tokens * 3 * row;
  const int group = q_heads / kv_heads;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < total; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t token = i / (3 * row);
    const int64_t within = i - token * 3 * row;
    const int part = static_cast<int>(within / row);
    const int64_t element = within - part * row;
    const int head = static_cast<int>(element / head_dim);
    const int d =
        static_cast<int>(element - static_cast<int64_t>(head) * head_dim);
    if (part == 0) {
      packed[i] = q[token * row + element];
    } else {
      const T* source = part == 1 ? k : v;
      packed[i] = source[(token * kv_heads + head / group) * head_dim + d];
    }
  }
}

// One thread per element of grad_q and of grad_k / grad_v.
template <typename T>
__global__ void UnpackGradKernel(const T* __restrict__ grad_packed,
                                 T* __restrict__ grad_q, T* __restrict__ grad_k,
                                 T* __restrict__ grad_v, int64_t tokens,
                                 int q_heads, int kv_heads, int head_dim) {
  const int64_t row = static_cast<int64_t>(q_heads) * head_dim;
  const int64_t kv_row = static_cast<int64_t>(kv_heads) * head_dim;
  const int group = q_heads / kv_heads;
  const int64_t q_total = tokens * row;
  const int64_t total = q_total + 2 * tokens * kv_row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < total; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (i < q_total) {
      const int64_t token = i / row;
      grad_q[i] = grad_packed[token * 3 * row + (i - token * row)];
      continue;
    }
    const int64_t j = i - q_total;
    const int part = j < tokens * kv_row ? 1 : 2;
    const int64_t index = part == 1 ? j : j - tokens * kv_row;
    const int64_t token = index / kv_row;
    const int64_t element = index - token * kv_row;
    const int kv_head = static_cast<int>(element / head_dim);
    const int d =
        static_cast<int>(element - static_cast<int64_t>(kv_head) * head_dim);
    const T* source = grad_packed + token * 3 * row + part * row +
                      static_cast<int64_t>(kv_head) * group * head_dim + d;
    float sum = 0.0f;
    for (int h = 0; h < group; ++h) sum += ToFloat(source[h * head_dim]);
    (part == 1 ? grad_k : grad_v)[index] = FromFloat<T>(sum);
  }
}

int Grid(int64_t total) {
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  const int64_t cap = static_cast<int64_t>(NumSms()) * 16;
  return static_cast<int>(blocks < cap ? (blocks > 0 ? blocks : 1) : cap);
}

}  // namespace

int LaunchPackGroupedQkv(const void* q, const void* k, const void* v,
                         void* packed, int64_t tokens, int q_heads,
                         int kv_heads, int head_dim, int dtype, void* stream) {
  const int64_t total = tokens * 3 * q_heads * static_cast<int64_t>(head_dim);
  if (total == 0) return 0;
  return DispatchFloat(dtype, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    PackKernel<T>
        <<<Grid(total), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
            static_cast<const T*>(q), static_cast<const T*>(k),
            static_cast<const T*>(v), static_cast<T*>(packed), tokens, q_heads,
            kv_heads, head_dim);
    return LastError();
  });
}

int LaunchUnpackGroupedQkvGrad(const void* grad_packed, void* grad_q,
                               void* grad_k, void* grad_v, int64_t tokens,
                               int q_heads, int kv_heads, int head_dim,
                               int dtype, void* stream) {
  const int64_t total =
      tokens * (q_heads + 2 * static_cast<int64_t>(kv_heads)) * head_dim;
  if (total == 0) return 0;
  return DispatchFloat(dtype, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    UnpackGradKernel<T>
        <<<Grid(total), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
            static_cast<const T*>(grad_packed), static_cast<T*>(grad_q),
            static_cast<T*>(grad_k), static_cast<T*>(grad_v), tokens, q_heads,
            kv_heads, head_dim);
    return LastError();
  });
}

}  // namespace cuda_kernels
}  // namespace nn
}  // namespace ze
