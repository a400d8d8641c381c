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
// The AVX-512 operations carry a target pragma, Avx512::Step the target
// attribute (the build targets x86-64-v3); they run only after
// SimdPathSupported(kAvx512). The one vector loop and the conversions are
// templates over the width, flattened into each path's Step.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/dtype.h"
#include "offload/cpu_optimizer.h"
#include "offload/moment_codec.h"

namespace ze {
namespace offload {
namespace {

// kSplit: `out` is the bf16 high half of a split master, master_lo its low
// half (StepBuffers::master_lo); not a DType.
// kBF16Away: bf16 rounded ties away from zero (StepBuffers::bf16_ties_away).
enum : int {
  kF32 = 0,
  kBF16 = 1,
  kF16 = 2,
  kSplit = 3,
  kBF16Away = 4,
  kNoOutput = -1
};

// How a pass stores Adam's moments: f32, bf16 rounded to nearest even or
// stochastically (8-bit moments have their own block loop, Block8Step).
enum : int { kMomF32 = 0, kMomBf16 = 1, kMomBf16Stochastic = 2 };

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
  } else if constexpr (kDType == kBF16Away) {
    static_cast<uint16_t*>(data)[i] = SplitForBf16(value).hi;
  } else if constexpr (kDType == kF16) {
    static_cast<uint16_t*>(data)[i] = static_cast<uint16_t>(
        _cvtss_sh(value, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

// The master weight i, and its update written back with the model weight.
template <int kOut>
inline float LoadMaster1(const StepBuffers& b, int64_t i) {
  if constexpr (kOut == kSplit) {
    return JoinBf16Split(static_cast<const uint16_t*>(b.out)[i],
                         b.master_lo[i]);
  } else {
    return b.master[i];
  }
}

template <int kOut>
inline void StoreMaster1(const StepBuffers& b, int64_t i, float p) {
  if constexpr (kOut == kSplit) {
    const Bf16Split split = SplitForBf16(p);
    static_cast<uint16_t*>(b.out)[i] = split.hi;
    b.master_lo[i] = split.lo;
  } else {
    b.master[i] = p;
    Store1<kOut>(b.out, i, p);
  }
}

template <int kMoments>
inline float LoadMoment1(const void* state, int64_t i) {
  if constexpr (kMoments == kMomF32) {
    return static_cast<const float*>(state)[i];
  } else {
    return Bf16ToFloat(static_cast<const uint16_t*>(state)[i]);
  }
}

// `key`: the moment's rounding key; i + b.first_index the noise counter.
template <int kMoments>
inline void StoreMoment1(void* state, int64_t i, float value, uint32_t key,
                         int64_t first_index) {
  if constexpr (kMoments == kMomF32) {
    static_cast<float*>(state)[i] = value;
  } else if constexpr (kMoments == kMomBf16) {
    static_cast<uint16_t*>(state)[i] = NearestBf16(value);
  } else {
    static_cast<uint16_t*>(state)[i] = StochasticBf16(
        value, RoundingNoise(key, static_cast<uint32_t>(first_index + i)));
  }
}

// The Adam update of one element from its old moments: p, m and v in
// place (the header comment's sequence).
inline void AdamCore(const StepCoefficients& c, float grad, float& p, float& m,
                     float& v) {
  float g = grad * c.grad_scale;
  g = std::fma(c.l2, p, g);
  m = std::fma(c.beta1, m, c.one_minus_beta1 * g);
  v = std::fma(c.beta2, v, (c.one_minus_beta2 * g) * g);
  const float denom =
      std::fma(std::sqrt(v), c.inv_sqrt_bias_correction2, c.eps);
  p = p * c.decay_factor;
  p = std::fma(c.neg_step_size, m / denom, p);
}

template <int kGrad, int kOut, int kMoments>
inline void AdamElement(const StepCoefficients& c, const StepBuffers& b,
                        int64_t i) {
  float p = LoadMaster1<kOut>(b, i);
  float m = LoadMoment1<kMoments>(b.state0, i);
  float v = LoadMoment1<kMoments>(b.state1, i);
  AdamCore(c, Load1<kGrad>(b.grads, i), p, m, v);
  StoreMoment1<kMoments>(b.state0, i, m, c.round_key_m, b.first_index);
  StoreMoment1<kMoments>(b.state1, i, v, c.round_key_v, b.first_index);
  StoreMaster1<kOut>(b, i, p);
}

template <int kGrad, int kOut>
inline void SgdElement(const StepCoefficients& c, const StepBuffers& b,
                       int64_t i) {
  float p = LoadMaster1<kOut>(b, i);
  float g = Load1<kGrad>(b.grads, i) * c.grad_scale;
  g = std::fma(c.l2, p, g);
  if (c.has_momentum_buffer) {
    float* state = static_cast<float*>(b.state0);
    const float buf = c.first_step ? g
                                   : std::fma(c.momentum, state[i],
                                              c.one_minus_dampening * g);
    state[i] = buf;
    g = c.nesterov ? std::fma(c.momentum, buf, g) : buf;
  }
  p = std::fma(c.neg_step_size, g, p);
  StoreMaster1<kOut>(b, i, p);
}

// Element i of either optimizer: the scalar path, and every vector path's
// tail.
template <int kGrad, int kOut, bool kSgd, int kMoments>
inline void StepElement(const StepCoefficients& c, const StepBuffers& b,
                        int64_t i) {
  if constexpr (kSgd) {
    SgdElement<kGrad, kOut>(c, b, i);
  } else {
    AdamElement<kGrad, kOut, kMoments>(c, b, i);
  }
}

// The Adam update of element i of an 8-bit pass (Block8Step): old moments
// decoded with the block's tops, new ones (f32) into m_new[j] / v_new[j].
template <int kGrad, int kOut>
inline void Block8Element(const StepCoefficients& c, const StepBuffers& b,
                          int64_t i, float m_top, float v_top, float* m_new,
                          float* v_new) {
  float p = LoadMaster1<kOut>(b, i);
  float m = DecodeM(static_cast<const int8_t*>(b.state0)[i], m_top);
  float v = DecodeV(static_cast<const uint8_t*>(b.state1)[i], v_top);
  AdamCore(c, Load1<kGrad>(b.grads, i), p, m, v);
  *m_new = m;
  *v_new = v;
  StoreMaster1<kOut>(b, i, p);
}

// Every path's Step takes the tuning and a non-temporal flag; only AVX-512
// acts on them.
struct Scalar {
  static constexpr int kWidth = 1;
  template <int kGrad, int kOut, bool kNontemporal, bool kSgd, int kMoments>
  static void Step(const StepCoefficients& c, const StepBuffers& b,
                   const KernelTuning&) {
    for (int64_t i = 0; i < b.count; ++i)
      StepElement<kGrad, kOut, kSgd, kMoments>(c, b, i);
  }
  template <int kGrad, int kOut>
  static void Step8(const StepCoefficients& c, const StepBuffers& b,
                    const KernelTuning&);
};

// ---- the vector operations of each width ---------------------------------
//
// Declared boilerplate: one line per operation per instruction set, the
// table the one vector loop below (VectorStep) is written against. The
// conversions and the loop are written once, over these.

// AVX2 / FMA: 8 elements. AVX2 neither prefetches nor streams: kNontemporal
// and the tuning are ignored.
struct Avx2Ops {
  using Vec = __m256;    // 8 f32
  using Int = __m256i;   // 8 32-bit lanes
  using Bits = __m128i;  // 8 16-bit values
  static constexpr int kWidth = 8;
  static Vec Set1(float x) { return _mm256_set1_ps(x); }
  static Vec Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
  template <bool kNontemporal>
  static void StoreOut(float* p, Vec v) {
    _mm256_storeu_ps(p, v);
  }
  static Vec Mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
  static Vec Div(Vec a, Vec b) { return _mm256_div_ps(a, b); }
  static Vec Fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static Vec Sqrt(Vec a) { return _mm256_sqrt_ps(a); }
  static Bits LoadBits(const uint16_t* p) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  }
  template <bool kNontemporal>
  static void StoreBits(uint16_t* p, Bits bits) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), bits);
  }
  static Vec WidenF16(Bits bits) { return _mm256_cvtph_ps(bits); }
  static Bits NarrowF16(Vec v) {
    return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static Int AsInt(Vec v) { return _mm256_castps_si256(v); }
  static Vec AsFloat(Int a) { return _mm256_castsi256_ps(a); }
  static Int Splat(int x) { return _mm256_set1_epi32(x); }
  static Int Add(Int a, Int b) { return _mm256_add_epi32(a, b); }
  static Int Sub(Int a, Int b) { return _mm256_sub_epi32(a, b); }
  static Int And(Int a, Int b) { return _mm256_and_si256(a, b); }
  static Int Or(Int a, Int b) { return _mm256_or_si256(a, b); }
  static Int ShiftLeft16(Int a) { return _mm256_slli_epi32(a, 16); }
  static Int ShiftRight16(Int a) { return _mm256_srli_epi32(a, 16); }
  static Int Widen16(Bits bits) { return _mm256_cvtepu16_epi32(bits); }
  // Each lane's low 16 bits (every lane < 2^16, so unsigned saturation is
  // exact); packus works per 128-bit lane, so gather 64-bit pieces 0 and 2
  // afterwards.
  static Bits Narrow16(Int a) {
    return _mm256_castsi256_si128(
        _mm256_permute4x64_epi64(_mm256_packus_epi32(a, a), 0x08));
  }
  // Lanes where `value` is NaN take `nan`, the others `other`.
  static Int SelectNan(Vec value, Int other, Int nan) {
    return _mm256_blendv_epi8(
        other, nan,
        _mm256_castps_si256(_mm256_cmp_ps(value, value, _CMP_UNORD_Q)));
  }
  template <int kGrad>
  static void Prefetch(const StepBuffers&, int64_t, int64_t) {}
  template <bool kNontemporal>
  static void Fence() {}
  // Compressed moments: the rounding noise's integer hash, 8-bit codes.
  static Int Iota() { return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); }
  static Int Xor(Int a, Int b) { return _mm256_xor_si256(a, b); }
  static Int MulLo(Int a, Int b) { return _mm256_mullo_epi32(a, b); }
  template <int kBits>
  static Int ShiftRight(Int a) {
    return _mm256_srli_epi32(a, kBits);
  }
  static Vec Max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
  // 8-bit codes as 32-bit lanes.
  static Int LoadI8(const int8_t* p) {
    return _mm256_cvtepi8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static Int LoadU8(const uint8_t* p) {
    return _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  // Integral codes in [-127, 255] as bytes (the low byte of each lane).
  static void StoreCodes(void* p, Vec codes) {
    alignas(32) int32_t lanes[kWidth];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                       _mm256_cvttps_epi32(codes));
    for (int k = 0; k < kWidth; ++k) {
      static_cast<uint8_t*>(p)[k] = static_cast<uint8_t>(lanes[k]);
    }
  }
  static Int LoadInt(const uint32_t* p) {
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
  }
  static void StoreInt(uint32_t* p, Int a) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(p), a);
  }
  template <int kBits>
  static Int ShiftLeft(Int a) {
    return _mm256_slli_epi32(a, kBits);
  }
  static Int AbsInt(Int a) { return _mm256_abs_epi32(a); }
  // m where `code` is not 0, else 0.
  static Vec ZeroWhereZero(Vec m, Vec code) {
    return _mm256_and_ps(m,
                         _mm256_cmp_ps(code, _mm256_setzero_ps(), _CMP_NEQ_OQ));
  }
  // Lanes < 2^31, exact below 2^24.
  static Vec IntToFloat(Int a) { return _mm256_cvtepi32_ps(a); }
  // a < b ? if_less : otherwise, lane by lane.
  static Vec SelectLess(Vec a, Vec b, Vec if_less, Vec otherwise) {
    return _mm256_blendv_ps(otherwise, if_less,
                            _mm256_cmp_ps(a, b, _CMP_LT_OQ));
  }
};

// AVX-512: 16 elements. Everything from here to the matching pop carries
// the AVX-512 target (the build targets x86-64-v3); it runs only after
// SimdPathSupported(kAvx512).
#pragma GCC push_options
#pragma GCC target("avx512f")

// Software prefetch of the streams `ahead` elements past element i (no-op
// for ahead == 0; a prefetch past the end of a buffer cannot fault).
template <int kGrad>
inline void PrefetchAhead(const StepBuffers& b, int64_t i, int64_t ahead) {
  if (ahead == 0) return;
  const int64_t j = i + ahead;
  if (b.master != nullptr) {
    _mm_prefetch(reinterpret_cast<const char*>(b.master + j), _MM_HINT_T0);
  }
  const int64_t state_bytes = b.moment_format == MomentFormat::kBf16 ? 2 : 4;
  if (b.state0 != nullptr) {
    _mm_prefetch(static_cast<const char*>(b.state0) + j * state_bytes,
                 _MM_HINT_T0);
  }
  if (b.state1 != nullptr) {
    _mm_prefetch(static_cast<const char*>(b.state1) + j * state_bytes,
                 _MM_HINT_T0);
  }
  constexpr int kGradBytes = kGrad == kF32 ? 4 : 2;
  _mm_prefetch(static_cast<const char*>(b.grads) + j * kGradBytes, _MM_HINT_T0);
}

// kNontemporal stores stream past the caches; the address must then be
// aligned to the store's width (32 bytes for 16-bit, 64 for f32).
struct Avx512Ops {
  using Vec = __m512;    // 16 f32
  using Int = __m512i;   // 16 32-bit lanes
  using Bits = __m256i;  // 16 16-bit values
  static constexpr int kWidth = 16;
  static Vec Set1(float x) { return _mm512_set1_ps(x); }
  static Vec Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
  template <bool kNontemporal>
  static void StoreOut(float* p, Vec v) {
    if constexpr (kNontemporal) {
      _mm512_stream_ps(p, v);
    } else {
      _mm512_storeu_ps(p, v);
    }
  }
  static Vec Mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
  static Vec Div(Vec a, Vec b) { return _mm512_div_ps(a, b); }
  static Vec Fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static Vec Sqrt(Vec a) { return _mm512_sqrt_ps(a); }
  static Bits LoadBits(const uint16_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  template <bool kNontemporal>
  static void StoreBits(uint16_t* p, Bits bits) {
    if constexpr (kNontemporal) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(p), bits);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bits);
    }
  }
  static Vec WidenF16(Bits bits) { return _mm512_cvtph_ps(bits); }
  static Bits NarrowF16(Vec v) {
    return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static Int AsInt(Vec v) { return _mm512_castps_si512(v); }
  static Vec AsFloat(Int a) { return _mm512_castsi512_ps(a); }
  static Int Splat(int x) { return _mm512_set1_epi32(x); }
  static Int Add(Int a, Int b) { return _mm512_add_epi32(a, b); }
  static Int Sub(Int a, Int b) { return _mm512_sub_epi32(a, b); }
  static Int And(Int a, Int b) { return _mm512_and_si512(a, b); }
  static Int Or(Int a, Int b) { return _mm512_or_si512(a, b); }
  static Int ShiftLeft16(Int a) { return _mm512_slli_epi32(a, 16); }
  static Int ShiftRight16(Int a) { return _mm512_srli_epi32(a, 16); }
  static Int Widen16(Bits bits) { return _mm512_cvtepu16_epi32(bits); }
  // A narrowing move: exact, every lane < 2^16.
  static Bits Narrow16(Int a) { return _mm512_cvtepi32_epi16(a); }
  static Int SelectNan(Vec value, Int other, Int nan) {
    return _mm512_mask_blend_epi32(
        _mm512_cmp_ps_mask(value, value, _CMP_UNORD_Q), other, nan);
  }
  template <int kGrad>
  static void Prefetch(const StepBuffers& b, int64_t i, int64_t ahead) {
    PrefetchAhead<kGrad>(b, i, ahead);
  }
  template <bool kNontemporal>
  static void Fence() {
    if constexpr (kNontemporal) _mm_sfence();
  }
  static Int Iota() {
    return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
                             15);
  }
  static Int Xor(Int a, Int b) { return _mm512_xor_si512(a, b); }
  static Int MulLo(Int a, Int b) { return _mm512_mullo_epi32(a, b); }
  template <int kBits>
  static Int ShiftRight(Int a) {
    return _mm512_srli_epi32(a, kBits);
  }
  static Vec Max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
  static Int LoadI8(const int8_t* p) {
    return _mm512_cvtepi8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static Int LoadU8(const uint8_t* p) {
    return _mm512_cvtepu8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void StoreCodes(void* p, Vec codes) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(codes)));
  }
  static Int LoadInt(const uint32_t* p) { return _mm512_load_si512(p); }
  static void StoreInt(uint32_t* p, Int a) { _mm512_store_si512(p, a); }
  template <int kBits>
  static Int ShiftLeft(Int a) {
    return _mm512_slli_epi32(a, kBits);
  }
  static Int AbsInt(Int a) { return _mm512_abs_epi32(a); }
  static Vec ZeroWhereZero(Vec m, Vec code) {
    return _mm512_maskz_mov_ps(
        _mm512_cmp_ps_mask(code, _mm512_setzero_ps(), _CMP_NEQ_OQ), m);
  }
  static Vec IntToFloat(Int a) { return _mm512_cvtepi32_ps(a); }
  static Vec SelectLess(Vec a, Vec b, Vec if_less, Vec otherwise) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), otherwise,
                                if_less);
  }
};

#pragma GCC pop_options

// ---- conversions, once for every width -----------------------------------

// V::kWidth elements of a kDType buffer from element i, as f32.
template <class V, int kDType>
inline typename V::Vec LoadAs(const void* data, int64_t i) {
  if constexpr (kDType == kF32) {
    return V::Load(static_cast<const float*>(data) + i);
  } else {
    const typename V::Bits bits =
        V::LoadBits(static_cast<const uint16_t*>(data) + i);
    if constexpr (kDType == kBF16) {
      // bf16 is the top half of an f32: widen and shift, exact.
      return V::AsFloat(V::ShiftLeft16(V::Widen16(bits)));
    } else {
      return V::WidenF16(bits);
    }
  }
}

// FloatToBf16Bits V::kWidth at a time: add 0x7fff plus the lowest kept bit
// and keep the top half; NaN becomes a quiet NaN with its sign.
template <class V>
inline typename V::Bits ToBf16Bits(typename V::Vec value) {
  using Int = typename V::Int;
  const Int bits = V::AsInt(value);
  const Int high = V::ShiftRight16(bits);
  const Int lsb = V::And(high, V::Splat(1));
  const Int rounded =
      V::ShiftRight16(V::Add(bits, V::Add(V::Splat(0x7fff), lsb)));
  const Int quiet_nan = V::Or(high, V::Splat(0x40));
  return V::Narrow16(V::SelectNan(value, rounded, quiet_nan));
}

// V::kWidth elements into a kDType buffer from element i (nothing for
// kNoOutput).
template <class V, int kDType, bool kNontemporal>
inline void StoreAs(void* data, int64_t i, typename V::Vec value) {
  if constexpr (kDType == kF32) {
    V::template StoreOut<kNontemporal>(static_cast<float*>(data) + i, value);
  } else if constexpr (kDType == kBF16) {
    V::template StoreBits<kNontemporal>(static_cast<uint16_t*>(data) + i,
                                        ToBf16Bits<V>(value));
  } else if constexpr (kDType == kF16) {
    V::template StoreBits<kNontemporal>(static_cast<uint16_t*>(data) + i,
                                        V::NarrowF16(value));
  } else if constexpr (kDType == kBF16Away) {
    V::template StoreBits<kNontemporal>(
        static_cast<uint16_t*>(data) + i,
        V::Narrow16(
            V::ShiftRight16(V::Add(V::AsInt(value), V::Splat(0x8000)))));
  }
}

// The master weights [i, i + V::kWidth): f32, or JoinBf16Split of the split
// master's halves, V::kWidth at a time.
template <class V, int kOut>
inline typename V::Vec LoadMasterAs(const StepBuffers& b, int64_t i) {
  if constexpr (kOut == kSplit) {
    using Int = typename V::Int;
    const Int hi =
        V::Widen16(V::LoadBits(static_cast<const uint16_t*>(b.out) + i));
    const Int lo = V::Widen16(V::LoadBits(b.master_lo + i));
    const Int carry = V::And(lo, V::Splat(0x8000));
    return V::AsFloat(
        V::Sub(V::Or(V::ShiftLeft16(hi), lo), V::Add(carry, carry)));
  } else {
    return V::Load(b.master + i);
  }
}

// The updated master weights [i, i + V::kWidth) and the model weights: f32
// and `out` rounded to kOut, or the split's two halves.
template <class V, int kOut, bool kNontemporal>
inline void StoreMasterAs(const StepBuffers& b, int64_t i,
                          typename V::Vec value) {
  if constexpr (kOut == kSplit) {
    const typename V::Int bits = V::AsInt(value);
    V::template StoreBits<false>(
        static_cast<uint16_t*>(b.out) + i,
        V::Narrow16(V::ShiftRight16(V::Add(bits, V::Splat(0x8000)))));
    V::template StoreBits<false>(b.master_lo + i,
                                 V::Narrow16(V::And(bits, V::Splat(0xffff))));
  } else {
    V::Store(b.master + i, value);
    StoreAs<V, kOut, kNontemporal>(b.out, i, value);
  }
}

// ---- compressed moments, once for every width ----------------------------

// Moments [i, i + V::kWidth) as f32 (f32 or bf16 storage).
template <class V, int kMoments>
inline typename V::Vec LoadMomentAs(const void* state, int64_t i) {
  if constexpr (kMoments == kMomF32) {
    return V::Load(static_cast<const float*>(state) + i);
  } else {
    return LoadAs<V, kBF16>(state, i);
  }
}

// RoundingNoise(key, first + lane) for every lane (32-bit wrap-around).
template <class V>
inline typename V::Int RoundingNoiseAs(uint32_t key, int64_t first) {
  using Int = typename V::Int;
  Int x =
      V::Xor(V::Add(V::Splat(static_cast<int>(static_cast<uint32_t>(first))),
                    V::Iota()),
             V::Splat(static_cast<int>(key)));
  x = V::Xor(x, V::template ShiftRight<16>(x));
  x = V::MulLo(x, V::Splat(0x7feb352d));
  x = V::Xor(x, V::template ShiftRight<15>(x));
  x = V::MulLo(x, V::Splat(static_cast<int>(0x846ca68bu)));
  return V::Xor(x, V::template ShiftRight<16>(x));
}

// StochasticBf16 V::kWidth at a time.
template <class V>
inline typename V::Bits ToBf16Stochastic(typename V::Vec value,
                                         typename V::Int noise) {
  using Int = typename V::Int;
  const Int bits = V::AsInt(value);
  const Int rounded = V::ShiftRight16(V::Add(bits, V::ShiftRight16(noise)));
  const Int quiet_nan = V::Or(V::ShiftRight16(bits), V::Splat(0x40));
  return V::Narrow16(V::SelectNan(value, rounded, quiet_nan));
}

template <class V, int kMoments>
inline void StoreMomentAs(void* state, int64_t i, typename V::Vec value,
                          uint32_t key, int64_t first_index) {
  if constexpr (kMoments == kMomF32) {
    V::Store(static_cast<float*>(state) + i, value);
  } else if constexpr (kMoments == kMomBf16) {
    V::template StoreBits<false>(static_cast<uint16_t*>(state) + i,
                                 ToBf16Bits<V>(value));
  } else {
    V::template StoreBits<false>(
        static_cast<uint16_t*>(state) + i,
        ToBf16Stochastic<V>(value, RoundingNoiseAs<V>(key, first_index + i)));
  }
}

// The per-step coefficients broadcast, and the Adam and SGD updates of
// V::kWidth elements in the header comment's order of fused operations.
template <class V>
struct Coefficients {
  using Vec = typename V::Vec;
  explicit Coefficients(const StepCoefficients& c)
      : grad_scale(V::Set1(c.grad_scale)),
        l2(V::Set1(c.l2)),
        beta1(V::Set1(c.beta1)),
        one_minus_beta1(V::Set1(c.one_minus_beta1)),
        beta2(V::Set1(c.beta2)),
        one_minus_beta2(V::Set1(c.one_minus_beta2)),
        eps(V::Set1(c.eps)),
        inv_sqrt_bc2(V::Set1(c.inv_sqrt_bias_correction2)),
        decay(V::Set1(c.decay_factor)),
        momentum(V::Set1(c.momentum)),
        one_minus_dampening(V::Set1(c.one_minus_dampening)),
        neg_step(V::Set1(c.neg_step_size)) {}
  // p, m and v updated from the unscaled gradient.
  void Adam(Vec grad, Vec& p, Vec& m, Vec& v) const {
    Vec g = V::Mul(grad, grad_scale);
    g = V::Fmadd(l2, p, g);
    m = V::Fmadd(beta1, m, V::Mul(one_minus_beta1, g));
    v = V::Fmadd(beta2, v, V::Mul(V::Mul(one_minus_beta2, g), g));
    const Vec denom = V::Fmadd(V::Sqrt(v), inv_sqrt_bc2, eps);
    p = V::Mul(p, decay);
    p = V::Fmadd(neg_step, V::Div(m, denom), p);
  }
  Vec grad_scale, l2, beta1, one_minus_beta1, beta2, one_minus_beta2, eps,
      inv_sqrt_bc2, decay, momentum, one_minus_dampening, neg_step;
};

// The largest lane of `lanes` (order-free for the finite values it is
// given, so it equals the scalar running MomentMax).
template <class V>
inline float LargestLane(typename V::Vec lanes) {
  alignas(64) float values[V::kWidth];
  V::Store(values, lanes);
  float largest = 0.0f;
  for (int k = 0; k < V::kWidth; ++k) largest = MomentMax(values[k], largest);
  return largest;
}

// moment_codec.h's GridCodeStochastic V::kWidth at a time, from each
// lane's magnitude, its grid index `index` (as a float: exact, indices are
// under 2^12) and its noise16 (as a float), given the block's top index
// and lowest point: the same operations (the code levels - (top - index)
// as index + (levels - top), exact in small integers; the products exact).
template <class V>
inline typename V::Vec GridCodeAs(typename V::Vec magnitude,
                                  typename V::Vec index,
                                  typename V::Vec noise16, uint32_t top_index,
                                  float lowest, MomentGrid grid) {
  using Vec = typename V::Vec;
  const Vec one = V::Set1(1.0f);
  const Vec zero = V::Set1(0.0f);
  const Vec in_range =
      V::ZeroWhereZero(V::Fmadd(index, one,
                                V::Set1(static_cast<float>(grid.levels) -
                                        static_cast<float>(top_index))),
                       index);
  const Vec low = V::Set1(lowest);
  const Vec under = V::SelectLess(
      V::Mul(noise16, low), V::Mul(magnitude, V::Set1(0x1p16f)), one, zero);
  return V::SelectLess(magnitude, low, under, in_range);
}

// The grid indices of V::kWidth magnitudes rounded with noise16 (integer
// lanes in [0, 2^16)), as floats.
template <class V, int kShift>
inline typename V::Vec GridIndexAs(typename V::Vec magnitude,
                                   typename V::Int noise16) {
  return V::IntToFloat(V::template ShiftRight<kShift>(V::Add(
      V::AsInt(magnitude), V::template ShiftLeft<kShift - 16>(noise16))));
}

// EncodeBlock8Stochastic over n (a multiple of V::kWidth) elements,
// V::kWidth at a time: the same operations per element. Each element's
// hash is computed once and kept for the later passes; so are the grid
// indices, which the block's top must see whole before any code.
template <class V>
inline void EncodeBlock8As(float* m, const float* v, int64_t n, int8_t* m_codes,
                           uint8_t* v_codes, float* m_top, float* v_top,
                           uint32_t key, int64_t first) {
  using Vec = typename V::Vec;
  using Int = typename V::Int;
  static_assert(kVGrid.shift == 20 && kMGrid.shift == 21,
                "GridIndexAs's shifts are moment_codec.h's grids");
  alignas(64) uint32_t noise[kMomentBlock];
  alignas(64) float index[kMomentBlock];
  const Int low_half = V::Splat(0xffff);
  const Int sign_off = V::Splat(0x7fffffff);
  Vec largest = V::Set1(0.0f);
  for (int64_t j = 0; j < n; j += V::kWidth) {
    const Int hash = RoundingNoiseAs<V>(key, first + j);
    V::StoreInt(noise + j, hash);
    const Vec at =
        GridIndexAs<V, 20>(V::Load(v + j), V::template ShiftRight<16>(hash));
    V::Store(index + j, at);
    largest = V::Max(at, largest);
  }
  uint32_t top_index = static_cast<uint32_t>(LargestLane<V>(largest));
  *v_top = GridTop(top_index, kVGrid);
  float lowest = GridLowest(*v_top, kVGrid);
  largest = V::Set1(0.0f);
  for (int64_t j = 0; j < n; j += V::kWidth) {
    const Int hash = V::LoadInt(noise + j);
    const Vec code =
        GridCodeAs<V>(V::Load(v + j), V::Load(index + j),
                      V::IntToFloat(V::template ShiftRight<16>(hash)),
                      top_index, lowest, kVGrid);
    V::StoreCodes(v_codes + j, code);
    const Vec kept = V::ZeroWhereZero(V::Load(m + j), code);
    V::Store(m + j, kept);
    const Vec at = GridIndexAs<V, 21>(
        V::AsFloat(V::And(V::AsInt(kept), sign_off)), V::And(hash, low_half));
    V::Store(index + j, at);
    largest = V::Max(at, largest);
  }
  top_index = static_cast<uint32_t>(LargestLane<V>(largest));
  *m_top = GridTop(top_index, kMGrid);
  lowest = GridLowest(*m_top, kMGrid);
  const Int sign_on = V::Splat(static_cast<int>(0x80000000u));
  for (int64_t j = 0; j < n; j += V::kWidth) {
    const Vec value = V::Load(m + j);
    const Vec magnitude = GridCodeAs<V>(
        V::AsFloat(V::And(V::AsInt(value), sign_off)), V::Load(index + j),
        V::IntToFloat(V::And(V::LoadInt(noise + j), low_half)), top_index,
        lowest, kMGrid);
    // sign(m) on the code (-0 for a negative m of code 0 truncates to 0).
    V::StoreCodes(m_codes + j,
                  V::AsFloat(V::Or(V::AsInt(magnitude),
                                   V::And(V::AsInt(value), sign_on))));
  }
}

// ---- the vector loop, once for every width -------------------------------

// One optimizer step over b.count elements, V::kWidth at a time with V's
// operations, the rest element by element. Adam's and SGD's element
// updates are the header comment's sequences, in that order of fused
// operations; the broadcasts the other optimizer would need are dead code
// the compiler drops. Not compiled on its own (its vectors need V's
// target): each path's Step flattens it into itself.
template <class V, int kGrad, int kOut, bool kNontemporal, bool kSgd,
          int kMoments>
inline void VectorStep(const StepCoefficients& c, const StepBuffers& b,
                       const KernelTuning& t) {
  using Vec = typename V::Vec;
  const Coefficients<V> k(c);
  int64_t i = 0;
  for (; i + V::kWidth <= b.count; i += V::kWidth) {
    V::template Prefetch<kGrad>(b, i, t.prefetch_elements);
    Vec p = LoadMasterAs<V, kOut>(b, i);
    const Vec grad = LoadAs<V, kGrad>(b.grads, i);
    if constexpr (kSgd) {
      Vec g = V::Mul(grad, k.grad_scale);
      g = V::Fmadd(k.l2, p, g);
      if (c.has_momentum_buffer) {
        float* state = static_cast<float*>(b.state0);
        const Vec buf = c.first_step
                            ? g
                            : V::Fmadd(k.momentum, V::Load(state + i),
                                       V::Mul(k.one_minus_dampening, g));
        V::Store(state + i, buf);
        g = c.nesterov ? V::Fmadd(k.momentum, buf, g) : buf;
      }
      p = V::Fmadd(k.neg_step, g, p);
    } else {
      Vec m = LoadMomentAs<V, kMoments>(b.state0, i);
      Vec v = LoadMomentAs<V, kMoments>(b.state1, i);
      k.Adam(grad, p, m, v);
      StoreMomentAs<V, kMoments>(b.state0, i, m, c.round_key_m, b.first_index);
      StoreMomentAs<V, kMoments>(b.state1, i, v, c.round_key_v, b.first_index);
    }
    StoreMasterAs<V, kOut, kNontemporal>(b, i, p);
  }
  for (; i < b.count; ++i) StepElement<kGrad, kOut, kSgd, kMoments>(c, b, i);
  V::template Fence<kNontemporal>();
}

// Adam over 8-bit moments (b.first_index a multiple of kMomentBlock), block
// by block: decode, update and keep the new f32 moments of the block
// (V::kWidth at a time, the rest element by element), then encode them
// (EncodeBlock8Stochastic; its vector form for whole vectors). V is Scalar (no
// vectors) or an Ops table.
template <class V, int kGrad, int kOut>
inline void Block8Step(const StepCoefficients& c, const StepBuffers& b) {
  alignas(64) float m_new[kMomentBlock];
  alignas(64) float v_new[kMomentBlock];
  int8_t* m_codes = static_cast<int8_t*>(b.state0);
  uint8_t* v_codes = static_cast<uint8_t*>(b.state1);
  for (int64_t start = 0; start < b.count; start += kMomentBlock) {
    const int64_t n = std::min<int64_t>(kMomentBlock, b.count - start);
    const int64_t block = start / kMomentBlock;
    const float m_top = b.step0[block];
    const float v_top = b.step1[block];
    int64_t j = 0;
    const bool whole_vectors = n % V::kWidth == 0;
    if constexpr (V::kWidth > 1) {
      using Vec = typename V::Vec;
      const Coefficients<V> k(c);
      // Decoding is integer arithmetic on the bits (moment_codec.h's
      // GridValue): the point `levels - code` below the block's top.
      const typename V::Int m_base =
          V::Splat(static_cast<int>(GridTopIndex(m_top, kMGrid)) -
                   static_cast<int>(kMGrid.levels));
      const typename V::Int v_base =
          V::Splat(static_cast<int>(GridTopIndex(v_top, kVGrid)) -
                   static_cast<int>(kVGrid.levels));
      const typename V::Int sign_on = V::Splat(static_cast<int>(0x80000000u));
      for (; j + V::kWidth <= n; j += V::kWidth) {
        const int64_t i = start + j;
        Vec p = LoadMasterAs<V, kOut>(b, i);
        const typename V::Int q = V::LoadI8(m_codes + i);
        Vec m = V::ZeroWhereZero(
            V::AsFloat(
                V::Or(V::template ShiftLeft<21>(V::Add(V::AbsInt(q), m_base)),
                      V::And(q, sign_on))),
            V::IntToFloat(q));
        const typename V::Int c = V::LoadU8(v_codes + i);
        Vec v = V::ZeroWhereZero(
            V::AsFloat(V::template ShiftLeft<20>(V::Add(c, v_base))),
            V::IntToFloat(c));
        k.Adam(LoadAs<V, kGrad>(b.grads, i), p, m, v);
        V::Store(m_new + j, m);
        V::Store(v_new + j, v);
        StoreMasterAs<V, kOut, false>(b, i, p);
      }
    }
    for (; j < n; ++j) {
      Block8Element<kGrad, kOut>(c, b, start + j, m_top, v_top, m_new + j,
                                 v_new + j);
    }
    if constexpr (V::kWidth > 1) {
      if (whole_vectors) {
        EncodeBlock8As<V>(m_new, v_new, n, m_codes + start, v_codes + start,
                          b.step0 + block, b.step1 + block, c.round_key_m,
                          b.first_index + start);
        continue;
      }
    }
    EncodeBlock8Stochastic(m_new, v_new, n, m_codes + start, v_codes + start,
                           b.step0 + block, b.step1 + block, c.round_key_m,
                           b.first_index + start);
  }
}

template <int kGrad, int kOut>
void Scalar::Step8(const StepCoefficients& c, const StepBuffers& b,
                   const KernelTuning&) {
  Block8Step<Scalar, kGrad, kOut>(c, b);
}

struct Avx2 {
  template <int kGrad, int kOut, bool kNontemporal, bool kSgd, int kMoments>
  __attribute__((flatten)) static void Step(const StepCoefficients& c,
                                            const StepBuffers& b,
                                            const KernelTuning& t) {
    VectorStep<Avx2Ops, kGrad, kOut, kNontemporal, kSgd, kMoments>(c, b, t);
  }
  template <int kGrad, int kOut>
  __attribute__((flatten)) static void Step8(const StepCoefficients& c,
                                             const StepBuffers& b,
                                             const KernelTuning&) {
    Block8Step<Avx2Ops, kGrad, kOut>(c, b);
  }
};

struct Avx512 {
  template <int kGrad, int kOut, bool kNontemporal, bool kSgd, int kMoments>
  __attribute__((target("avx512f"), flatten)) static void Step(
      const StepCoefficients& c, const StepBuffers& b, const KernelTuning& t) {
    VectorStep<Avx512Ops, kGrad, kOut, kNontemporal, kSgd, kMoments>(c, b, t);
  }
  template <int kGrad, int kOut>
  __attribute__((target("avx512f"), flatten)) static void Step8(
      const StepCoefficients& c, const StepBuffers& b, const KernelTuning&) {
    Block8Step<Avx512Ops, kGrad, kOut>(c, b);
  }
};

// ---- dispatch on optimizer and dtypes -----------------------------------

template <class Isa, int kGrad, int kOut, bool kNontemporal>
void RunKind(const StepCoefficients& c, const StepBuffers& b,
             const KernelTuning& t) {
  if (c.is_sgd) {
    return Isa::template Step<kGrad, kOut, kNontemporal, true, kMomF32>(c, b,
                                                                        t);
  }
  switch (b.moment_format) {
    case MomentFormat::kBlockwise8:
      return Isa::template Step8<kGrad, kOut>(c, b, t);
    case MomentFormat::kBf16:
      if (c.stochastic_rounding) {
        return Isa::template Step<kGrad, kOut, kNontemporal, false,
                                  kMomBf16Stochastic>(c, b, t);
      }
      return Isa::template Step<kGrad, kOut, kNontemporal, false, kMomBf16>(
          c, b, t);
    case MomentFormat::kF32:
      break;
  }
  Isa::template Step<kGrad, kOut, kNontemporal, false, kMomF32>(c, b, t);
}

template <class Isa, int kGrad, bool kNontemporal>
void RunOut(const StepCoefficients& c, const StepBuffers& b,
            const KernelTuning& t) {
  if (b.master_lo != nullptr)
    return RunKind<Isa, kGrad, kSplit, false>(c, b, t);
  if (b.out == nullptr) return RunKind<Isa, kGrad, kNoOutput, false>(c, b, t);
  switch (b.out_dtype) {
    case DType::kBF16:
      if (b.bf16_ties_away) {
        return RunKind<Isa, kGrad, kBF16Away, kNontemporal>(c, b, t);
      }
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
  RunGrad<Avx512, true>(c, SliceStepBuffers(b, peel, b.count - peel), t);
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
      // A split master's hi is read as well as written: never streamed;
      // 8-bit blocks must not be cut by the peel.
      if (tuning.nontemporal_out && buffers.out != nullptr &&
          buffers.master_lo == nullptr &&
          buffers.moment_format != MomentFormat::kBlockwise8) {
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
