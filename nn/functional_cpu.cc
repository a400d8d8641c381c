#include "nn/functional_cpu.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "core/status.h"

namespace ze {
namespace nn {
namespace cpu_backend {
namespace {

// A read-only f32 view of a host tensor: the tensor's own bytes when it is
// f32, otherwise a widened copy (bf16/f16 are storage formats on the CPU).
class FloatIn {
 public:
  explicit FloatIn(const Tensor &tensor) {
    if (!tensor.defined()) return;
    if (tensor.dtype() == DType::kF32) {
      data_ = tensor.data_as<const float>();
      return;
    }
    widened_.resize(tensor.numel());
    for (int64_t i = 0; i < tensor.numel(); ++i) {
      widened_[i] = LoadAsFloat(tensor.data(), tensor.dtype(), i);
    }
    data_ = widened_.data();
  }
  const float *get() const { return data_; }

 private:
  const float *data_ = nullptr;
  std::vector<float> widened_;
};

// A writable f32 view of a host tensor. An f32 tensor is written in place;
// other dtypes go through an f32 buffer that Commit() rounds back. With
// `load`, the buffer starts from the tensor's values (for accumulation).
class FloatOut {
 public:
  FloatOut(const Tensor &tensor, bool load) : tensor_(tensor) {
    if (!tensor.defined()) return;
    if (tensor.dtype() == DType::kF32) {
      data_ = tensor.data_as<float>();
      return;
    }
    buffer_.assign(tensor.numel(), 0.0f);
    if (load) {
      for (int64_t i = 0; i < tensor.numel(); ++i) {
        buffer_[i] = LoadAsFloat(tensor.data(), tensor.dtype(), i);
      }
    }
    data_ = buffer_.data();
  }
  float *get() const { return data_; }
  void Commit() {
    if (!tensor_.defined() || tensor_.dtype() == DType::kF32) return;
    for (int64_t i = 0; i < tensor_.numel(); ++i) {
      StoreFromFloat(tensor_.data(), tensor_.dtype(), i, buffer_[i]);
    }
  }

 private:
  Tensor tensor_;
  float *data_ = nullptr;
  std::vector<float> buffer_;
};

constexpr float kLayerNormEpsilon = 1e-5f;

// Softmax of each row i of scores (rows, cols) over columns [0, first + i]
// (causal with `first` earlier positions), zeroing the rest; returns each
// row's logsumexp in `lse` when given.
void CausalSoftmax(float *scores, int rows, int cols, int first, float *lse) {
  for (int i = 0; i < rows; ++i) {
    float *row = scores + static_cast<int64_t>(i) * cols;
    const int last = first + i;
    float row_max = -std::numeric_limits<float>::infinity();
    for (int j = 0; j <= last; ++j) row_max = std::max(row_max, row[j]);
    double sum = 0.0;
    for (int j = 0; j <= last; ++j) {
      row[j] = std::exp(row[j] - row_max);
      sum += row[j];
    }
    const float inverse_sum = static_cast<float>(1.0 / sum);
    for (int j = 0; j <= last; ++j) row[j] *= inverse_sum;
    for (int j = last + 1; j < cols; ++j) row[j] = 0.0f;
    if (lse != nullptr) lse[i] = row_max + static_cast<float>(std::log(sum));
  }
}

}  // namespace

absl::Status LinearForward(const Tensor &input, const Tensor &weight,
                           const Tensor &bias, const Tensor &output) {
  const int m = static_cast<int>(input.size(0));
  const int k = static_cast<int>(input.size(1));
  const int n = static_cast<int>(weight.size(0));
  FloatIn x(input), w(weight), b(bias);
  FloatOut y(output, /*load=*/false);
  if (m > 0 && n > 0) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x.get(),
                k, w.get(), k, 0.0f, y.get(), n);
  }
  if (bias.defined()) {
    for (int row = 0; row < m; ++row) {
      float *y_row = y.get() + static_cast<int64_t>(row) * n;
      for (int col = 0; col < n; ++col) y_row[col] += b.get()[col];
    }
  }
  y.Commit();
  return absl::OkStatus();
}

absl::Status LinearBackward(const Tensor &grad_output, const Tensor &input,
                            const Tensor &weight, const Tensor &grad_input,
                            const Tensor &grad_weight,
                            const Tensor &grad_bias) {
  const int m = static_cast<int>(grad_output.size(0));
  const int n = static_cast<int>(grad_output.size(1));
  const int k = static_cast<int>(weight.size(1));
  FloatIn dy(grad_output);
  // The weight gradient first: grad_input may be input itself.
  if (grad_weight.defined()) {
    FloatIn x(input);
    FloatOut dw(grad_weight, /*load=*/true);
    if (n > 0 && k > 0 && m > 0) {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, k, m, 1.0f,
                  dy.get(), n, x.get(), k, 1.0f, dw.get(), k);
    }
    dw.Commit();
  }
  if (grad_input.defined()) {
    FloatIn w(weight);
    FloatOut dx(grad_input, /*load=*/false);
    if (m > 0 && k > 0) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, k, n, 1.0f,
                  dy.get(), n, w.get(), k, 0.0f, dx.get(), k);
    }
    dx.Commit();
  }
  if (grad_bias.defined()) {
    FloatOut db(grad_bias, /*load=*/true);
    for (int row = 0; row < m; ++row) {
      const float *dy_row = dy.get() + static_cast<int64_t>(row) * n;
      for (int col = 0; col < n; ++col) db.get()[col] += dy_row[col];
    }
    db.Commit();
  }
  return absl::OkStatus();
}

absl::Status LayerNormForward(const Tensor &input, const Tensor &weight,
                              const Tensor &bias, const Tensor &output,
                              const Tensor &mean, const Tensor &rstd) {
  const int64_t rows = input.size(0);
  const int64_t channels = input.size(1);
  FloatIn x(input), w(weight), b(bias);
  FloatOut y(output, /*load=*/false);
  float *mean_out = mean.data_as<float>();
  float *rstd_out = rstd.data_as<float>();
  for (int64_t row = 0; row < rows; ++row) {
    const float *x_row = x.get() + row * channels;
    float *y_row = y.get() + row * channels;
    double sum = 0.0;
    for (int64_t c = 0; c < channels; ++c) sum += x_row[c];
    const float row_mean = static_cast<float>(sum / channels);
    double squares = 0.0;
    for (int64_t c = 0; c < channels; ++c) {
      const double centered = x_row[c] - row_mean;
      squares += centered * centered;
    }
    const float row_rstd = static_cast<float>(
        1.0 / std::sqrt(squares / channels + kLayerNormEpsilon));
    for (int64_t c = 0; c < channels; ++c) {
      y_row[c] = (x_row[c] - row_mean) * row_rstd * w.get()[c] + b.get()[c];
    }
    mean_out[row] = row_mean;
    rstd_out[row] = row_rstd;
  }
  y.Commit();
  return absl::OkStatus();
}

absl::Status LayerNormBackward(const Tensor &grad_output, const Tensor &input,
                               const Tensor &weight, const Tensor &mean,
                               const Tensor &rstd, const Tensor &grad_input,
                               const Tensor &grad_weight,
                               const Tensor &grad_bias) {
  const int64_t rows = input.size(0);
  const int64_t channels = input.size(1);
  FloatIn dy(grad_output), x(input), w(weight);
  FloatOut dx(grad_input, /*load=*/false);
  FloatOut dw(grad_weight, /*load=*/true);
  FloatOut db(grad_bias, /*load=*/true);
  const float *mean_in = mean.data_as<const float>();
  const float *rstd_in = rstd.data_as<const float>();
  for (int64_t row = 0; row < rows; ++row) {
    const float *dy_row = dy.get() + row * channels;
    const float *x_row = x.get() + row * channels;
    const float row_mean = mean_in[row];
    const float row_rstd = rstd_in[row];
    // dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), where
    // dxhat = dy * weight and xhat is the normalised input.
    double dxhat_sum = 0.0, dxhat_xhat_sum = 0.0;
    for (int64_t c = 0; c < channels; ++c) {
      const float xhat = (x_row[c] - row_mean) * row_rstd;
      const float dxhat = dy_row[c] * w.get()[c];
      dxhat_sum += dxhat;
      dxhat_xhat_sum += dxhat * xhat;
      if (dw.get() != nullptr) dw.get()[c] += dy_row[c] * xhat;
      if (db.get() != nullptr) db.get()[c] += dy_row[c];
    }
    if (dx.get() == nullptr) continue;
    const float dxhat_mean = static_cast<float>(dxhat_sum / channels);
    const float dxhat_xhat_mean = static_cast<float>(dxhat_xhat_sum / channels);
    float *dx_row = dx.get() + row * channels;
    for (int64_t c = 0; c < channels; ++c) {
      const float xhat = (x_row[c] - row_mean) * row_rstd;
      const float dxhat = dy_row[c] * w.get()[c];
      dx_row[c] = row_rstd * (dxhat - dxhat_mean - xhat * dxhat_xhat_mean);
    }
  }
  dx.Commit();
  dw.Commit();
  db.Commit();
  return absl::OkStatus();
}

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

float GeluTanh(float v) {
  const float inner = kGeluScale * (v + kGeluCubic * v * v * v);
  return 0.5f * v * (1.0f + std::tanh(inner));
}

float GeluDerivative(float v) {
  const float inner = kGeluScale * (v + kGeluCubic * v * v * v);
  const float tanh_inner = std::tanh(inner);
  const float sech2 = 1.0f - tanh_inner * tanh_inner;
  return 0.5f * (1.0f + tanh_inner) +
         0.5f * v * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
}

}  // namespace

absl::Status GeluForward(const Tensor &input, const Tensor &output) {
  FloatIn x(input);
  FloatOut y(output, /*load=*/false);
  for (int64_t i = 0; i < input.numel(); ++i) y.get()[i] = GeluTanh(x.get()[i]);
  y.Commit();
  return absl::OkStatus();
}

absl::Status GeluBackward(const Tensor &grad_output, const Tensor &input,
                          const Tensor &grad_input) {
  // grad_input may alias grad_output: FloatIn widens (or points at) dy before
  // any element of dx is written, and each element only reads its own dy.
  FloatIn dy(grad_output), x(input);
  FloatOut dx(grad_input, /*load=*/false);
  for (int64_t i = 0; i < input.numel(); ++i) {
    dx.get()[i] = dy.get()[i] * GeluDerivative(x.get()[i]);
  }
  dx.Commit();
  return absl::OkStatus();
}

absl::Status LinearGeluForward(const Tensor &input, const Tensor &weight,
                               const Tensor &bias, const Tensor &output,
                               const Tensor &pre_activation) {
  // The pre-activation in f32 (in place when it is f32), GELU from those f32
  // values; each output rounded once.
  FloatOut pre(pre_activation, /*load=*/false);
  {
    const int m = static_cast<int>(input.size(0));
    const int k = static_cast<int>(input.size(1));
    const int n = static_cast<int>(weight.size(0));
    FloatIn x(input), w(weight), b(bias);
    if (m > 0 && n > 0) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f,
                  x.get(), k, w.get(), k, 0.0f, pre.get(), n);
    }
    if (bias.defined()) {
      for (int row = 0; row < m; ++row) {
        float *p_row = pre.get() + static_cast<int64_t>(row) * n;
        for (int col = 0; col < n; ++col) p_row[col] += b.get()[col];
      }
    }
  }
  FloatOut y(output, /*load=*/false);
  for (int64_t i = 0; i < output.numel(); ++i) {
    y.get()[i] = GeluTanh(pre.get()[i]);
  }
  y.Commit();
  pre.Commit();
  return absl::OkStatus();
}

absl::Status GeluLinearBackward(const Tensor &grad_output, const Tensor &input,
                                const Tensor &weight,
                                const Tensor &pre_activation,
                                const Tensor &grad_pre_activation,
                                const Tensor &grad_weight,
                                const Tensor &grad_bias,
                                const Tensor &grad_pre_activation_bias) {
  const int m = static_cast<int>(grad_output.size(0));
  const int n = static_cast<int>(grad_output.size(1));
  const int k = static_cast<int>(weight.size(1));
  // The weight and bias gradients first: grad_pre_activation may be input
  // itself.
  if (grad_weight.defined() || grad_bias.defined()) {
    ZE_RETURN_IF_ERROR(LinearBackward(grad_output, input, weight, Tensor(),
                                      grad_weight, grad_bias));
  }
  {
    // d(pre) = (dy @ W) * gelu'(pre), all in f32; the bias sum is taken from
    // the f32 values before rounding.
    FloatIn dy(grad_output), w(weight), pre(pre_activation);
    FloatOut dpre(grad_pre_activation, /*load=*/false);
    if (m > 0 && k > 0) {
      if (n > 0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, k, n, 1.0f,
                    dy.get(), n, w.get(), k, 0.0f, dpre.get(), k);
      } else {
        std::fill(dpre.get(), dpre.get() + static_cast<int64_t>(m) * k, 0.0f);
      }
    }
    for (int64_t i = 0; i < static_cast<int64_t>(m) * k; ++i) {
      dpre.get()[i] *= GeluDerivative(pre.get()[i]);
    }
    if (grad_pre_activation_bias.defined()) {
      FloatOut db(grad_pre_activation_bias, /*load=*/true);
      for (int row = 0; row < m; ++row) {
        const float *row_values = dpre.get() + static_cast<int64_t>(row) * k;
        for (int col = 0; col < k; ++col) db.get()[col] += row_values[col];
      }
      db.Commit();
    }
    dpre.Commit();
  }
  return absl::OkStatus();
}

absl::Status AttentionForward(const Tensor &qkv, int num_heads,
                              const Tensor &output, const Tensor &logsumexp) {
  const int batch = static_cast<int>(qkv.size(0));
  const int seq = static_cast<int>(qkv.size(1));
  const int channels = static_cast<int>(output.size(2));
  const int head_dim = channels / num_heads;
  const int qkv_stride = 3 * channels;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  FloatIn qkv_f(qkv);
  FloatOut out(output, /*load=*/false);
  float *lse = logsumexp.data_as<float>();
  std::vector<float> probs(static_cast<size_t>(seq) * seq);  // (T, T)
  for (int b = 0; b < batch; ++b) {
    for (int h = 0; h < num_heads; ++h) {
      const float *q = qkv_f.get() +
                       static_cast<int64_t>(b) * seq * qkv_stride +
                       h * head_dim;
      const float *k = q + channels;
      const float *v = q + 2 * channels;
      float *o =
          out.get() + static_cast<int64_t>(b) * seq * channels + h * head_dim;
      float *lse_bh = lse + (static_cast<int64_t>(b) * num_heads + h) * seq;
      // scores (T, T) = scale * q (T, D) @ k (T, D)^T
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, seq, seq, head_dim,
                  scale, q, qkv_stride, k, qkv_stride, 0.0f, probs.data(), seq);
      CausalSoftmax(probs.data(), seq, seq, /*first=*/0, lse_bh);
      // o (T, D) = probs (T, T) @ v (T, D)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, seq, head_dim, seq,
                  1.0f, probs.data(), seq, v, qkv_stride, 0.0f, o, channels);
    }
  }
  out.Commit();
  return absl::OkStatus();
}

namespace {

// Every (rows[i], starts[i]) must address positions [start, start + T) of a
// row of the cache (B, H, T_max, D).
absl::Status CheckCacheSlots(const char *op, const Tensor &rows,
                             const Tensor &starts, int64_t seq,
                             const Tensor &cache) {
  const int32_t *row = rows.data_as<const int32_t>();
  const int32_t *start = starts.data_as<const int32_t>();
  const int64_t batch = cache.size(0), capacity = cache.size(2);
  for (int64_t i = 0; i < rows.numel(); ++i) {
    if (row[i] < 0 || row[i] >= batch) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": rows[", i, "] = ", row[i],
                       " is outside the cache's batch [0, ", batch, ")"));
    }
    if (start[i] < 0 || start[i] + seq > capacity) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": starts[", i, "] = ", start[i], ": positions [", start[i], ", ",
          start[i] + seq, ") do not fit the cache's T_max = ", capacity));
    }
  }
  return absl::OkStatus();
}

// Positions [0, count) of one (row, head) block of a cache as f32: the
// cache's own bytes when it is f32, else a widened copy in `buffer`.
const float *CacheBlock(const Tensor &cache, int64_t row, int64_t head,
                        int64_t count, std::vector<float> &buffer) {
  const int64_t heads = cache.size(1), capacity = cache.size(2),
                head_dim = cache.size(3);
  const int64_t first = ((row * heads + head) * capacity) * head_dim;
  if (cache.dtype() == DType::kF32) return cache.data_as<const float>() + first;
  buffer.resize(count * head_dim);
  for (int64_t e = 0; e < count * head_dim; ++e) {
    buffer[e] = LoadAsFloat(cache.data(), cache.dtype(), first + e);
  }
  return buffer.data();
}

}  // namespace

absl::Status KvCacheWrite(const Tensor &qkv, const Tensor &rows,
                          const Tensor &starts, int num_heads,
                          const Tensor &key_cache, const Tensor &value_cache) {
  const int64_t n = qkv.size(0), seq = qkv.size(1);
  ZE_RETURN_IF_ERROR(
      CheckCacheSlots("KvCacheWrite", rows, starts, seq, key_cache));
  const int64_t channels = qkv.size(2) / 3;
  const int64_t head_dim = channels / num_heads;
  const int64_t capacity = key_cache.size(2);
  const size_t element = SizeOf(qkv.dtype());
  const size_t row_bytes = head_dim * element;
  const char *source = static_cast<const char *>(qkv.data());
  const int32_t *row = rows.data_as<const int32_t>();
  const int32_t *start = starts.data_as<const int32_t>();
  // Same dtype on both sides: whole (D) rows move as bytes.
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t t = 0; t < seq; ++t) {
      const int64_t token = i * seq + t;
      for (int64_t h = 0; h < num_heads; ++h) {
        const int64_t k_offset = token * 3 * channels + channels + h * head_dim;
        const int64_t v_offset = k_offset + channels;
        const int64_t cache_offset =
            ((row[i] * num_heads + h) * capacity + start[i] + t) * head_dim;
        std::memcpy(
            static_cast<char *>(key_cache.data()) + cache_offset * element,
            source + k_offset * element, row_bytes);
        std::memcpy(
            static_cast<char *>(value_cache.data()) + cache_offset * element,
            source + v_offset * element, row_bytes);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CachedAttentionForward(const Tensor &qkv, const Tensor &rows,
                                    const Tensor &starts, int num_heads,
                                    const Tensor &key_cache,
                                    const Tensor &value_cache,
                                    const Tensor &output) {
  const int n = static_cast<int>(qkv.size(0));
  const int seq = static_cast<int>(qkv.size(1));
  ZE_RETURN_IF_ERROR(
      CheckCacheSlots("CachedAttentionForward", rows, starts, seq, key_cache));
  const int channels = static_cast<int>(output.size(2));
  const int head_dim = channels / num_heads;
  const int qkv_stride = 3 * channels;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const int32_t *row = rows.data_as<const int32_t>();
  const int32_t *start = starts.data_as<const int32_t>();
  FloatIn qkv_f(qkv);
  FloatOut out(output, /*load=*/false);
  std::vector<float> probs, key_buffer, value_buffer;
  // The same steps as AttentionForward, over the cached keys: query t of
  // sequence i sees positions [0, start + t].
  for (int i = 0; i < n; ++i) {
    const int keys = start[i] + seq;
    probs.resize(static_cast<size_t>(seq) * keys);  // (T, keys)
    for (int h = 0; h < num_heads; ++h) {
      const float *q = qkv_f.get() +
                       static_cast<int64_t>(i) * seq * qkv_stride +
                       h * head_dim;
      const float *k = CacheBlock(key_cache, row[i], h, keys, key_buffer);
      const float *v = CacheBlock(value_cache, row[i], h, keys, value_buffer);
      float *o =
          out.get() + static_cast<int64_t>(i) * seq * channels + h * head_dim;
      // scores (T, keys) = scale * q (T, D) @ k (keys, D)^T
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, seq, keys, head_dim,
                  scale, q, qkv_stride, k, head_dim, 0.0f, probs.data(), keys);
      // causal: query t sees positions [0, start + t]
      CausalSoftmax(probs.data(), seq, keys, start[i], /*lse=*/nullptr);
      // o (T, D) = probs (T, keys) @ v (keys, D)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, seq, head_dim,
                  keys, 1.0f, probs.data(), keys, v, head_dim, 0.0f, o,
                  channels);
    }
  }
  out.Commit();
  return absl::OkStatus();
}

absl::Status AttentionBackward(const Tensor &grad_output, const Tensor &qkv,
                               const Tensor &output, const Tensor &logsumexp,
                               int num_heads, const Tensor &grad_qkv) {
  const int batch = static_cast<int>(qkv.size(0));
  const int seq = static_cast<int>(qkv.size(1));
  const int channels = static_cast<int>(output.size(2));
  const int head_dim = channels / num_heads;
  const int qkv_stride = 3 * channels;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  FloatIn qkv_f(qkv), out_f(output), dout_f(grad_output);
  FloatOut dqkv(grad_qkv, /*load=*/false);
  const float *lse = logsumexp.data_as<const float>();
  std::vector<float> probs(static_cast<size_t>(seq) * seq);        // (T, T)
  std::vector<float> grad_scores(static_cast<size_t>(seq) * seq);  // (T, T)
  for (int b = 0; b < batch; ++b) {
    for (int h = 0; h < num_heads; ++h) {
      const int64_t qkv_offset =
          static_cast<int64_t>(b) * seq * qkv_stride + h * head_dim;
      const int64_t out_offset =
          static_cast<int64_t>(b) * seq * channels + h * head_dim;
      const float *q = qkv_f.get() + qkv_offset;
      const float *k = q + channels;
      const float *v = q + 2 * channels;
      const float *o = out_f.get() + out_offset;
      const float *d_o = dout_f.get() + out_offset;
      float *dq = dqkv.get() + qkv_offset;
      float *dk = dq + channels;
      float *dv = dq + 2 * channels;
      const float *lse_bh =
          lse + (static_cast<int64_t>(b) * num_heads + h) * seq;
      // Recompute probs from the saved logsumexp instead of storing (T, T).
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, seq, seq, head_dim,
                  scale, q, qkv_stride, k, qkv_stride, 0.0f, probs.data(), seq);
      // dprobs (T, T) = d_o (T, D) @ v (T, D)^T
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, seq, seq, head_dim,
                  1.0f, d_o, channels, v, qkv_stride, 0.0f, grad_scores.data(),
                  seq);
      for (int i = 0; i < seq; ++i) {
        float *p_row = probs.data() + static_cast<int64_t>(i) * seq;
        float *ds_row = grad_scores.data() + static_cast<int64_t>(i) * seq;
        // sum_j p_ij dp_ij equals d_o_i . o_i, which avoids a pass over T.
        double row_dot = 0.0;
        for (int d = 0; d < head_dim; ++d) {
          row_dot +=
              static_cast<double>(d_o[static_cast<int64_t>(i) * channels + d]) *
              o[static_cast<int64_t>(i) * channels + d];
        }
        for (int j = 0; j <= i; ++j) {
          p_row[j] = std::exp(p_row[j] - lse_bh[i]);
          ds_row[j] = p_row[j] * (ds_row[j] - static_cast<float>(row_dot));
        }
        for (int j = i + 1; j < seq; ++j) {
          p_row[j] = 0.0f;
          ds_row[j] = 0.0f;
        }
      }
      // dq = scale * dscores @ k; dk = scale * dscores^T @ q; dv = probs^T @
      // d_o
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, seq, head_dim, seq,
                  scale, grad_scores.data(), seq, k, qkv_stride, 0.0f, dq,
                  qkv_stride);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, seq, head_dim, seq,
                  scale, grad_scores.data(), seq, q, qkv_stride, 0.0f, dk,
                  qkv_stride);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, seq, head_dim, seq,
                  1.0f, probs.data(), seq, d_o, channels, 0.0f, dv, qkv_stride);
    }
  }
  dqkv.Commit();
  return absl::OkStatus();
}

namespace {

// output (B, T, C) row (b, t) = token_table[tokens[b, t]] +
// position_table[start(b) + t], start(b) = starts ? starts[b] : 0. The
// position table may be undefined (no position term).
absl::Status EmbeddingRows(const char *op, const Tensor &tokens,
                           const int32_t *starts, const Tensor &token_table,
                           const Tensor &position_table, const Tensor &output) {
  const int64_t batch = tokens.size(0);
  const int64_t seq = tokens.size(1);
  const int64_t vocab = token_table.size(0);
  const int64_t channels = token_table.size(1);
  const int32_t *ids = tokens.data_as<const int32_t>();
  for (int64_t i = 0; i < batch * seq; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": tokens[", i / seq, ", ", i % seq, "] = ", ids[i],
                       " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  if (starts != nullptr) {
    const int64_t max_positions = position_table.size(0);
    for (int64_t b = 0; b < batch; ++b) {
      if (starts[b] < 0 || starts[b] + seq > max_positions) {
        return absl::InvalidArgumentError(absl::StrCat(
            op, ": starts[", b, "] = ", starts[b], ": positions [", starts[b],
            ", ", starts[b] + seq, ") are outside the position table [0, ",
            max_positions, ")"));
      }
    }
  }
  FloatIn wte(token_table), wpe(position_table);
  FloatOut out(output, /*load=*/false);
  for (int64_t i = 0; i < batch * seq; ++i) {
    const float *token_row = wte.get() + ids[i] * channels;
    float *out_row = out.get() + i * channels;
    if (wpe.get() != nullptr) {
      const int64_t position =
          (starts != nullptr ? starts[i / seq] : 0) + i % seq;
      const float *position_row = wpe.get() + position * channels;
      for (int64_t c = 0; c < channels; ++c) {
        out_row[c] = token_row[c] + position_row[c];
      }
    } else {
      for (int64_t c = 0; c < channels; ++c) out_row[c] = token_row[c];
    }
  }
  out.Commit();
  return absl::OkStatus();
}

}  // namespace

absl::Status EmbeddingForward(const Tensor &tokens, const Tensor &token_table,
                              const Tensor &position_table,
                              const Tensor &output) {
  return EmbeddingRows("EmbeddingForward", tokens, nullptr, token_table,
                       position_table, output);
}

absl::Status EmbeddingForwardAt(const Tensor &tokens, const Tensor &starts,
                                const Tensor &token_table,
                                const Tensor &position_table,
                                const Tensor &output) {
  return EmbeddingRows("EmbeddingForwardAt", tokens,
                       starts.data_as<const int32_t>(), token_table,
                       position_table, output);
}

absl::Status EmbeddingBackward(const Tensor &grad_output, const Tensor &tokens,
                               const Tensor &grad_token_table,
                               const Tensor &grad_position_table) {
  const int64_t batch = tokens.size(0);
  const int64_t seq = tokens.size(1);
  const int64_t channels = grad_output.size(2);
  const int32_t *ids = tokens.data_as<const int32_t>();
  FloatIn dout(grad_output);
  if (grad_token_table.defined()) {
    const int64_t vocab = grad_token_table.size(0);
    for (int64_t i = 0; i < batch * seq; ++i) {
      if (ids[i] < 0 || ids[i] >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat(
            "EmbeddingBackward: tokens[", i / seq, ", ", i % seq,
            "] = ", ids[i], " is outside the vocabulary [0, ", vocab, ")"));
      }
    }
    FloatOut dwte(grad_token_table, /*load=*/true);
    for (int64_t i = 0; i < batch * seq; ++i) {
      float *row = dwte.get() + ids[i] * channels;
      const float *d_row = dout.get() + i * channels;
      for (int64_t c = 0; c < channels; ++c) row[c] += d_row[c];
    }
    dwte.Commit();
  }
  if (grad_position_table.defined()) {
    FloatOut dwpe(grad_position_table, /*load=*/true);
    for (int64_t i = 0; i < batch * seq; ++i) {
      float *row = dwpe.get() + (i % seq) * channels;
      const float *d_row = dout.get() + i * channels;
      for (int64_t c = 0; c < channels; ++c) row[c] += d_row[c];
    }
    dwpe.Commit();
  }
  return absl::OkStatus();
}

namespace {

// Checks every target is < vocab (negative means ignored).
absl::Status CheckTargets(const int32_t *targets, int64_t rows, int64_t vocab,
                          const char *operation) {
  for (int64_t row = 0; row < rows; ++row) {
    if (targets[row] >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat(operation, ": targets[", row, "] = ", targets[row],
                       " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

// logsumexp of one row, in double for a stable reference.
float RowLogSumExp(const float *row, int64_t count) {
  float row_max = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < count; ++i) row_max = std::max(row_max, row[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < count; ++i) sum += std::exp(row[i] - row_max);
  return row_max + static_cast<float>(std::log(sum));
}

}  // namespace

namespace {

// The softmax cross-entropy's gradient over `width` logits of one row, the
// vocabulary's columns [offset, offset + width): grad_scale * (exp(x -
// lse) - onehot(target)) below `classes`, 0 from there on and for an
// ignored row (target < 0). Element by element, so dx may be x; the
// whole-row and slice backwards' one arithmetic.
void SoftmaxGradientRow(const float *x, int64_t width, int64_t offset,
                        float lse, int64_t target, int64_t classes,
                        float grad_scale, float *dx) {
  for (int64_t i = 0; i < width; ++i) {
    const int64_t column = offset + i;
    if (target < 0 || column >= classes) {
      dx[i] = 0.0f;
      continue;
    }
    dx[i] = grad_scale * std::exp(x[i] - lse);
    if (column == target) dx[i] -= grad_scale;
  }
}

}  // namespace

absl::Status CrossEntropyForward(const Tensor &logits, const Tensor &targets,
                                 const Tensor &losses, int64_t classes,
                                 const Tensor &logsumexp) {
  const int64_t rows = logits.size(0);
  const int64_t vocab = logits.size(1);
  const int32_t *target_ids = targets.data_as<const int32_t>();
  {
    absl::Status status =
        CheckTargets(target_ids, rows, classes, "CrossEntropyForward");
    if (!status.ok()) return status;
  }
  FloatIn x(logits);
  float *loss_out = losses.data_as<float>();
  float *lse_out = logsumexp.defined() ? logsumexp.data_as<float>() : nullptr;
  for (int64_t row = 0; row < rows; ++row) {
    if (target_ids[row] < 0) {
      loss_out[row] = 0.0f;
      if (lse_out != nullptr) lse_out[row] = 0.0f;
      continue;
    }
    const float *x_row = x.get() + row * vocab;
    const float lse = RowLogSumExp(x_row, classes);
    loss_out[row] = lse - x_row[target_ids[row]];
    if (lse_out != nullptr) lse_out[row] = lse;
  }
  return absl::OkStatus();
}

absl::Status CrossEntropySliceBackward(const Tensor &logits,
                                       const Tensor &logsumexp,
                                       const Tensor &targets, float grad_scale,
                                       const Tensor &grad_logits,
                                       int64_t offset, int64_t classes) {
  const int64_t rows = logits.size(0);
  const int64_t width = logits.size(1);
  const int32_t *target_ids = targets.data_as<const int32_t>();
  const float *lse = logsumexp.data_as<const float>();
  // As CrossEntropyBackward's arithmetic (grad_logits may alias logits).
  FloatIn x(logits);
  FloatOut dx(grad_logits, /*load=*/false);
  for (int64_t row = 0; row < rows; ++row) {
    SoftmaxGradientRow(x.get() + row * width, width, offset, lse[row],
                       target_ids[row], classes, grad_scale,
                       dx.get() + row * width);
  }
  dx.Commit();
  return absl::OkStatus();
}

absl::Status CrossEntropyBackward(const Tensor &logits, const Tensor &targets,
                                  float grad_scale, const Tensor &grad_logits,
                                  int64_t classes) {
  const int64_t rows = logits.size(0);
  const int64_t vocab = logits.size(1);
  const int32_t *target_ids = targets.data_as<const int32_t>();
  {
    absl::Status status =
        CheckTargets(target_ids, rows, classes, "CrossEntropyBackward");
    if (!status.ok()) return status;
  }
  // grad_logits may alias logits: each row's logsumexp is taken before the
  // row is overwritten, and rows are independent.
  FloatIn x(logits);
  FloatOut dx(grad_logits, /*load=*/false);
  for (int64_t row = 0; row < rows; ++row) {
    const float *x_row = x.get() + row * vocab;
    float *dx_row = dx.get() + row * vocab;
    const float lse = target_ids[row] < 0 ? 0.0f : RowLogSumExp(x_row, classes);
    SoftmaxGradientRow(x_row, vocab, 0, lse, target_ids[row], classes,
                       grad_scale, dx_row);
  }
  dx.Commit();
  return absl::OkStatus();
}

// ---- Decoder (Llama-family) ops.

absl::Status RmsNormForward(const Tensor &input, const Tensor &weight,
                            float eps, const Tensor &output,
                            const Tensor &rstd) {
  const int64_t rows = input.size(0);
  const int64_t channels = input.size(1);
  FloatIn x(input), w(weight);
  FloatOut y(output, /*load=*/false);
  float *rstd_out = rstd.data_as<float>();
  for (int64_t row = 0; row < rows; ++row) {
    const float *x_row = x.get() + row * channels;
    float *y_row = y.get() + row * channels;
    double squares = 0.0;
    for (int64_t c = 0; c < channels; ++c) {
      squares += static_cast<double>(x_row[c]) * x_row[c];
    }
    // Hugging Face: the f32 mean of squares plus eps, then rsqrt.
    const float variance = static_cast<float>(squares / channels);
    const float row_rstd = static_cast<float>(
        1.0 / std::sqrt(static_cast<double>(variance + eps)));
    for (int64_t c = 0; c < channels; ++c) {
      y_row[c] = w.get()[c] * (x_row[c] * row_rstd);
    }
    rstd_out[row] = row_rstd;
  }
  y.Commit();
  return absl::OkStatus();
}

absl::Status RmsNormBackward(const Tensor &grad_output, const Tensor &input,
                             const Tensor &weight, const Tensor &rstd,
                             const Tensor &grad_input,
                             const Tensor &grad_weight) {
  const int64_t rows = input.size(0);
  const int64_t channels = input.size(1);
  FloatIn dy(grad_output), x(input), w(weight);
  FloatOut dx(grad_input, /*load=*/false);
  FloatOut dw(grad_weight, /*load=*/true);
  const float *rstd_in = rstd.data_as<const float>();
  std::vector<float> dxhat_row(channels);
  for (int64_t row = 0; row < rows; ++row) {
    const float *dy_row = dy.get() + row * channels;
    const float *x_row = x.get() + row * channels;
    const float r = rstd_in[row];
    // y = w * xhat with xhat = x * r; dx = r * (dxhat - xhat * mean(dxhat *
    // xhat)), dxhat = dy * w.
    double dot = 0.0;
    for (int64_t c = 0; c < channels; ++c) {
      const float xhat = x_row[c] * r;
      dxhat_row[c] = dy_row[c] * w.get()[c];
      dot += static_cast<double>(dxhat_row[c]) * xhat;
      if (dw.get() != nullptr) dw.get()[c] += dy_row[c] * xhat;
    }
    if (dx.get() == nullptr) continue;
    const float mean_dot = static_cast<float>(dot / channels);
    float *dx_row = dx.get() + row * channels;  // may alias dy_row (f32)
    for (int64_t c = 0; c < channels; ++c) {
      dx_row[c] = r * (dxhat_row[c] - x_row[c] * r * mean_dot);
    }
  }
  dx.Commit();
  dw.Commit();
  return absl::OkStatus();
}

absl::Status RotaryEmbedding(const Tensor &input, const Tensor &inv_freq,
                             const Tensor &starts, const Tensor &output,
                             bool inverse) {
  const int64_t batch = input.size(0), seq = input.size(1),
                heads = input.size(2), head_dim = input.size(3);
  const int64_t half = head_dim / 2;
  const float *frequencies = inv_freq.data_as<const float>();
  const int32_t *start =
      starts.defined() ? starts.data_as<const int32_t>() : nullptr;
  FloatIn x(input);
  FloatOut y(output, /*load=*/false);
  std::vector<float> cosines(half), sines(half);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq; ++t) {
      const int64_t position = (start != nullptr ? start[b] : 0) + t;
      for (int64_t i = 0; i < half; ++i) {
        // As Hugging Face: the angle is the f32 product, cos/sin of it
        // rounded to f32.
        const float angle = frequencies[i] * static_cast<float>(position);
        cosines[i] = static_cast<float>(std::cos(static_cast<double>(angle)));
        sines[i] = static_cast<float>(std::sin(static_cast<double>(angle)));
        if (inverse) sines[i] = -sines[i];
      }
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t offset = ((b * seq + t) * heads + h) * head_dim;
        const float *x_row = x.get() + offset;
        float *y_row = y.get() + offset;  // may alias x_row (f32)
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = x_row[i], x2 = x_row[i + half];
          y_row[i] = x1 * cosines[i] - x2 * sines[i];
          y_row[i + half] = x2 * cosines[i] + x1 * sines[i];
        }
      }
    }
  }
  y.Commit();
  return absl::OkStatus();
}

namespace {

float Sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

}  // namespace

absl::Status SwiGluForward(const Tensor &gate, const Tensor &up,
                           const Tensor &output) {
  FloatIn g(gate), u(up);
  FloatOut y(output, /*load=*/false);
  for (int64_t i = 0; i < gate.numel(); ++i) {
    const float a = g.get()[i];
    y.get()[i] = (a * Sigmoid(a)) * u.get()[i];
  }
  y.Commit();
  return absl::OkStatus();
}

absl::Status SwiGluBackward(const Tensor &grad_output, const Tensor &gate,
                            const Tensor &up, const Tensor &grad_gate,
                            const Tensor &grad_up) {
  FloatIn dy(grad_output), g(gate), u(up);
  FloatOut dg(grad_gate, /*load=*/false), du(grad_up, /*load=*/false);
  for (int64_t i = 0; i < gate.numel(); ++i) {
    const float a = g.get()[i];
    const float s = Sigmoid(a);
    const float d = dy.get()[i];
    // silu(a) = a s; silu'(a) = s (1 + a (1 - s)).
    if (dg.get() != nullptr) {
      dg.get()[i] = d * u.get()[i] * (s * (1.0f + a * (1.0f - s)));
    }
    if (du.get() != nullptr) du.get()[i] = d * (a * s);
  }
  dg.Commit();
  du.Commit();
  return absl::OkStatus();
}

namespace {

// Sizes of grouped-query attention over (B, T, H, D) tensors.
struct GroupedSizes {
  int batch, seq, q_heads, kv_heads, head_dim;
  int group() const { return q_heads / kv_heads; }
  int q_stride() const { return q_heads * head_dim; }    // between tokens
  int kv_stride() const { return kv_heads * head_dim; }  // between tokens
};

GroupedSizes SizesOf(const Tensor &q, const Tensor &k) {
  return {static_cast<int>(q.size(0)), static_cast<int>(q.size(1)),
          static_cast<int>(q.size(2)), static_cast<int>(k.size(2)),
          static_cast<int>(q.size(3))};
}

}  // namespace

absl::Status GroupedAttentionForward(const Tensor &q, const Tensor &k,
                                     const Tensor &v, const Tensor &output,
                                     const Tensor &logsumexp) {
  const GroupedSizes s = SizesOf(q, k);
  const int seq = s.seq, d = s.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  FloatIn q_f(q), k_f(k), v_f(v);
  FloatOut out(output, /*load=*/false);
  float *lse = logsumexp.data_as<float>();
  std::vector<float> probs(static_cast<size_t>(seq) * seq);  // (T, T)
  for (int b = 0; b < s.batch; ++b) {
    for (int h = 0; h < s.q_heads; ++h) {
      const int kv = h / s.group();  // Hugging Face's repeat_kv order
      const int64_t q_offset = static_cast<int64_t>(b) * seq * s.q_stride() +
                               static_cast<int64_t>(h) * d;
      const int64_t kv_offset = static_cast<int64_t>(b) * seq * s.kv_stride() +
                                static_cast<int64_t>(kv) * d;
      // scores (T, T) = scale * q (T, D) @ k (T, D)^T
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, seq, seq, d, scale,
                  q_f.get() + q_offset, s.q_stride(), k_f.get() + kv_offset,
                  s.kv_stride(), 0.0f, probs.data(), seq);
      CausalSoftmax(probs.data(), seq, seq, 0,
                    lse + (static_cast<int64_t>(b) * s.q_heads + h) * seq);
      // o (T, D) = probs (T, T) @ v (T, D)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, seq, d, seq, 1.0f,
                  probs.data(), seq, v_f.get() + kv_offset, s.kv_stride(), 0.0f,
                  out.get() + q_offset, s.q_stride());
    }
  }
  out.Commit();
  return absl::OkStatus();
}

absl::Status GroupedAttentionBackward(
    const Tensor &grad_output, const Tensor &q, const Tensor &k,
    const Tensor &v, const Tensor &output, const Tensor &logsumexp,
    const Tensor &grad_q, const Tensor &grad_k, const Tensor &grad_v) {
  const GroupedSizes s = SizesOf(q, k);
  const int seq = s.seq, d = s.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  FloatIn q_f(q), k_f(k), v_f(v), out_f(output), dout_f(grad_output);
  FloatOut dq(grad_q, /*load=*/false);
  // The q heads of a group add into their kv head's gradient: start at 0.
  FloatOut dk(grad_k, /*load=*/false), dv(grad_v, /*load=*/false);
  std::fill(dk.get(), dk.get() + grad_k.numel(), 0.0f);
  std::fill(dv.get(), dv.get() + grad_v.numel(), 0.0f);
  const float *lse = logsumexp.data_as<const float>();
  std::vector<float> probs(static_cast<size_t>(seq) * seq);        // (T, T)
  std::vector<float> grad_scores(static_cast<size_t>(seq) * seq);  // (T, T)
  for (int b = 0; b < s.batch; ++b) {
    for (int h = 0; h < s.q_heads; ++h) {
      const int kv = h / s.group();
      const int64_t q_offset = static_cast<int64_t>(b) * seq * s.q_stride() +
                               static_cast<int64_t>(h) * d;
      const int64_t kv_offset = static_cast<int64_t>(b) * seq * s.kv_stride() +
                                static_cast<int64_t>(kv) * d;
      const float *qh = q_f.get() + q_offset;
      const float *kh = k_f.get() + kv_offset;
      const float *vh = v_f.get() + kv_offset;
      const float *oh = out_f.get() + q_offset;
      const float *doh = dout_f.get() + q_offset;
      const float *lse_bh =
          lse + (static_cast<int64_t>(b) * s.q_heads + h) * seq;
      // Recompute probs from the saved logsumexp.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, seq, seq, d, scale,
                  qh, s.q_stride(), kh, s.kv_stride(), 0.0f, probs.data(), seq);
      // dprobs (T, T) = d_o (T, D) @ v (T, D)^T
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, seq, seq, d, 1.0f,
                  doh, s.q_stride(), vh, s.kv_stride(), 0.0f,
                  grad_scores.data(), seq);
      for (int i = 0; i < seq; ++i) {
        float *p_row = probs.data() + static_cast<int64_t>(i) * seq;
        float *ds_row = grad_scores.data() + static_cast<int64_t>(i) * seq;
        // sum_j p_ij dp_ij = d_o_i . o_i
        double row_dot = 0.0;
        for (int e = 0; e < d; ++e) {
          row_dot += static_cast<double>(
                         doh[static_cast<int64_t>(i) * s.q_stride() + e]) *
                     oh[static_cast<int64_t>(i) * s.q_stride() + e];
        }
        for (int j = 0; j <= i; ++j) {
          p_row[j] = std::exp(p_row[j] - lse_bh[i]);
          ds_row[j] = p_row[j] * (ds_row[j] - static_cast<float>(row_dot));
        }
        for (int j = i + 1; j < seq; ++j) {
          p_row[j] = 0.0f;
          ds_row[j] = 0.0f;
        }
      }
      // dq = scale dS k (overwritten); dk += scale dS^T q; dv += P^T d_o.
      if (dq.get() != nullptr) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, seq, d, seq,
                    scale, grad_scores.data(), seq, kh, s.kv_stride(), 0.0f,
                    dq.get() + q_offset, s.q_stride());
      }
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, seq, d, seq, scale,
                  grad_scores.data(), seq, qh, s.q_stride(), 1.0f,
                  dk.get() + kv_offset, s.kv_stride());
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, seq, d, seq, 1.0f,
                  probs.data(), seq, doh, s.q_stride(), 1.0f,
                  dv.get() + kv_offset, s.kv_stride());
    }
  }
  dq.Commit();
  dk.Commit();
  dv.Commit();
  return absl::OkStatus();
}

absl::Status GroupedKvCacheWrite(const Tensor &k, const Tensor &v,
                                 const Tensor &rows, const Tensor &starts,
                                 const Tensor &key_cache,
                                 const Tensor &value_cache) {
  const int64_t n = k.size(0), seq = k.size(1), heads = k.size(2),
                head_dim = k.size(3);
  ZE_RETURN_IF_ERROR(
      CheckCacheSlots("GroupedKvCacheWrite", rows, starts, seq, key_cache));
  const int64_t capacity = key_cache.size(2);
  const size_t element = SizeOf(k.dtype());
  const size_t row_bytes = head_dim * element;
  const int32_t *row = rows.data_as<const int32_t>();
  const int32_t *start = starts.data_as<const int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t t = 0; t < seq; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t source = ((i * seq + t) * heads + h) * head_dim;
        const int64_t target =
            ((row[i] * heads + h) * capacity + start[i] + t) * head_dim;
        std::memcpy(static_cast<char *>(key_cache.data()) + target * element,
                    static_cast<const char *>(k.data()) + source * element,
                    row_bytes);
        std::memcpy(static_cast<char *>(value_cache.data()) + target * element,
                    static_cast<const char *>(v.data()) + source * element,
                    row_bytes);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status GroupedCachedAttentionForward(const Tensor &q, const Tensor &rows,
                                           const Tensor &starts,
                                           const Tensor &key_cache,
                                           const Tensor &value_cache,
                                           const Tensor &output) {
  const int n = static_cast<int>(q.size(0));
  const int seq = static_cast<int>(q.size(1));
  const int q_heads = static_cast<int>(q.size(2));
  const int d = static_cast<int>(q.size(3));
  const int kv_heads = static_cast<int>(key_cache.size(1));
  const int group = q_heads / kv_heads;
  const int q_stride = q_heads * d;
  ZE_RETURN_IF_ERROR(CheckCacheSlots("GroupedCachedAttentionForward", rows,
                                     starts, seq, key_cache));
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int32_t *row = rows.data_as<const int32_t>();
  const int32_t *start = starts.data_as<const int32_t>();
  FloatIn q_f(q);
  FloatOut out(output, /*load=*/false);
  std::vector<float> probs, key_buffer, value_buffer;
  for (int i = 0; i < n; ++i) {
    const int keys = start[i] + seq;
    probs.resize(static_cast<size_t>(seq) * keys);  // (T, keys)
    for (int kv = 0; kv < kv_heads; ++kv) {
      const float *kh = CacheBlock(key_cache, row[i], kv, keys, key_buffer);
      const float *vh = CacheBlock(value_cache, row[i], kv, keys, value_buffer);
      for (int h = kv * group; h < (kv + 1) * group; ++h) {
        const int64_t q_offset = static_cast<int64_t>(i) * seq * q_stride +
                                 static_cast<int64_t>(h) * d;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, seq, keys, d,
                    scale, q_f.get() + q_offset, q_stride, kh, d, 0.0f,
                    probs.data(), keys);
        CausalSoftmax(probs.data(), seq, keys, start[i], nullptr);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, seq, d, keys,
                    1.0f, probs.data(), keys, vh, d, 0.0f, out.get() + q_offset,
                    q_stride);
      }
    }
  }
  out.Commit();
  return absl::OkStatus();
}

}  // namespace cpu_backend
}  // namespace nn
}  // namespace ze
