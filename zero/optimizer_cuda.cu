// Fused CUDA optimizer step: one pass over the slice, reading the gradient,
// master weight and state once and writing the state, the master weight and
// the rounded model weight once. Each thread handles 4 consecutive elements
// with 16-byte (f32) or 8-byte (16-bit) vector accesses when every pointer is
// aligned for them (slices from flat_layout.h always are); otherwise the
// same code runs one element at a time. Explicit __fmaf_rn / __fmul_rn /
// __fsqrt_rn / __fdiv_rn keep nvcc from contracting differently from the CPU
// kernel (optimizer_kernels.h spells out the sequence).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "offload/moment_codec.h"
#include "zero/optimizer_kernels.h"

namespace ze {
namespace zero {
namespace cuda {
namespace {

// kSplit: `out` is the bf16 high half of an exact 16+16 master whose low
// half is `lo` (core/dtype.h's Bf16Split); not a DType.
enum : int { kF32 = 0, kBF16 = 1, kF16 = 2, kSplit = 3 };
// How a launch stores Adam's moments (8-bit ones have Block8Kernel).
enum : int { kMomF32 = 0, kMomBf16 = 1, kMomBf16Stochastic = 2 };
constexpr int kThreads = 256;
constexpr int kVector = 4;

template <int kDType>
__device__ __forceinline__ float LoadOne(const void* data, int64_t i) {
  if (kDType == kBF16) {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(data)[i]);
  } else if (kDType == kF16) {
    return __half2float(static_cast<const __half*>(data)[i]);
  } else {
    return static_cast<const float*>(data)[i];
  }
}

template <int kDType>
__device__ __forceinline__ void StoreOne(void* data, int64_t i, float value) {
  if (kDType == kBF16) {
    static_cast<__nv_bfloat16*>(data)[i] = __float2bfloat16_rn(value);
  } else if (kDType == kF16) {
    static_cast<__half*>(data)[i] = __float2half_rn(value);
  } else if (kDType == kF32) {
    static_cast<float*>(data)[i] = value;
  }
}

// Loads elements [i, i + 4) into v; i is a multiple of 4.
template <int kDType>
__device__ __forceinline__ void Load4(const void* data, int64_t i, float* v) {
  if (kDType == kF32) {
    const float4 x =
        *reinterpret_cast<const float4*>(static_cast<const float*>(data) + i);
    v[0] = x.x;
    v[1] = x.y;
    v[2] = x.z;
    v[3] = x.w;
  } else {
    const uint2 raw =
        *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(data) + i);
    const uint16_t* h = reinterpret_cast<const uint16_t*>(&raw);
    for (int k = 0; k < 4; ++k) v[k] = LoadOne<kDType>(h, k);
  }
}

template <int kDType>
__device__ __forceinline__ void Store4(void* data, int64_t i, const float* v) {
  if (kDType == kF32) {
    *reinterpret_cast<float4*>(static_cast<float*>(data) + i) =
        make_float4(v[0], v[1], v[2], v[3]);
  } else if (kDType == kBF16 || kDType == kF16) {
    uint2 raw;
    uint16_t* h = reinterpret_cast<uint16_t*>(&raw);
    for (int k = 0; k < 4; ++k) StoreOne<kDType>(h, k, v[k]);
    *reinterpret_cast<uint2*>(static_cast<uint16_t*>(data) + i) = raw;
  }
}

// core/dtype.h's JoinBf16Split and SplitForBf16, on the device.
__device__ __forceinline__ float JoinSplit(uint16_t hi, uint16_t lo) {
  const uint32_t carry = (static_cast<uint32_t>(lo) & 0x8000u) << 1;
  return __uint_as_float(((static_cast<uint32_t>(hi) << 16) | lo) - carry);
}

__device__ __forceinline__ void SplitInto(float value, uint16_t* hi,
                                          uint16_t* lo) {
  const uint32_t bits = __float_as_uint(value);
  *hi = static_cast<uint16_t>((bits + 0x8000u) >> 16);
  *lo = static_cast<uint16_t>(bits);
}

// The master weight i: f32, or the split master's two halves joined.
template <int kOut>
__device__ __forceinline__ float LoadMaster(const float* master,
                                            const void* out, const uint16_t* lo,
                                            int64_t i) {
  if (kOut == kSplit) {
    return JoinSplit(static_cast<const uint16_t*>(out)[i], lo[i]);
  } else {
    return master[i];
  }
}

// Writes the updated master weight i and the model weight.
template <int kOut>
__device__ __forceinline__ void StoreMaster(float* master, void* out,
                                            uint16_t* lo, int64_t i, float p) {
  if (kOut == kSplit) {
    SplitInto(p, static_cast<uint16_t*>(out) + i, lo + i);
  } else {
    master[i] = p;
    StoreOne<kOut>(out, i, p);
  }
}

// Moment i as f32 (f32 or bf16 storage).
template <int kMoments>
__device__ __forceinline__ float LoadMoment(const void* state, int64_t i) {
  if (kMoments == kMomF32) {
    return static_cast<const float*>(state)[i];
  } else {
    return offload::Bf16ToFloat(static_cast<const uint16_t*>(state)[i]);
  }
}

// Stores moment i: bf16 with offload/moment_codec.h's roundings (the CPU
// kernels' bits, NaNs included); `first_index` + i is the noise counter.
template <int kMoments>
__device__ __forceinline__ void StoreMoment(void* state, int64_t i, float value,
                                            uint32_t key, int64_t first_index) {
  if (kMoments == kMomF32) {
    static_cast<float*>(state)[i] = value;
  } else if (kMoments == kMomBf16) {
    static_cast<uint16_t*>(state)[i] = offload::NearestBf16(value);
  } else {
    static_cast<uint16_t*>(state)[i] = offload::StochasticBf16(
        value,
        offload::RoundingNoise(key, static_cast<uint32_t>(first_index + i)));
  }
}

__device__ __forceinline__ void AdamElement(const offload::StepCoefficients& c,
                                            float grad, float& p, float& m,
                                            float& v) {
  float g = __fmul_rn(grad, c.grad_scale);
  g = __fmaf_rn(c.l2, p, g);
  m = __fmaf_rn(c.beta1, m, __fmul_rn(c.one_minus_beta1, g));
  v = __fmaf_rn(c.beta2, v, __fmul_rn(__fmul_rn(c.one_minus_beta2, g), g));
  const float denom =
      __fmaf_rn(__fsqrt_rn(v), c.inv_sqrt_bias_correction2, c.eps);
  p = __fmul_rn(p, c.decay_factor);
  p = __fmaf_rn(c.neg_step_size, __fdiv_rn(m, denom), p);
}

__device__ __forceinline__ void SgdElement(const offload::StepCoefficients& c,
                                           float grad, float& p, float* buf) {
  float g = __fmul_rn(grad, c.grad_scale);
  g = __fmaf_rn(c.l2, p, g);
  if (c.has_momentum_buffer) {
    const float b =
        c.first_step
            ? g
            : __fmaf_rn(c.momentum, *buf, __fmul_rn(c.one_minus_dampening, g));
    *buf = b;
    g = c.nesterov ? __fmaf_rn(c.momentum, b, g) : b;
  }
  p = __fmaf_rn(c.neg_step_size, g, p);
}

// Element i alone: the unvectorised loop's body and the vectorised one's
// tail.
template <int kGrad, int kOut, int kMoments>
__device__ __forceinline__ void UpdateOne(const offload::StepCoefficients& c,
                                          float* master, const Moments& moments,
                                          const void* grads, void* out,
                                          uint16_t* lo, int64_t i) {
  float p = LoadMaster<kOut>(master, out, lo, i);
  const float g = LoadOne<kGrad>(grads, i);
  if (!c.is_sgd) {
    float m = LoadMoment<kMoments>(moments.state0, i);
    float v = LoadMoment<kMoments>(moments.state1, i);
    AdamElement(c, g, p, m, v);
    StoreMoment<kMoments>(moments.state0, i, m, c.round_key_m,
                          moments.first_index);
    StoreMoment<kMoments>(moments.state1, i, v, c.round_key_v,
                          moments.first_index);
  } else {
    SgdElement(c, g, p,
               c.has_momentum_buffer ? static_cast<float*>(moments.state0) + i
                                     : nullptr);
  }
  StoreMaster<kOut>(master, out, lo, i, p);
}

// Elements [4 * group, 4 * group + 4) per iteration when kVectorised;
// otherwise one element per iteration. The grid strides over the slice.
template <int kGrad, int kOut, int kMoments, bool kVectorised>
__global__ void OptimizerKernel(offload::StepCoefficients c, float* master,
                                Moments moments, const void* grads, void* out,
                                uint16_t* lo, int64_t count) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (kVectorised) {
    const int64_t groups = count / kVector;
    for (int64_t group = first; group < groups; group += stride) {
      const int64_t i = group * kVector;
      float p[kVector], g[kVector];
      if (kOut == kSplit) {
        const uint2 hi_raw = *reinterpret_cast<const uint2*>(
            static_cast<const uint16_t*>(out) + i);
        const uint2 lo_raw = *reinterpret_cast<const uint2*>(lo + i);
        const uint16_t* h = reinterpret_cast<const uint16_t*>(&hi_raw);
        const uint16_t* l = reinterpret_cast<const uint16_t*>(&lo_raw);
        for (int k = 0; k < kVector; ++k) p[k] = JoinSplit(h[k], l[k]);
      } else {
        Load4<kF32>(master, i, p);
      }
      Load4<kGrad>(grads, i, g);
      if (!c.is_sgd) {
        float m[kVector], v[kVector];
        if (kMoments == kMomF32) {
          Load4<kF32>(moments.state0, i, m);
          Load4<kF32>(moments.state1, i, v);
        } else {
          Load4<kBF16>(moments.state0, i, m);
          Load4<kBF16>(moments.state1, i, v);
        }
        for (int k = 0; k < kVector; ++k)
          AdamElement(c, g[k], p[k], m[k], v[k]);
        if (kMoments == kMomF32) {
          Store4<kF32>(moments.state0, i, m);
          Store4<kF32>(moments.state1, i, v);
        } else {
          uint2 m_raw, v_raw;
          for (int k = 0; k < kVector; ++k) {
            StoreMoment<kMoments>(&m_raw, k, m[k], c.round_key_m,
                                  moments.first_index + i);
            StoreMoment<kMoments>(&v_raw, k, v[k], c.round_key_v,
                                  moments.first_index + i);
          }
          *reinterpret_cast<uint2*>(static_cast<uint16_t*>(moments.state0) +
                                    i) = m_raw;
          *reinterpret_cast<uint2*>(static_cast<uint16_t*>(moments.state1) +
                                    i) = v_raw;
        }
      } else if (c.has_momentum_buffer) {
        float b[kVector] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (!c.first_step) Load4<kF32>(moments.state0, i, b);
        for (int k = 0; k < kVector; ++k) SgdElement(c, g[k], p[k], &b[k]);
        Store4<kF32>(moments.state0, i, b);
      } else {
        for (int k = 0; k < kVector; ++k) SgdElement(c, g[k], p[k], nullptr);
      }
      if (kOut == kSplit) {
        uint2 hi_raw, lo_raw;
        uint16_t* h = reinterpret_cast<uint16_t*>(&hi_raw);
        uint16_t* l = reinterpret_cast<uint16_t*>(&lo_raw);
        for (int k = 0; k < kVector; ++k) SplitInto(p[k], h + k, l + k);
        *reinterpret_cast<uint2*>(static_cast<uint16_t*>(out) + i) = hi_raw;
        *reinterpret_cast<uint2*>(lo + i) = lo_raw;
      } else {
        Store4<kF32>(master, i, p);
        Store4<kOut>(out, i, p);
      }
    }
    // The tail (count % 4 elements) goes to the first threads.
    const int64_t tail = groups * kVector + first;
    if (tail < count) {
      UpdateOne<kGrad, kOut, kMoments>(c, master, moments, grads, out, lo,
                                       tail);
    }
  } else {
    for (int64_t i = first; i < count; i += stride) {
      UpdateOne<kGrad, kOut, kMoments>(c, master, moments, grads, out, lo, i);
    }
  }
}

// The largest of every thread's `value` in the thread block (kThreads
// threads), on every thread. Finite values: the order of the maxima does
// not matter, so it equals the CPU's running MomentMax.
__device__ __forceinline__ float BlockMax(float value, float* shared) {
  for (int offset = 16; offset > 0; offset /= 2) {
    value =
        offload::MomentMax(__shfl_xor_sync(0xffffffffu, value, offset), value);
  }
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = value;
  __syncthreads();
  float largest = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) {
    largest = offload::MomentMax(shared[w], largest);
  }
  __syncthreads();  // `shared` is free again
  return largest;
}

// The top of one state block's grid (offload::GridTop) from every thread's
// grid index: their BlockMax as floats (exact: indices are under 2^12).
__device__ __forceinline__ float BlockGridTop(uint32_t index,
                                              offload::MomentGrid grid,
                                              float* shared) {
  return offload::GridTop(
      static_cast<uint32_t>(BlockMax(static_cast<float>(index), shared)), grid);
}

// Adam over 8-bit moments: thread block b (grid-strided) updates state
// block b, thread t its element t: decode with the block's tops, update,
// then offload::EncodeBlock8Stochastic's steps, in its order (v's grid
// index, v's top, v's code, m zeroed where v's code is 0, m's index, m's
// top, m's code), the noise keyed by the step's key and the element's
// state index.
template <int kGrad, int kOut>
__global__ void Block8Kernel(offload::StepCoefficients c, float* master,
                             Moments moments, const void* grads, void* out,
                             uint16_t* lo, int64_t count) {
  __shared__ float shared[kThreads / 32];
  const int64_t blocks =
      (count + offload::kMomentBlock - 1) / offload::kMomentBlock;
  int8_t* m_codes = static_cast<int8_t*>(moments.state0);
  uint8_t* v_codes = static_cast<uint8_t*>(moments.state1);
  for (int64_t block = blockIdx.x; block < blocks; block += gridDim.x) {
    const int64_t i = block * offload::kMomentBlock + threadIdx.x;
    const bool active = i < count;
    float m = 0.0f;
    float v = 0.0f;
    if (active) {
      float p = LoadMaster<kOut>(master, out, lo, i);
      m = offload::DecodeM(m_codes[i], moments.step0[block]);
      v = offload::DecodeV(v_codes[i], moments.step1[block]);
      AdamElement(c, LoadOne<kGrad>(grads, i), p, m, v);
      StoreMaster<kOut>(master, out, lo, i, p);
    }
    // The noise: a hash of the element's index in the optimizer's state,
    // its halves for the two moments.
    const uint32_t noise = offload::RoundingNoise(
        c.round_key_m, static_cast<uint32_t>(moments.first_index + i));
    const uint32_t v_noise = offload::VCodeNoise(noise);
    const uint32_t v_index =
        offload::GridIndexStochastic(v, offload::kVGrid, v_noise);
    // Every thread read the old tops before BlockMax's barriers.
    const float v_top = BlockGridTop(v_index, offload::kVGrid, shared);
    const uint8_t v_code = static_cast<uint8_t>(offload::GridCodeStochastic(
        v, v_index, v_top, offload::GridLowest(v_top, offload::kVGrid),
        offload::kVGrid, v_noise));
    if (v_code == 0) m = 0.0f;
    const float magnitude = offload::AbsMoment(m);
    const uint32_t m_noise = offload::MCodeNoise(noise);
    const uint32_t m_index =
        offload::GridIndexStochastic(magnitude, offload::kMGrid, m_noise);
    const float m_top = BlockGridTop(m_index, offload::kMGrid, shared);
    if (active) {
      v_codes[i] = v_code;
      m_codes[i] =
          offload::SignedCode(offload::GridCodeStochastic(
                                  magnitude, m_index, m_top,
                                  offload::GridLowest(m_top, offload::kMGrid),
                                  offload::kMGrid, m_noise),
                              m);
    }
    if (threadIdx.x == 0) {
      moments.step0[block] = m_top;
      moments.step1[block] = v_top;
    }
  }
}

bool Aligned(const void* pointer, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(pointer) % bytes == 0;
}

template <int kGrad, int kOut, int kMoments>
int LaunchMoments(const offload::StepCoefficients& c, float* master,
                  const Moments& moments, const void* grads, void* out,
                  int64_t count, cudaStream_t stream, uint16_t* lo) {
  const uintptr_t grad_bytes = kGrad == kF32 ? 16 : 8;
  const uintptr_t out_bytes = kOut == kF32 ? 16 : 8;
  const uintptr_t state_bytes = kMoments == kMomF32 ? 16 : 8;
  const bool vectorised =
      (kOut == kSplit ? Aligned(lo, 8) : Aligned(master, 16)) &&
      (moments.state0 == nullptr || Aligned(moments.state0, state_bytes)) &&
      (moments.state1 == nullptr || Aligned(moments.state1, state_bytes)) &&
      Aligned(grads, grad_bytes) && (out == nullptr || Aligned(out, out_bytes));
  const int64_t work = vectorised ? (count + kVector - 1) / kVector : count;
  int64_t blocks = (work + kThreads - 1) / kThreads;
  if (blocks > 65535 * 8) blocks = 65535 * 8;  // grid-stride beyond this
  if (blocks < 1) blocks = 1;
  if (vectorised) {
    OptimizerKernel<kGrad, kOut, kMoments, true>
        <<<static_cast<int>(blocks), kThreads, 0, stream>>>(
            c, master, moments, grads, out, lo, count);
  } else {
    OptimizerKernel<kGrad, kOut, kMoments, false>
        <<<static_cast<int>(blocks), kThreads, 0, stream>>>(
            c, master, moments, grads, out, lo, count);
  }
  return static_cast<int>(cudaGetLastError());
}

template <int kGrad, int kOut>
int Launch(const offload::StepCoefficients& c, float* master,
           const Moments& moments, const void* grads, void* out, int64_t count,
           cudaStream_t stream, uint16_t* lo = nullptr) {
  if (c.is_sgd ||
      moments.format == static_cast<int>(offload::MomentFormat::kF32)) {
    return LaunchMoments<kGrad, kOut, kMomF32>(c, master, moments, grads, out,
                                               count, stream, lo);
  }
  if (moments.format == static_cast<int>(offload::MomentFormat::kBf16)) {
    if (c.stochastic_rounding) {
      return LaunchMoments<kGrad, kOut, kMomBf16Stochastic>(
          c, master, moments, grads, out, count, stream, lo);
    }
    return LaunchMoments<kGrad, kOut, kMomBf16>(c, master, moments, grads, out,
                                                count, stream, lo);
  }
  // 8-bit: a thread block of kThreads (= kMomentBlock) per state block.
  static_assert(kThreads == offload::kMomentBlock, "one thread an element");
  int64_t blocks = (count + kThreads - 1) / kThreads;
  if (blocks > 65535 * 8) blocks = 65535 * 8;
  if (blocks < 1) blocks = 1;
  Block8Kernel<kGrad, kOut><<<static_cast<int>(blocks), kThreads, 0, stream>>>(
      c, master, moments, grads, out, lo, count);
  return static_cast<int>(cudaGetLastError());
}

template <int kGrad>
int LaunchForOut(const offload::StepCoefficients& c, float* master,
                 const Moments& moments, const void* grads, void* out,
                 int out_dtype, int64_t count, cudaStream_t stream) {
  switch (out_dtype) {
    case kF32:
      return Launch<kGrad, kF32>(c, master, moments, grads, out, count, stream);
    case kBF16:
      return Launch<kGrad, kBF16>(c, master, moments, grads, out, count,
                                  stream);
    case kF16:
      return Launch<kGrad, kF16>(c, master, moments, grads, out, count, stream);
    default:
      return Launch<kGrad, kNoOutput>(c, master, moments, grads, nullptr, count,
                                      stream);
  }
}

}  // namespace

int LaunchSplitMasterStep(const offload::StepCoefficients& coefficients,
                          uint16_t* master_hi, uint16_t* master_lo,
                          const Moments& moments, const void* grads,
                          int grad_dtype, int64_t count, void* stream) {
  cudaStream_t cuda_stream = static_cast<cudaStream_t>(stream);
  switch (grad_dtype) {
    case kBF16:
      return Launch<kBF16, kSplit>(coefficients, nullptr, moments, grads,
                                   master_hi, count, cuda_stream, master_lo);
    case kF16:
      return Launch<kF16, kSplit>(coefficients, nullptr, moments, grads,
                                  master_hi, count, cuda_stream, master_lo);
    default:
      return Launch<kF32, kSplit>(coefficients, nullptr, moments, grads,
                                  master_hi, count, cuda_stream, master_lo);
  }
}

int LaunchOptimizerStep(const offload::StepCoefficients& coefficients,
                        float* master, const Moments& moments,
                        const void* grads, int grad_dtype, void* out,
                        int out_dtype, int64_t count, void* stream) {
  cudaStream_t cuda_stream = static_cast<cudaStream_t>(stream);
  switch (grad_dtype) {
    case kBF16:
      return LaunchForOut<kBF16>(coefficients, master, moments, grads, out,
                                 out_dtype, count, cuda_stream);
    case kF16:
      return LaunchForOut<kF16>(coefficients, master, moments, grads, out,
                                out_dtype, count, cuda_stream);
    default:
      return LaunchForOut<kF32>(coefficients, master, moments, grads, out,
                                out_dtype, count, cuda_stream);
  }
}

}  // namespace cuda
}  // namespace zero
}  // namespace ze
