// CUDA backend of nn/functional.h: cuBLASLt for the matrix products, the
// kernels of kernels.cu and attention.cu for the rest.
//
// Row-major to column-major mapping used for every product: a row-major
// (R, C) matrix with leading dimension C is, bit for bit, the column-major
// (C, R) matrix, its transpose. So a row-major product Y = X W^T is computed
// by cuBLASLt as the column-major Y^T = W X^T, i.e. with the operands in
// swapped order. Each call below spells out its m, n, k and transposes.
#include "nn/cuda/functional_cuda.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/allocator.h"
#include "core/device.h"
#include "core/status.h"
#include "nn/cuda/attention.h"
#include "nn/cuda/kernels.h"

namespace ze {
namespace nn {
namespace cuda_backend {
namespace {

namespace kernels = ::ze::nn::cuda_kernels;

// cuBLASLt's recommended workspace on Hopper.
constexpr size_t kLtWorkspaceBytes = 32u << 20;

absl::Status LaunchStatus(int error, const char* what) {
  return CudaStatus(error, what);
}

absl::Status CublasStatus(cublasStatus_t status, const std::string& what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, " failed: ", cublasGetStatusString(status)));
}

absl::StatusOr<cudaDataType_t> CudaType(DType dtype, const char* name) {
  switch (dtype) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          name, " must be f32, bf16 or f16, got ", DTypeName(dtype)));
  }
}

// Per-(device, stream) state: a cuBLASLt workspace (one per stream, because
// concurrent matmuls on two streams must not share one) and a grow-only
// scratch buffer for the kernels' temporaries. Both come from the device's
// caching allocator so they count in its statistics. Work on one stream is
// ordered, so a buffer reused by the next call on the same stream is safe.
struct StreamState {
  void* workspace = nullptr;
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
};

struct DeviceState {
  cublasLtHandle_t handle = nullptr;
  std::map<void*, StreamState> streams;
  // Heuristic results, by a key describing the problem: the heuristic
  // query costs microseconds, the matmuls it picks for should not.
  std::map<std::string, cublasLtMatmulAlgo_t> algos;
};

std::mutex& StateMutex() {
  static std::mutex* mutex = new std::mutex;
  return *mutex;
}

std::map<int, DeviceState>& States() {
  static auto* states = new std::map<int, DeviceState>;
  return *states;
}

// Returns the device state with its handle created; StateMutex() held.
absl::StatusOr<DeviceState*> DeviceStateLocked(int device) {
  DeviceState& state = States()[device];
  if (state.handle == nullptr) {
    ZE_RETURN_IF_ERROR(
        CublasStatus(cublasLtCreate(&state.handle),
                     absl::StrCat("cublasLtCreate on cuda:", device)));
  }
  return &state;
}

absl::StatusOr<StreamState*> StreamStateLocked(int device, void* stream) {
  ZE_ASSIGN_OR_RETURN(DeviceState * state, DeviceStateLocked(device));
  StreamState& stream_state = state->streams[stream];
  if (stream_state.workspace == nullptr) {
    ZE_ASSIGN_OR_RETURN(stream_state.workspace,
                        CudaMemory(device)->Allocate(kLtWorkspaceBytes));
  }
  return &stream_state;
}

// A device buffer of at least `bytes` for temporaries of work queued on
// `stream`; valid until the next call for the same stream. Growing it waits
// for the stream first (the old buffer may still be in use).
absl::StatusOr<void*> Scratch(const Stream& stream, size_t bytes) {
  const int device = stream.device().index;
  std::lock_guard<std::mutex> lock(StateMutex());
  ZE_ASSIGN_OR_RETURN(StreamState * state,
                      StreamStateLocked(device, stream.native()));
  if (state->scratch_bytes < bytes) {
    if (state->scratch != nullptr) {
      ZE_RETURN_IF_ERROR(stream.Synchronize());
      CudaMemory(device)->Deallocate(state->scratch, state->scratch_bytes);
      state->scratch = nullptr;
      state->scratch_bytes = 0;
    }
    ZE_ASSIGN_OR_RETURN(state->scratch, CudaMemory(device)->Allocate(bytes));
    state->scratch_bytes = bytes;
  }
  return state->scratch;
}

int AlignmentOf(const void* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  int alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

// One column-major product D (m, n) = A' (m, k) B' (n... ) as cuBLASLt sees
// it: D = op(A) op(B) + beta D [+ bias per row of D].
struct MatmulArgs {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  cudaDataType_t a_type = CUDA_R_32F;
  int64_t lda = 0;
  const void* b = nullptr;
  cudaDataType_t b_type = CUDA_R_32F;
  int64_t ldb = 0;
  void* d = nullptr;
  cudaDataType_t d_type = CUDA_R_32F;
  int64_t ldd = 0;
  float beta = 0.0f;
  const void* bias = nullptr;  // length m, type d_type; null: none
};

// RAII owners of cuBLASLt descriptors.
struct LayoutDeleter {
  void operator()(cublasLtMatrixLayoutOpaque_t* p) const {
    cublasLtMatrixLayoutDestroy(p);
  }
};
using Layout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LayoutDeleter>;
struct DescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* p) const {
    cublasLtMatmulDescDestroy(p);
  }
};
using Desc = std::unique_ptr<cublasLtMatmulDescOpaque_t, DescDeleter>;
struct PrefDeleter {
  void operator()(cublasLtMatmulPreferenceOpaque_t* p) const {
    cublasLtMatmulPreferenceDestroy(p);
  }
};
using Pref = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, PrefDeleter>;

absl::StatusOr<Layout> MakeLayout(cudaDataType_t type, int64_t rows,
                                  int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t layout = nullptr;
  ZE_RETURN_IF_ERROR(
      CublasStatus(cublasLtMatrixLayoutCreate(&layout, type, rows, cols, ld),
                   "cublasLtMatrixLayoutCreate"));
  return Layout(layout);
}

absl::Status Matmul(const Stream& stream, const MatmulArgs& args) {
  if (args.m == 0 || args.n == 0) return absl::OkStatus();
  const int device = stream.device().index;
  // f32 data computes in plain f32 (no TF32) so CPU comparisons stay tight;
  // 16-bit data uses tensor cores with f32 accumulation.
  const cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cublasLtMatmulDesc_t raw_desc = nullptr;
  ZE_RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulDescCreate(&raw_desc, compute, CUDA_R_32F),
                   "cublasLtMatmulDescCreate"));
  Desc desc(raw_desc);
  const cublasOperation_t op_a = args.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = args.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  ZE_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSA,
                                     &op_a, sizeof(op_a)),
      "set TRANSA"));
  ZE_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSB,
                                     &op_b, sizeof(op_b)),
      "set TRANSB"));
  if (args.bias != nullptr) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    ZE_RETURN_IF_ERROR(CublasStatus(
        cublasLtMatmulDescSetAttribute(desc.get(),
                                       CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                       sizeof(epilogue)),
        "set EPILOGUE"));
    ZE_RETURN_IF_ERROR(CublasStatus(
        cublasLtMatmulDescSetAttribute(desc.get(),
                                       CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                       &args.bias, sizeof(args.bias)),
        "set BIAS_POINTER"));
  }
  // Stored shapes: op(A) is (m, k), so A is (k, m) when transposed.
  ZE_ASSIGN_OR_RETURN(Layout a_layout,
                      MakeLayout(args.a_type, args.trans_a ? args.k : args.m,
                                 args.trans_a ? args.m : args.k, args.lda));
  ZE_ASSIGN_OR_RETURN(Layout b_layout,
                      MakeLayout(args.b_type, args.trans_b ? args.n : args.k,
                                 args.trans_b ? args.k : args.n, args.ldb));
  ZE_ASSIGN_OR_RETURN(Layout d_layout,
                      MakeLayout(args.d_type, args.m, args.n, args.ldd));

  const int align_a = AlignmentOf(args.a), align_b = AlignmentOf(args.b);
  const int align_d = AlignmentOf(args.d);
  const std::string key = absl::StrCat(
      args.trans_a, ",", args.trans_b, ",", args.m, ",", args.n, ",", args.k,
      ",", args.a_type, ",", args.b_type, ",", args.d_type, ",", args.lda, ",",
      args.ldb, ",", args.ldd, ",", args.beta != 0.0f, ",",
      args.bias != nullptr, ",", align_a, ",", align_b, ",", align_d);

  cublasLtHandle_t handle;
  void* workspace;
  cublasLtMatmulAlgo_t algo;
  {
    std::lock_guard<std::mutex> lock(StateMutex());
    ZE_ASSIGN_OR_RETURN(DeviceState * state, DeviceStateLocked(device));
    ZE_ASSIGN_OR_RETURN(StreamState * stream_state,
                        StreamStateLocked(device, stream.native()));
    handle = state->handle;
    workspace = stream_state->workspace;
    auto found = state->algos.find(key);
    if (found != state->algos.end()) {
      algo = found->second;
    } else {
      cublasLtMatmulPreference_t raw_pref = nullptr;
      ZE_RETURN_IF_ERROR(CublasStatus(cublasLtMatmulPreferenceCreate(&raw_pref),
                                      "cublasLtMatmulPreferenceCreate"));
      Pref pref(raw_pref);
      const uint64_t workspace_bytes = kLtWorkspaceBytes;
      cublasLtMatmulPreferenceSetAttribute(
          pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
          &workspace_bytes, sizeof(workspace_bytes));
      const uint32_t aligns[3] = {static_cast<uint32_t>(align_a),
                                  static_cast<uint32_t>(align_b),
                                  static_cast<uint32_t>(align_d)};
      cublasLtMatmulPreferenceSetAttribute(
          pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aligns[0],
          sizeof(uint32_t));
      cublasLtMatmulPreferenceSetAttribute(
          pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &aligns[1],
          sizeof(uint32_t));
      cublasLtMatmulPreferenceSetAttribute(
          pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &aligns[2],
          sizeof(uint32_t));
      cublasLtMatmulPreferenceSetAttribute(
          pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &aligns[2],
          sizeof(uint32_t));
      cublasLtMatmulHeuristicResult_t result = {};
      int found_count = 0;
      ZE_RETURN_IF_ERROR(CublasStatus(
          cublasLtMatmulAlgoGetHeuristic(handle, desc.get(), a_layout.get(),
                                         b_layout.get(), d_layout.get(),
                                         d_layout.get(), pref.get(), 1, &result,
                                         &found_count),
          absl::StrCat("cublasLtMatmulAlgoGetHeuristic (", key, ")")));
      if (found_count == 0) {
        return absl::UnimplementedError(
            absl::StrCat("cuBLASLt has no algorithm for matmul (", key, ")"));
      }
      algo = result.algo;
      state->algos.emplace(key, algo);
    }
  }
  const float alpha = 1.0f;
  return CublasStatus(
      cublasLtMatmul(handle, desc.get(), &alpha, args.a, a_layout.get(), args.b,
                     b_layout.get(), &args.beta, args.d, d_layout.get(), args.d,
                     d_layout.get(), &algo, workspace, kLtWorkspaceBytes,
                     static_cast<cudaStream_t>(stream.native())),
      absl::StrCat("cublasLtMatmul (", key, ")"));
}

int DTypeCode(DType dtype) { return static_cast<int>(dtype); }

absl::Status RequireSameDType(const char* op, const Tensor& reference,
                              std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* tensor : tensors) {
    if (tensor->defined() && tensor->dtype() != reference.dtype()) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, " on CUDA needs activations and weights of one dtype: ",
          tensor->DebugString(), " vs ", reference.DebugString()));
    }
  }
  return absl::OkStatus();
}

absl::Status RequireFloatDType(const char* op, const Tensor& tensor) {
  if (tensor.dtype() == DType::kI32) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, " needs a float tensor, got ", tensor.DebugString()));
  }
  return absl::OkStatus();
}

// Sets the current device to the stream's (kernels launch there).
absl::Status Enter(const Stream& stream) {
  return SetCurrentDevice(stream.device());
}

size_t RoundUp256(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

absl::Status LinearForward(const Tensor& input, const Tensor& weight,
                           const Tensor& bias, const Tensor& output,
                           const Stream& stream) {
  ZE_RETURN_IF_ERROR(Enter(stream));
  ZE_RETURN_IF_ERROR(RequireSameDType("LinearForward", input, {&weight}));
  if (bias.defined() && bias.dtype() != output.dtype()) {
    return absl::InvalidArgumentError(
        absl::StrCat("LinearForward on CUDA needs bias in the output's dtype: ",
                     bias.DebugString(), " vs ", output.DebugString()));
  }
  const int64_t m = input.size(0), k = input.size(1), n = weight.size(0);
  MatmulArgs args;
  // Y^T (N, M) = W^T' ... column-major: D (n_out=N, M) = op(A) B with
  // A = weight stored column-major (K, N) -> transposed; B = input stored
  // column-major (K, M) as is.
  args.trans_a = true;
  args.trans_b = false;
  args.m = n;
  args.n = m;
  args.k = k;
  args.a = weight.data();
  ZE_ASSIGN_OR_RETURN(args.a_type, CudaType(weight.dtype(), "weight"));
  args.lda = k;
  args.b = input.data();
  ZE_ASSIGN_OR_RETURN(args.b_type, CudaType(input.dtype(), "input"));
  args.ldb = k;
  args.d = output.data();
  ZE_ASSIGN_OR_RETURN(args.d_type, CudaType(output.dtype(), "output"));
  args.ldd = n;
  args.beta = 0.0f;
  args.bias = bias.defined() ? bias.data() : nullptr;
  if (k == 0) {
    // An empty reduction: cuBLASLt may reject k = 0; the result is the bias.
    return absl::UnimplementedError("LinearForward on CUDA with K = 0");
  }
  return Annotate(Matmul(stream, args), "LinearForward");
}

absl::Status LinearBackward(const Tensor& grad_output, const Tensor& input,
                            const Tensor& weight, const Tensor& grad_input,
                            const Tensor& grad_weight, const Tensor& grad_bias,
                            const Stream& stream) {
  ZE_RETURN_IF_ERROR(Enter(stream));
  const int64_t m = grad_output.size(0), n = grad_output.size(1);
  const int64_t k = weight.size(1);
  if (grad_input.defined()) {
    ZE_RETURN_IF_ERROR(
        RequireSameDType("LinearBackward", grad_output, {&weight}));
    // dX^T (K, M) = W^T (K, N) dY^T (N, M), all column-major as stored.
    MatmulArgs args;
    args.m = k;
    args.n = m;
    args.k = n;
    args.a = weight.data();
    ZE_ASSIGN_OR_RETURN(args.a_type, CudaType(weight.dtype(), "weight"));
    args.lda = k;
    args.b = grad_output.data();
    ZE_ASSIGN_OR_RETURN(args.b_type,
                        CudaType(grad_output.dtype(), "grad_output"));
    args.ldb = n;
    args.d = grad_input.data();
    ZE_ASSIGN_OR_RETURN(args.d_type,
                        CudaType(grad_input.dtype(), "grad_input"));
    args.ldd = k;
    if (n == 0) {
      ZE_RETURN_IF_ERROR(CudaStatus(
          cudaMemsetAsync(grad_input.data(), 0, grad_input.nbytes(),
                          static_cast<cudaStream_t>(stream.native())),
          "LinearBackward zeroing grad_input"));
    } else {
      ZE_RETURN_IF_ERROR(
          Annotate(Matmul(stream, args), "LinearBackward grad_input"));
    }
  }
  if (grad_weight.defined() && m > 0) {
    ZE_RETURN_IF_ERROR(
        RequireSameDType("LinearBackward", grad_output, {&input}));
    // dW^T (K, N) += X^T (K, M) dY (M, N): X stored column-major (K, M) as
    // is; dY stored column-major (N, M), transposed. beta = 1 accumulates.
    MatmulArgs args;
    args.trans_a = false;
    args.trans_b = true;
    args.m = k;
    args.n = n;
    args.k = m;
    args.a = input.data();
    ZE_ASSIGN_OR_RETURN(args.a_type, CudaType(input.dtype(), "input"));
    args.lda = k;
    args.b = grad_output.data();
    ZE_ASSIGN_OR_RETURN(args.b_type,
                        CudaType(grad_output.dtype(), "grad_output"));
    args.ldb = n;
    args.d = grad_weight.data();
    ZE_ASSIGN_OR_RETURN(args.d_type,
                        CudaType(grad_weight.dtype(), "grad_weight"));
    args.ldd = k;
    args.beta = 1.0f;
    ZE_RETURN_IF_ERROR(
        Annotate(Matmul(stream, args), "LinearBackward grad_weight"));
  }
  if (grad_bias.defined() && m > 0) {
    ZE_RETURN_IF_ERROR(RequireFloatDType("LinearBackward", grad_output));
    const int partial_rows = kernels::ColumnPartialSumsCount(m);
    ZE_ASSIGN_OR_RETURN(
        void* scratch,
        Scratch(stream, RoundUp256(sizeof(float) * partial_rows * n)));
    float* partials = static_cast<float*>(scratch);
    ZE_RETURN_IF_ERROR(LaunchStatus(
        kernels::LaunchColumnPartialSums(grad_output.data(), m, n,
                                         DTypeCode(grad_output.dtype()),
                                         partials, stream.native()),
        "LinearBackward grad_bias partial sums"));
    ZE_RETURN_IF_ERROR(
        LaunchStatus(kernels::LaunchAddColumnSums(
                         partials, partial_rows, n, grad_bias.data(),
                         DTypeCode(grad_bias.dtype()), stream.native()),
                     "LinearBackward grad_bias"));
  }
  return absl::OkStatus();
}

absl::Status LayerNormForward(const Tensor& input, const Tensor& weight,
                              const Tensor& bias, const Tensor& output,
                              const Tensor& mean, const Tensor& rstd,
                              const Stream& stream, const Tensor& residual,
                              const Tensor& sum) {
  ZE_RETURN_IF_ERROR(Enter(stream));
  ZE_RETURN_IF_ERROR(RequireSameDType(
      "LayerNormForward", input, {&weight, &bias, &output, &residual, &sum}));
  const int64_t rows = input.size(0), cols = input.size(1);
  return LaunchStatus(
      kernels::LaunchLayerNormForward(
          input.data(), weight.data(), bias.defined() ? bias.data() : nullptr,
          output.data(), mean.defined() ? mean.data_as<float>() : nullptr,
          rstd.defined() ? rstd.data_as<float>() : nullptr, rows, cols,
          DTypeCode(input.dtype()), stream.native(),
          residual.defined() ? residual.data() : nullptr,
          sum.defined() ? sum.data() : nullptr),
      "LayerNormForward kernel");
}

absl::Status LayerNormBackward(const Tensor& grad_output, const Tensor& input,
                               const Tensor& weight, const Tensor& mean,
                               const Tensor& rstd, const Tensor& grad_input,
                               const Tensor& grad_weight,
                               const Tensor& grad_bias, const Stream& stream,
                               const Tensor& grad_addend) {
  ZE_RETURN_IF_ERROR(Enter(stream));
  ZE_RETURN_IF_ERROR(
      RequireSameDType("LayerNormBackward", input,
                       {&grad_output, &weight, &grad_input, &grad_addend}));
  const int64_t rows = input.size(0), cols = input.size(1);
  if (rows == 0) return absl::OkStatus();
  const int partial_rows = kernels::LayerNormBackwardNumPartials(
      rows, cols, DTypeCode(input.dtype()));
  float* weight_partials = nullptr;
  float* bias_partials = nullptr;
  if (grad_weight.defined() || grad_bias.defined()) {
    const size_t one = RoundUp256(sizeof(float) * partial_rows * cols);
    ZE_ASSIGN_OR_RETURN(void* scratch, Scratch(stream, 2 * one));
    if (grad_weight.defined()) weight_partials = static_cast<float*>(scratch);
    if (grad_bias.defined()) {
      bias_partials =
          reinterpret_cast<float*>(static_cast<char*>(scratch) + one);
    }
  }
  ZE_RETURN_IF_ERROR(LaunchStatus(
      kernels::LaunchLayerNormBackward(
          grad_output.data(), input.data(), weight.data(),
          mean.data_as<float>(), rstd.data_as<float>(),
          grad_input.defined() ? grad_input.data() : nullptr, weight_partials,
          bias_partials, rows, cols, DTypeCode(input.dtype()), stream.native(),
          grad_addend.defined() ? grad_addend.data() : nullptr),
      "LayerNormBackward kernel"));
  if (weight_partials != nullptr) {
    ZE_RETURN_IF_ERROR(LaunchStatus(
        kernels::LaunchAddColumnSums(
            weight_partials, partial_rows, cols, grad_weight.data(),
            DTypeCode(grad_weight.dtype()), stream.native()),
        "LayerNormBackward grad_weight"));
  }
  if (bias_partials != nullptr) {
    ZE_RETURN_IF_ERROR(
        LaunchStatus(kernels::LaunchAddColumnSums(
                         bias_partials, partial_rows, cols, grad_bias.data(),
                         DTypeCode(grad_bias.dtype()), stream.native()),
                     "LayerNormBackward grad_bias"));
  }
  return absl::OkStatus();
}

absl::Status GeluForward(const Tensor& input, const Tensor& output,
                         const Stream& stream) {
  ZE_RETURN_IF_ERROR(Enter(stream));
  ZE_RETURN_IF_ERROR(RequireSameDType("GeluForward", input, {&output}));
  return LaunchStatus(
      kernels::LaunchGeluForward(input.data(), output.data(), input.numel(),
                                 DTypeCode(input.dtype()), stream.native()),
      "GeluForward kernel");
}

absl::Status GeluBackward(const Tensor& grad_output, const Tensor& input,
                          const Tensor& grad_input, const Stream& stream) {
  ZE_RETURN_IF_ERROR(Enter(stream));
  ZE_RETURN_IF_ERROR(
      RequireSameDType("GeluBackward", input, {&grad_output, &grad_input}));
  return LaunchStatus(
      kernels::LaunchGeluBackward(grad_output.data(), input.data(),
                                  grad_input.data(), input.numel(),
                                  DTypeCode(input.dtype()), stream.native()),
      "GeluBackward kernel");
}

absl::Status AttentionForward(const Tensor& qkv, int num_heads,
                              const Tensor& output, const Tensor& logsumexp,
                              const Stream& stream) {
  ZE_RETURN_IF_ERROR(Enter(stream));
  ZE_RETURN_IF_ERROR(RequireSameDType("AttentionForward", qkv, {&output}));
  const int64_t batch = qkv.size(0), seq_len = qkv.size(1);
  const int64_t head_dim = qkv.size(2) / 3 / num_heads;
  if (head_dim > kernels::kMaxAttentionHeadDim) {
    return absl::UnimplementedError(
        absl::StrCat("AttentionForward on CUDA supports head_dim <= ",
                     kernels::kMaxAttentionHeadDim, ", got ", head_dim));
  }
  return LaunchStatus(
      kernels::LaunchAttentionForward(
          qkv.data(), output.data(), logsumexp.data_as<float>(),
          static_cast<int>(batch), static_cast<int>(seq_len), num_heads,
          static_cast<int>(head_dim), DTypeCode(qkv.dtype()), stream.native()),
      "AttentionForward kernel");
}

absl::Status AttentionBackward(const Tensor& grad_output, const Tensor& qkv,
                               const Tensor& output, const Tensor& logsumexp,
                               int num_heads, const Tensor& grad_qkv,
                               const Stream& stream) {
  ZE_RETURN_IF_ERROR(Enter(stream));
  ZE_RETURN_IF_ERROR(RequireSameDType("AttentionBackward", qkv,
                                      {&grad_output, &output, &grad_qkv}));
  const int batch = static_cast<int>(qkv.size(0));
  const int seq_len = static_cast<int>(qkv.size(1));
  const int head_dim = static_cast<int>(qkv.size(2) / 3 / num_heads);
  if (head_dim > kernels::kMaxAttentionHeadDim) {
    return absl::UnimplementedError(
        absl::StrCat("AttentionBackward on CUDA supports head_dim <= ",
                     kernels::kMaxAttentionHeadDim, ", got ", head_dim));
  }
  ZE_ASSIGN_OR_RETURN(
      void* workspace,
      Scratch(stream, kernels::AttentionBackwardWorkspaceBytes(
                          batch, seq_len, num_heads, head_dim)));
  return LaunchStatus(kernels::LaunchAttentionBackward(
                          grad_output.data(), qkv.data(), output.data(),
                          logsumexp.data_as<float>(), grad_qkv.data(),
                          workspace, batch, seq_len, num_heads, head_dim,
                          DTypeCode(qkv.dtype()), stream.native()),
                      "AttentionBackward kernels");
}

absl::Status EmbeddingForward(const Tensor& tokens, const Tensor& token_table,
                              const Tensor& position_table,
                              const Tensor& output, const Stream& stream) {
  ZE_RETURN_IF_ERROR(Enter(stream));
  ZE_RETURN_IF_ERROR(RequireSameDType("EmbeddingForward", token_table,
                                      {&position_table, &output}));
  const int64_t batch = tokens.size(0), seq_len = tokens.size(1);
  const int64_t vocab = token_table.size(0), cols = token_table.size(1);
  return LaunchStatus(
      kernels::LaunchEmbeddingForward(
          tokens.data_as<int32_t>(), token_table.data(),
          position_table.defined() ? position_table.data() : nullptr,
          output.data(), batch, seq_len, cols, vocab,
          DTypeCode(token_table.dtype()), stream.native()),
      "EmbeddingForward kernel");
}

absl::Status EmbeddingBackward(const Tensor& grad_output, const Tensor& tokens,
                               const Tensor& grad_token_table,
                               const Tensor& grad_position_table,
                               const Stream& stream) {
  ZE_RETURN_IF_ERROR(Enter(stream));
  ZE_RETURN_IF_ERROR(RequireFloatDType("EmbeddingBackward", grad_output));
  const int64_t batch = tokens.size(0), seq_len = tokens.size(1);
  const int64_t rows = batch * seq_len;
  const int64_t cols = grad_output.size(grad_output.dim() - 1);
  const int dtype = DTypeCode(grad_output.dtype());
  if (grad_position_table.defined()) {
    ZE_RETURN_IF_ERROR(LaunchStatus(
        kernels::LaunchEmbeddingPositionBackward(
            grad_output.data(), grad_position_table.data(), batch, seq_len,
            cols, dtype, DTypeCode(grad_position_table.dtype()),
            stream.native()),
        "EmbeddingBackward position kernel"));
  }
  if (!grad_token_table.defined() || rows == 0) return absl::OkStatus();
  const int64_t vocab = grad_token_table.size(0);
  if (grad_token_table.dtype() == DType::kF32) {
    return LaunchStatus(
        kernels::LaunchEmbeddingScatterAddF32(
            grad_output.data(), dtype, tokens.data_as<int32_t>(), rows, cols,
            vocab, grad_token_table.data_as<float>(), stream.native()),
        "EmbeddingBackward scatter-add");
  }
  // 16-bit gradients cannot take atomics precisely: sum in f32 scratch.
  const size_t flags_bytes = RoundUp256(sizeof(int32_t) * vocab);
  ZE_ASSIGN_OR_RETURN(
      void* scratch,
      Scratch(stream, flags_bytes + sizeof(float) * vocab * cols));
  int32_t* touched = static_cast<int32_t*>(scratch);
  float* sums =
      reinterpret_cast<float*>(static_cast<char*>(scratch) + flags_bytes);
  ZE_RETURN_IF_ERROR(
      CudaStatus(cudaMemsetAsync(touched, 0, sizeof(int32_t) * vocab,
                                 static_cast<cudaStream_t>(stream.native())),
                 "EmbeddingBackward clearing flags"));
  return LaunchStatus(
      kernels::LaunchEmbeddingScatterAddViaScratch(
          grad_output.data(), dtype, tokens.data_as<int32_t>(), rows, cols,
          vocab, touched, sums, grad_token_table.data(),
          DTypeCode(grad_token_table.dtype()), stream.native()),
      "EmbeddingBackward scatter-add");
}

absl::Status CrossEntropyForward(const Tensor& logits, const Tensor& targets,
                                 const Tensor& losses, const Stream& stream) {
  ZE_RETURN_IF_ERROR(Enter(stream));
  ZE_RETURN_IF_ERROR(RequireFloatDType("CrossEntropyForward", logits));
  const int64_t vocab = logits.size(logits.dim() - 1);
  const int64_t rows = vocab == 0 ? 0 : logits.numel() / vocab;
  return LaunchStatus(
      kernels::LaunchCrossEntropyForward(
          logits.data(), targets.data_as<int32_t>(), losses.data_as<float>(),
          rows, vocab, DTypeCode(logits.dtype()), stream.native()),
      "CrossEntropyForward kernel");
}

absl::Status CrossEntropyBackward(const Tensor& logits, const Tensor& targets,
                                  float grad_scale, const Tensor& grad_logits,
                                  const Stream& stream) {
  ZE_RETURN_IF_ERROR(Enter(stream));
  ZE_RETURN_IF_ERROR(
      RequireSameDType("CrossEntropyBackward", logits, {&grad_logits}));
  const int64_t vocab = logits.size(logits.dim() - 1);
  const int64_t rows = vocab == 0 ? 0 : logits.numel() / vocab;
  return LaunchStatus(kernels::LaunchCrossEntropyBackward(
                          logits.data(), targets.data_as<int32_t>(), grad_scale,
                          grad_logits.data(), rows, vocab,
                          DTypeCode(logits.dtype()), stream.native()),
                      "CrossEntropyBackward kernel");
}

}  // namespace cuda_backend
}  // namespace nn
}  // namespace ze
