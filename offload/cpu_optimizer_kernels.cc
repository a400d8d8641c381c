// The CPU optimizer's element loops: scalar (the reference, and every
// vector path's tail), AVX2/FMA (8 wide) and AVX-512 (16 wide).
//
// Every path evaluates, per element and in f32, exactly the sequence of
// zero/optimizer_kernels.h:
//   g = grad * grad_scale
//   Adam/AdamW: g = fma(l2, p, g)
//               m = fma(beta1, m, one_minus_beta1 * g)
//               v = fma(beta2, v, (one_minus_beta2 * g) * g)
//               denom = fma(sqrt(v), inv_sqrt_bias_correction2, eps)
//               p = p * decay_factor
//               p = fma(neg_step_size, m / denom, p)
//   SGD:        g = fma(l2, p, g)
//               buf = first_step ? g : fma(momentum, buf,
//                                          one_minus_dampening * g)
//               g = nesterov ? fma(momentum, buf, g) : buf
//               p = fma(neg_step_size, g, p)
// The library is compiled with -ffp-contract=off, so nothing else is fused;
// sqrt and division are IEEE (correctly rounded) in every path, so all paths
// agree bit for bit. 16-bit conversions use the F16C/AVX-512 instructions
// in every path (the build targets x86-64-v3, which includes F16C), so even
// NaN payloads agree; bf16 rounds to nearest even as core's
// FloatToBf16Bits does.
//
// The AVX-512 functions carry a function-level target attribute (the build
// targets x86-64-v3); they run only after SimdPathSupported(kAvx512).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/dtype.h"
#include "offload/cpu_optimizer.h"

#define ZE_TARGET_AVX512 __attribute__((target("avx512f")))

namespace ze {
namespace offload {
namespace {

enum : int { kF32 = 0, kBF16 = 1, kF16 = 2, kNoOutput = -1 };

// ---- scalar ---------------------------------------------------------------

template <int kDType>
inline float Load1(const void* data, int64_t i) {
  if constexpr (kDType == kF32) {
    return static_cast<const float*>(data)[i];
  } else if constexpr (kDType == kBF16) {
    return Bf16BitsToFloat(static_cast<const uint16_t*>(data)[i]);
  } else {
    return _cvtsh_ss(static_cast<const uint16_t*>(data)[i]);  // F16C, exact
  }
}

template <int kDType>
inline void Store1(void* data, int64_t i, float value) {
  if constexpr (kDType == kF32) {
    static_cast<float*>(data)[i] = value;
  } else if constexpr (kDType == kBF16) {
    static_cast<uint16_t*>(data)[i] = FloatToBf16Bits(value);
  } else if constexpr (kDType == kF16) {
    static_cast<uint16_t*>(data)[i] = static_cast<uint16_t>(
        _cvtss_sh(value, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

template <int kGrad, int kOut>
inline void AdamElement(const StepCoefficients& c, const StepBuffers& b,
                        int64_t i) {
  float p = b.master[i];
  float g = Load1<kGrad>(b.grads, i) * c.grad_scale;
  g = std::fma(c.l2, p, g);
  const float m = std::fma(c.beta1, b.state0[i], c.one_minus_beta1 * g);
  const float v = std::fma(c.beta2, b.state1[i], (c.one_minus_beta2 * g) * g);
  const float denom =
      std::fma(std::sqrt(v), c.inv_sqrt_bias_correction2, c.eps);
  p = p * c.decay_factor;
  p = std::fma(c.neg_step_size, m / denom, p);
  b.state0[i] = m;
  b.state1[i] = v;
  b.master[i] = p;
  Store1<kOut>(b.out, i, p);
}

template <int kGrad, int kOut>
inline void SgdElement(const StepCoefficients& c, const StepBuffers& b,
                       int64_t i) {
  float p = b.master[i];
  float g = Load1<kGrad>(b.grads, i) * c.grad_scale;
  g = std::fma(c.l2, p, g);
  if (c.has_momentum_buffer) {
    const float buf = c.first_step ? g
                                   : std::fma(c.momentum, b.state0[i],
                                              c.one_minus_dampening * g);
    b.state0[i] = buf;
    g = c.nesterov ? std::fma(c.momentum, buf, g) : buf;
  }
  p = std::fma(c.neg_step_size, g, p);
  b.master[i] = p;
  Store1<kOut>(b.out, i, p);
}

// Every path's Adam and Sgd take the tuning and a non-temporal flag; only
// AVX-512 acts on them.
struct Scalar {
  template <int kGrad, int kOut, bool kNontemporal>
  static void Adam(const StepCoefficients& c, const StepBuffers& b,
                   const KernelTuning&) {
    for (int64_t i = 0; i < b.count; ++i) AdamElement<kGrad, kOut>(c, b, i);
  }
  template <int kGrad, int kOut, bool kNontemporal>
  static void Sgd(const StepCoefficients& c, const StepBuffers& b,
                  const KernelTuning&) {
    for (int64_t i = 0; i < b.count; ++i) SgdElement<kGrad, kOut>(c, b, i);
  }
};

// ---- AVX2 / FMA: 8 elements ---------------------------------------------

template <int kDType>
inline __m256 Load8(const void* data, int64_t i) {
  if constexpr (kDType == kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(data) + i);
  } else {
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(
        static_cast<const uint16_t*>(data) + i));
    if constexpr (kDType == kBF16) {
      // bf16 is the top half of an f32: widen and shift, exact.
      return _mm256_castsi256_ps(
          _mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
    } else {
      return _mm256_cvtph_ps(bits);
    }
  }
}

template <int kDType>
inline void Store8(void* data, int64_t i, __m256 value) {
  if constexpr (kDType == kF32) {
    _mm256_storeu_ps(static_cast<float*>(data) + i, value);
  } else if constexpr (kDType == kBF16) {
    // FloatToBf16Bits 8 at a time: add 0x7fff plus the lowest kept bit and
    // keep the top half; NaN becomes a quiet NaN with its sign.
    const __m256i bits = _mm256_castps_si256(value);
    const __m256i high = _mm256_srli_epi32(bits, 16);
    const __m256i lsb = _mm256_and_si256(high, _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(bits,
                         _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)),
        16);
    const __m256i quiet_nan = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
    const __m256i is_nan =
        _mm256_castps_si256(_mm256_cmp_ps(value, value, _CMP_UNORD_Q));
    const __m256i result = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
    // All lanes < 2^16, so unsigned saturation is exact; packus works per
    // 128-bit lane, so gather 64-bit pieces 0 and 2 afterwards.
    const __m256i packed =
        _mm256_permute4x64_epi64(_mm256_packus_epi32(result, result), 0x08);
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(static_cast<uint16_t*>(data) + i),
        _mm256_castsi256_si128(packed));
  } else if constexpr (kDType == kF16) {
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(static_cast<uint16_t*>(data) + i),
        _mm256_cvtps_ph(value, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

struct Avx2 {
  template <int kGrad, int kOut, bool kNontemporal>
  static void Adam(const StepCoefficients& c, const StepBuffers& b,
                   const KernelTuning&) {
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
    for (; i + 8 <= b.count; i += 8) {
      __m256 p = _mm256_loadu_ps(b.master + i);
      __m256 g = _mm256_mul_ps(Load8<kGrad>(b.grads, i), grad_scale);
      g = _mm256_fmadd_ps(l2, p, g);
      __m256 m = _mm256_loadu_ps(b.state0 + i);
      __m256 v = _mm256_loadu_ps(b.state1 + i);
      m = _mm256_fmadd_ps(beta1, m, _mm256_mul_ps(one_minus_beta1, g));
      v = _mm256_fmadd_ps(beta2, v,
                          _mm256_mul_ps(_mm256_mul_ps(one_minus_beta2, g), g));
      const __m256 denom =
          _mm256_fmadd_ps(_mm256_sqrt_ps(v), inv_sqrt_bc2, eps);
      p = _mm256_mul_ps(p, decay);
      p = _mm256_fmadd_ps(neg_step, _mm256_div_ps(m, denom), p);
      _mm256_storeu_ps(b.state0 + i, m);
      _mm256_storeu_ps(b.state1 + i, v);
      _mm256_storeu_ps(b.master + i, p);
      Store8<kOut>(b.out, i, p);
    }
    for (; i < b.count; ++i) AdamElement<kGrad, kOut>(c, b, i);
  }

  template <int kGrad, int kOut, bool kNontemporal>
  static void Sgd(const StepCoefficients& c, const StepBuffers& b,
                  const KernelTuning&) {
    const __m256 grad_scale = _mm256_set1_ps(c.grad_scale);
    const __m256 l2 = _mm256_set1_ps(c.l2);
    const __m256 momentum = _mm256_set1_ps(c.momentum);
    const __m256 one_minus_dampening = _mm256_set1_ps(c.one_minus_dampening);
    const __m256 neg_step = _mm256_set1_ps(c.neg_step_size);
    int64_t i = 0;
    for (; i + 8 <= b.count; i += 8) {
      __m256 p = _mm256_loadu_ps(b.master + i);
      __m256 g = _mm256_mul_ps(Load8<kGrad>(b.grads, i), grad_scale);
      g = _mm256_fmadd_ps(l2, p, g);
      if (c.has_momentum_buffer) {
        const __m256 buf =
            c.first_step
                ? g
                : _mm256_fmadd_ps(momentum, _mm256_loadu_ps(b.state0 + i),
                                  _mm256_mul_ps(one_minus_dampening, g));
        _mm256_storeu_ps(b.state0 + i, buf);
        g = c.nesterov ? _mm256_fmadd_ps(momentum, buf, g) : buf;
      }
      p = _mm256_fmadd_ps(neg_step, g, p);
      _mm256_storeu_ps(b.master + i, p);
      Store8<kOut>(b.out, i, p);
    }
    for (; i < b.count; ++i) SgdElement<kGrad, kOut>(c, b, i);
  }
};

// ---- AVX-512: 16 elements ------------------------------------------------

template <int kDType>
ZE_TARGET_AVX512 inline __m512 Load16(const void* data, int64_t i) {
  if constexpr (kDType == kF32) {
    return _mm512_loadu_ps(static_cast<const float*>(data) + i);
  } else {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
        static_cast<const uint16_t*>(data) + i));
    if constexpr (kDType == kBF16) {
      return _mm512_castsi512_ps(
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
    } else {
      return _mm512_cvtph_ps(bits);
    }
  }
}

// 16 bits per lane to `dst`: non-temporal (`dst` 32-byte aligned) or not.
template <bool kNontemporal>
ZE_TARGET_AVX512 inline void Put256(uint16_t* dst, __m256i bits) {
  if constexpr (kNontemporal) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), bits);
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), bits);
  }
}

// kNontemporal: stream past the caches; the address must then be aligned to
// the store's width (32 bytes for 16-bit, 64 for f32).
template <int kDType, bool kNontemporal = false>
ZE_TARGET_AVX512 inline void Store16(void* data, int64_t i, __m512 value) {
  if constexpr (kDType == kF32) {
    if constexpr (kNontemporal) {
      _mm512_stream_ps(static_cast<float*>(data) + i, value);
    } else {
      _mm512_storeu_ps(static_cast<float*>(data) + i, value);
    }
  } else if constexpr (kDType == kBF16) {
    // As Store8<kBF16>, with a mask for NaN and a narrowing move (exact:
    // every lane < 2^16).
    const __m512i bits = _mm512_castps_si512(value);
    const __m512i high = _mm512_srli_epi32(bits, 16);
    const __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(bits,
                         _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)),
        16);
    const __m512i quiet_nan = _mm512_or_si512(high, _mm512_set1_epi32(0x40));
    const __mmask16 is_nan = _mm512_cmp_ps_mask(value, value, _CMP_UNORD_Q);
    const __m512i result = _mm512_mask_blend_epi32(is_nan, rounded, quiet_nan);
    Put256<kNontemporal>(static_cast<uint16_t*>(data) + i,
                         _mm512_cvtepi32_epi16(result));
  } else if constexpr (kDType == kF16) {
    Put256<kNontemporal>(
        static_cast<uint16_t*>(data) + i,
        _mm512_cvtps_ph(value, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

// Software prefetch of the streams `ahead` elements past element i (no-op
// for ahead == 0; a prefetch past the end of a buffer cannot fault).
template <int kGrad>
inline void PrefetchAhead(const StepBuffers& b, int64_t i, int64_t ahead) {
  if (ahead == 0) return;
  const int64_t j = i + ahead;
  _mm_prefetch(reinterpret_cast<const char*>(b.master + j), _MM_HINT_T0);
  if (b.state0 != nullptr) {
    _mm_prefetch(reinterpret_cast<const char*>(b.state0 + j), _MM_HINT_T0);
  }
  if (b.state1 != nullptr) {
    _mm_prefetch(reinterpret_cast<const char*>(b.state1 + j), _MM_HINT_T0);
  }
  constexpr int kGradBytes = kGrad == kF32 ? 4 : 2;
  _mm_prefetch(static_cast<const char*>(b.grads) + j * kGradBytes, _MM_HINT_T0);
}

struct Avx512 {
  template <int kGrad, int kOut, bool kNontemporal>
  ZE_TARGET_AVX512 static void Adam(const StepCoefficients& c,
                                    const StepBuffers& b,
                                    const KernelTuning& t) {
    const __m512 grad_scale = _mm512_set1_ps(c.grad_scale);
    const __m512 l2 = _mm512_set1_ps(c.l2);
    const __m512 beta1 = _mm512_set1_ps(c.beta1);
    const __m512 one_minus_beta1 = _mm512_set1_ps(c.one_minus_beta1);
    const __m512 beta2 = _mm512_set1_ps(c.beta2);
    const __m512 one_minus_beta2 = _mm512_set1_ps(c.one_minus_beta2);
    const __m512 eps = _mm512_set1_ps(c.eps);
    const __m512 inv_sqrt_bc2 = _mm512_set1_ps(c.inv_sqrt_bias_correction2);
    const __m512 decay = _mm512_set1_ps(c.decay_factor);
    const __m512 neg_step = _mm512_set1_ps(c.neg_step_size);
    int64_t i = 0;
    for (; i + 16 <= b.count; i += 16) {
      PrefetchAhead<kGrad>(b, i, t.prefetch_elements);
      __m512 p = _mm512_loadu_ps(b.master + i);
      __m512 g = _mm512_mul_ps(Load16<kGrad>(b.grads, i), grad_scale);
      g = _mm512_fmadd_ps(l2, p, g);
      __m512 m = _mm512_loadu_ps(b.state0 + i);
      __m512 v = _mm512_loadu_ps(b.state1 + i);
      m = _mm512_fmadd_ps(beta1, m, _mm512_mul_ps(one_minus_beta1, g));
      v = _mm512_fmadd_ps(beta2, v,
                          _mm512_mul_ps(_mm512_mul_ps(one_minus_beta2, g), g));
      const __m512 denom =
          _mm512_fmadd_ps(_mm512_sqrt_ps(v), inv_sqrt_bc2, eps);
      p = _mm512_mul_ps(p, decay);
      p = _mm512_fmadd_ps(neg_step, _mm512_div_ps(m, denom), p);
      _mm512_storeu_ps(b.state0 + i, m);
      _mm512_storeu_ps(b.state1 + i, v);
      _mm512_storeu_ps(b.master + i, p);
      Store16<kOut, kNontemporal>(b.out, i, p);
    }
    for (; i < b.count; ++i) AdamElement<kGrad, kOut>(c, b, i);
    if constexpr (kNontemporal) _mm_sfence();
  }

  template <int kGrad, int kOut, bool kNontemporal>
  ZE_TARGET_AVX512 static void Sgd(const StepCoefficients& c,
                                   const StepBuffers& b,
                                   const KernelTuning& t) {
    const __m512 grad_scale = _mm512_set1_ps(c.grad_scale);
    const __m512 l2 = _mm512_set1_ps(c.l2);
    const __m512 momentum = _mm512_set1_ps(c.momentum);
    const __m512 one_minus_dampening = _mm512_set1_ps(c.one_minus_dampening);
    const __m512 neg_step = _mm512_set1_ps(c.neg_step_size);
    int64_t i = 0;
    for (; i + 16 <= b.count; i += 16) {
      PrefetchAhead<kGrad>(b, i, t.prefetch_elements);
      __m512 p = _mm512_loadu_ps(b.master + i);
      __m512 g = _mm512_mul_ps(Load16<kGrad>(b.grads, i), grad_scale);
      g = _mm512_fmadd_ps(l2, p, g);
      if (c.has_momentum_buffer) {
        const __m512 buf =
            c.first_step
                ? g
                : _mm512_fmadd_ps(momentum, _mm512_loadu_ps(b.state0 + i),
                                  _mm512_mul_ps(one_minus_dampening, g));
        _mm512_storeu_ps(b.state0 + i, buf);
        g = c.nesterov ? _mm512_fmadd_ps(momentum, buf, g) : buf;
      }
      p = _mm512_fmadd_ps(neg_step, g, p);
      _mm512_storeu_ps(b.master + i, p);
      Store16<kOut, kNontemporal>(b.out, i, p);
    }
    for (; i < b.count; ++i) SgdElement<kGrad, kOut>(c, b, i);
    if constexpr (kNontemporal) _mm_sfence();
  }
};

// ---- dispatch on optimizer and dtypes -----------------------------------

template <class Isa, int kGrad, int kOut, bool kNontemporal>
void RunKind(const StepCoefficients& c, const StepBuffers& b,
             const KernelTuning& t) {
  if (c.is_sgd) {
    Isa::template Sgd<kGrad, kOut, kNontemporal>(c, b, t);
  } else {
    Isa::template Adam<kGrad, kOut, kNontemporal>(c, b, t);
  }
}

template <class Isa, int kGrad, bool kNontemporal>
void RunOut(const StepCoefficients& c, const StepBuffers& b,
            const KernelTuning& t) {
  if (b.out == nullptr) return RunKind<Isa, kGrad, kNoOutput, false>(c, b, t);
  switch (b.out_dtype) {
    case DType::kBF16:
      return RunKind<Isa, kGrad, kBF16, kNontemporal>(c, b, t);
    case DType::kF16:
      return RunKind<Isa, kGrad, kF16, kNontemporal>(c, b, t);
    default:
      return RunKind<Isa, kGrad, kF32, kNontemporal>(c, b, t);
  }
}

template <class Isa, bool kNontemporal>
void RunGrad(const StepCoefficients& c, const StepBuffers& b,
             const KernelTuning& t) {
  switch (b.grad_dtype) {
    case DType::kBF16:
      return RunOut<Isa, kBF16, kNontemporal>(c, b, t);
    case DType::kF16:
      return RunOut<Isa, kF16, kNontemporal>(c, b, t);
    default:
      return RunOut<Isa, kF32, kNontemporal>(c, b, t);
  }
}

// The AVX-512 pass with non-temporal stores of `out`: the elements before
// out's first 64-byte boundary run with plain stores, the rest streamed (the
// vector body then stores whole aligned halves or lines; the split changes
// no value, as every element evaluates the same operations either way).
void RunAvx512Nontemporal(const StepCoefficients& c, const StepBuffers& b,
                          const KernelTuning& t) {
  const int64_t out_bytes = SizeOf(b.out_dtype);
  const uintptr_t address = reinterpret_cast<uintptr_t>(b.out);
  if (address % out_bytes != 0) return RunGrad<Avx512, false>(c, b, t);
  const int64_t peel =
      std::min<int64_t>(b.count, ((64 - address % 64) % 64) / out_bytes);
  if (peel > 0) {
    StepBuffers head = b;
    head.count = peel;
    RunGrad<Avx512, false>(c, head, t);
  }
  if (peel == b.count) return;
  StepBuffers body = b;
  body.master += peel;
  if (body.state0 != nullptr) body.state0 += peel;
  if (body.state1 != nullptr) body.state1 += peel;
  body.grads = static_cast<const char*>(b.grads) + peel * SizeOf(b.grad_dtype);
  body.out = static_cast<char*>(b.out) + peel * out_bytes;
  body.count = b.count - peel;
  RunGrad<Avx512, true>(c, body, t);
}

}  // namespace

void RunStepKernel(SimdPath path, const StepCoefficients& coefficients,
                   const StepBuffers& buffers) {
  RunStepKernel(path, coefficients, buffers, KernelTuning());
}

void RunStepKernel(SimdPath path, const StepCoefficients& coefficients,
                   const StepBuffers& buffers, const KernelTuning& tuning) {
  switch (path) {
    case SimdPath::kAvx512:
      if (tuning.nontemporal_out && buffers.out != nullptr) {
        return RunAvx512Nontemporal(coefficients, buffers, tuning);
      }
      return RunGrad<Avx512, false>(coefficients, buffers, tuning);
    case SimdPath::kAvx2:
      return RunGrad<Avx2, false>(coefficients, buffers, tuning);
    case SimdPath::kScalar:
      return RunGrad<Scalar, false>(coefficients, buffers, tuning);
  }
}

}  // namespace offload
}  // namespace ze
