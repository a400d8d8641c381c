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

template <int kGrad, int kOut>
inline void AdamElement(const StepCoefficients& c, const StepBuffers& b,
                        int64_t i) {
  float p = LoadMaster1<kOut>(b, i);
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
  StoreMaster1<kOut>(b, i, p);
}

template <int kGrad, int kOut>
inline void SgdElement(const StepCoefficients& c, const StepBuffers& b,
                       int64_t i) {
  float p = LoadMaster1<kOut>(b, i);
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
  StoreMaster1<kOut>(b, i, p);
}

// Element i of either optimizer: the scalar path, and every vector path's
// tail.
template <int kGrad, int kOut, bool kSgd>
inline void StepElement(const StepCoefficients& c, const StepBuffers& b,
                        int64_t i) {
  if constexpr (kSgd) {
    SgdElement<kGrad, kOut>(c, b, i);
  } else {
    AdamElement<kGrad, kOut>(c, b, i);
  }
}

// Every path's Step takes the tuning and a non-temporal flag; only AVX-512
// acts on them.
struct Scalar {
  template <int kGrad, int kOut, bool kNontemporal, bool kSgd>
  static void Step(const StepCoefficients& c, const StepBuffers& b,
                   const KernelTuning&) {
    for (int64_t i = 0; i < b.count; ++i)
      StepElement<kGrad, kOut, kSgd>(c, b, i);
  }
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
  if (b.state0 != nullptr) {
    _mm_prefetch(reinterpret_cast<const char*>(b.state0 + j), _MM_HINT_T0);
  }
  if (b.state1 != nullptr) {
    _mm_prefetch(reinterpret_cast<const char*>(b.state1 + j), _MM_HINT_T0);
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

// ---- the vector loop, once for every width -------------------------------

// One optimizer step over b.count elements, V::kWidth at a time with V's
// operations, the rest element by element. Adam's and SGD's element
// updates are the header comment's sequences, in that order of fused
// operations; the broadcasts the other optimizer would need are dead code
// the compiler drops. Not compiled on its own (its vectors need V's
// target): each path's Step flattens it into itself.
template <class V, int kGrad, int kOut, bool kNontemporal, bool kSgd>
inline void VectorStep(const StepCoefficients& c, const StepBuffers& b,
                       const KernelTuning& t) {
  using Vec = typename V::Vec;
  const Vec grad_scale = V::Set1(c.grad_scale);
  const Vec l2 = V::Set1(c.l2);
  const Vec beta1 = V::Set1(c.beta1);
  const Vec one_minus_beta1 = V::Set1(c.one_minus_beta1);
  const Vec beta2 = V::Set1(c.beta2);
  const Vec one_minus_beta2 = V::Set1(c.one_minus_beta2);
  const Vec eps = V::Set1(c.eps);
  const Vec inv_sqrt_bc2 = V::Set1(c.inv_sqrt_bias_correction2);
  const Vec decay = V::Set1(c.decay_factor);
  const Vec momentum = V::Set1(c.momentum);
  const Vec one_minus_dampening = V::Set1(c.one_minus_dampening);
  const Vec neg_step = V::Set1(c.neg_step_size);
  int64_t i = 0;
  for (; i + V::kWidth <= b.count; i += V::kWidth) {
    V::template Prefetch<kGrad>(b, i, t.prefetch_elements);
    Vec p = LoadMasterAs<V, kOut>(b, i);
    Vec g = V::Mul(LoadAs<V, kGrad>(b.grads, i), grad_scale);
    g = V::Fmadd(l2, p, g);
    if constexpr (kSgd) {
      if (c.has_momentum_buffer) {
        const Vec buf = c.first_step ? g
                                     : V::Fmadd(momentum, V::Load(b.state0 + i),
                                                V::Mul(one_minus_dampening, g));
        V::Store(b.state0 + i, buf);
        g = c.nesterov ? V::Fmadd(momentum, buf, g) : buf;
      }
      p = V::Fmadd(neg_step, g, p);
    } else {
      Vec m = V::Load(b.state0 + i);
      Vec v = V::Load(b.state1 + i);
      m = V::Fmadd(beta1, m, V::Mul(one_minus_beta1, g));
      v = V::Fmadd(beta2, v, V::Mul(V::Mul(one_minus_beta2, g), g));
      const Vec denom = V::Fmadd(V::Sqrt(v), inv_sqrt_bc2, eps);
      p = V::Mul(p, decay);
      p = V::Fmadd(neg_step, V::Div(m, denom), p);
      V::Store(b.state0 + i, m);
      V::Store(b.state1 + i, v);
    }
    StoreMasterAs<V, kOut, kNontemporal>(b, i, p);
  }
  for (; i < b.count; ++i) StepElement<kGrad, kOut, kSgd>(c, b, i);
  V::template Fence<kNontemporal>();
}

struct Avx2 {
  template <int kGrad, int kOut, bool kNontemporal, bool kSgd>
  __attribute__((flatten)) static void Step(const StepCoefficients& c,
                                            const StepBuffers& b,
                                            const KernelTuning& t) {
    VectorStep<Avx2Ops, kGrad, kOut, kNontemporal, kSgd>(c, b, t);
  }
};

struct Avx512 {
  template <int kGrad, int kOut, bool kNontemporal, bool kSgd>
  __attribute__((target("avx512f"), flatten)) static void Step(
      const StepCoefficients& c, const StepBuffers& b, const KernelTuning& t) {
    VectorStep<Avx512Ops, kGrad, kOut, kNontemporal, kSgd>(c, b, t);
  }
};

// ---- dispatch on optimizer and dtypes -----------------------------------

template <class Isa, int kGrad, int kOut, bool kNontemporal>
void RunKind(const StepCoefficients& c, const StepBuffers& b,
             const KernelTuning& t) {
  if (c.is_sgd) {
    Isa::template Step<kGrad, kOut, kNontemporal, true>(c, b, t);
  } else {
    Isa::template Step<kGrad, kOut, kNontemporal, false>(c, b, t);
  }
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
      // A split master's hi is read as well as written: never streamed.
      if (tuning.nontemporal_out && buffers.out != nullptr &&
          buffers.master_lo == nullptr) {
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
