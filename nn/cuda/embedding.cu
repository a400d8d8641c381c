// Token + position embedding forward and backward (nn/cuda/kernels.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cub/device/device_radix_sort.cuh>
#include <limits>
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

// Sort keys: the clamped token id of each row, and the row itself.
__global__ void TokenSortKeysKernel(const int32_t* __restrict__ tokens,
                                    int64_t rows, int64_t vocab, int32_t* keys,
                                    int32_t* row_ids) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows) return;
  keys[i] = static_cast<int32_t>(ClampToken(tokens[i], vocab));
  row_ids[i] = static_cast<int32_t>(i);
}

// Block (sorted position p, column tile): if p starts a run of equal
// tokens, its threads add the run's dy rows into the token's gradient row,
// one column each, in ascending row order (the radix sort is stable). The
// loads of a batch are issued before its adds, so a long run (a frequent
// token) is not one memory latency per row.
template <typename T>
__global__ void AccumulateTokenRunsKernel(const T* __restrict__ dy,
                                          const int32_t* __restrict__ keys,
                                          const int32_t* __restrict__ row_ids,
                                          int64_t rows, int64_t cols,
                                          void* grad, int grad_dtype) {
  const int64_t first = blockIdx.x;
  const int32_t token = keys[first];
  if (first > 0 && keys[first - 1] == token) return;
  const int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const int64_t at = static_cast<int64_t>(token) * cols + c;
  float sum = LoadAny(grad, grad_dtype, at);
  constexpr int kBatch = 8;
  int64_t i = first;
  while (true) {
    float v[kBatch];
    int n = 0;
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      if (n == k && i + k < rows && keys[i + k] == token) {
        v[k] = ToFloat(dy[static_cast<int64_t>(row_ids[i + k]) * cols + c]);
        ++n;
      }
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      if (k < n) sum += v[k];
    }
    i += n;
    if (n < kBatch) break;
  }
  StoreAny(grad, grad_dtype, at, sum);
}

int SortKeyBits(int64_t vocab) {
  int bits = 1;
  while (bits < 31 && (int64_t{1} << bits) < vocab) ++bits;
  return bits;
}

// The token-backward workspace: keys and rows, before and after the sort,
// then the sort's own temporary storage.
struct TokenBackwardWorkspace {
  int32_t* keys_in;
  int32_t* keys_out;
  int32_t* rows_in;
  int32_t* rows_out;
  void* sort_storage;
  size_t sort_bytes;
};

size_t Align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Sizes (base == nullptr) or carves the workspace for `rows` rows.
size_t LayoutTokenBackwardWorkspace(int64_t rows, int64_t vocab, void* base,
                                    TokenBackwardWorkspace* out) {
  size_t sort_bytes = 0;
  cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, static_cast<const int32_t*>(nullptr),
      static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
      static_cast<int32_t*>(nullptr), static_cast<int>(rows), 0,
      SortKeyBits(vocab));
  const size_t one = Align256(sizeof(int32_t) * rows);
  if (out != nullptr) {
    char* p = static_cast<char*>(base);
    out->keys_in = reinterpret_cast<int32_t*>(p);
    out->keys_out = reinterpret_cast<int32_t*>(p + one);
    out->rows_in = reinterpret_cast<int32_t*>(p + 2 * one);
    out->rows_out = reinterpret_cast<int32_t*>(p + 3 * one);
    out->sort_storage = p + 4 * one;
    out->sort_bytes = sort_bytes;
  }
  return 4 * one + Align256(sort_bytes);
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

size_t EmbeddingTokenBackwardWorkspaceBytes(int64_t rows, int64_t vocab) {
  return LayoutTokenBackwardWorkspace(rows, vocab, nullptr, nullptr);
}

int LaunchEmbeddingTokenBackward(const void* dy, int dtype,
                                 const int32_t* tokens, int64_t rows,
                                 int64_t cols, int64_t vocab, void* workspace,
                                 size_t workspace_bytes, void* grad_token_table,
                                 int grad_dtype, void* stream) {
  if (rows == 0 || cols == 0) return 0;
  if (rows > std::numeric_limits<int32_t>::max() || vocab < 1 ||
      vocab > std::numeric_limits<int32_t>::max() ||
      (cols + 255) / 256 > 65535) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  TokenBackwardWorkspace w;
  if (LayoutTokenBackwardWorkspace(rows, vocab, workspace, &w) >
      workspace_bytes) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  auto s = static_cast<cudaStream_t>(stream);
  TokenSortKeysKernel<<<GridFor(rows, 256), 256, 0, s>>>(tokens, rows, vocab,
                                                         w.keys_in, w.rows_in);
  size_t sort_bytes = w.sort_bytes;
  const cudaError_t sorted = cub::DeviceRadixSort::SortPairs(
      w.sort_storage, sort_bytes, w.keys_in, w.keys_out, w.rows_in, w.rows_out,
      static_cast<int>(rows), 0, SortKeyBits(vocab), s);
  if (sorted != cudaSuccess) return static_cast<int>(sorted);
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const dim3 grid(static_cast<unsigned>(rows),
                    static_cast<unsigned>((cols + 255) / 256));
    AccumulateTokenRunsKernel<T>
        <<<grid, 256, 0, s>>>(static_cast<const T*>(dy), w.keys_out, w.rows_out,
                              rows, cols, grad_token_table, grad_dtype);
    return LastError();
  });
}

}  // namespace cuda_kernels
}  // namespace nn
}  // namespace ze
