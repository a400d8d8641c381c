// The decoder's CUDA ops (nn/functional.h, "Decoder" section; kernels in
// nn/cuda/decoder_kernels.h) against the CPU ops on the same inputs: every
// output and gradient, in f32 (tight) and bf16 / f16 (storage rounding).
// Inputs are rounded to the storage dtype first and the CPU reference runs
// in f32 on exactly those values. Shapes are awkward on purpose: odd T, T
// not a multiple of the 16-row attention tiles, rows not a multiple of the
// column-sum chunks, group sizes 1, 2 and 4, head sizes 64 and 128 (and 40,
// 6), KV-cache rows with nonzero starts. Tagged gpu: runs on the GPU
// machine.
//
// Each check prints "name dtype max_abs_err max_ref" and passes when
// max_abs_err <= tol(dtype) * max(max |ref|, 1e-3).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/device.h"
#include "core/ops.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "nn/cuda/functional_cuda_testing.h"
#include "nn/functional.h"

namespace ze {
namespace nn {
namespace {

using Vec = std::vector<float>;

double Tolerance(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 1e-5;
    case DType::kF16:
      return 1e-2;
    default:
      return 2.5e-2;
  }
}

// A random input held twice: on the GPU in the test's dtype, and on the
// CPU in f32 with exactly the GPU's (rounded) values.
struct Pair {
  Tensor gpu, cpu;
};

class DecoderCudaTest : public testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    ASSERT_GT(CudaDeviceCount(), 0) << "this test needs a GPU";
    stream_ = *Stream::Create(Device::Cuda(0));
  }

  DType dtype() const { return GetParam(); }

  Pair Random(const Shape& shape, uint32_t seed, float scale = 1.0f) {
    std::mt19937 generator(seed);
    std::normal_distribution<float> normal(0.0f, scale);
    Vec values(NumElements(shape));
    for (float& v : values) v = normal(generator);
    return FromValues(values, shape);
  }

  Pair FromValues(const Vec& values, const Shape& shape) {
    Pair pair;
    pair.gpu =
        *FromHostFloats(values, shape, dtype(), Device::Cuda(0), stream_);
    pair.cpu = Cpu(Host(pair.gpu), shape);
    return pair;
  }

  // Uninitialised output pair (filled with `fill`, so a kernel that skips
  // an element shows).
  Pair Output(const Shape& shape, float fill = 0.0f) {
    return FromValues(Vec(NumElements(shape), fill), shape);
  }

  Tensor I32(const std::vector<int32_t>& values, const Device& device) {
    Tensor t = *Tensor::Empty({static_cast<int64_t>(values.size())},
                              DType::kI32, device);
    if (device.is_cuda()) {
      EXPECT_EQ(cudaMemcpy(t.data(), values.data(), values.size() * 4,
                           cudaMemcpyHostToDevice),
                cudaSuccess);
    } else {
      std::copy(values.begin(), values.end(), t.data_as<int32_t>());
    }
    return t;
  }
  std::pair<Tensor, Tensor> I32Pair(const std::vector<int32_t>& values) {
    return {I32(values, Device::Cuda(0)), I32(values, Device::Cpu())};
  }

  Tensor F32Gpu(const Vec& values, const Shape& shape) {
    return *FromHostFloats(values, shape, DType::kF32, Device::Cuda(0),
                           stream_);
  }

  Vec Host(const Tensor& t) {
    EXPECT_TRUE(stream_.Synchronize().ok());
    return *ToHostFloats(t, t.device().is_cuda() ? stream_ : Stream());
  }
  static Tensor Cpu(const Vec& values, const Shape& shape) {
    return *FromHostFloats(values, shape, DType::kF32, Device::Cpu(), Stream());
  }

  // Compares the GPU tensor with the CPU one: the largest absolute error
  // within Tolerance(dtype) * tol_scale * max(largest |reference|, scale).
  // `scale` is the magnitude of the terms the result was computed from, for
  // a result that cancels to (near) zero: there rounding is relative to the
  // terms, not to the result.
  void Check(const std::string& name, const Tensor& gpu, const Tensor& cpu,
             double tol_scale = 1.0, double scale = 1e-3) {
    Check(name, Host(gpu), *ToHostFloats(cpu, Stream()), tol_scale, gpu.dtype(),
          scale);
  }
  void Check(const std::string& name, const Vec& got, const Vec& ref,
             double tol_scale, DType dtype, double scale = 1e-3) {
    ASSERT_EQ(got.size(), ref.size()) << name;
    double max_err = 0.0, max_ref = 0.0;
    size_t worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
      if (!(err <= max_err)) {  // also catches NaN
        max_err = std::isnan(err) ? INFINITY : err;
        worst = i;
      }
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[i])));
    }
    const double bound =
        Tolerance(dtype) * tol_scale * std::max(max_ref, scale);
    std::printf("%-48s %-4s max_abs_err %.3e max_ref %.3e %s\n", name.c_str(),
                DTypeName(dtype), max_err, max_ref,
                max_err <= bound ? "ok" : "FAIL");
    EXPECT_LE(max_err, bound)
        << name << " " << DTypeName(dtype) << " worst index " << worst
        << " got " << got[worst] << " want " << ref[worst];
  }

  Stream stream_;
};

std::string Dims(const Shape& shape) { return ShapeToString(shape); }

// ------------------------------------------------------------------ RMSNorm

TEST_P(DecoderCudaTest, RmsNormMatchesCpu) {
  // 300 rows span three column-sum chunks; 40 columns take the vector
  // kernels, 13 the scalar ones; (B, T, H, D) input is Qwen3's q/k norm.
  for (const Shape& shape :
       {Shape{300, 40}, Shape{7, 13}, Shape{2, 5, 3, 64}}) {
    const int64_t channels = shape.back();
    const std::string tag = "RmsNorm " + Dims(shape);
    Pair x = Random(shape, 1, 2.0f), w = Random({channels}, 2);
    Pair dy = Random(shape, 3);
    const int64_t rows = NumElements(shape) / channels;
    Pair y = Output(shape);
    Tensor rstd_gpu = F32Gpu(Vec(rows, 0.0f), {rows});
    Tensor rstd_cpu = Cpu(Vec(rows, 0.0f), {rows});
    const float eps = 1e-6f;
    ASSERT_TRUE(
        RmsNormForward(x.gpu, w.gpu, eps, y.gpu, rstd_gpu, stream_).ok());
    ASSERT_TRUE(
        RmsNormForward(x.cpu, w.cpu, eps, y.cpu, rstd_cpu, Stream()).ok());
    Check(tag + " output", y.gpu, y.cpu);
    Check(tag + " rstd", Host(rstd_gpu), *ToHostFloats(rstd_cpu, Stream()), 1.0,
          DType::kF32);

    // grad_weight accumulates: start both from the same nonzero values.
    Pair dx = Output(shape);
    Pair dw = Random({channels}, 4);
    ASSERT_TRUE(
        RmsNormBackward(dy.gpu, x.gpu, w.gpu, rstd_gpu, dx.gpu, dw.gpu, stream_)
            .ok());
    ASSERT_TRUE(RmsNormBackward(dy.cpu, x.cpu, w.cpu, rstd_cpu, dx.cpu, dw.cpu,
                                Stream())
                    .ok());
    Check(tag + " grad_input", dx.gpu, dx.cpu);
    Check(tag + " grad_weight", dw.gpu, dw.cpu, 2.0);

    // In place (grad_input = grad_output) with an f32 grad_weight, and
    // grad_input alone.
    Pair dy2 = FromValues(Host(dy.gpu), shape);
    Tensor dw32_gpu = F32Gpu(Vec(channels, 0.5f), {channels});
    Tensor dw32_cpu = Cpu(Vec(channels, 0.5f), {channels});
    ASSERT_TRUE(RmsNormBackward(dy2.gpu, x.gpu, w.gpu, rstd_gpu, dy2.gpu,
                                dw32_gpu, stream_)
                    .ok());
    ASSERT_TRUE(RmsNormBackward(dy2.cpu, x.cpu, w.cpu, rstd_cpu, dy2.cpu,
                                dw32_cpu, Stream())
                    .ok());
    Check(tag + " grad_input in place", dy2.gpu, dy2.cpu);
    Check(tag + " grad_weight f32", Host(dw32_gpu),
          *ToHostFloats(dw32_cpu, Stream()), dtype() == DType::kF32 ? 2.0 : 1.0,
          dtype());
    Pair dx_only = Output(shape);
    ASSERT_TRUE(RmsNormBackward(dy.gpu, x.gpu, w.gpu, rstd_gpu, dx_only.gpu,
                                Tensor(), stream_)
                    .ok());
    Check(tag + " grad_input alone", dx_only.gpu, dx.cpu);
    // A residual branch's gradient added inside the kernel (one rounding;
    // the CPU adds after rounding, within the same tolerance).
    Pair addend = Random(shape, 5);
    Pair dx_sum = Output(shape);
    ASSERT_TRUE(RmsNormBackwardAdd(dy.gpu, x.gpu, w.gpu, rstd_gpu, addend.gpu,
                                   dx_sum.gpu, Tensor(), stream_)
                    .ok());
    ASSERT_TRUE(RmsNormBackwardAdd(dy.cpu, x.cpu, w.cpu, rstd_cpu, addend.cpu,
                                   dx_sum.cpu, Tensor(), Stream())
                    .ok());
    Check(tag + " grad_input + addend", dx_sum.gpu, dx_sum.cpu);
  }
}

// --------------------------------------------------------------------- RoPE

Vec InverseFrequencies(int64_t head_dim, double theta) {
  Vec inv(head_dim / 2);
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    inv[i] = static_cast<float>(
        1.0 / std::pow(theta, static_cast<double>(2 * i) / head_dim));
  }
  return inv;
}

TEST_P(DecoderCudaTest, RotaryEmbeddingMatchesCpu) {
  for (int64_t head_dim : {64, 128, 6}) {
    const Shape shape{2, 5, 3, head_dim};
    const std::string tag = "Rope D=" + std::to_string(head_dim);
    const Vec inv = InverseFrequencies(head_dim, 500000.0);
    Tensor inv_gpu = F32Gpu(inv, {head_dim / 2});
    Tensor inv_cpu = Cpu(inv, {head_dim / 2});
    // Large positions: the f32 angle and an accurate cos/sin matter.
    auto [starts_gpu, starts_cpu] = I32Pair({0, 100003});
    Pair x = Random(shape, 5);
    for (bool with_starts : {false, true}) {
      const std::string name = tag + (with_starts ? " starts" : "");
      Tensor sg = with_starts ? starts_gpu : Tensor();
      Tensor sc = with_starts ? starts_cpu : Tensor();
      Pair y = Output(shape);
      ASSERT_TRUE(
          RotaryEmbeddingForward(x.gpu, inv_gpu, sg, y.gpu, stream_).ok());
      ASSERT_TRUE(
          RotaryEmbeddingForward(x.cpu, inv_cpu, sc, y.cpu, Stream()).ok());
      Check(name + " forward", y.gpu, y.cpu, with_starts ? 4.0 : 1.0);
      Pair dx = Output(shape);
      ASSERT_TRUE(
          RotaryEmbeddingBackward(x.gpu, inv_gpu, sg, dx.gpu, stream_).ok());
      ASSERT_TRUE(
          RotaryEmbeddingBackward(x.cpu, inv_cpu, sc, dx.cpu, Stream()).ok());
      Check(name + " backward", dx.gpu, dx.cpu, with_starts ? 4.0 : 1.0);
      // In place.
      Pair inplace = FromValues(Host(x.gpu), shape);
      ASSERT_TRUE(
          RotaryEmbeddingForward(inplace.gpu, inv_gpu, sg, inplace.gpu, stream_)
              .ok());
      Check(name + " in place", inplace.gpu, y.cpu, with_starts ? 4.0 : 1.0);
    }
  }
}

// ------------------------------------------------------------------- SwiGLU

TEST_P(DecoderCudaTest, SwiGluMatchesCpu) {
  const Shape shape{3, 7, 111};  // not a multiple of any vector width
  Pair gate = Random(shape, 6, 3.0f), up = Random(shape, 7),
       dy = Random(shape, 8);
  Pair y = Output(shape);
  ASSERT_TRUE(SwiGluForward(gate.gpu, up.gpu, y.gpu, stream_).ok());
  ASSERT_TRUE(SwiGluForward(gate.cpu, up.cpu, y.cpu, Stream()).ok());
  Check("SwiGlu forward", y.gpu, y.cpu);
  Pair dgate = Output(shape), dup = Output(shape);
  ASSERT_TRUE(
      SwiGluBackward(dy.gpu, gate.gpu, up.gpu, dgate.gpu, dup.gpu, stream_)
          .ok());
  ASSERT_TRUE(
      SwiGluBackward(dy.cpu, gate.cpu, up.cpu, dgate.cpu, dup.cpu, Stream())
          .ok());
  Check("SwiGlu grad_gate", dgate.gpu, dgate.cpu);
  Check("SwiGlu grad_up", dup.gpu, dup.cpu);
  // One gradient at a time; the other stays untouched.
  Pair only_gate = Output(shape, 7.0f);
  ASSERT_TRUE(
      SwiGluBackward(dy.gpu, gate.gpu, up.gpu, only_gate.gpu, Tensor(), stream_)
          .ok());
  Check("SwiGlu grad_gate alone", only_gate.gpu, dgate.cpu);
  Pair only_up = Output(shape, 7.0f);
  ASSERT_TRUE(
      SwiGluBackward(dy.gpu, gate.gpu, up.gpu, Tensor(), only_up.gpu, stream_)
          .ok());
  Check("SwiGlu grad_up alone", only_up.gpu, dup.cpu);
  // In place (grad_gate into gate, grad_up into up): bit for bit the
  // separate buffers' values.
  Pair gate_in_place = Random(shape, 6, 3.0f), up_in_place = Random(shape, 7);
  ASSERT_TRUE(SwiGluBackward(dy.gpu, gate_in_place.gpu, up_in_place.gpu,
                             gate_in_place.gpu, up_in_place.gpu, stream_)
                  .ok());
  EXPECT_EQ(Host(gate_in_place.gpu), Host(dgate.gpu));
  EXPECT_EQ(Host(up_in_place.gpu), Host(dup.gpu));
}

// ------------------------------------------------------ Grouped attention

struct AttentionCase {
  int64_t batch, seq, q_heads, kv_heads, head_dim;
};

using cuda_backend::GroupedAttentionRoute;

// Sets SetGroupedAttentionRouteForTesting for a scope.
class ScopedRoute {
 public:
  explicit ScopedRoute(GroupedAttentionRoute route) {
    cuda_backend::SetGroupedAttentionRouteForTesting(route);
  }
  ~ScopedRoute() {
    cuda_backend::SetGroupedAttentionRouteForTesting(
        GroupedAttentionRoute::kProduction);
  }
  ScopedRoute(const ScopedRoute&) = delete;
  ScopedRoute& operator=(const ScopedRoute&) = delete;
};

bool DeviceIsHopper() {
  int device = 0, major = 0, minor = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                                device) == cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor,
                                device) == cudaSuccess &&
         major == 9 && minor == 0;
}

// Every route of bf16/f16 at D 64 and 128: the tiled kernels and the
// packed tensor-core kernels (each forced), and the production choice
// (on Hopper at D 64 the kernels that read q, k and v directly); the routes
// are counted, so a silent fallback shows.
TEST_P(DecoderCudaTest, GroupedAttentionMatchesCpu) {
  for (const GroupedAttentionRoute forced :
       {GroupedAttentionRoute::kTiled, GroupedAttentionRoute::kPacked,
        GroupedAttentionRoute::kProduction}) {
    const bool tiled_only = forced == GroupedAttentionRoute::kTiled;
    if (!tiled_only && dtype() == DType::kF32) continue;  // one route
    ScopedRoute scope(forced);
    const char* route = tiled_only                                 ? " tiled"
                        : forced == GroupedAttentionRoute::kPacked ? " packed"
                                                                   : " default";

    // Group sizes 1, 2 and 4; head sizes 64 and 128 (and 40, not a multiple
    // of 16); T odd, below, at and above the 16-row tiles.
    for (const AttentionCase& c :
         {AttentionCase{2, 7, 4, 4, 64}, AttentionCase{1, 33, 4, 2, 128},
          AttentionCase{2, 19, 8, 2, 64}, AttentionCase{1, 16, 4, 1, 128},
          AttentionCase{1, 17, 2, 1, 40}, AttentionCase{2, 1, 2, 2, 64},
          // Several 64-row tiles with groups of 4 and 2: the Hopper dK/dV
          // kernel's steps cross from one query head to the next.
          AttentionCase{2, 150, 8, 2, 64}, AttentionCase{1, 129, 4, 2, 64}}) {
      const Shape q_shape{c.batch, c.seq, c.q_heads, c.head_dim};
      const Shape kv_shape{c.batch, c.seq, c.kv_heads, c.head_dim};
      const Shape lse_shape{c.batch, c.q_heads, c.seq};
      const std::string tag = "GQA B" + std::to_string(c.batch) + " T" +
                              std::to_string(c.seq) + " Hq" +
                              std::to_string(c.q_heads) + " Hkv" +
                              std::to_string(c.kv_heads) + " D" +
                              std::to_string(c.head_dim) + route;
      const int64_t packed_before =
          cuda_backend::GroupedAttentionCallsForTesting(
              GroupedAttentionRoute::kPacked);
      const int64_t direct_before =
          cuda_backend::GroupedAttentionCallsForTesting(
              GroupedAttentionRoute::kProduction);
      Pair q = Random(q_shape, 11), k = Random(kv_shape, 12),
           v = Random(kv_shape, 13), dout = Random(q_shape, 14);
      Pair out = Output(q_shape);
      Tensor lse_gpu = F32Gpu(Vec(NumElements(lse_shape)), lse_shape);
      Tensor lse_cpu = Cpu(Vec(NumElements(lse_shape)), lse_shape);
      ASSERT_TRUE(GroupedAttentionForward(q.gpu, k.gpu, v.gpu, out.gpu, lse_gpu,
                                          stream_)
                      .ok());
      ASSERT_TRUE(GroupedAttentionForward(q.cpu, k.cpu, v.cpu, out.cpu, lse_cpu,
                                          Stream())
                      .ok());
      const bool direct = forced == GroupedAttentionRoute::kProduction &&
                          c.head_dim == 64 && DeviceIsHopper();
      const bool packed =
          !tiled_only && !direct && (c.head_dim == 64 || c.head_dim == 128);
      EXPECT_EQ(cuda_backend::GroupedAttentionCallsForTesting(
                    GroupedAttentionRoute::kPacked) -
                    packed_before,
                packed ? 1 : 0)
          << tag;
      EXPECT_EQ(cuda_backend::GroupedAttentionCallsForTesting(
                    GroupedAttentionRoute::kProduction) -
                    direct_before,
                direct ? 1 : 0)
          << tag;
      Check(tag + " output", out.gpu, out.cpu);
      // logsumexp is f32 from the same (rounded) inputs on both sides.
      Check(tag + " logsumexp", Host(lse_gpu), *ToHostFloats(lse_cpu, Stream()),
            2.0, DType::kF32);

      Pair dq = Output(q_shape, 9.0f), dk = Output(kv_shape, 9.0f),
           dv = Output(kv_shape, 9.0f);
      ASSERT_TRUE(GroupedAttentionBackward(dout.gpu, q.gpu, k.gpu, v.gpu,
                                           out.gpu, lse_gpu, dq.gpu, dk.gpu,
                                           dv.gpu, stream_)
                      .ok());
      ASSERT_TRUE(GroupedAttentionBackward(dout.cpu, q.cpu, k.cpu, v.cpu,
                                           out.cpu, lse_cpu, dq.cpu, dk.cpu,
                                           dv.cpu, Stream())
                      .ok());
      // Gradients sum many rounded terms: a little more room in 16 bits.
      const double grad_tol = dtype() == DType::kF32 ? 2.0 : 1.5;
      // grad_q and grad_k come from dS = P (dO.V - rowsum(dO * O)), a
      // difference of terms of the size of grad_v (dO weighted by P); at
      // T = 1 it is exactly zero (softmax of one score), so both sides
      // return rounding noise of that size, not of their own ~0 size.
      const Vec dv_ref = *ToHostFloats(dv.cpu, Stream());
      double dv_scale = 0.0;
      for (float x : dv_ref)
        dv_scale = std::max(dv_scale, std::fabs(double{x}));
      Check(tag + " grad_q", dq.gpu, dq.cpu, grad_tol, dv_scale);
      Check(tag + " grad_k", dk.gpu, dk.cpu, grad_tol, dv_scale);
      Check(tag + " grad_v", dv.gpu, dv.cpu, grad_tol);

      // Deterministic: a second backward gives the same bits.
      Pair dq2 = Output(q_shape), dk2 = Output(kv_shape),
           dv2 = Output(kv_shape);
      ASSERT_TRUE(GroupedAttentionBackward(dout.gpu, q.gpu, k.gpu, v.gpu,
                                           out.gpu, lse_gpu, dq2.gpu, dk2.gpu,
                                           dv2.gpu, stream_)
                      .ok());
      EXPECT_EQ(Host(dk2.gpu), Host(dk.gpu)) << tag;
      EXPECT_EQ(Host(dv2.gpu), Host(dv.gpu)) << tag;
      EXPECT_EQ(Host(dq2.gpu), Host(dq.gpu)) << tag;
    }
  }
}

// ----------------------------------------------------------------- KV cache

TEST_P(DecoderCudaTest, GroupedKvCacheMatchesCpu) {
  // Two sequences in rows 2 and 0 of a 3-row cache, group size 2 and 4.
  for (const int64_t kv_heads : {2, 1}) {
    for (const int64_t head_dim : {64, 128}) {
      const int64_t q_heads = 4, capacity = 24, batch = 3;
      const std::string tag = "KvCache Hkv" + std::to_string(kv_heads) + " D" +
                              std::to_string(head_dim);
      const Shape cache_shape{batch, kv_heads, capacity, head_dim};
      Pair key_cache = Random(cache_shape, 20),
           value_cache = Random(cache_shape, 21);
      auto [rows_gpu, rows_cpu] = I32Pair({2, 0});
      // Prefill of 5 tokens at position 3 and 0, then one decode step at 8
      // and 5.
      for (const auto& [seq, starts] :
           {std::pair<int64_t, std::vector<int32_t>>{5, {3, 0}}, {1, {8, 5}}}) {
        const std::string step = tag + " T" + std::to_string(seq);
        auto [starts_gpu, starts_cpu] = I32Pair(starts);
        Pair k = Random({2, seq, kv_heads, head_dim}, 22 + seq);
        Pair v = Random({2, seq, kv_heads, head_dim}, 23 + seq);
        Pair q = Random({2, seq, q_heads, head_dim}, 24 + seq);
        ASSERT_TRUE(GroupedKvCacheWrite(k.gpu, v.gpu, rows_gpu, starts_gpu,
                                        key_cache.gpu, value_cache.gpu, stream_)
                        .ok());
        ASSERT_TRUE(GroupedKvCacheWrite(k.cpu, v.cpu, rows_cpu, starts_cpu,
                                        key_cache.cpu, value_cache.cpu,
                                        Stream())
                        .ok());
        // The caches hold the same values: an exact copy.
        EXPECT_EQ(Host(key_cache.gpu), *ToHostFloats(key_cache.cpu, Stream()))
            << step;
        EXPECT_EQ(Host(value_cache.gpu),
                  *ToHostFloats(value_cache.cpu, Stream()))
            << step;
        Pair out = Output({2, seq, q_heads, head_dim});
        ASSERT_TRUE(GroupedCachedAttentionForward(
                        q.gpu, rows_gpu, starts_gpu, key_cache.gpu,
                        value_cache.gpu, out.gpu, stream_)
                        .ok());
        ASSERT_TRUE(GroupedCachedAttentionForward(
                        q.cpu, rows_cpu, starts_cpu, key_cache.cpu,
                        value_cache.cpu, out.cpu, Stream())
                        .ok());
        Check(step + " attention", out.gpu, out.cpu);
      }
    }
  }
}

TEST_P(DecoderCudaTest, GroupedKvCacheSkipsEntriesOutsideTheCache) {
  // CUDA does not read rows/starts back (nn/functional.h): entry 1 (row 5
  // of a 2-row cache) and entry 2 (start past the capacity) are skipped,
  // their caches and output rows untouched; entry 0 is done.
  const Shape cache_shape{2, 1, 8, 64};
  Pair key_cache = Output(cache_shape, 3.0f),
       value_cache = Output(cache_shape, 3.0f);
  auto [rows_gpu, rows_cpu] = I32Pair({1, 5, 0});
  auto [starts_gpu, starts_cpu] = I32Pair({2, 0, 7});
  Pair k = Random({3, 2, 1, 64}, 30), v = Random({3, 2, 1, 64}, 31);
  Pair q = Random({3, 2, 2, 64}, 32);
  ASSERT_TRUE(GroupedKvCacheWrite(k.gpu, v.gpu, rows_gpu, starts_gpu,
                                  key_cache.gpu, value_cache.gpu, stream_)
                  .ok());
  Pair out = Output({3, 2, 2, 64}, -5.0f);
  ASSERT_TRUE(GroupedCachedAttentionForward(q.gpu, rows_gpu, starts_gpu,
                                            key_cache.gpu, value_cache.gpu,
                                            out.gpu, stream_)
                  .ok());
  const Vec cache = Host(key_cache.gpu);
  const Vec keys = Host(k.gpu);
  // Row 0 untouched (entry 2 skipped); row 1 positions 2, 3 written.
  for (int64_t i = 0; i < 8 * 64; ++i) ASSERT_EQ(cache[i], 3.0f) << i;
  for (int64_t i = 0; i < 2 * 64; ++i) {
    EXPECT_EQ(cache[8 * 64 + 2 * 64 + i], keys[i]) << i;
  }
  const Vec o = Host(out.gpu);
  const int64_t entry = 2 * 2 * 64;
  for (int64_t i = entry; i < 3 * entry; ++i) ASSERT_EQ(o[i], -5.0f) << i;
  for (int64_t i = 0; i < entry; ++i) ASSERT_NE(o[i], -5.0f) << i;
}

// ------------------------------------------------------------------- Errors

TEST_P(DecoderCudaTest, RefusesWhatTheKernelsCannotDo) {
  // Mixed dtypes (allowed on the CPU) are refused on CUDA, naming the op.
  const DType other = dtype() == DType::kF32 ? DType::kBF16 : DType::kF32;
  Pair x = Random({4, 8}, 40);
  Tensor w_other = *Tensor::Zeros({8}, other, Device::Cuda(0));
  Tensor rstd = F32Gpu(Vec(4), {4});
  absl::Status status =
      RmsNormForward(x.gpu, w_other, 1e-6f, x.gpu, rstd, stream_);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("RmsNormForward"), std::string::npos)
      << status;

  // Head size 288 > 256: Unimplemented for both attention paths.
  Pair q = Random({1, 3, 2, 288}, 41), k = Random({1, 3, 1, 288}, 42);
  Tensor lse = F32Gpu(Vec(6), {1, 2, 3});
  Pair out = Output({1, 3, 2, 288});
  status = GroupedAttentionForward(q.gpu, k.gpu, k.gpu, out.gpu, lse, stream_);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << status;
  EXPECT_NE(status.message().find("GroupedAttentionForward"), std::string::npos)
      << status;
  Pair cache = Output({1, 1, 4, 288});
  auto [rows, rows_cpu] = I32Pair({0});
  status = GroupedCachedAttentionForward(q.gpu, rows, rows, cache.gpu,
                                         Output({1, 1, 4, 288}).gpu, out.gpu,
                                         stream_);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << status;

  // The shared checks of nn/functional.cc hold on CUDA too: odd D for RoPE,
  // Hkv not dividing Hq.
  Pair odd = Random({1, 2, 1, 5}, 43);
  Tensor inv = F32Gpu(Vec(2, 1.0f), {2});
  status = RotaryEmbeddingForward(odd.gpu, inv, Tensor(), odd.gpu, stream_);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  Pair q3 = Random({1, 4, 3, 64}, 44), k2 = Random({1, 4, 2, 64}, 45);
  Tensor lse3 = F32Gpu(Vec(12), {1, 3, 4});
  Pair out3 = Output({1, 4, 3, 64});
  status =
      GroupedAttentionForward(q3.gpu, k2.gpu, k2.gpu, out3.gpu, lse3, stream_);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
}

// Timings (not a check; run with --gtest_also_run_disabled_tests): grouped
// attention at a Llama-3-8B-like shape, each route (tiled, packed, and the
// production choice: direct on Hopper at D 64), forward and backward.
TEST_P(DecoderCudaTest, DISABLED_GroupedAttentionTimings) {
  if (dtype() == DType::kF32) GTEST_SKIP() << "16-bit only";
  const int64_t batch = 2, seq = 2048, q_heads = 32, kv_heads = 8;
  for (const int64_t head_dim : {64, 128}) {
    const Shape q_shape{batch, seq, q_heads, head_dim};
    const Shape kv_shape{batch, seq, kv_heads, head_dim};
    Tensor q = *Tensor::Zeros(q_shape, dtype(), Device::Cuda(0));
    Tensor k = *Tensor::Zeros(kv_shape, dtype(), Device::Cuda(0));
    Tensor v = *Tensor::Zeros(kv_shape, dtype(), Device::Cuda(0));
    Tensor out = *Tensor::Zeros(q_shape, dtype(), Device::Cuda(0));
    Tensor dq = *Tensor::Zeros(q_shape, dtype(), Device::Cuda(0));
    Tensor dk = *Tensor::Zeros(kv_shape, dtype(), Device::Cuda(0));
    Tensor dv = *Tensor::Zeros(kv_shape, dtype(), Device::Cuda(0));
    Tensor lse =
        *Tensor::Zeros({batch, q_heads, seq}, DType::kF32, Device::Cuda(0));
    for (const GroupedAttentionRoute forced :
         {GroupedAttentionRoute::kTiled, GroupedAttentionRoute::kPacked,
          GroupedAttentionRoute::kProduction}) {
      const bool tiled_only = forced == GroupedAttentionRoute::kTiled;
      ScopedRoute scope(forced);
      cudaEvent_t start, mid, stop;
      cudaEventCreate(&start);
      cudaEventCreate(&mid);
      cudaEventCreate(&stop);
      const auto stream = static_cast<cudaStream_t>(stream_.native());
      float forward_ms = 0, backward_ms = 0;
      const int iterations = tiled_only ? 2 : 10;
      for (int i = 0; i <= iterations; ++i) {  // i = 0: warm-up
        cudaEventRecord(start, stream);
        ASSERT_TRUE(GroupedAttentionForward(q, k, v, out, lse, stream_).ok());
        cudaEventRecord(mid, stream);
        ASSERT_TRUE(GroupedAttentionBackward(out, q, k, v, out, lse, dq, dk, dv,
                                             stream_)
                        .ok());
        cudaEventRecord(stop, stream);
        cudaEventSynchronize(stop);
        float f = 0, b = 0;
        cudaEventElapsedTime(&f, start, mid);
        cudaEventElapsedTime(&b, mid, stop);
        if (i > 0) {
          forward_ms += f / iterations;
          backward_ms += b / iterations;
        }
      }
      std::printf(
          "GQA timing B%lld T%lld Hq%lld Hkv%lld D%lld %s %s: forward %.3f "
          "ms backward %.3f ms\n",
          static_cast<long long>(batch), static_cast<long long>(seq),
          static_cast<long long>(q_heads), static_cast<long long>(kv_heads),
          static_cast<long long>(head_dim), DTypeName(dtype()),
          tiled_only                                 ? "tiled"
          : forced == GroupedAttentionRoute::kPacked ? "packed"
                                                     : "production",
          forward_ms, backward_ms);
      cudaEventDestroy(start);
      cudaEventDestroy(mid);
      cudaEventDestroy(stop);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, DecoderCudaTest,
                         testing::Values(DType::kF32, DType::kBF16,
                                         DType::kF16),
                         [](const testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

}  // namespace
}  // namespace nn
}  // namespace ze
