// Checks every CUDA building block against a plain double-precision CPU
// reference written here, on small awkward shapes (rows and sequence
// lengths not multiples of the tiles, vocabularies not multiples of 8, head
// sizes 20/40/64/80/128), in f32 and bf16 (and f16 for attention). Inputs
// are rounded to the storage dtype first, so the reference sees exactly the
// values the GPU sees. Tagged gpu: runs on the GPU machine.
//
// Each check prints "name dtype max_abs_err max_ref rel" and passes when
// max_abs_err <= tol * max(|ref|, 1e-3).
//
// The cuBLASLt epilogue fusions (LinearBackward's BGRADB, LinearGeluForward,
// GeluLinearBackward) are compared against the CPU ops of nn/functional.h
// on the same rounded inputs, with fusion on and off (the fallback), and
// EpiloguesAreFusedAtGptLikeShapes reports whether cuBLASLt accepted them.
// Attention runs both kernel families where a Hopper GPU has two (the wgmma
// kernels and, forced by attention_testing.h, the mma.sync ones).
#include "nn/cuda/functional_cuda.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/ops.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "nn/cuda/attention.h"
#include "nn/cuda/attention_testing.h"
#include "nn/cuda/functional_cuda_testing.h"
#include "nn/functional.h"

namespace ze {
namespace nn {
namespace {

namespace cb = ::ze::nn::cuda_backend;
namespace kernels = ::ze::nn::cuda_kernels;
using Vec = std::vector<float>;
using DVec = std::vector<double>;

double Tolerance(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 2e-5;
    case DType::kF16:
      return 1e-2;
    default:
      return 2.5e-2;
  }
}

class FunctionalCudaTest : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_GT(CudaDeviceCount(), 0) << "this test needs a GPU";
    stream_ = *Stream::Create(Device::Cuda(0));
  }

  // A device tensor of random normal values (times `scale`) in `dtype`, and
  // the rounded values it holds.
  Tensor Random(const Shape& shape, DType dtype, uint32_t seed, Vec* rounded,
                float scale = 1.0f) {
    std::mt19937 generator(seed);
    std::normal_distribution<float> normal(0.0f, scale);
    Vec values(NumElements(shape));
    for (float& v : values) v = normal(generator);
    Tensor t = *FromHostFloats(values, shape, dtype, Device::Cuda(0), stream_);
    *rounded = *ToHostFloats(t, stream_);
    return t;
  }

  Tensor Tokens(const std::vector<int32_t>& ids, const Shape& shape) {
    Tensor t = *Tensor::Empty(shape, DType::kI32, Device::Cuda(0));
    EXPECT_EQ(cudaMemcpy(t.data(), ids.data(), ids.size() * 4,
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    return t;
  }

  Vec Host(const Tensor& t) { return *ToHostFloats(t, stream_); }

  // A CPU f32 tensor holding `values`, and a CPU tensor's values as doubles:
  // for references computed by the CPU ops of nn/functional.h.
  static Tensor Cpu(const Vec& values, const Shape& shape) {
    return *FromHostFloats(values, shape, DType::kF32, Device::Cpu(), Stream());
  }
  static DVec Doubles(const Tensor& cpu) {
    const Vec values = *ToHostFloats(cpu, Stream());
    return DVec(values.begin(), values.end());
  }

  void Check(const std::string& name, DType dtype, const Vec& got,
             const DVec& ref, double tol_scale = 1.0) {
    ASSERT_EQ(got.size(), ref.size()) << name;
    double max_err = 0.0, max_ref = 0.0;
    size_t worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double err = std::fabs(got[i] - ref[i]);
      if (!(err <= max_err)) {  // also catches NaN
        max_err = std::isnan(err) ? INFINITY : err;
        worst = i;
      }
      max_ref = std::max(max_ref, std::fabs(ref[i]));
    }
    const double bound = Tolerance(dtype) * tol_scale * std::max(max_ref, 1e-3);
    std::printf("%-40s %-4s max_abs_err %.3e max_ref %.3e rel %.3e %s\n",
                name.c_str(), DTypeName(dtype), max_err, max_ref,
                max_err / std::max(max_ref, 1e-30),
                max_err <= bound ? "ok" : "FAIL");
    EXPECT_LE(max_err, bound)
        << name << " " << DTypeName(dtype) << " worst index " << worst
        << " got " << got[worst] << " want " << ref[worst];
  }

  Stream stream_;
};

// Sets the epilogue fusion switch for a scope, then restores the
// production choice.
class ScopedEpilogueFusion {
 public:
  explicit ScopedEpilogueFusion(bool enabled) {
    cb::SetMatmulEpilogueFusionForTesting(enabled);
  }
  ~ScopedEpilogueFusion() { cb::ResetMatmulEpilogueFusionForTesting(); }
  ScopedEpilogueFusion(const ScopedEpilogueFusion&) = delete;
  ScopedEpilogueFusion& operator=(const ScopedEpilogueFusion&) = delete;
};

// Forces the mma.sync attention kernels (per direction) for a scope, then
// restores the production choice.
class ScopedMmaSyncAttention {
 public:
  ScopedMmaSyncAttention(bool forward, bool backward) {
    kernels::SetAttentionMmaSyncOnlyForTesting(forward, backward);
  }
  ~ScopedMmaSyncAttention() {
    kernels::SetAttentionMmaSyncOnlyForTesting(false, false);
  }
  ScopedMmaSyncAttention(const ScopedMmaSyncAttention&) = delete;
  ScopedMmaSyncAttention& operator=(const ScopedMmaSyncAttention&) = delete;
};

std::string FusionTag(bool fusion) {
  return fusion ? " [fused]" : " [unfused]";
}

TEST_F(FunctionalCudaTest, Linear) {
  struct Case {
    int64_t m, k, n;
  };
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (Case c : {Case{37, 72, 50}, Case{5, 33, 7}, Case{256, 128, 384}}) {
      const std::string tag = "Linear " + std::to_string(c.m) + "x" +
                              std::to_string(c.k) + "x" + std::to_string(c.n);
      Vec x, w, b, dy, gw0, gb0;
      Tensor tx = Random({c.m, c.k}, dtype, 1, &x);
      Tensor tw = Random({c.n, c.k}, dtype, 2, &w, 0.2f);
      Tensor tb = Random({c.n}, dtype, 3, &b);
      Tensor ty = *Tensor::Empty({c.m, c.n}, dtype, Device::Cuda(0));
      ASSERT_TRUE(cb::LinearForward(tx, tw, tb, ty, stream_).ok());
      DVec y(c.m * c.n);
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t j = 0; j < c.n; ++j) {
          double s = b[j];
          for (int64_t l = 0; l < c.k; ++l)
            s += double(x[i * c.k + l]) * w[j * c.k + l];
          y[i * c.n + j] = s;
        }
      Check(tag + " forward", dtype, Host(ty), y);
      // Without bias.
      ASSERT_TRUE(cb::LinearForward(tx, tw, Tensor(), ty, stream_).ok());
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t j = 0; j < c.n; ++j) y[i * c.n + j] -= b[j];
      Check(tag + " forward no bias", dtype, Host(ty), y);

      Tensor tdy = Random({c.m, c.n}, dtype, 4, &dy);
      Tensor tgw = Random({c.n, c.k}, dtype, 5, &gw0);
      Tensor tgb = Random({c.n}, dtype, 6, &gb0);
      Tensor tdx = *Tensor::Empty({c.m, c.k}, dtype, Device::Cuda(0));
      DVec dx(c.m * c.k, 0.0), gw(c.n * c.k, 0.0), gb(c.n, 0.0);
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t j = 0; j < c.n; ++j) {
          const double g = dy[i * c.n + j];
          gb[j] += g;
          for (int64_t l = 0; l < c.k; ++l) {
            dx[i * c.k + l] += g * w[j * c.k + l];
            gw[j * c.k + l] += g * x[i * c.k + l];
          }
        }
      for (int repeat = 1; repeat <= 2; ++repeat) {
        ASSERT_TRUE(
            cb::LinearBackward(tdy, tx, tw, tdx, tgw, tgb, stream_).ok());
        DVec want_gw(gw.size()), want_gb(gb.size());
        for (size_t i = 0; i < gw.size(); ++i)
          want_gw[i] = gw0[i] + repeat * gw[i];
        for (size_t i = 0; i < gb.size(); ++i)
          want_gb[i] = gb0[i] + repeat * gb[i];
        const std::string r = " (backward x" + std::to_string(repeat) + ")";
        Check(tag + " grad_input" + r, dtype, Host(tdx), dx);
        Check(tag + " grad_weight" + r, dtype, Host(tgw), want_gw);
        Check(tag + " grad_bias" + r, dtype, Host(tgb), want_gb);
      }
      // Optional outputs skipped.
      ASSERT_TRUE(
          cb::LinearBackward(tdy, tx, tw, tdx, Tensor(), Tensor(), stream_)
              .ok());
      Check(tag + " grad_input only", dtype, Host(tdx), dx);
      // With another branch's gradient added by the product (C, beta 1).
      Vec addend;
      Tensor tadd = Random({c.m, c.k}, dtype, 7, &addend);
      Tensor tdx_sum = *Tensor::Empty({c.m, c.k}, dtype, Device::Cuda(0));
      ASSERT_TRUE(cb::LinearBackward(tdy, tx, tw, tdx_sum, Tensor(), Tensor(),
                                     stream_, tadd)
                      .ok());
      DVec dx_sum(dx.size());
      for (size_t i = 0; i < dx.size(); ++i) dx_sum[i] = dx[i] + addend[i];
      Check(tag + " grad_input + addend", dtype, Host(tdx_sum), dx_sum);
    }
  }
}

// A stream's cuBLASLt workspace (32 MiB) and scratch buffer go back to the
// allocator when the stream is destroyed: creating and destroying streams
// that run products (an engine per trial in a sweep) must not grow memory.
TEST_F(FunctionalCudaTest, DestroyedStreamReleasesItsMatmulWorkspace) {
  Vec x, w;
  Tensor tx = Random({64, 128}, DType::kBF16, 1, &x);
  Tensor tw = Random({96, 128}, DType::kBF16, 2, &w);
  Tensor ty = *Tensor::Empty({64, 96}, DType::kBF16, Device::Cuda(0));
  ASSERT_TRUE(stream_.Synchronize().ok());
  const int64_t before = CudaMemory(0)->stats().bytes_in_use;
  for (int round = 0; round < 3; ++round) {
    absl::StatusOr<Stream> stream = Stream::Create(Device::Cuda(0));
    ASSERT_TRUE(stream.ok()) << stream.status();
    ASSERT_TRUE(cb::LinearForward(tx, tw, Tensor(), ty, *stream).ok());
    ASSERT_TRUE(stream->Synchronize().ok());
    // The product ran on its own stream, so it holds its own workspace.
    EXPECT_GE(CudaMemory(0)->stats().bytes_in_use, before + (32 << 20))
        << "round " << round;
  }  // each round's stream is destroyed here
  EXPECT_EQ(CudaMemory(0)->stats().bytes_in_use, before);
}

TEST_F(FunctionalCudaTest, LayerNorm) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    // (rows, cols): small shapes take the warp-per-row kernel; multiples of
    // 256 take the team kernel (one, two or four teams per block, one, two
    // or four vectors per thread: bf16 5120-8192, GPT 13B-70B widths; f32
    // there takes the warp-per-row kernel), with more rows than rows in
    // flight so teams loop and some passes run past the last row.
    const std::vector<std::pair<int64_t, int64_t>> shapes = {
        {19, 64},    {19, 100},   {19, 2048},  {1037, 256},
        {1037, 768}, {700, 1024}, {613, 2048}, {129, 4096},
        {301, 5120}, {300, 6144}, {277, 8192}};
    for (const auto& [rows, cols] : shapes) {
      const std::string tag =
          "LayerNorm R=" + std::to_string(rows) + " C=" + std::to_string(cols);
      Vec x, w, b, dy, gw0, gb0;
      Tensor tx = Random({rows, cols}, dtype, 11, &x, 2.0f);
      Tensor tw = Random({cols}, dtype, 12, &w);
      Tensor tb = Random({cols}, dtype, 13, &b);
      Tensor ty = *Tensor::Empty({rows, cols}, dtype, Device::Cuda(0));
      Tensor tmean = *Tensor::Empty({rows}, DType::kF32, Device::Cuda(0));
      Tensor trstd = *Tensor::Empty({rows}, DType::kF32, Device::Cuda(0));
      ASSERT_TRUE(
          cb::LayerNormForward(tx, tw, tb, ty, tmean, trstd, stream_).ok());
      DVec y(rows * cols), mean(rows), rstd(rows), dx(rows * cols), gw(cols, 0),
          gb(cols, 0);
      Tensor tdy = Random({rows, cols}, dtype, 14, &dy);
      for (int64_t r = 0; r < rows; ++r) {
        double m = 0, v = 0;
        for (int64_t c = 0; c < cols; ++c) m += x[r * cols + c];
        m /= cols;
        for (int64_t c = 0; c < cols; ++c)
          v += (x[r * cols + c] - m) * (x[r * cols + c] - m);
        const double rs = 1.0 / std::sqrt(v / cols + 1e-5);
        mean[r] = m;
        rstd[r] = rs;
        double sg = 0, sgx = 0;
        for (int64_t c = 0; c < cols; ++c) {
          const double xh = (x[r * cols + c] - m) * rs;
          y[r * cols + c] = xh * w[c] + b[c];
          const double g = dy[r * cols + c];
          sg += g * w[c];
          sgx += g * w[c] * xh;
          gw[c] += g * xh;
          gb[c] += g;
        }
        for (int64_t c = 0; c < cols; ++c) {
          const double xh = (x[r * cols + c] - m) * rs;
          dx[r * cols + c] =
              rs * (dy[r * cols + c] * w[c] - sg / cols - xh * sgx / cols);
        }
      }
      Check(tag + " forward", dtype, Host(ty), y);
      Check(tag + " mean", DType::kF32, Host(tmean), mean, 10.0);
      Check(tag + " rstd", DType::kF32, Host(trstd), rstd, 10.0);
      Tensor tgw = Random({cols}, dtype, 15, &gw0);
      Tensor tgb = Random({cols}, dtype, 16, &gb0);
      Tensor tdx = *Tensor::Empty({rows, cols}, dtype, Device::Cuda(0));
      for (int repeat = 1; repeat <= 2; ++repeat) {
        ASSERT_TRUE(cb::LayerNormBackward(tdy, tx, tw, tmean, trstd, tdx, tgw,
                                          tgb, stream_)
                        .ok());
        DVec want_gw(cols), want_gb(cols);
        for (int64_t c = 0; c < cols; ++c) {
          want_gw[c] = gw0[c] + repeat * gw[c];
          want_gb[c] = gb0[c] + repeat * gb[c];
        }
        const std::string r = " (backward x" + std::to_string(repeat) + ")";
        Check(tag + " grad_input" + r, dtype, Host(tdx), dx);
        Check(tag + " grad_weight" + r, dtype, Host(tgw), want_gw);
        Check(tag + " grad_bias" + r, dtype, Host(tgb), want_gb);
      }
    }
  }
}

// The team kernel's weight and bias gradients are the same bits every run
// (registers in a fixed order, partial rows summed in a fixed order): bf16
// at every team shape, one, two and four vectors per thread, into zeroed
// gradients twice.
TEST_F(FunctionalCudaTest, LayerNormBackwardTeamKernelIsDeterministic) {
  for (const int64_t cols : {768, 2048, 4096, 5120, 8192}) {
    const int64_t rows = 2053;
    const std::string tag = "LayerNorm C=" + std::to_string(cols);
    Vec x, w, b, dy;
    Tensor tx = Random({rows, cols}, DType::kBF16, 31, &x, 2.0f);
    Tensor tw = Random({cols}, DType::kBF16, 32, &w);
    Tensor tb = Random({cols}, DType::kBF16, 33, &b);
    Tensor tdy = Random({rows, cols}, DType::kBF16, 34, &dy);
    Tensor ty = *Tensor::Empty({rows, cols}, DType::kBF16, Device::Cuda(0));
    Tensor tmean = *Tensor::Empty({rows}, DType::kF32, Device::Cuda(0));
    Tensor trstd = *Tensor::Empty({rows}, DType::kF32, Device::Cuda(0));
    ASSERT_TRUE(
        cb::LayerNormForward(tx, tw, tb, ty, tmean, trstd, stream_).ok());
    std::vector<std::vector<uint32_t>> runs;  // f32 gradients' bits
    for (int run = 0; run < 2; ++run) {
      Tensor tdx = *Tensor::Empty({rows, cols}, DType::kBF16, Device::Cuda(0));
      Tensor tgw = *Tensor::Zeros({cols}, DType::kF32, Device::Cuda(0));
      Tensor tgb = *Tensor::Zeros({cols}, DType::kF32, Device::Cuda(0));
      ASSERT_TRUE(cb::LayerNormBackward(tdy, tx, tw, tmean, trstd, tdx, tgw,
                                        tgb, stream_)
                      .ok());
      std::vector<uint32_t> bits;
      for (const Tensor& t : {tgw, tgb}) {
        for (const float v : Host(t)) {
          uint32_t u;
          std::memcpy(&u, &v, sizeof(u));
          bits.push_back(u);
        }
      }
      runs.push_back(std::move(bits));
    }
    EXPECT_EQ(runs[0], runs[1]) << tag;
  }
}

// LinearBackward's fused bias gradient (BGRADB) with gradients in f32 for
// 16-bit weights (as the engine installs them), and grad_bias without
// grad_weight (never fused), against the CPU op; accumulating twice into
// non-zero gradients.
TEST_F(FunctionalCudaTest, LinearBackwardBiasGradientMatchesCpu) {
  struct Case {
    int64_t m, k, n;
  };
  for (bool fusion : {true, false}) {
    ScopedEpilogueFusion scoped(fusion);
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      for (DType grad_dtype : {dtype, DType::kF32}) {
        if (dtype == DType::kF32 && grad_dtype != dtype) continue;
        for (Case c : {Case{37, 72, 64}, Case{5, 33, 7}, Case{300, 256, 768}}) {
          const std::string tag = "LinearBackward " + std::to_string(c.m) +
                                  "x" + std::to_string(c.k) + "x" +
                                  std::to_string(c.n) + " grads " +
                                  DTypeName(grad_dtype) + FusionTag(fusion);
          Vec x, w, dy, gw0, gb0;
          Tensor tx = Random({c.m, c.k}, dtype, 31, &x);
          Tensor tw = Random({c.n, c.k}, dtype, 32, &w, 0.2f);
          Tensor tdy = Random({c.m, c.n}, dtype, 33, &dy);
          Tensor tgw = Random({c.n, c.k}, grad_dtype, 34, &gw0);
          Tensor tgb = Random({c.n}, grad_dtype, 35, &gb0);
          Tensor tgb_only = Random({c.n}, grad_dtype, 35, &gb0);
          const Tensor cx = Cpu(x, {c.m, c.k}), cw = Cpu(w, {c.n, c.k});
          const Tensor cdy = Cpu(dy, {c.m, c.n});
          Tensor cgw = Cpu(gw0, {c.n, c.k}), cgb = Cpu(gb0, {c.n});
          for (int repeat = 1; repeat <= 2; ++repeat) {
            ASSERT_TRUE(
                cb::LinearBackward(tdy, tx, tw, Tensor(), tgw, tgb, stream_)
                    .ok());
            ASSERT_TRUE(cb::LinearBackward(tdy, Tensor(), tw, Tensor(),
                                           Tensor(), tgb_only, stream_)
                            .ok());
            ASSERT_TRUE(
                nn::LinearBackward(cdy, cx, cw, Tensor(), cgw, cgb, Stream())
                    .ok());
            const std::string r = " (x" + std::to_string(repeat) + ")";
            Check(tag + " grad_weight" + r, dtype, Host(tgw), Doubles(cgw));
            Check(tag + " grad_bias" + r, dtype, Host(tgb), Doubles(cgb));
            Check(tag + " grad_bias only" + r, dtype, Host(tgb_only),
                  Doubles(cgb));
          }
        }
      }
    }
  }
}

// LinearGeluForward against the CPU op, fused and unfused; N = 50 is never
// fused (the GELU aux leading dimension must be a multiple of 8). cuBLASLt's
// GELU may use a faster tanh than the CPU: f32 GELU outputs get 1e-3.
TEST_F(FunctionalCudaTest, LinearGeluForwardMatchesCpu) {
  struct Case {
    int64_t m, k, n;
  };
  for (bool fusion : {true, false}) {
    ScopedEpilogueFusion scoped(fusion);
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      const double gelu_tol = dtype == DType::kF32 ? 50.0 : 1.0;
      for (Case c : {Case{37, 72, 64}, Case{5, 33, 50}, Case{256, 128, 512}}) {
        for (bool with_bias : {true, false}) {
          const std::string tag =
              "LinearGeluForward " + std::to_string(c.m) + "x" +
              std::to_string(c.k) + "x" + std::to_string(c.n) +
              (with_bias ? "" : " no bias") + FusionTag(fusion);
          Vec x, w, b;
          Tensor tx = Random({c.m, c.k}, dtype, 41, &x);
          Tensor tw = Random({c.n, c.k}, dtype, 42, &w, 0.2f);
          Tensor tb = Random({c.n}, dtype, 43, &b);
          Tensor ty = *Tensor::Empty({c.m, c.n}, dtype, Device::Cuda(0));
          Tensor tpre = *Tensor::Empty({c.m, c.n}, dtype, Device::Cuda(0));
          ASSERT_TRUE(cb::LinearGeluForward(tx, tw, with_bias ? tb : Tensor(),
                                            ty, tpre, stream_)
                          .ok());
          Tensor y = Cpu(Vec(c.m * c.n), {c.m, c.n});
          Tensor pre = Cpu(Vec(c.m * c.n), {c.m, c.n});
          ASSERT_TRUE(
              nn::LinearGeluForward(Cpu(x, {c.m, c.k}), Cpu(w, {c.n, c.k}),
                                    with_bias ? Cpu(b, {c.n}) : Tensor(), y,
                                    pre, Stream())
                  .ok());
          Check(tag + " pre_activation", dtype, Host(tpre), Doubles(pre));
          Check(tag + " output", dtype, Host(ty), Doubles(y), gelu_tol);
        }
      }
    }
  }
}

// GeluLinearBackward against the CPU op, fused (DGELU_BGRAD, or DGELU
// without the bias output) and unfused; K = 50 is never fused. Gradients
// accumulate twice into non-zero values; the pre-activation bias gradient
// is f32 (as Mlp passes it) or in the activations' dtype.
TEST_F(FunctionalCudaTest, GeluLinearBackwardMatchesCpu) {
  struct Case {
    int64_t m, k, n;  // rows, hidden (this Linear's input), outputs
  };
  for (bool fusion : {true, false}) {
    ScopedEpilogueFusion scoped(fusion);
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      const double gelu_tol = dtype == DType::kF32 ? 50.0 : 1.0;
      for (Case c : {Case{37, 64, 72}, Case{5, 50, 33}, Case{256, 512, 128}}) {
        for (int variant = 0; variant < 3; ++variant) {
          // 0: every output, pre bias f32; 1: pre bias in dtype; 2: only
          // grad_pre_activation.
          const DType pre_bias_dtype = variant == 1 ? dtype : DType::kF32;
          const std::string tag = "GeluLinearBackward " + std::to_string(c.m) +
                                  "x" + std::to_string(c.k) + "x" +
                                  std::to_string(c.n) + " variant " +
                                  std::to_string(variant) + FusionTag(fusion);
          Vec pre, h, w, dy, gw0, gb0, gpb0;
          Tensor tpre = Random({c.m, c.k}, dtype, 51, &pre, 2.0f);
          Tensor th = *Tensor::Empty({c.m, c.k}, dtype, Device::Cuda(0));
          ASSERT_TRUE(cb::GeluForward(tpre, th, stream_).ok());
          h = Host(th);
          Tensor tw = Random({c.n, c.k}, dtype, 52, &w, 0.2f);
          Tensor tdy = Random({c.m, c.n}, dtype, 53, &dy);
          Tensor tgw = Random({c.n, c.k}, dtype, 54, &gw0);
          Tensor tgb = Random({c.n}, dtype, 55, &gb0);
          Tensor tgpb = Random({c.k}, pre_bias_dtype, 56, &gpb0);
          Tensor tdpre = *Tensor::Empty({c.m, c.k}, dtype, Device::Cuda(0));
          const Tensor cpre = Cpu(pre, {c.m, c.k}), ch = Cpu(h, {c.m, c.k});
          const Tensor cw = Cpu(w, {c.n, c.k}), cdy = Cpu(dy, {c.m, c.n});
          Tensor cgw = Cpu(gw0, {c.n, c.k}), cgb = Cpu(gb0, {c.n});
          Tensor cgpb = Cpu(gpb0, {c.k});
          Tensor cdpre = Cpu(Vec(c.m * c.k), {c.m, c.k});
          const bool all = variant < 2;
          for (int repeat = 1; repeat <= 2; ++repeat) {
            ASSERT_TRUE(cb::GeluLinearBackward(
                            tdy, all ? th : Tensor(), tw, tpre, tdpre,
                            all ? tgw : Tensor(), all ? tgb : Tensor(),
                            all ? tgpb : Tensor(), stream_)
                            .ok());
            ASSERT_TRUE(nn::GeluLinearBackward(
                            cdy, all ? ch : Tensor(), cw, cpre, cdpre,
                            all ? cgw : Tensor(), all ? cgb : Tensor(),
                            all ? cgpb : Tensor(), Stream())
                            .ok());
            const std::string r = " (x" + std::to_string(repeat) + ")";
            Check(tag + " grad_pre_activation" + r, dtype, Host(tdpre),
                  Doubles(cdpre), gelu_tol);
            if (!all) continue;
            Check(tag + " grad_weight" + r, dtype, Host(tgw), Doubles(cgw));
            Check(tag + " grad_bias" + r, dtype, Host(tgb), Doubles(cgb));
            Check(tag + " grad_pre_activation_bias" + r, dtype, Host(tgpb),
                  Doubles(cgpb), gelu_tol);
          }
        }
      }
    }
  }
}

// LinearBackward and GeluLinearBackward with the input's gradient written
// into the input itself (nn/functional.h: the weight gradient, its only
// reader, runs first on the stream) equal separate buffers bit for bit:
// the same products in another order. Fused and unfused, f32 and bf16.
TEST_F(FunctionalCudaTest, InputGradientMayOverwriteTheInput) {
  for (bool fusion : {true, false}) {
    ScopedEpilogueFusion scoped(fusion);
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      const int64_t m = 256, k = 512, n = 128;
      Vec unused;
      Tensor pre = Random({m, k}, dtype, 61, &unused, 2.0f);
      Tensor w = Random({n, k}, dtype, 62, &unused, 0.2f);
      Tensor dy = Random({m, n}, dtype, 63, &unused);
      for (int op = 0; op < 2; ++op) {
        const std::string tag =
            std::string(op == 0 ? "LinearBackward" : "GeluLinearBackward") +
            " " + DTypeName(dtype) + FusionTag(fusion);
        auto run = [&](const Tensor& x, const Tensor& dx, const Tensor& dw) {
          return op == 0
                     ? cb::LinearBackward(dy, x, w, dx, dw, Tensor(), stream_)
                     : cb::GeluLinearBackward(dy, x, w, pre, dx, dw, Tensor(),
                                              Tensor(), stream_);
        };
        Tensor x = *Tensor::Empty({m, k}, dtype, Device::Cuda(0));
        ASSERT_TRUE(cb::GeluForward(pre, x, stream_).ok());
        Tensor dx = *Tensor::Empty({m, k}, dtype, Device::Cuda(0));
        Tensor dw = Random({n, k}, dtype, 64, &unused);
        ASSERT_TRUE(run(x, dx, dw).ok()) << tag;
        Tensor x_in_place = *Tensor::Empty({m, k}, dtype, Device::Cuda(0));
        ASSERT_TRUE(cb::GeluForward(pre, x_in_place, stream_).ok());
        Tensor dw_in_place = Random({n, k}, dtype, 64, &unused);
        ASSERT_TRUE(run(x_in_place, x_in_place, dw_in_place).ok()) << tag;
        EXPECT_EQ(Host(x_in_place), Host(dx)) << tag << " grad_input";
        EXPECT_EQ(Host(dw_in_place), Host(dw)) << tag << " grad_weight";
      }
    }
  }
}

// Which GELU cuBLASLt's epilogue computes: f32 pre-activations over
// [-6, 6] (identity weight, so output = gelu(input)) against the tanh
// approximation (our CPU and kernels) and the exact erf form, which differ
// by up to ~4.7e-4. Prints both errors; expects the tanh form to be the
// closer one and within 1e-3.
TEST_F(FunctionalCudaTest, GeluEpilogueIsTheTanhApproximation) {
  ScopedEpilogueFusion scoped(true);
  const int64_t m = 1200, c = 8;
  Vec x(m * c), eye(c * c, 0.0f);
  for (int64_t i = 0; i < m * c; ++i) x[i] = -6.0f + 12.0f * i / (m * c - 1);
  for (int64_t i = 0; i < c; ++i) eye[i * c + i] = 1.0f;
  Tensor tx = *FromHostFloats(x, {m, c}, DType::kF32, Device::Cuda(0), stream_);
  Tensor tw =
      *FromHostFloats(eye, {c, c}, DType::kF32, Device::Cuda(0), stream_);
  Tensor ty = *Tensor::Empty({m, c}, DType::kF32, Device::Cuda(0));
  Tensor tpre = *Tensor::Empty({m, c}, DType::kF32, Device::Cuda(0));
  cb::ResetMatmulEpilogueStats();
  ASSERT_TRUE(cb::LinearGeluForward(tx, tw, Tensor(), ty, tpre, stream_).ok());
  const bool fused = cb::GetMatmulEpilogueStats().gelu_aux_fused == 1;
  const Vec y = Host(ty);
  double err_tanh = 0.0, err_erf = 0.0;
  const double k = std::sqrt(2.0 / M_PI);
  for (int64_t i = 0; i < m * c; ++i) {
    const double v = x[i];
    const double tanh_form =
        0.5 * v * (1 + std::tanh(k * (v + 0.044715 * v * v * v)));
    const double erf_form = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
    err_tanh = std::max(err_tanh, std::fabs(y[i] - tanh_form));
    err_erf = std::max(err_erf, std::fabs(y[i] - erf_form));
  }
  std::printf(
      "GELU epilogue (f32, %s): max |y - gelu_tanh| %.3e, max |y - "
      "gelu_erf| %.3e\n",
      fused ? "fused" : "NOT fused, our kernel", err_tanh, err_erf);
  EXPECT_LT(err_tanh, err_erf);
  EXPECT_LE(err_tanh, 1e-3);
}

// Whether cuBLASLt accepts the three epilogues for the layouts and dtypes
// the GPT uses (bf16, f32 or bf16 gradients; sizes multiples of 64): every
// call must have run fused. A failure here is a performance finding, not a
// correctness one (the fallback is tested above); the printed counts say
// which epilogue was rejected.
TEST_F(FunctionalCudaTest, EpiloguesAreFusedAtGptLikeShapes) {
  ScopedEpilogueFusion scoped(true);
  const DType dt = DType::kBF16;
  const int64_t m = 512, c = 256, h = 4 * c;
  Vec unused;
  Tensor x = Random({m, c}, dt, 61, &unused);
  Tensor w_fc = Random({h, c}, dt, 62, &unused, 0.05f);
  Tensor b_fc = Random({h}, dt, 63, &unused);
  Tensor w_proj = Random({c, h}, dt, 64, &unused, 0.05f);
  Tensor dy = Random({m, c}, dt, 65, &unused);
  Tensor hidden = *Tensor::Empty({m, h}, dt, Device::Cuda(0));
  Tensor pre = *Tensor::Empty({m, h}, dt, Device::Cuda(0));
  Tensor dpre = *Tensor::Empty({m, h}, dt, Device::Cuda(0));
  Tensor dx = *Tensor::Empty({m, c}, dt, Device::Cuda(0));
  cb::ResetMatmulEpilogueStats();
  for (DType grad_dtype : {dt, DType::kF32}) {
    Tensor gw_fc = *Tensor::Zeros({h, c}, grad_dtype, Device::Cuda(0));
    Tensor gb_fc = *Tensor::Zeros({h}, grad_dtype, Device::Cuda(0));
    Tensor gw_proj = *Tensor::Zeros({c, h}, grad_dtype, Device::Cuda(0));
    Tensor gb_proj = *Tensor::Zeros({c}, grad_dtype, Device::Cuda(0));
    Tensor pre_bias = *Tensor::Zeros({h}, DType::kF32, Device::Cuda(0));
    // The Mlp's step: fc forward, proj backward with GELU's backward and
    // fc's bias sum, fc backward (weight only, plus a plain Linear's
    // weight-and-bias backward).
    ASSERT_TRUE(
        cb::LinearGeluForward(x, w_fc, b_fc, hidden, pre, stream_).ok());
    ASSERT_TRUE(cb::GeluLinearBackward(dy, hidden, w_proj, pre, dpre, gw_proj,
                                       gb_proj, pre_bias, stream_)
                    .ok());
    ASSERT_TRUE(
        cb::LinearBackward(dpre, x, w_fc, dx, gw_fc, gb_fc, stream_).ok());
  }
  ASSERT_TRUE(stream_.Synchronize().ok());
  const cb::MatmulEpilogueStats stats = cb::GetMatmulEpilogueStats();
  std::printf(
      "epilogues at GPT-like shapes: BGRADB fused %lld fallback %lld, "
      "GELU_AUX_BIAS fused %lld fallback %lld, DGELU_BGRAD fused %lld "
      "fallback %lld\n",
      static_cast<long long>(stats.bgradb_fused),
      static_cast<long long>(stats.bgradb_fallback),
      static_cast<long long>(stats.gelu_aux_fused),
      static_cast<long long>(stats.gelu_aux_fallback),
      static_cast<long long>(stats.dgelu_fused),
      static_cast<long long>(stats.dgelu_fallback));
  EXPECT_EQ(stats.gelu_aux_fused, 2);
  EXPECT_EQ(stats.dgelu_fused, 2);
  EXPECT_EQ(stats.bgradb_fused, 4);
  EXPECT_EQ(
      stats.gelu_aux_fallback + stats.dgelu_fallback + stats.bgradb_fallback,
      0);
  // With fusion off nothing is attempted (and nothing counted).
  cb::SetMatmulEpilogueFusionForTesting(false);
  cb::ResetMatmulEpilogueStats();
  ASSERT_TRUE(cb::LinearGeluForward(x, w_fc, b_fc, hidden, pre, stream_).ok());
  const cb::MatmulEpilogueStats off = cb::GetMatmulEpilogueStats();
  EXPECT_EQ(off.gelu_aux_fused + off.gelu_aux_fallback, 0);
}

TEST_F(FunctionalCudaTest, Gelu) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t count : {1003, 4096}) {
      Vec x, dy;
      Tensor tx = Random({count}, dtype, 21, &x, 3.0f);
      Tensor tdy = Random({count}, dtype, 22, &dy);
      Tensor ty = *Tensor::Empty({count}, dtype, Device::Cuda(0));
      ASSERT_TRUE(cb::GeluForward(tx, ty, stream_).ok());
      DVec y(count), dx(count);
      const double k = std::sqrt(2.0 / M_PI);
      for (int64_t i = 0; i < count; ++i) {
        const double v = x[i];
        const double t = std::tanh(k * (v + 0.044715 * v * v * v));
        y[i] = 0.5 * v * (1 + t);
        const double dt = (1 - t * t) * k * (1 + 3 * 0.044715 * v * v);
        dx[i] = dy[i] * (0.5 * (1 + t) + 0.5 * v * dt);
      }
      const std::string tag = "Gelu n=" + std::to_string(count);
      Check(tag + " forward", dtype, Host(ty), y);
      // In place: grad_input aliases grad_output.
      ASSERT_TRUE(cb::GeluBackward(tdy, tx, tdy, stream_).ok());
      Check(tag + " backward in place", dtype, Host(tdy), dx);
    }
  }
}

// Reference causal attention in double. qkv (B, T, 3C); returns out
// (B, T, C), lse (B, H, T); with dout, fills dqkv (B, T, 3C).
void ReferenceAttention(const Vec& qkv, const Vec& dout, int B, int T, int H,
                        int D, DVec* out, DVec* lse, DVec* dqkv) {
  const int C = H * D;
  out->assign(static_cast<size_t>(B) * T * C, 0.0);
  lse->assign(static_cast<size_t>(B) * H * T, 0.0);
  dqkv->assign(static_cast<size_t>(B) * T * 3 * C, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  auto at = [&](int b, int t, int part, int h, int d) {
    return (static_cast<size_t>(b) * T + t) * 3 * C + part * C + h * D + d;
  };
  std::vector<double> p(T), dp(T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int q = 0; q < T; ++q) {
        double m = -INFINITY;
        for (int k = 0; k <= q; ++k) {
          double s = 0;
          for (int d = 0; d < D; ++d)
            s += double(qkv[at(b, q, 0, h, d)]) * qkv[at(b, k, 1, h, d)];
          p[k] = s * scale;
          m = std::max(m, p[k]);
        }
        double sum = 0;
        for (int k = 0; k <= q; ++k) sum += (p[k] = std::exp(p[k] - m));
        (*lse)[(static_cast<size_t>(b) * H + h) * T + q] = m + std::log(sum);
        for (int k = 0; k <= q; ++k) p[k] /= sum;
        const size_t orow = (static_cast<size_t>(b) * T + q) * C + h * D;
        for (int d = 0; d < D; ++d) {
          double o = 0;
          for (int k = 0; k <= q; ++k) o += p[k] * qkv[at(b, k, 2, h, d)];
          (*out)[orow + d] = o;
        }
        double delta = 0;
        for (int k = 0; k <= q; ++k) {
          double s = 0;
          for (int d = 0; d < D; ++d)
            s += double(dout[orow + d]) * qkv[at(b, k, 2, h, d)];
          dp[k] = s;
          delta += p[k] * s;
        }
        for (int k = 0; k <= q; ++k) {
          const double ds = p[k] * (dp[k] - delta) * scale;
          for (int d = 0; d < D; ++d) {
            (*dqkv)[at(b, q, 0, h, d)] += ds * qkv[at(b, k, 1, h, d)];
            (*dqkv)[at(b, k, 1, h, d)] += ds * qkv[at(b, q, 0, h, d)];
            (*dqkv)[at(b, k, 2, h, d)] += p[k] * dout[orow + d];
          }
        }
      }
}

TEST_F(FunctionalCudaTest, Attention) {
  struct Case {
    DType dtype;
    int B, T, H, D;
  };
  const std::vector<Case> cases = {
      {DType::kF32, 2, 67, 2, 64},
      {DType::kF32, 1, 33, 3, 20},
      {DType::kBF16, 2, 67, 2, 64},
      {DType::kBF16, 1, 130, 2, 64},
      {DType::kBF16, 1, 64, 1, 64},
      {DType::kBF16, 2, 67, 2, 80},
      {DType::kBF16, 1, 100, 2, 128},
      {DType::kBF16, 1, 67, 2, 40},
      {DType::kBF16, 1, 45, 2, 20},
      {DType::kBF16, 1, 70, 1, 256},
      {DType::kF16, 2, 67, 2, 64},
      {DType::kF16, 1, 200, 2, 128},
      // Five query/key tiles: both pipeline stages reused, odd tile count.
      {DType::kBF16, 2, 300, 2, 64},
      {DType::kBF16, 1, 257, 1, 20},
  };
  for (const Case& c : cases) {
    const int C = c.H * c.D;
    const std::string tag = "Attention B" + std::to_string(c.B) + " T" +
                            std::to_string(c.T) + " H" + std::to_string(c.H) +
                            " D" + std::to_string(c.D);
    Vec qkv, dout;
    Tensor tqkv = Random({c.B, c.T, 3 * C}, c.dtype, 31, &qkv);
    Tensor tdout = Random({c.B, c.T, C}, c.dtype, 32, &dout);
    Tensor tout = *Tensor::Empty({c.B, c.T, C}, c.dtype, Device::Cuda(0));
    Tensor tlse = *Tensor::Empty({c.B, c.H, c.T}, DType::kF32, Device::Cuda(0));
    Tensor tdqkv = *Tensor::Empty({c.B, c.T, 3 * C}, c.dtype, Device::Cuda(0));
    ASSERT_TRUE(cb::AttentionForward(tqkv, c.H, tout, tlse, stream_).ok())
        << tag;
    // Backward with the GPU's own (rounded) output, as training does.
    ASSERT_TRUE(
        cb::AttentionBackward(tdout, tqkv, tout, tlse, c.H, tdqkv, stream_)
            .ok())
        << tag;
    DVec out, lse, dqkv;
    ReferenceAttention(qkv, dout, c.B, c.T, c.H, c.D, &out, &lse, &dqkv);
    Check(tag + " output", c.dtype, Host(tout), out);
    Check(tag + " logsumexp", c.dtype, Host(tlse), lse, 0.2);
    Check(tag + " grad_qkv", c.dtype, Host(tdqkv), dqkv, 1.5);
  }
}

// Both tensor-core attention families (the production choice, which is the
// wgmma kernels on a compute capability 9.0 GPU at D 64, and the mma.sync
// kernels forced by the test hook) on shapes that stress the 128-row
// kernels' tiling: T not a multiple of 64 or 128, a single token, exactly
// one and two 128-row tiles, several heads and batches (the grid's B*H
// axis), D 64 and 128 and a padded D (40, falls to the 64 instantiation
// with zero-filled columns), and D 80 (no 128-row instantiation: the 4-warp
// pipelined kernels together with the f32 dQ accumulator passes).
TEST_F(FunctionalCudaTest, AttentionKernelVariants) {
  struct Case {
    DType dtype;
    int B, T, H, D;
  };
  const std::vector<Case> cases = {
      {DType::kBF16, 2, 1, 3, 64},    {DType::kBF16, 1, 128, 2, 64},
      {DType::kBF16, 2, 191, 3, 64},  {DType::kBF16, 1, 256, 1, 64},
      {DType::kBF16, 3, 333, 2, 64},  {DType::kF16, 2, 129, 2, 64},
      {DType::kF16, 1, 65, 3, 128},   {DType::kBF16, 2, 200, 2, 128},
      {DType::kBF16, 1, 385, 1, 128}, {DType::kF16, 1, 300, 2, 128},
      {DType::kBF16, 2, 150, 2, 40},  {DType::kBF16, 1, 100, 2, 80},
  };
  for (const bool mma_sync_only : {false, true}) {
    ScopedMmaSyncAttention scoped(mma_sync_only, mma_sync_only);
    const char* variant = mma_sync_only ? "mma.sync" : "production";
    for (const Case& c : cases) {
      const int C = c.H * c.D;
      const std::string tag = std::string("Attn[") + variant + "] B" +
                              std::to_string(c.B) + " T" + std::to_string(c.T) +
                              " H" + std::to_string(c.H) + " D" +
                              std::to_string(c.D);
      Vec qkv, dout;
      Tensor tqkv = Random({c.B, c.T, 3 * C}, c.dtype, 51 + c.T, &qkv);
      Tensor tdout = Random({c.B, c.T, C}, c.dtype, 52 + c.T, &dout);
      Tensor tout = *Tensor::Empty({c.B, c.T, C}, c.dtype, Device::Cuda(0));
      Tensor tlse =
          *Tensor::Empty({c.B, c.H, c.T}, DType::kF32, Device::Cuda(0));
      Tensor tdqkv =
          *Tensor::Empty({c.B, c.T, 3 * C}, c.dtype, Device::Cuda(0));
      // Garbage in the outputs: every element must be overwritten.
      ASSERT_EQ(cudaMemset(tdqkv.data(), 0x7f, tdqkv.nbytes()), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ASSERT_TRUE(cb::AttentionForward(tqkv, c.H, tout, tlse, stream_).ok())
          << tag;
      ASSERT_TRUE(
          cb::AttentionBackward(tdout, tqkv, tout, tlse, c.H, tdqkv, stream_)
              .ok())
          << tag;
      DVec out, lse, dqkv;
      ReferenceAttention(qkv, dout, c.B, c.T, c.H, c.D, &out, &lse, &dqkv);
      Check(tag + " output", c.dtype, Host(tout), out);
      Check(tag + " logsumexp", c.dtype, Host(tlse), lse, 0.2);
      Check(tag + " grad_qkv", c.dtype, Host(tdqkv), dqkv, 1.5);
    }
  }
}

// The accuracy tests above pass whichever kernel runs, so a silent fallback
// from the Hopper kernels would go unnoticed there: by default a compute
// capability 9.0 GPU must run them for 16-bit tensors at head size 64, and
// every other case the mma.sync (or f32) kernels.
TEST_F(FunctionalCudaTest, AttentionDefaultKernelIsTheHopperOneOnHopper) {
  int major = 0, minor = 0;
  ASSERT_EQ(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0),
      cudaSuccess);
  ASSERT_EQ(
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0),
      cudaSuccess);
  const bool hopper = major == 9 && minor == 0;
  const int T = 130;
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (int D : {64, 128}) {
      const int code = dtype == DType::kF32 ? 0 : dtype == DType::kBF16 ? 1 : 2;
      Tensor qkv = *Tensor::Empty({2, T, 3 * 2 * D}, dtype, Device::Cuda(0));
      Tensor out = *Tensor::Empty({2, T, 2 * D}, dtype, Device::Cuda(0));
      Tensor dqkv = *Tensor::Empty({2, T, 3 * 2 * D}, dtype, Device::Cuda(0));
      const std::string expected = dtype == DType::kF32 ? "f32"
                                   : hopper && D == 64  ? "wgmma"
                                                        : "mma.sync";
      const std::string tag = std::string(DTypeName(dtype)) + " D" +
                              std::to_string(D) + " on compute capability " +
                              std::to_string(major) + "." +
                              std::to_string(minor);
      EXPECT_EQ(kernels::AttentionKernelName(false, qkv.data(), out.data(),
                                             nullptr, T, D, code),
                expected)
          << "forward, " << tag;
      EXPECT_EQ(kernels::AttentionKernelName(true, qkv.data(), out.data(),
                                             dqkv.data(), T, D, code),
                expected)
          << "backward, " << tag;
      if (dtype != DType::kF32) {
        ScopedMmaSyncAttention scoped(true, true);
        EXPECT_EQ(kernels::AttentionKernelName(false, qkv.data(), out.data(),
                                               nullptr, T, D, code),
                  std::string("mma.sync"))
            << "forward with the mma.sync kernels forced, " << tag;
      }
    }
  }
}

// A 16-bit view that does not start 16-byte aligned is a named error, not a
// fault inside a kernel (both kernel families move 16-byte tiles).
TEST_F(FunctionalCudaTest, AttentionRejectsMisalignedViews) {
  const int T = 64, C = 64;
  Tensor flat = *Tensor::Empty({3 * C * T + 4}, DType::kBF16, Device::Cuda(0));
  ASSERT_TRUE(Fill(flat, 0.25f, stream_).ok());
  Tensor shifted = flat.Slice(4, 3 * C * T).View({1, T, 3 * C});  // +8 bytes
  Tensor qkv = flat.Slice(0, 3 * C * T).View({1, T, 3 * C});
  Tensor out = *Tensor::Empty({1, T, C}, DType::kBF16, Device::Cuda(0));
  Tensor lse = *Tensor::Empty({1, 1, T}, DType::kF32, Device::Cuda(0));
  absl::Status status = cb::AttentionForward(shifted, 1, out, lse, stream_);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("qkv"), std::string::npos) << status;
  EXPECT_NE(status.message().find("16-byte"), std::string::npos) << status;
  ASSERT_TRUE(cb::AttentionForward(qkv, 1, out, lse, stream_).ok());
  status = cb::AttentionBackward(out, qkv, out, lse, 1, shifted, stream_);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("grad_qkv"), std::string::npos) << status;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // nothing faulted
}

// Forward and backward on different families (the test hook forces the
// mma.sync kernels per direction; on a non-Hopper GPU both are mma.sync):
// the backward of one family must accept the output and log-sum-exp the
// other family's forward wrote.
TEST_F(FunctionalCudaTest, AttentionForwardAndBackwardOnDifferentKernels) {
  const int B = 2, T = 191, H = 2, D = 64, C = H * D;
  Vec qkv, dout;
  Tensor tqkv = Random({B, T, 3 * C}, DType::kBF16, 61, &qkv);
  Tensor tdout = Random({B, T, C}, DType::kBF16, 62, &dout);
  DVec out, lse, dqkv;
  ReferenceAttention(qkv, dout, B, T, H, D, &out, &lse, &dqkv);
  // {forward on mma.sync, backward on mma.sync}
  const std::vector<std::pair<bool, bool>> pairs = {{true, false},
                                                    {false, true}};
  for (const auto& [forward_mma_sync, backward_mma_sync] : pairs) {
    ScopedMmaSyncAttention scoped(forward_mma_sync, backward_mma_sync);
    const std::string tag =
        std::string("Attn fwd[") +
        (forward_mma_sync ? "mma.sync" : "production") + "] bwd[" +
        (backward_mma_sync ? "mma.sync" : "production") + "]";
    Tensor tout = *Tensor::Empty({B, T, C}, DType::kBF16, Device::Cuda(0));
    Tensor tlse = *Tensor::Empty({B, H, T}, DType::kF32, Device::Cuda(0));
    Tensor tdqkv = *Tensor::Empty({B, T, 3 * C}, DType::kBF16, Device::Cuda(0));
    ASSERT_TRUE(cb::AttentionForward(tqkv, H, tout, tlse, stream_).ok()) << tag;
    ASSERT_TRUE(
        cb::AttentionBackward(tdout, tqkv, tout, tlse, H, tdqkv, stream_).ok())
        << tag;
    Check(tag + " output", DType::kBF16, Host(tout), out);
    Check(tag + " logsumexp", DType::kBF16, Host(tlse), lse, 0.2);
    Check(tag + " grad_qkv", DType::kBF16, Host(tdqkv), dqkv, 1.5);
  }
}

TEST_F(FunctionalCudaTest, Embedding) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t cols : {64, 36}) {
      const int64_t B = 3, T = 5, V = 1003, max_t = 8;
      std::vector<int32_t> ids(B * T);
      for (int64_t i = 0; i < B * T; ++i)
        ids[i] = static_cast<int32_t>((i * 7919) % 11 * 91);
      ids[3] = ids[4] = 1002;  // repeats and the last row
      Tensor tokens = Tokens(ids, {B, T});
      Vec wte, wpe, dy, gte0, gpe0;
      Tensor twte = Random({V, cols}, dtype, 41, &wte);
      Tensor twpe = Random({max_t, cols}, dtype, 42, &wpe);
      Tensor tout = *Tensor::Empty({B, T, cols}, dtype, Device::Cuda(0));
      ASSERT_TRUE(cb::EmbeddingForward(tokens, twte, twpe, tout, stream_).ok());
      DVec out(B * T * cols);
      for (int64_t r = 0; r < B * T; ++r)
        for (int64_t c = 0; c < cols; ++c)
          out[r * cols + c] =
              double(wte[ids[r] * cols + c]) + wpe[(r % T) * cols + c];
      const std::string tag = "Embedding C=" + std::to_string(cols);
      Check(tag + " forward", dtype, Host(tout), out);

      Tensor tdy = Random({B, T, cols}, dtype, 43, &dy);
      Tensor tgte = Random({V, cols}, dtype, 44, &gte0);
      Tensor tgpe = Random({max_t, cols}, dtype, 45, &gpe0);
      DVec gte(V * cols, 0.0), gpe(max_t * cols, 0.0);
      for (int64_t r = 0; r < B * T; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          gte[ids[r] * cols + c] += dy[r * cols + c];
          gpe[(r % T) * cols + c] += dy[r * cols + c];
        }
      for (int repeat = 1; repeat <= 2; ++repeat) {
        ASSERT_TRUE(
            cb::EmbeddingBackward(tdy, tokens, tgte, tgpe, stream_).ok());
        DVec want_te(gte.size()), want_pe(gpe.size());
        for (size_t i = 0; i < gte.size(); ++i)
          want_te[i] = gte0[i] + repeat * gte[i];
        for (size_t i = 0; i < gpe.size(); ++i)
          want_pe[i] = gpe0[i] + repeat * gpe[i];
        const std::string r = " (backward x" + std::to_string(repeat) + ")";
        Check(tag + " grad_token_table" + r, dtype, Host(tgte), want_te);
        Check(tag + " grad_position_table" + r, dtype, Host(tgpe), want_pe);
      }
    }
  }
}

// The token table's gradient is summed in a fixed order (the CPU backend's:
// the gradient's value, then its token's rows in ascending row order, in
// f32), so the GPU equals the CPU bit for bit, for every gradient dtype,
// with a frequent token (runs longer than the kernel's load batch), ids
// at both ends of the vocabulary, and an existing gradient to add to.
TEST_F(FunctionalCudaTest, EmbeddingTokenGradientEqualsCpuBitForBit) {
  const int64_t B = 4, T = 61, V = 5003;
  std::mt19937 generator(7);
  std::uniform_int_distribution<int32_t> any_token(0, V - 1);
  std::vector<int32_t> ids(B * T);
  for (int64_t i = 0; i < B * T; ++i) {
    ids[i] = i % 5 < 2 ? 7
                       : (i % 5 == 2 ? static_cast<int32_t>(i % 13)
                                     : any_token(generator));
  }
  ids[0] = 0;
  ids[B * T - 1] = V - 1;
  const Tensor tokens = Tokens(ids, {B, T});
  const Tensor cpu_tokens = *Tensor::Empty({B, T}, DType::kI32, Device::Cpu());
  std::copy(ids.begin(), ids.end(), cpu_tokens.data_as<int32_t>());
  struct Case {
    DType dy, grad;
  };
  for (const Case& dtypes :
       {Case{DType::kF32, DType::kF32}, Case{DType::kBF16, DType::kBF16},
        Case{DType::kF16, DType::kF16}, Case{DType::kBF16, DType::kF32}}) {
    for (int64_t cols : {64, 37, 520}) {
      const std::string tag = std::string("dy ") + DTypeName(dtypes.dy) +
                              " grad " + DTypeName(dtypes.grad) +
                              " C=" + std::to_string(cols);
      Vec dy, grad0;
      const Tensor tdy = Random({B, T, cols}, dtypes.dy, 61, &dy);
      const Tensor tgrad = Random({V, cols}, dtypes.grad, 62, &grad0, 0.1f);
      const Tensor cpu_dy =
          *FromHostFloats(dy, {B, T, cols}, dtypes.dy, Device::Cpu(), Stream());
      const Tensor cpu_grad = *FromHostFloats(grad0, {V, cols}, dtypes.grad,
                                              Device::Cpu(), Stream());
      for (int repeat = 1; repeat <= 2; ++repeat) {
        ASSERT_TRUE(
            EmbeddingBackward(tdy, tokens, tgrad, Tensor(), stream_).ok())
            << tag;
        ASSERT_TRUE(
            EmbeddingBackward(cpu_dy, cpu_tokens, cpu_grad, Tensor(), Stream())
                .ok())
            << tag;
        const Vec got = Host(tgrad);
        const Vec want = *ToHostFloats(cpu_grad, Stream());
        int64_t differ = 0, first = -1;
        for (size_t i = 0; i < want.size(); ++i) {
          if (got[i] != want[i]) {
            if (first < 0) first = static_cast<int64_t>(i);
            ++differ;
          }
        }
        EXPECT_EQ(differ, 0)
            << tag << " backward x" << repeat << ": first at token "
            << first / cols << " column " << first % cols << " got "
            << got[first] << " want " << want[first];
      }
    }
  }
}

// Incremental decoding: KvCacheWrite, CachedAttentionForward and
// EmbeddingForwardAt through nn/functional.h's dispatch, against the same
// ops on the CPU with the rounded inputs. Three sequences in rows 2, 0 and 3
// of a 4-row cache take a prefill of 5 positions, a decode step of 1 and a
// chunk of 3 at their own starts; the cache contents must match exactly.
TEST_F(FunctionalCudaTest, KvCacheDecodeMatchesCpu) {
  const std::vector<int32_t> row_ids = {2, 0, 3};
  const int64_t n = 3, batch = 4, heads = 3, capacity = 37;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t head_dim : {64, 20, 128, 256}) {
      const int64_t channels = heads * head_dim;
      const Shape cache_shape = {batch, heads, capacity, head_dim};
      Vec k0, v0;
      Tensor keys = Random(cache_shape, dtype, 51, &k0);
      Tensor values = Random(cache_shape, dtype, 52, &v0);
      Tensor cpu_keys = Cpu(k0, cache_shape), cpu_values = Cpu(v0, cache_shape);
      const Tensor rows = Tokens(row_ids, {n});
      const Tensor cpu_rows = *Tensor::Empty({n}, DType::kI32, Device::Cpu());
      std::copy(row_ids.begin(), row_ids.end(), cpu_rows.data_as<int32_t>());
      int32_t position = 0;
      for (int64_t chunk : {5, 1, 3}) {
        const std::string tag =
            "CachedAttention D=" + std::to_string(head_dim) + " at " +
            std::to_string(position);
        Vec q;
        Tensor qkv = Random({n, chunk, 3 * channels}, dtype,
                            60 + static_cast<uint32_t>(position), &q);
        const std::vector<int32_t> start_ids(n, position);
        const Tensor starts = Tokens(start_ids, {n});
        const Tensor cpu_starts =
            *Tensor::Empty({n}, DType::kI32, Device::Cpu());
        std::copy(start_ids.begin(), start_ids.end(),
                  cpu_starts.data_as<int32_t>());
        const Tensor cpu_qkv = Cpu(q, {n, chunk, 3 * channels});
        ASSERT_TRUE(
            KvCacheWrite(qkv, rows, starts, heads, keys, values, stream_).ok());
        ASSERT_TRUE(KvCacheWrite(cpu_qkv, cpu_rows, cpu_starts, heads, cpu_keys,
                                 cpu_values, Stream())
                        .ok());
        Tensor out =
            *Tensor::Empty({n, chunk, channels}, dtype, Device::Cuda(0));
        Tensor cpu_out =
            *Tensor::Empty({n, chunk, channels}, DType::kF32, Device::Cpu());
        ASSERT_TRUE(CachedAttentionForward(qkv, rows, starts, heads, keys,
                                           values, out, stream_)
                        .ok());
        ASSERT_TRUE(CachedAttentionForward(cpu_qkv, cpu_rows, cpu_starts, heads,
                                           cpu_keys, cpu_values, cpu_out,
                                           Stream())
                        .ok());
        Check(tag, dtype, Host(out), Doubles(cpu_out));
        position += static_cast<int32_t>(chunk);
      }
      // The writes are copies: bit-equal to the CPU's (same rounded values).
      EXPECT_EQ(Host(keys), *ToHostFloats(cpu_keys, Stream()));
      EXPECT_EQ(Host(values), *ToHostFloats(cpu_values, Stream()));
    }
  }
  // Positioned embedding.
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const int64_t T = 2, V = 50, cols = 40, max_t = 9;
    const std::vector<int32_t> ids = {3, 49, 0, 7, 12, 12};
    const std::vector<int32_t> start_ids = {7, 0, 3};
    Vec wte, wpe;
    Tensor twte = Random({V, cols}, dtype, 71, &wte);
    Tensor twpe = Random({max_t, cols}, dtype, 72, &wpe);
    Tensor out = *Tensor::Empty({3, T, cols}, dtype, Device::Cuda(0));
    ASSERT_TRUE(EmbeddingForwardAt(Tokens(ids, {3, T}), Tokens(start_ids, {3}),
                                   twte, twpe, out, stream_)
                    .ok());
    DVec want(3 * T * cols);
    for (int64_t r = 0; r < 3 * T; ++r)
      for (int64_t c = 0; c < cols; ++c)
        want[r * cols + c] = double(wte[ids[r] * cols + c]) +
                             wpe[(start_ids[r / T] + r % T) * cols + c];
    Check("EmbeddingForwardAt", dtype, Host(out), want);
  }
}

// Rows of V logits of which the first `classes` take part (V > classes: a
// padded vocabulary, on the vectorised path when V is a multiple of 8).
TEST_F(FunctionalCudaTest, CrossEntropy) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1003, 1003}, {1024, 1024}, {1024, 1003}, {1024, 1000}};
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (const auto& [V, classes] : shapes) {
      const int64_t M = 7;
      std::vector<int32_t> targets = {5, -1, 1002, 0, 17, -1, 999};
      for (int32_t& t : targets) {
        t = t >= classes ? static_cast<int32_t>(classes - 1) : t;
      }
      Tensor ttargets = Tokens(targets, {M});
      Vec logits;
      Tensor tlogits = Random({M, V}, dtype, 51, &logits, 4.0f);
      Tensor tlosses = *Tensor::Empty({M}, DType::kF32, Device::Cuda(0));
      ASSERT_TRUE(
          cb::CrossEntropyForward(tlogits, ttargets, tlosses, classes, stream_)
              .ok());
      DVec losses(M, 0.0), grad(M * V, 0.0);
      const double scale = 0.5;
      for (int64_t r = 0; r < M; ++r) {
        if (targets[r] < 0) continue;
        double m = -INFINITY, s = 0;
        for (int64_t c = 0; c < classes; ++c)
          m = std::max(m, double(logits[r * V + c]));
        for (int64_t c = 0; c < classes; ++c) {
          s += std::exp(logits[r * V + c] - m);
        }
        const double lse = m + std::log(s);
        losses[r] = lse - logits[r * V + targets[r]];
        for (int64_t c = 0; c < classes; ++c) {
          grad[r * V + c] = scale * (std::exp(logits[r * V + c] - lse) -
                                     (c == targets[r] ? 1.0 : 0.0));
        }
      }
      const std::string tag = "CrossEntropy V=" + std::to_string(V) +
                              " classes=" + std::to_string(classes);
      Check(tag + " losses", DType::kF32, Host(tlosses), losses,
            dtype == DType::kF32 ? 1 : 5);
      Tensor tgrad = *Tensor::Empty({M, V}, dtype, Device::Cuda(0));
      ASSERT_TRUE(cb::CrossEntropyBackward(tlogits, ttargets, 0.5f, tgrad,
                                           classes, stream_)
                      .ok());
      Check(tag + " grad", dtype, Host(tgrad), grad);
      // In place: grad_logits aliases logits.
      ASSERT_TRUE(cb::CrossEntropyBackward(tlogits, ttargets, 0.5f, tlogits,
                                           classes, stream_)
                      .ok());
      Check(tag + " grad in place", dtype, Host(tlogits), grad);
      // A slice of the columns from the forward's logsumexp (in place).
      Tensor tlogits2 = Random({M, V}, dtype, 51, &logits, 4.0f);
      Tensor tlse = *Tensor::Empty({M}, DType::kF32, Device::Cuda(0));
      ASSERT_TRUE(cb::CrossEntropyForward(tlogits2, ttargets, tlosses, classes,
                                          stream_, tlse)
                      .ok());
      Check(tag + " losses with logsumexp", DType::kF32, Host(tlosses), losses,
            dtype == DType::kF32 ? 1 : 5);
      const int64_t offset = 496, width = V - offset;
      Vec slice_values(M * width);
      for (int64_t r = 0; r < M; ++r) {
        for (int64_t c = 0; c < width; ++c) {
          slice_values[r * width + c] = logits[r * V + offset + c];
        }
      }
      Tensor tslice = *FromHostFloats(slice_values, {M, width}, dtype,
                                      Device::Cuda(0), stream_);
      ASSERT_TRUE(cb::CrossEntropySliceBackward(tslice, tlse, ttargets, 0.5f,
                                                tslice, offset, classes,
                                                stream_)
                      .ok());
      DVec slice_grad(M * width);
      for (int64_t r = 0; r < M; ++r) {
        for (int64_t c = 0; c < width; ++c) {
          slice_grad[r * width + c] = grad[r * V + offset + c];
        }
      }
      Check(tag + " slice grad", dtype, Host(tslice), slice_grad);
    }
  }
}

// The residual gradient fused into LayerNorm's backward (dx =
// LayerNorm'(dy) + addend), on the warp-per-row, unvectorised and team
// kernels.
TEST_F(FunctionalCudaTest, LayerNormBackwardWithAddend) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const std::vector<std::pair<int64_t, int64_t>> shapes = {
        {19, 64}, {19, 100}, {613, 2048}, {1037, 768}};
    for (const auto& [rows, cols] : shapes) {
      const std::string tag = "LayerNorm+addend R=" + std::to_string(rows) +
                              " C=" + std::to_string(cols);
      Vec x, w, b, dy, addend;
      Tensor tx = Random({rows, cols}, dtype, 21, &x, 2.0f);
      Tensor tw = Random({cols}, dtype, 23, &w);
      Tensor tb = Random({cols}, dtype, 24, &b);
      Tensor ty = *Tensor::Empty({rows, cols}, dtype, Device::Cuda(0));
      Tensor tmean = *Tensor::Empty({rows}, DType::kF32, Device::Cuda(0));
      Tensor trstd = *Tensor::Empty({rows}, DType::kF32, Device::Cuda(0));
      ASSERT_TRUE(
          cb::LayerNormForward(tx, tw, tb, ty, tmean, trstd, stream_).ok());
      DVec y(rows * cols), dx(rows * cols);
      Tensor tdy = Random({rows, cols}, dtype, 25, &dy);
      Tensor tadd = Random({rows, cols}, dtype, 26, &addend, 3.0f);
      for (int64_t row = 0; row < rows; ++row) {
        double m = 0, v = 0;
        for (int64_t c = 0; c < cols; ++c) m += x[row * cols + c];
        m /= cols;
        for (int64_t c = 0; c < cols; ++c) {
          v += (x[row * cols + c] - m) * (x[row * cols + c] - m);
        }
        const double rs = 1.0 / std::sqrt(v / cols + 1e-5);
        double sg = 0, sgx = 0;
        for (int64_t c = 0; c < cols; ++c) {
          const double xh = (x[row * cols + c] - m) * rs;
          y[row * cols + c] = xh * w[c] + b[c];
          sg += dy[row * cols + c] * w[c];
          sgx += dy[row * cols + c] * w[c] * xh;
        }
        for (int64_t c = 0; c < cols; ++c) {
          const double xh = (x[row * cols + c] - m) * rs;
          dx[row * cols + c] =
              rs * (dy[row * cols + c] * w[c] - sg / cols - xh * sgx / cols) +
              addend[row * cols + c];
        }
      }
      Check(tag + " forward", dtype, Host(ty), y);
      Tensor tdx = *Tensor::Empty({rows, cols}, dtype, Device::Cuda(0));
      ASSERT_TRUE(cb::LayerNormBackward(tdy, tx, tw, tmean, trstd, tdx,
                                        Tensor(), Tensor(), stream_,
                                        /*grad_addend=*/tadd)
                      .ok());
      Check(tag + " backward + addend", dtype, Host(tdx), dx);
    }
  }
}

}  // namespace
}  // namespace nn
}  // namespace ze
