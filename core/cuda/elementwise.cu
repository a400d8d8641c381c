#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "core/cuda/dtype_cuda.cuh"
#include "core/cuda/elementwise.h"

namespace ze {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// ---------------------------------------------------------------------------
// Elementwise maps (Fill, Cast, Scale, Axpby).
//
// These are pure bandwidth: a residual add over (16384, 2048) bf16 moves
// 200 MB. So each kernel is instantiated for its operands' dtypes (the host
// dispatches once, instead of a switch per element and operand), and each
// thread moves 16 bytes of the narrowest operand per step with vector loads
// and stores. Per element the conversions are those of LoadF32/StoreF32 and
// the arithmetic that of the previous one-element kernels, whichever path
// (vector or scalar) the element takes, so results are unchanged bit for bit
// and still match the CPU path in core/ops.cc (see AxpbyOp).

// Marks an absent input (Fill has none, Cast and Scale have one).
constexpr int kNone = -1;

// Elements are moved as raw bits; ToF32/FromF32 convert.
template <int kDType>
struct Raw {
  using Type = float;
};
template <>
struct Raw<kBF16> {
  using Type = unsigned short;
};
template <>
struct Raw<kF16> {
  using Type = unsigned short;
};
template <>
struct Raw<kI32> {
  using Type = int;
};

constexpr int SizeOfDType(int dtype) {
  return dtype == kBF16 || dtype == kF16 ? 2 : 4;
}

// Elements per thread per step: 16 bytes of the narrowest operand (8 for
// bf16/f16, 4 for f32/i32); wider operands then move 32 bytes (two loads).
constexpr int VectorWidth(int in0, int in1, int out) {
  int narrowest = SizeOfDType(out);
  if (in0 != kNone && SizeOfDType(in0) < narrowest) {
    narrowest = SizeOfDType(in0);
  }
  if (in1 != kNone && SizeOfDType(in1) < narrowest) {
    narrowest = SizeOfDType(in1);
  }
  return 16 / narrowest;
}

// The same intrinsics as LoadF32 (and so the same values).
template <int kDType>
__device__ __forceinline__ float ToF32(typename Raw<kDType>::Type bits) {
  if constexpr (kDType == kBF16) {
    return __bfloat162float(__ushort_as_bfloat16(bits));
  } else if constexpr (kDType == kF16) {
    return __half2float(__ushort_as_half(bits));
  } else if constexpr (kDType == kI32) {
    return static_cast<float>(bits);
  } else {
    return bits;
  }
}

// The same intrinsics as StoreF32: round to nearest even, like core/dtype.h.
template <int kDType>
__device__ __forceinline__ typename Raw<kDType>::Type FromF32(float value) {
  if constexpr (kDType == kBF16) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(value));
  } else if constexpr (kDType == kF16) {
    return __half_as_ushort(__float2half_rn(value));
  } else if constexpr (kDType == kI32) {
    return static_cast<int>(value);
  } else {
    return value;
  }
}

// N elements of dtype kDType, viewed as whole 16-byte words for the memory
// access. A union of trivial types, so the bits move without conversion.
template <int kDType, int N>
union Pack {
  static constexpr int kWords =
      N * static_cast<int>(sizeof(typename Raw<kDType>::Type)) / 16;
  static_assert(kWords >= 1 && N * sizeof(typename Raw<kDType>::Type) ==
                                   kWords * sizeof(uint4),
                "a pack is whole 16-byte words");
  uint4 words[kWords];
  typename Raw<kDType>::Type elements[N];
};

// Loads elements [first, first + N); `base` + first must be 16-byte aligned.
// Plain (coherent) loads, not __ldg: `out` may alias an input.
template <int kDType, int N>
__device__ __forceinline__ void LoadVector(const void* base, int64_t first,
                                           float (&values)[N]) {
  using T = typename Raw<kDType>::Type;
  const uint4* source =
      reinterpret_cast<const uint4*>(static_cast<const T*>(base) + first);
  Pack<kDType, N> pack;
#pragma unroll
  for (int w = 0; w < Pack<kDType, N>::kWords; ++w) pack.words[w] = source[w];
#pragma unroll
  for (int i = 0; i < N; ++i) values[i] = ToF32<kDType>(pack.elements[i]);
}

template <int kDType, int N>
__device__ __forceinline__ void StoreVector(void* base, int64_t first,
                                            const float (&values)[N]) {
  using T = typename Raw<kDType>::Type;
  Pack<kDType, N> pack;
#pragma unroll
  for (int i = 0; i < N; ++i) pack.elements[i] = FromF32<kDType>(values[i]);
  uint4* target = reinterpret_cast<uint4*>(static_cast<T*>(base) + first);
#pragma unroll
  for (int w = 0; w < Pack<kDType, N>::kWords; ++w) target[w] = pack.words[w];
}

template <int kDType>
__device__ __forceinline__ float LoadScalar(const void* base, int64_t index) {
  return ToF32<kDType>(
      static_cast<const typename Raw<kDType>::Type*>(base)[index]);
}

// out[i] = op(in0[i], in1[i]) for i < count (absent inputs read as 0).
// Elements [0, vector_end) go N at a time (vector_end is a multiple of N, and
// 0 when some pointer is not 16-byte aligned); the rest one at a time. Both
// loops are grid-stride. An element is read and written by one thread only,
// so `out` may alias an input exactly.
template <int kIn0, int kIn1, int kOut, typename Op>
__global__ void __launch_bounds__(kThreads)
    MapKernel(const void* in0, const void* in1, void* out, int64_t count,
              int64_t vector_end, Op op) {
  constexpr int N = VectorWidth(kIn0, kIn1, kOut);
  const int64_t thread = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t threads = int64_t(gridDim.x) * blockDim.x;
  for (int64_t first = thread * N; first < vector_end; first += threads * N) {
    float x[N] = {};
    float y[N] = {};
    float z[N];
    if constexpr (kIn0 != kNone) LoadVector<kIn0, N>(in0, first, x);
    if constexpr (kIn1 != kNone) LoadVector<kIn1, N>(in1, first, y);
#pragma unroll
    for (int i = 0; i < N; ++i) z[i] = op(x[i], y[i]);
    StoreVector<kOut, N>(out, first, z);
  }
  for (int64_t i = vector_end + thread; i < count; i += threads) {
    float x = 0.0f;
    float y = 0.0f;
    if constexpr (kIn0 != kNone) x = LoadScalar<kIn0>(in0, i);
    if constexpr (kIn1 != kNone) y = LoadScalar<kIn1>(in1, i);
    static_cast<typename Raw<kOut>::Type*>(out)[i] = FromF32<kOut>(op(x, y));
  }
}

struct FillOp {
  float value;
  __device__ float operator()(float, float) const { return value; }
};

struct CastOp {
  __device__ float operator()(float x, float) const { return x; }
};

struct ScaleOp {
  float factor;
  __device__ float operator()(float x, float) const { return x * factor; }
};

// a * alpha + b * beta as fma(a, alpha, b * beta): the contraction nvcc
// chose for that expression in the previous one-element kernel, spelled out
// so unrolling cannot pick another pairing and results stay what they were
// bit for bit. (The CPU path's pairing is GCC's choice and differs between
// its f32 and generic loops, so CPU and CUDA agree bit for bit when the
// products are exact: alpha and beta powers of two, as in Add.)
struct AxpbyOp {
  float alpha;
  float beta;
  __device__ float operator()(float a, float b) const {
    return __fmaf_rn(a, alpha, __fmul_rn(b, beta));
  }
};

// Resident blocks per SM for kThreads-thread blocks (2048 threads per SM on
// sm_90); a grid of one such wave, grid-striding, keeps every SM streaming
// without paying for block launch and retirement per few elements.
constexpr int kBlocksPerSm = 2048 / kThreads;
constexpr int kMaxDevices = 64;

int MultiprocessorCount() {
  // Cached per device: the attribute query is far slower than a launch.
  static std::atomic<int> counts[kMaxDevices];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 ||
      device >= kMaxDevices) {
    return 132;  // an H100/H200; only the grid size depends on it
  }
  int count = counts[device].load(std::memory_order_relaxed);
  if (count == 0) {
    if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount,
                               device) != cudaSuccess ||
        count <= 0) {
      return 132;
    }
    counts[device].store(count, std::memory_order_relaxed);
  }
  return count;
}

int MapBlocks(int64_t work_items) {
  const int64_t cap = int64_t(MultiprocessorCount()) * kBlocksPerSm;
  int64_t blocks = (work_items + kThreads - 1) / kThreads;
  if (blocks > cap) blocks = cap;
  return static_cast<int>(blocks < 1 ? 1 : blocks);
}

bool Aligned16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

template <int kIn0, int kIn1, int kOut, typename Op>
int LaunchMap(const void* in0, const void* in1, void* out, int64_t count, Op op,
              void* stream) {
  constexpr int N = VectorWidth(kIn0, kIn1, kOut);
  // Absent inputs are null, which counts as aligned.
  const bool aligned = Aligned16(in0) && Aligned16(in1) && Aligned16(out);
  const int64_t vector_end = aligned ? count / N * N : 0;
  const int64_t work_items = vector_end / N + (count - vector_end);
  MapKernel<kIn0, kIn1, kOut, Op><<<MapBlocks(work_items), kThreads, 0,
                                    static_cast<cudaStream_t>(stream)>>>(
      in0, in1, out, count, vector_end, op);
  return static_cast<int>(cudaGetLastError());
}

template <int kValue>
using DTypeConstant = std::integral_constant<int, kValue>;

// Calls f(DTypeConstant<dtype>()) so kernels are instantiated per dtype.
template <typename F>
int DispatchDType(int dtype, F&& f) {
  switch (dtype) {
    case kF32:
      return f(DTypeConstant<kF32>());
    case kBF16:
      return f(DTypeConstant<kBF16>());
    case kF16:
      return f(DTypeConstant<kF16>());
    case kI32:
      return f(DTypeConstant<kI32>());
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

// ---------------------------------------------------------------------------
// Reductions (SumOfSquares, HasInfOrNan). Once per step, but over every
// gradient (GPT-1.3B: 2.6 GB of bf16), so they stream like the maps: per
// dtype, 16 bytes per thread per load, two loads in flight per thread, a
// one-wave grid. (The previous one-element runtime-dtype kernel read 1.4
// TB/s, 1.9 ms per 1.3B step at full clock.)

__device__ float WarpSum(float value) {
  for (int offset = 16; offset > 0; offset /= 2) {
    value += __shfl_down_sync(0xffffffffu, value, offset);
  }
  return value;
}

// The block's sum of `partial`, in a fixed order, in thread 0.
__device__ float BlockSum(float partial) {
  __shared__ float warp_sums[kThreads / 32];
  partial = WarpSum(partial);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = partial;
  __syncthreads();
  float value = 0.0f;
  if (threadIdx.x < 32) {
    value = threadIdx.x < kThreads / 32 ? warp_sums[threadIdx.x] : 0.0f;
    value = WarpSum(value);
  }
  return value;
}

// Calls visit(value) for every element of x[0, count): elements
// [0, vector_end) N at a time (vector_end a multiple of 2 N, 0 when x is not
// 16-byte aligned), the rest one at a time; grid-stride.
template <int kDType, typename Visit>
__device__ __forceinline__ void ForEachElement(const void* x, int64_t count,
                                               int64_t vector_end,
                                               Visit&& visit) {
  constexpr int N = 16 / SizeOfDType(kDType);
  const int64_t thread = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t threads = int64_t(gridDim.x) * blockDim.x;
  for (int64_t first = thread * 2 * N; first < vector_end;
       first += threads * 2 * N) {
    float low[N];
    float high[N];
    LoadVector<kDType, N>(x, first, low);
    LoadVector<kDType, N>(x, first + N, high);
#pragma unroll
    for (int i = 0; i < N; ++i) visit(low[i]);
#pragma unroll
    for (int i = 0; i < N; ++i) visit(high[i]);
  }
  for (int64_t i = vector_end + thread; i < count; i += threads) {
    visit(LoadScalar<kDType>(x, i));
  }
}

// Block b writes the sum of squares of its elements to partials[b].
template <int kDType>
__global__ void __launch_bounds__(kThreads)
    SumOfSquaresKernel(const void* x, int64_t count, int64_t vector_end,
                       float* partials) {
  float partial = 0.0f;
  ForEachElement<kDType>(x, count, vector_end, [&](float value) {
    partial = __fmaf_rn(value, value, partial);
  });
  partial = BlockSum(partial);
  if (threadIdx.x == 0) partials[blockIdx.x] = partial;
}

// One block: *result += the sum of partials[0, count), in a fixed order.
__global__ void __launch_bounds__(kThreads)
    AddPartialsKernel(const float* partials, int count, float* result) {
  float partial = 0.0f;
  for (int i = threadIdx.x; i < count; i += kThreads) partial += partials[i];
  partial = BlockSum(partial);
  if (threadIdx.x == 0) *result += partial;
}

template <int kDType>
__global__ void __launch_bounds__(kThreads)
    HasInfOrNanKernel(const void* x, int64_t count, int64_t vector_end,
                      float* flag) {
  bool found = false;
  ForEachElement<kDType>(x, count, vector_end,
                         [&](float value) { found |= !isfinite(value); });
  if (__syncthreads_or(found) && threadIdx.x == 0) *flag = 1.0f;
}

// Splits x[0, count) as ForEachElement expects and calls
// launch(DTypeConstant<dtype>, blocks, vector_end), which launches the
// reduction kernel for that dtype.
template <typename Launch>
int LaunchReduction(const void* x, int dtype, int64_t count, Launch&& launch) {
  if (count == 0) return 0;
  return DispatchDType(dtype, [&](auto type) {
    constexpr int64_t kStep = 2 * (16 / SizeOfDType(decltype(type)::value));
    const int64_t vector_end = Aligned16(x) ? count / kStep * kStep : 0;
    const int64_t work_items = vector_end / kStep + (count - vector_end);
    launch(type, MapBlocks(work_items), vector_end);
    return static_cast<int>(cudaGetLastError());
  });
}

}  // namespace

int LaunchFill(void* dst, int dtype, int64_t count, float value, void* stream) {
  if (count == 0) return 0;
  return DispatchDType(dtype, [&](auto out) {
    return LaunchMap<kNone, kNone, decltype(out)::value>(
        nullptr, nullptr, dst, count, FillOp{value}, stream);
  });
}

int LaunchCast(const void* src, int src_dtype, void* dst, int dst_dtype,
               int64_t count, void* stream) {
  if (count == 0) return 0;
  return DispatchDType(src_dtype, [&](auto in) {
    return DispatchDType(dst_dtype, [&](auto out) {
      return LaunchMap<decltype(in)::value, kNone, decltype(out)::value>(
          src, nullptr, dst, count, CastOp{}, stream);
    });
  });
}

int LaunchAxpby(const void* a, int a_dtype, float alpha, const void* b,
                int b_dtype, float beta, void* out, int out_dtype,
                int64_t count, void* stream) {
  if (count == 0) return 0;
  return DispatchDType(a_dtype, [&](auto a_type) {
    return DispatchDType(b_dtype, [&](auto b_type) {
      return DispatchDType(out_dtype, [&](auto out_type) {
        return LaunchMap<decltype(a_type)::value, decltype(b_type)::value,
                         decltype(out_type)::value>(
            a, b, out, count, AxpbyOp{alpha, beta}, stream);
      });
    });
  });
}

int LaunchScale(void* x, int dtype, int64_t count, float factor, void* stream) {
  if (count == 0) return 0;
  return DispatchDType(dtype, [&](auto type) {
    return LaunchMap<decltype(type)::value, kNone, decltype(type)::value>(
        x, nullptr, x, count, ScaleOp{factor}, stream);
  });
}
int SumOfSquaresBlocks(int64_t count) {
  // Two vectors of up to 8 elements per work item; as many blocks as fill a
  // large GPU once, but fixed by the count alone.
  const int64_t blocks = (count / 16 + kThreads - 1) / kThreads;
  return static_cast<int>(std::clamp<int64_t>(blocks, 1, kMaxReductionBlocks));
}

int LaunchSumOfSquares(const void* x, int dtype, int64_t count, float* partials,
                       float* result_f32, void* stream) {
  if (count == 0) return 0;
  const int blocks = SumOfSquaresBlocks(count);
  auto s = static_cast<cudaStream_t>(stream);
  return DispatchDType(dtype, [&](auto type) {
    constexpr int64_t kStep = 2 * (16 / SizeOfDType(decltype(type)::value));
    const int64_t vector_end = Aligned16(x) ? count / kStep * kStep : 0;
    SumOfSquaresKernel<decltype(type)::value>
        <<<blocks, kThreads, 0, s>>>(x, count, vector_end, partials);
    AddPartialsKernel<<<1, kThreads, 0, s>>>(partials, blocks, result_f32);
    return static_cast<int>(cudaGetLastError());
  });
}

int LaunchHasInfOrNan(const void* x, int dtype, int64_t count, float* flag_f32,
                      void* stream) {
  return LaunchReduction(
      x, dtype, count, [&](auto type, int blocks, int64_t vector_end) {
        HasInfOrNanKernel<decltype(type)::value>
            <<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
                x, count, vector_end, flag_f32);
      });
}

}  // namespace cuda
}  // namespace ze
