// CPU optimizer kernel: AVX2/FMA (the build targets x86-64-v3), 8 elements
// per iteration, with a scalar tail that evaluates the same operations (the
// library is compiled with -ffp-contract=off, so the scalar tail fuses only
// where std::fma says so, exactly like the vector body and the CUDA kernel).
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "core/dtype.h"
#include "zero/optimizer_kernels.h"

namespace ze {
namespace zero {
namespace {

enum : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

// ---- loads and stores of 8 elements as f32 ------------------------------

template <int kDType>
inline __m256 Load8(const void* data, int64_t i);

template <>
inline __m256 Load8<kF32>(const void* data, int64_t i) {
  return _mm256_loadu_ps(static_cast<const float*>(data) + i);
}

template <>
inline __m256 Load8<kBF16>(const void* data, int64_t i) {
  // bf16 is the top half of an f32: widen and shift, exact.
  const __m128i bits = _mm_loadu_si128(
      reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(data) + i));
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

template <>
inline __m256 Load8<kF16>(const void* data, int64_t i) {
  const __m128i bits = _mm_loadu_si128(
      reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(data) + i));
  return _mm256_cvtph_ps(bits);  // F16C: exact
}

template <int kDType>
inline void Store8(void* data, int64_t i, __m256 value);

template <>
inline void Store8<kF32>(void* data, int64_t i, __m256 value) {
  _mm256_storeu_ps(static_cast<float*>(data) + i, value);
}

template <>
inline void Store8<kBF16>(void* data, int64_t i, __m256 value) {
  // Round to nearest even as FloatToBf16Bits does: add 0x7fff plus the lowest
  // kept bit, keep the top half; NaN becomes a quiet NaN with its sign.
  const __m256i bits = _mm256_castps_si256(value);
  const __m256i lsb =
      _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)),
      16);
  const __m256i quiet_nan =
      _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
  const __m256i is_nan =
      _mm256_castps_si256(_mm256_cmp_ps(value, value, _CMP_UNORD_Q));
  const __m256i result = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
  // Pack the 8 low halves (all < 2^16, so unsigned saturation is exact);
  // packus works per 128-bit lane, so gather lanes 0 and 2 afterwards.
  const __m256i packed =
      _mm256_permute4x64_epi64(_mm256_packus_epi32(result, result), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(data) + i),
                   _mm256_castsi256_si128(packed));
}

template <>
inline void Store8<kF16>(void* data, int64_t i, __m256 value) {
  _mm_storeu_si128(
      reinterpret_cast<__m128i*>(static_cast<uint16_t*>(data) + i),
      _mm256_cvtps_ph(value, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

template <int kDType>
inline float Load1(const void* data, int64_t i) {
  return LoadAsFloat(data, static_cast<DType>(kDType), i);
}

template <int kDType>
inline void Store1(void* data, int64_t i, float value) {
  if (kDType == kF16) {
    // The same F16C instruction as the vector body, so NaN payloads match.
    static_cast<uint16_t*>(data)[i] = static_cast<uint16_t>(_mm_extract_epi16(
        _mm_cvtps_ph(_mm_set_ss(value),
                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
        0));
    return;
  }
  StoreFromFloat(data, static_cast<DType>(kDType), i, value);
}

// ---- Adam / AdamW --------------------------------------------------------

template <int kGrad, int kOut>
void AdamLoop(const OptimizerCoefficients& c, float* master, float* exp_avg,
              float* exp_avg_sq, const void* grads, void* out, int64_t count) {
  const __m256 grad_scale = _mm256_set1_ps(c.grad_scale);
  const __m256 l2 = _mm256_set1_ps(c.l2);
  const __m256 beta1 = _mm256_set1_ps(c.beta1);
  const __m256 one_minus_beta1 = _mm256_set1_ps(c.one_minus_beta1);
  const __m256 beta2 = _mm256_set1_ps(c.beta2);
  const __m256 one_minus_beta2 = _mm256_set1_ps(c.one_minus_beta2);
  const __m256 eps = _mm256_set1_ps(c.eps);
  const __m256 inv_sqrt_bc2 = _mm256_set1_ps(c.inv_sqrt_bias_correction2);
  const __m256 decay = _mm256_set1_ps(c.decay_factor);
  const __m256 neg_step = _mm256_set1_ps(c.neg_step_size);
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m256 p = _mm256_loadu_ps(master + i);
    __m256 g = _mm256_mul_ps(Load8<kGrad>(grads, i), grad_scale);
    g = _mm256_fmadd_ps(l2, p, g);
    __m256 m = _mm256_loadu_ps(exp_avg + i);
    __m256 v = _mm256_loadu_ps(exp_avg_sq + i);
    m = _mm256_fmadd_ps(beta1, m, _mm256_mul_ps(one_minus_beta1, g));
    v = _mm256_fmadd_ps(beta2, v,
                        _mm256_mul_ps(_mm256_mul_ps(one_minus_beta2, g), g));
    const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(v), inv_sqrt_bc2, eps);
    p = _mm256_mul_ps(p, decay);
    p = _mm256_fmadd_ps(neg_step, _mm256_div_ps(m, denom), p);
    _mm256_storeu_ps(exp_avg + i, m);
    _mm256_storeu_ps(exp_avg_sq + i, v);
    _mm256_storeu_ps(master + i, p);
    if constexpr (kOut != kNoOutput) Store8<kOut>(out, i, p);
  }
  for (; i < count; ++i) {
    float p = master[i];
    float g = Load1<kGrad>(grads, i) * c.grad_scale;
    g = std::fma(c.l2, p, g);
    const float m = std::fma(c.beta1, exp_avg[i], c.one_minus_beta1 * g);
    const float v =
        std::fma(c.beta2, exp_avg_sq[i], (c.one_minus_beta2 * g) * g);
    const float denom =
        std::fma(std::sqrt(v), c.inv_sqrt_bias_correction2, c.eps);
    p = p * c.decay_factor;
    p = std::fma(c.neg_step_size, m / denom, p);
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    master[i] = p;
    if constexpr (kOut != kNoOutput) Store1<kOut>(out, i, p);
  }
}

// ---- SGD -----------------------------------------------------------------

template <int kGrad, int kOut>
void SgdLoop(const OptimizerCoefficients& c, float* master, float* buffer,
             const void* grads, void* out, int64_t count) {
  const __m256 grad_scale = _mm256_set1_ps(c.grad_scale);
  const __m256 l2 = _mm256_set1_ps(c.l2);
  const __m256 momentum = _mm256_set1_ps(c.momentum);
  const __m256 one_minus_dampening = _mm256_set1_ps(c.one_minus_dampening);
  const __m256 neg_step = _mm256_set1_ps(c.neg_step_size);
  const bool has_buffer = c.has_momentum_buffer != 0;
  const bool first = c.first_step != 0;
  const bool nesterov = c.nesterov != 0;
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m256 p = _mm256_loadu_ps(master + i);
    __m256 g = _mm256_mul_ps(Load8<kGrad>(grads, i), grad_scale);
    g = _mm256_fmadd_ps(l2, p, g);
    if (has_buffer) {
      __m256 buf = first
                       ? g
                       : _mm256_fmadd_ps(momentum, _mm256_loadu_ps(buffer + i),
                                         _mm256_mul_ps(one_minus_dampening, g));
      _mm256_storeu_ps(buffer + i, buf);
      g = nesterov ? _mm256_fmadd_ps(momentum, buf, g) : buf;
    }
    p = _mm256_fmadd_ps(neg_step, g, p);
    _mm256_storeu_ps(master + i, p);
    if constexpr (kOut != kNoOutput) Store8<kOut>(out, i, p);
  }
  for (; i < count; ++i) {
    float p = master[i];
    float g = Load1<kGrad>(grads, i) * c.grad_scale;
    g = std::fma(c.l2, p, g);
    if (has_buffer) {
      const float buf =
          first ? g
                : std::fma(c.momentum, buffer[i], c.one_minus_dampening * g);
      buffer[i] = buf;
      g = nesterov ? std::fma(c.momentum, buf, g) : buf;
    }
    p = std::fma(c.neg_step_size, g, p);
    master[i] = p;
    if constexpr (kOut != kNoOutput) Store1<kOut>(out, i, p);
  }
}

template <int kGrad, int kOut>
void Dispatch(const OptimizerCoefficients& c, float* master, float* state0,
              float* state1, const void* grads, void* out, int64_t count) {
  if (c.kind == kKernelAdam) {
    AdamLoop<kGrad, kOut>(c, master, state0, state1, grads, out, count);
  } else {
    SgdLoop<kGrad, kOut>(c, master, state0, grads, out, count);
  }
}

template <int kGrad>
void DispatchOut(const OptimizerCoefficients& c, float* master, float* state0,
                 float* state1, const void* grads, void* out, int out_dtype,
                 int64_t count) {
  switch (out_dtype) {
    case kF32:
      return Dispatch<kGrad, kF32>(c, master, state0, state1, grads, out,
                                   count);
    case kBF16:
      return Dispatch<kGrad, kBF16>(c, master, state0, state1, grads, out,
                                    count);
    case kF16:
      return Dispatch<kGrad, kF16>(c, master, state0, state1, grads, out,
                                   count);
    default:
      return Dispatch<kGrad, kNoOutput>(c, master, state0, state1, grads,
                                        nullptr, count);
  }
}

}  // namespace

void CpuOptimizerStep(const OptimizerCoefficients& coefficients, float* master,
                      float* state0, float* state1, const void* grads,
                      int grad_dtype, void* out, int out_dtype, int64_t count) {
  switch (grad_dtype) {
    case kBF16:
      return DispatchOut<kBF16>(coefficients, master, state0, state1, grads,
                                out, out_dtype, count);
    case kF16:
      return DispatchOut<kF16>(coefficients, master, state0, state1, grads, out,
                               out_dtype, count);
    default:
      return DispatchOut<kF32>(coefficients, master, state0, state1, grads, out,
                               out_dtype, count);
  }
}

}  // namespace zero
}  // namespace ze
