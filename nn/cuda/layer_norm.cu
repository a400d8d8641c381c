// LayerNorm forward and backward (nn/cuda/kernels.h). All arithmetic in
// f32; inputs and outputs in the tensors' storage dtype.
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

constexpr float kLayerNormEps = 1e-5f;

// ---------------------------------------------------------------- LayerNorm
// One warp per row. The row is read three times (mean, variance, output);
// the second and third reads hit L1/L2, and the two-pass variance avoids the
// cancellation of E[x^2] - E[x]^2.
template <typename T, int VEC>
__global__ void LayerNormForwardKernel(const T* __restrict__ x,
                                       const T* __restrict__ weight,
                                       const T* __restrict__ bias,
                                       T* __restrict__ y, float* mean_out,
                                       float* rstd_out, int64_t rows,
                                       int cols) {
  const int lane = threadIdx.x & 31;
  const int64_t row =
      static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const T* xr = x + row * cols;
  float sum = 0.0f;
  for (int c = lane * VEC; c < cols; c += 32 * VEC) {
    float v[VEC];
    LoadFloats<T, VEC>(xr + c, v);
#pragma unroll
    for (int i = 0; i < VEC; ++i) sum += v[i];
  }
  const float mean = WarpSum(sum) / cols;
  float sq = 0.0f;
  for (int c = lane * VEC; c < cols; c += 32 * VEC) {
    float v[VEC];
    LoadFloats<T, VEC>(xr + c, v);
#pragma unroll
    for (int i = 0; i < VEC; ++i) sq += (v[i] - mean) * (v[i] - mean);
  }
  const float rstd = rsqrtf(WarpSum(sq) / cols + kLayerNormEps);
  T* yr = y + row * cols;
  for (int c = lane * VEC; c < cols; c += 32 * VEC) {
    float v[VEC], w[VEC], b[VEC];
    LoadFloats<T, VEC>(xr + c, v);
    LoadFloats<T, VEC>(weight + c, w);
    if (bias != nullptr) {
      LoadFloats<T, VEC>(bias + c, b);
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) b[i] = 0.0f;
    }
    float out[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = (v[i] - mean) * rstd * w[i] + b[i];
    StoreFloats<T, VEC>(yr + c, out);
  }
  if (lane == 0) {
    if (mean_out != nullptr) mean_out[row] = mean;
    if (rstd_out != nullptr) rstd_out[row] = rstd;
  }
}

// One warp per row, rows strided over a grid of a few blocks per SM. Weight
// and bias gradients accumulate in shared memory (f32 atomics, cheap there)
// and each block writes one partial row; LaunchAddColumnSums finishes them.
// The atomics' order varies from run to run, so these gradients may differ
// in their last bits between identical runs: only shapes the team kernel
// below cannot take come here (PlanLayerNormBackward: a width that is not
// a multiple of 32 x 1, 2 or 4 16-byte vectors within 256 threads, e.g.
// bf16 4608 or above 8192, f32 above 4096; unaligned tensors).
template <typename T, int VEC>
__global__ void LayerNormBackwardKernel(
    const T* __restrict__ dy, const T* __restrict__ x,
    const T* __restrict__ weight, const float* __restrict__ mean,
    const float* __restrict__ rstd, T* __restrict__ dx,
    const T* __restrict__ dx_addend, float* weight_partials,
    float* bias_partials, int64_t rows, int cols) {
  extern __shared__ float shared[];
  const bool param_grads =
      weight_partials != nullptr || bias_partials != nullptr;
  float* dweight = shared;       // (C)
  float* dbias = shared + cols;  // (C)
  if (param_grads) {
    for (int c = threadIdx.x; c < 2 * cols; c += blockDim.x) shared[c] = 0.0f;
    __syncthreads();
  }
  const int lane = threadIdx.x & 31;
  const int warps = blockDim.x >> 5;
  for (int64_t row =
           static_cast<int64_t>(blockIdx.x) * warps + (threadIdx.x >> 5);
       row < rows; row += static_cast<int64_t>(gridDim.x) * warps) {
    const T* dyr = dy + row * cols;
    const T* xr = x + row * cols;
    const float m = mean[row];
    const float rs = rstd[row];
    float sum_g = 0.0f, sum_gx = 0.0f;  // sums of dy*w and dy*w*xhat
    for (int c = lane * VEC; c < cols; c += 32 * VEC) {
      float g[VEC], v[VEC], w[VEC];
      LoadFloats<T, VEC>(dyr + c, g);
      LoadFloats<T, VEC>(xr + c, v);
      LoadFloats<T, VEC>(weight + c, w);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float xhat = (v[i] - m) * rs;
        sum_g += g[i] * w[i];
        sum_gx += g[i] * w[i] * xhat;
        if (param_grads) {
          atomicAdd(&dweight[c + i], g[i] * xhat);
          atomicAdd(&dbias[c + i], g[i]);
        }
      }
    }
    if (dx == nullptr) continue;
    sum_g = WarpSum(sum_g) / cols;
    sum_gx = WarpSum(sum_gx) / cols;
    T* dxr = dx + row * cols;
    for (int c = lane * VEC; c < cols; c += 32 * VEC) {
      float g[VEC], v[VEC], w[VEC], out[VEC];
      LoadFloats<T, VEC>(dyr + c, g);
      LoadFloats<T, VEC>(xr + c, v);
      LoadFloats<T, VEC>(weight + c, w);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float xhat = (v[i] - m) * rs;
        out[i] = rs * (g[i] * w[i] - sum_g - xhat * sum_gx);
      }
      if (dx_addend != nullptr) {
        float a[VEC];
        LoadFloats<T, VEC>(dx_addend + row * cols + c, a);
#pragma unroll
        for (int i = 0; i < VEC; ++i) out[i] += a[i];
      }
      StoreFloats<T, VEC>(dxr + c, out);
    }
  }
  if (param_grads) {
    __syncthreads();
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      if (weight_partials != nullptr) {
        weight_partials[static_cast<int64_t>(blockIdx.x) * cols + c] =
            dweight[c];
      }
      if (bias_partials != nullptr) {
        bias_partials[static_cast<int64_t>(blockIdx.x) * cols + c] = dbias[c];
      }
    }
  }
}

// Fused backward for rows a whole number of 16-byte vectors wide: a team of
// `threads_per_row` threads (a multiple of 32) owns one row at a time, each
// thread ITEMS (1, 2 or 4) vectors of VEC columns at fixed positions, so the
// weight stays in registers and the weight/bias gradient partials accumulate
// in registers (f32) with no atomics: the same sums in the same order every
// run. A block holds blockDim / threads_per_row teams and
// each team writes one partial row at the end (see LayerNormBackwardPlan).
// The row sums cross the team's warps through shared memory, double-buffered
// so one barrier per row suffices; the next row's dy and x are loaded before
// that barrier to keep memory busy.
template <typename T, int VEC, int ITEMS>
__global__ void __launch_bounds__(256, ITEMS == 1 ? 4 : (ITEMS == 2 ? 2 : 1))
    LayerNormBackwardTeamKernel(
        const T* __restrict__ dy, const T* __restrict__ x,
        const T* __restrict__ weight, const float* __restrict__ mean,
        const float* __restrict__ rstd, T* __restrict__ dx,
        const T* __restrict__ dx_addend, float* __restrict__ weight_partials,
        float* __restrict__ bias_partials, int64_t rows, int cols,
        int threads_per_row) {
  __shared__ float2 sums[2][8];  // [buffer][warp]: (sum dy*w, sum dy*w*xhat)
  const int teams = blockDim.x / threads_per_row;
  const int team = threadIdx.x / threads_per_row;
  const int member = threadIdx.x % threads_per_row;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int team_warps = threads_per_row >> 5;
  const int first_warp = team * team_warps;
  const float inv_cols = 1.0f / cols;

  float w[ITEMS][VEC], dw[ITEMS][VEC], db[ITEMS][VEC];
#pragma unroll
  for (int it = 0; it < ITEMS; ++it) {
    LoadFloats<T, VEC>(weight + (it * threads_per_row + member) * VEC, w[it]);
#pragma unroll
    for (int i = 0; i < VEC; ++i) dw[it][i] = db[it][i] = 0.0f;
  }

  using P = Pack<T, VEC>;
  const int64_t step = static_cast<int64_t>(gridDim.x) * teams;
  int64_t row = static_cast<int64_t>(blockIdx.x) * teams + team;
  // Every thread runs the same number of passes (barriers inside); rows past
  // the end are computed on zeros and not stored.
  const int64_t first = static_cast<int64_t>(blockIdx.x) * teams;
  const int64_t passes = first < rows ? (rows - first + step - 1) / step : 0;
  P next_g[ITEMS], next_v[ITEMS];
  auto load = [&](int64_t r) {
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
      if (r < rows) {
        const int64_t off = r * cols + (it * threads_per_row + member) * VEC;
        next_g[it] = *reinterpret_cast<const P*>(dy + off);
        next_v[it] = *reinterpret_cast<const P*>(x + off);
      } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          next_g[it].v[i] = FromFloat<T>(0.0f);
          next_v[it].v[i] = FromFloat<T>(0.0f);
        }
      }
    }
  };
  load(row);
  for (int64_t pass = 0; pass < passes; ++pass, row += step) {
    const bool valid = row < rows;
    const float m = valid ? mean[row] : 0.0f;
    const float rs = valid ? rstd[row] : 0.0f;
    // The row stays packed (16-bit values for bf16/f16) and is converted
    // again for dx: registers, not arithmetic, bound the blocks per SM.
    P cur_g[ITEMS], cur_v[ITEMS];
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
      cur_g[it] = next_g[it];
      cur_v[it] = next_v[it];
    }
    load(row + step);
    float sum_g = 0.0f, sum_gx = 0.0f;
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float g = ToFloat(cur_g[it].v[i]);
        const float xhat = (ToFloat(cur_v[it].v[i]) - m) * rs;
        const float gw = g * w[it][i];
        sum_g += gw;
        sum_gx += gw * xhat;
        dw[it][i] += g * xhat;
        db[it][i] += g;
      }
    }
    sum_g = WarpSum(sum_g);
    sum_gx = WarpSum(sum_gx);
    if (team_warps > 1) {
      float2* buffer = sums[pass & 1];
      if (lane == 0) buffer[warp] = make_float2(sum_g, sum_gx);
      __syncthreads();
      sum_g = 0.0f;
      sum_gx = 0.0f;
      for (int k = 0; k < team_warps; ++k) {
        const float2 s = buffer[first_warp + k];
        sum_g += s.x;
        sum_gx += s.y;
      }
    }
    if (dx == nullptr || !valid) continue;
    sum_g *= inv_cols;
    sum_gx *= inv_cols;
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
      const int64_t off = row * cols + (it * threads_per_row + member) * VEC;
      float addend[VEC];
      if (dx_addend != nullptr) {
        LoadFloats<T, VEC>(dx_addend + off, addend);
      } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) addend[i] = 0.0f;
      }
      float out[VEC];
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float g = ToFloat(cur_g[it].v[i]);
        const float xhat = (ToFloat(cur_v[it].v[i]) - m) * rs;
        out[i] = rs * (g * w[it][i] - sum_g - xhat * sum_gx) + addend[i];
      }
      StoreFloats<T, VEC>(dx + off, out);
    }
  }
  const int64_t partial = static_cast<int64_t>(blockIdx.x) * teams + team;
#pragma unroll
  for (int it = 0; it < ITEMS; ++it) {
    const int c = (it * threads_per_row + member) * VEC;
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      if (weight_partials != nullptr) {
        weight_partials[partial * cols + c + i] = dw[it][i];
      }
      if (bias_partials != nullptr) {
        bias_partials[partial * cols + c + i] = db[it][i];
      }
    }
  }
}

}  // namespace

int LaunchLayerNormForward(const void* x, const void* weight, const void* bias,
                           void* y, float* mean, float* rstd, int64_t rows,
                           int64_t cols, int dtype, void* stream) {
  if (rows == 0) return 0;
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int kVec = 16 / sizeof(T);
    const bool vec = cols % kVec == 0 && Aligned(x, 16) && Aligned(y, 16) &&
                     Aligned(weight, 16) &&
                     (bias == nullptr || Aligned(bias, 16));
    const int threads = 256;
    const int grid = GridFor(rows, threads / 32);
    auto s = static_cast<cudaStream_t>(stream);
    if (vec) {
      LayerNormForwardKernel<T, kVec><<<grid, threads, 0, s>>>(
          static_cast<const T*>(x), static_cast<const T*>(weight),
          static_cast<const T*>(bias), static_cast<T*>(y), mean, rstd, rows,
          static_cast<int>(cols));
    } else {
      LayerNormForwardKernel<T, 1><<<grid, threads, 0, s>>>(
          static_cast<const T*>(x), static_cast<const T*>(weight),
          static_cast<const T*>(bias), static_cast<T*>(y), mean, rstd, rows,
          static_cast<int>(cols));
    }
    return LastError();
  });
}

namespace {

// How LaunchLayerNormBackward splits the rows. The team kernel needs whole
// 16-byte vectors per thread and teams of whole warps of at most 256
// threads; other shapes take the warp-per-row kernel, which accepts any grid
// size, so the partial count never depends on pointer alignment (checked only
// at launch).
struct LayerNormBackwardPlan {
  bool team = false;
  int items = 1;            // vectors per thread per row
  int threads_per_row = 0;  // team size
  int teams = 1;            // teams (rows in flight) per block
  int grid = 1;
  int partials = 1;  // grid * teams (team kernel) or grid (warp per row)
};

LayerNormBackwardPlan PlanLayerNormBackward(int64_t rows, int64_t cols,
                                            int dtype) {
  LayerNormBackwardPlan plan;
  const int elem = dtype == kF32 ? 4 : 2;
  const int vec = 16 / elem;
  for (int items = 1; items <= 4; items *= 2) {
    const int64_t width = static_cast<int64_t>(vec) * items;
    if (cols % (32 * width) != 0 || cols / width > 256) continue;
    plan.team = true;
    plan.items = items;
    plan.threads_per_row = static_cast<int>(cols / width);
    plan.teams = 256 / plan.threads_per_row;
    break;
  }
  if (plan.team) {
    // As many blocks as __launch_bounds__ guarantees resident per SM (4 for
    // one vector per thread, 2 for two): about 32 KB of loads in flight per
    // SM, what HBM3e needs to stream, for ~528 partial rows. Four vectors
    // (bf16 rows of 5120, 6144, 7168 or 8192: GPT 13B-70B widths; f32 rows
    // of 2560-4096) take 255 registers a thread in bf16 (175 in f32) with
    // no spills (ptxas, sm_90a), so one bf16 block of 160-256 threads is
    // resident per SM and the second of each SM's pair waits: a
    // memory-bound kernel at about 20 KB in flight per SM, a small share of
    // a step at those widths, traded for gradients that are the same bits
    // every run (the warp-per-row kernel's atomics are not).
    const int per_sm = plan.items == 1 ? 4 : 2;
    const int64_t needed = (rows + plan.teams - 1) / plan.teams;
    plan.grid = static_cast<int>(
        std::max<int64_t>(1, std::min<int64_t>(needed, per_sm * NumSms())));
    plan.partials = plan.grid * plan.teams;
  } else {
    const int64_t warps_per_block = 8;
    const int64_t needed = (rows + warps_per_block - 1) / warps_per_block;
    plan.grid = static_cast<int>(
        std::max<int64_t>(1, std::min<int64_t>(needed, 2 * NumSms())));
    plan.partials = plan.grid;
  }
  return plan;
}

}  // namespace

int LayerNormBackwardNumPartials(int64_t rows, int64_t cols, int dtype) {
  return PlanLayerNormBackward(rows, cols, dtype).partials;
}

int LaunchLayerNormBackward(const void* dy, const void* x, const void* weight,
                            const float* mean, const float* rstd, void* dx,
                            float* weight_partials, float* bias_partials,
                            int64_t rows, int64_t cols, int dtype, void* stream,
                            const void* dx_addend) {
  if (rows == 0) return 0;
  if (dx_addend != nullptr && (dx == nullptr || dx_addend == dx)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const LayerNormBackwardPlan plan = PlanLayerNormBackward(rows, cols, dtype);
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int kVec = 16 / sizeof(T);
    const bool vec = cols % kVec == 0 && Aligned(dy, 16) && Aligned(x, 16) &&
                     Aligned(weight, 16) &&
                     (dx == nullptr || Aligned(dx, 16)) &&
                     (dx_addend == nullptr || Aligned(dx_addend, 16));
    auto s = static_cast<cudaStream_t>(stream);
    if (plan.team && vec) {
      const int threads = plan.teams * plan.threads_per_row;
      auto launch = [&](auto kernel) {
        kernel<<<plan.grid, threads, 0, s>>>(
            static_cast<const T*>(dy), static_cast<const T*>(x),
            static_cast<const T*>(weight), mean, rstd, static_cast<T*>(dx),
            static_cast<const T*>(dx_addend), weight_partials, bias_partials,
            rows, static_cast<int>(cols), plan.threads_per_row);
      };
      if (plan.items == 1) {
        launch(LayerNormBackwardTeamKernel<T, kVec, 1>);
      } else if (plan.items == 2) {
        launch(LayerNormBackwardTeamKernel<T, kVec, 2>);
      } else {
        launch(LayerNormBackwardTeamKernel<T, kVec, 4>);
      }
      return LastError();
    }
    // Warp-per-row kernel: one partial row per block, any grid size.
    const int threads = 256;
    const size_t shared = 2 * cols * sizeof(float);
    auto launch = [&](auto kernel) {
      if (shared > 48 * 1024) {
        cudaFuncSetAttribute(kernel,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(shared));
      }
      kernel<<<plan.partials, threads, shared, s>>>(
          static_cast<const T*>(dy), static_cast<const T*>(x),
          static_cast<const T*>(weight), mean, rstd, static_cast<T*>(dx),
          static_cast<const T*>(dx_addend), weight_partials, bias_partials,
          rows, static_cast<int>(cols));
    };
    if (vec) {
      launch(LayerNormBackwardKernel<T, kVec>);
    } else {
      launch(LayerNormBackwardKernel<T, 1>);
    }
    return LastError();
  });
}

}  // namespace cuda_kernels
}  // namespace nn
}  // namespace ze
