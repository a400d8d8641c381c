// Token + position embedding forward and backward (nn/cuda/kernels.h).
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

// ---------------------------------------------------------------- Embedding
__device__ __forceinline__ int64_t ClampToken(int32_t token, int64_t vocab) {
  return token < 0 ? 0 : (token >= vocab ? vocab - 1 : token);
}

template <typename T, int VEC>
__global__ void EmbeddingForwardKernel(
    const int32_t* __restrict__ tokens, const T* __restrict__ token_table,
    const T* __restrict__ position_table, T* __restrict__ out, int64_t rows,
    int64_t seq_len, int64_t cols, int64_t vocab,
    const int32_t* __restrict__ starts, int64_t max_positions) {
  const int64_t chunks = cols / VEC;
  const int64_t idx =
      static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * chunks) return;
  const int64_t row = idx / chunks;
  const int64_t c = (idx % chunks) * VEC;
  const int64_t token = ClampToken(tokens[row], vocab);
  float v[VEC];
  LoadFloats<T, VEC>(token_table + token * cols + c, v);
  if (position_table != nullptr) {
    float p[VEC];
    int64_t position = row % seq_len;
    if (starts != nullptr) {
      position += starts[row / seq_len];
      position = position < 0 ? 0
                              : (position >= max_positions ? max_positions - 1
                                                           : position);
    }
    LoadFloats<T, VEC>(position_table + position * cols + c, p);
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] += p[k];
  }
  StoreFloats<T, VEC>(out + row * cols + c, v);
}

// Thread per (t, c): owns one element of the position gradient.
template <typename T>
__global__ void EmbeddingPositionBackwardKernel(const T* __restrict__ dy,
                                                void* grad, int64_t batch,
                                                int64_t seq_len, int64_t cols,
                                                int grad_dtype) {
  const int64_t idx =
      static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= seq_len * cols) return;
  float sum = 0.0f;
  for (int64_t b = 0; b < batch; ++b)
    sum += ToFloat(dy[b * seq_len * cols + idx]);
  StoreAny(grad, grad_dtype, idx, LoadAny(grad, grad_dtype, idx) + sum);
}

template <typename T>
__global__ void EmbeddingScatterAddKernel(const T* __restrict__ dy,
                                          const int32_t* __restrict__ tokens,
                                          int64_t rows, int64_t cols,
                                          int64_t vocab, float* table) {
  const int64_t idx =
      static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * cols) return;
  const int64_t row = idx / cols;
  const int64_t c = idx % cols;
  const int64_t token = ClampToken(tokens[row], vocab);
  atomicAdd(&table[token * cols + c], ToFloat(dy[idx]));
}

__global__ void MarkTokensKernel(const int32_t* __restrict__ tokens,
                                 int64_t rows, int64_t vocab,
                                 int32_t* touched) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < rows) touched[ClampToken(tokens[i], vocab)] = 1;
}

// Block per vocabulary row; untouched rows return at once.
__global__ void ZeroTouchedRowsKernel(const int32_t* __restrict__ touched,
                                      int64_t cols, float* scratch) {
  if (touched[blockIdx.x] == 0) return;
  float* row = scratch + static_cast<int64_t>(blockIdx.x) * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) row[c] = 0.0f;
}

__global__ void AddTouchedRowsKernel(const int32_t* __restrict__ touched,
                                     int64_t cols,
                                     const float* __restrict__ scratch,
                                     void* grad, int grad_dtype) {
  if (touched[blockIdx.x] == 0) return;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    StoreAny(grad, grad_dtype, base + c,
             LoadAny(grad, grad_dtype, base + c) + scratch[base + c]);
  }
}

}  // namespace

int LaunchEmbeddingForward(const int32_t* tokens, const void* token_table,
                           const void* position_table, void* out, int64_t batch,
                           int64_t seq_len, int64_t cols, int64_t vocab,
                           int dtype, void* stream,
                           const int32_t* position_starts,
                           int64_t max_positions) {
  const int64_t rows = batch * seq_len;
  if (rows == 0 || cols == 0) return 0;
  if (position_starts != nullptr &&
      (position_table == nullptr || max_positions < 1)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int kVec = 16 / sizeof(T);
    auto s = static_cast<cudaStream_t>(stream);
    const bool vec = cols % kVec == 0 && Aligned(token_table, 16) &&
                     Aligned(out, 16) &&
                     (position_table == nullptr || Aligned(position_table, 16));
    if (vec) {
      EmbeddingForwardKernel<T, kVec>
          <<<GridFor(rows * cols / kVec, 256), 256, 0, s>>>(
              tokens, static_cast<const T*>(token_table),
              static_cast<const T*>(position_table), static_cast<T*>(out), rows,
              seq_len, cols, vocab, position_starts, max_positions);
    } else {
      EmbeddingForwardKernel<T, 1><<<GridFor(rows * cols, 256), 256, 0, s>>>(
          tokens, static_cast<const T*>(token_table),
          static_cast<const T*>(position_table), static_cast<T*>(out), rows,
          seq_len, cols, vocab, position_starts, max_positions);
    }
    return LastError();
  });
}

int LaunchEmbeddingPositionBackward(const void* dy, void* grad_position_table,
                                    int64_t batch, int64_t seq_len,
                                    int64_t cols, int dtype, int grad_dtype,
                                    void* stream) {
  if (seq_len * cols == 0) return 0;
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    EmbeddingPositionBackwardKernel<T><<<GridFor(seq_len * cols, 256), 256, 0,
                                         static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(dy), grad_position_table, batch, seq_len, cols,
        grad_dtype);
    return LastError();
  });
}

int LaunchEmbeddingScatterAddF32(const void* dy, int dtype,
                                 const int32_t* tokens, int64_t rows,
                                 int64_t cols, int64_t vocab,
                                 float* grad_token_table, void* stream) {
  if (rows * cols == 0) return 0;
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    EmbeddingScatterAddKernel<T><<<GridFor(rows * cols, 256), 256, 0,
                                   static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(dy), tokens, rows, cols, vocab, grad_token_table);
    return LastError();
  });
}

int LaunchEmbeddingScatterAddViaScratch(const void* dy, int dtype,
                                        const int32_t* tokens, int64_t rows,
                                        int64_t cols, int64_t vocab,
                                        int32_t* touched, float* scratch,
                                        void* grad_token_table, int grad_dtype,
                                        void* stream) {
  if (rows * cols == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  MarkTokensKernel<<<GridFor(rows, 256), 256, 0, s>>>(tokens, rows, vocab,
                                                      touched);
  ZeroTouchedRowsKernel<<<static_cast<unsigned>(vocab), 256, 0, s>>>(
      touched, cols, scratch);
  const int error = LaunchEmbeddingScatterAddF32(dy, dtype, tokens, rows, cols,
                                                 vocab, scratch, stream);
  if (error != 0) return error;
  AddTouchedRowsKernel<<<static_cast<unsigned>(vocab), 256, 0, s>>>(
      touched, cols, scratch, grad_token_table, grad_dtype);
  return LastError();
}

}  // namespace cuda_kernels
}  // namespace nn
}  // namespace ze
