// CUDA backend of nn/functional.h: cuBLASLt for the matrix products, the
// kernels of kernels.h and attention.h for the rest.
//
// Row-major to column-major mapping used for every product: a row-major
// (R, C) matrix with leading dimension C is, bit for bit, the column-major
// (C, R) matrix, its transpose. So a row-major product Y = X W^T is computed
// by cuBLASLt as the column-major Y^T = W X^T, i.e. with the operands in
// swapped order. Each call below spells out its m, n, k and transposes.
#include "nn/cuda/functional_cuda.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/allocator.h"
#include "core/device.h"
#include "core/logging.h"
#include "core/ops.h"
#include "core/status.h"
#include "core/stream.h"
#include "nn/cuda/attention.h"
#include "nn/cuda/decoder_kernels.h"
#include "nn/cuda/functional_cuda_testing.h"
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
  // Chosen algorithms, by a key describing the problem: the heuristic query
  // costs microseconds, the matmuls should not.
  std::map<std::string, cublasLtMatmulAlgo_t> algos;
  // Problems with a fused epilogue that cuBLASLt has no algorithm for, or
  // rejected: they take the unfused path without asking again.
  std::set<std::string> rejected;
};

// SetMatmulEpilogueFusionForTesting's choice for every epilogue: -1 none
// (the production choice below), 0 all off, 1 all on.
std::atomic<int> fusion_override{-1};

// The fusions in production: gelu_aux and dgelu_colsum.
// Measured on the H200 (CUDA 13's cuBLASLt, GPT-1.3B, gpt_bench):
//   - all three of gelu_aux, dgelu (DGELU_BGRAD) and bgradb: 271.4 ms
//     against 256.6 ms unfused. DGELU_BGRAD ran as a separate 1.16 ms kernel
//     per layer instead of a 0.2 ms GELU backward, and BGRADB's own
//     reduction read its input no faster than the column-sum kernel.
//   - gelu_aux alone: 255.6 / 255.9 ms against 257.9 / 258.0 ms unfused
//     (alternating runs, one machine). At full clock it is 0.17 ms per call
//     slower than the plain product (the GELU kernel takes 0.15), but it
//     moves 256 MB less per layer, and the power-capped card turns saved
//     joules into clock.
//   - dgelu_colsum: DGELU in the product, then the column-sum kernel for
//     the bias gradient (instead of DGELU_BGRAD's reduction): with
//     gelu_aux, 254.8 ms against 256.1 ms for gelu_aux alone (one machine).
// The other two stay in the code because tests switch every fusion on
// (SetMatmulEpilogueFusionForTesting) to keep them correct.
enum class Epilogue { kGeluAux, kDgelu, kDgeluColumnSums, kBgradb };

bool FusionEnabledInProduction(Epilogue which) {
  return which == Epilogue::kGeluAux || which == Epilogue::kDgeluColumnSums;
}

// The test override for every epilogue, else the production choice for
// `which`.
bool EpilogueFusionEnabled(Epilogue which) {
  const int override_value = fusion_override.load(std::memory_order_relaxed);
  if (override_value >= 0) return override_value == 1;
  return FusionEnabledInProduction(which);
}

struct EpilogueCounters {
  std::atomic<int64_t> bgradb_fused{0}, bgradb_fallback{0};
  std::atomic<int64_t> gelu_aux_fused{0}, gelu_aux_fallback{0};
  std::atomic<int64_t> dgelu_fused{0}, dgelu_fallback{0};
};

EpilogueCounters& Counters() {
  static auto* counters = new EpilogueCounters;
  return *counters;
}

void Count(std::atomic<int64_t>& fused, std::atomic<int64_t>& fallback,
           bool was_fused) {
  (was_fused ? fused : fallback).fetch_add(1, std::memory_order_relaxed);
}

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

// Stream release callback (core/stream.h): once the stream's queued work has
// finished, its workspace and scratch go back to the allocator. Without it
// every destroyed stream (one per engine, for example) kept 32 MiB and more.
// Streams without state here return at once, without waiting.
void ReleaseStreamState(int device, void* stream) {
  StreamState released;
  {
    std::lock_guard<std::mutex> lock(StateMutex());
    auto device_state = States().find(device);
    if (device_state == States().end()) return;
    auto found = device_state->second.streams.find(stream);
    if (found == device_state->second.streams.end()) return;
    released = found->second;
    device_state->second.streams.erase(found);
  }
  // Work still queued on the stream may use the buffers; they were
  // allocated on it (StreamStateLocked, Scratch), so the caching allocator
  // hands them out again only after that work (core/allocator.h): no wait.
  if (released.workspace != nullptr) {
    CudaMemory(device)->Deallocate(released.workspace, kLtWorkspaceBytes);
  }
  if (released.scratch != nullptr) {
    CudaMemory(device)->Deallocate(released.scratch, released.scratch_bytes);
  }
}

absl::StatusOr<StreamState*> StreamStateLocked(const Stream& stream) {
  const int device = stream.device().index;
  static const bool registered = [] {
    AddStreamReleaseCallback(&ReleaseStreamState);
    return true;
  }();
  (void)registered;
  ZE_ASSIGN_OR_RETURN(DeviceState * state, DeviceStateLocked(device));
  StreamState& stream_state = state->streams[stream.native()];
  if (stream_state.workspace == nullptr) {
    StreamGuard guard(stream);  // the workspace is used on `stream` only
    ZE_ASSIGN_OR_RETURN(stream_state.workspace,
                        CudaMemory(device)->Allocate(kLtWorkspaceBytes));
  }
  return &stream_state;
}

// A device buffer of at least `bytes` for temporaries of work queued on
// `stream`; valid until the next call for the same stream. The buffer
// belongs to `stream`, so growing it frees the old one without waiting: the
// caching allocator orders its reuse after the work queued on `stream`.
absl::StatusOr<void*> Scratch(const Stream& stream, size_t bytes) {
  const int device = stream.device().index;
  std::lock_guard<std::mutex> lock(StateMutex());
  ZE_ASSIGN_OR_RETURN(StreamState * state, StreamStateLocked(stream));
  if (state->scratch_bytes < bytes) {
    StreamGuard guard(stream);
    if (state->scratch != nullptr) {
      CudaMemory(device)->Deallocate(state->scratch, state->scratch_bytes);
      state->scratch = nullptr;
      state->scratch_bytes = 0;
    }
    ZE_ASSIGN_OR_RETURN(state->scratch, CudaMemory(device)->Allocate(bytes));
    state->scratch_bytes = bytes;
  }
  return state->scratch;
}

// A device buffer of `bytes` for one call's temporaries, allocated for
// `stream` and handed back to the caching allocator when the returned
// tensor goes (its reuse ordered after the work queued on `stream`). For
// the attention kernels' workspaces (an f32 dq, packed q/k/v and their
// gradients: 0.13 GB at the 1.3B GPT's micro-batch, 0.54 GB at the 8B
// Llama's), which kept in the stream's scratch buffer stayed allocated for
// the rest of the step and sat in every later activation peak (RESULTS
// run 71).
absl::StatusOr<Tensor> CallWorkspace(const Stream& stream, size_t bytes) {
  StreamGuard guard(stream);
  return Tensor::Empty({static_cast<int64_t>((bytes + 3) / 4)}, DType::kF32,
                       stream.device());
}

int AlignmentOf(const void* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  int alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

// One column-major product as cuBLASLt sees it: D (m, n) = op(A) (m, k)
// op(B) (k, n) + beta D, followed by `epilogue`.
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
  // The C of D = op(A) op(B) + beta C: null means D itself (accumulation);
  // otherwise a distinct matrix laid out as D (type d_type, ldd), e.g. the
  // residual a Linear's output is added to.
  const void* c = nullptr;
  // DEFAULT, or BIAS when `bias` is set and nothing else is asked for.
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  // BIAS, GELU_AUX_BIAS: the bias added to each column of D (length m, type
  // d_type). BGRADB: the bias gradient written, length n (the column sums
  // of op(B), reduced over k). DGELU_BGRAD: length m, reduced over n.
  void* bias = nullptr;
  // CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE; -1 leaves cuBLASLt's default (the
  // type of D).
  int bias_type = -1;
  // GELU_AUX(_BIAS): the pre-activation written; DGELU(_BGRAD): read. Laid
  // out as D, leading dimension aux_ld (a multiple of 8, >= m).
  void* aux = nullptr;
  int64_t aux_ld = 0;
  // For fused epilogues: a problem cuBLASLt offers no algorithm for or
  // rejects is reported as "not run" (TryMatmul returns false) instead of an
  // error, and remembered.
  bool may_reject = false;
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

absl::Status SetDescAttribute(cublasLtMatmulDesc_t desc,
                              cublasLtMatmulDescAttributes_t attribute,
                              const void* value, size_t bytes,
                              const char* what) {
  return CublasStatus(
      cublasLtMatmulDescSetAttribute(desc, attribute, value, bytes), what);
}

// Runs the product; true when queued. With args.may_reject, false when
// cuBLASLt has no algorithm for the problem or rejects it (nothing queued;
// remembered, so the next call returns false at once); other failures are
// errors.
absl::StatusOr<bool> TryMatmul(const Stream& stream, const MatmulArgs& args) {
  if (args.m == 0 || args.n == 0) return true;
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
  ZE_RETURN_IF_ERROR(SetDescAttribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSA,
                                      &op_a, sizeof(op_a), "set TRANSA"));
  ZE_RETURN_IF_ERROR(SetDescAttribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSB,
                                      &op_b, sizeof(op_b), "set TRANSB"));
  cublasLtEpilogue_t epilogue = args.epilogue;
  if (epilogue == CUBLASLT_EPILOGUE_DEFAULT && args.bias != nullptr) {
    epilogue = CUBLASLT_EPILOGUE_BIAS;
  }
  if (epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    ZE_RETURN_IF_ERROR(
        SetDescAttribute(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                         sizeof(epilogue), "set EPILOGUE"));
  }
  if (args.bias != nullptr) {
    ZE_RETURN_IF_ERROR(
        SetDescAttribute(desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                         &args.bias, sizeof(args.bias), "set BIAS_POINTER"));
    if (args.bias_type >= 0) {
      const int32_t bias_type = args.bias_type;
      ZE_RETURN_IF_ERROR(SetDescAttribute(
          desc.get(), CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
          sizeof(bias_type), "set BIAS_DATA_TYPE"));
    }
  }
  if (args.aux != nullptr) {
    ZE_RETURN_IF_ERROR(SetDescAttribute(
        desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &args.aux,
        sizeof(args.aux), "set EPILOGUE_AUX_POINTER"));
    const int64_t aux_ld = args.aux_ld;
    ZE_RETURN_IF_ERROR(
        SetDescAttribute(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                         &aux_ld, sizeof(aux_ld), "set EPILOGUE_AUX_LD"));
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
  // C is D unless a distinct C (a residual) is given; the algorithm may
  // assume no more alignment than either has.
  const int align_c = args.c != nullptr && args.c != args.d
                          ? std::min(align_d, AlignmentOf(args.c))
                          : align_d;
  std::string key = absl::StrCat(
      args.trans_a, ",", args.trans_b, ",", args.m, ",", args.n, ",", args.k,
      ",", args.a_type, ",", args.b_type, ",", args.d_type, ",", args.lda, ",",
      args.ldb, ",", args.ldd, ",", args.beta != 0.0f, ",",
      args.bias != nullptr, ",", align_a, ",", align_b, ",", align_d);
  if (args.c != nullptr && args.c != args.d) {
    absl::StrAppend(&key, ",c ", AlignmentOf(args.c));
  }
  if (epilogue != CUBLASLT_EPILOGUE_DEFAULT &&
      epilogue != CUBLASLT_EPILOGUE_BIAS) {
    absl::StrAppend(&key, ",epilogue ", static_cast<int>(epilogue), ",",
                    args.bias_type, ",", AlignmentOf(args.bias), ",",
                    args.aux_ld, ",", AlignmentOf(args.aux));
  }

  cublasLtHandle_t handle;
  void* workspace;
  cublasLtMatmulAlgo_t algo;
  {
    std::lock_guard<std::mutex> lock(StateMutex());
    ZE_ASSIGN_OR_RETURN(DeviceState * state, DeviceStateLocked(device));
    ZE_ASSIGN_OR_RETURN(StreamState * stream_state, StreamStateLocked(stream));
    handle = state->handle;
    workspace = stream_state->workspace;
    if (args.may_reject && state->rejected.count(key) > 0) return false;
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
      const uint32_t aligns[4] = {
          static_cast<uint32_t>(align_a), static_cast<uint32_t>(align_b),
          static_cast<uint32_t>(align_d), static_cast<uint32_t>(align_c)};
      cublasLtMatmulPreferenceSetAttribute(
          pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aligns[0],
          sizeof(uint32_t));
      cublasLtMatmulPreferenceSetAttribute(
          pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &aligns[1],
          sizeof(uint32_t));
      cublasLtMatmulPreferenceSetAttribute(
          pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &aligns[3],
          sizeof(uint32_t));
      cublasLtMatmulPreferenceSetAttribute(
          pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &aligns[2],
          sizeof(uint32_t));
      // The best-predicted algorithm.
      cublasLtMatmulHeuristicResult_t results[1] = {};
      int found_count = 0;
      const cublasStatus_t heuristic = cublasLtMatmulAlgoGetHeuristic(
          handle, desc.get(), a_layout.get(), b_layout.get(), d_layout.get(),
          d_layout.get(), pref.get(), 1, results, &found_count);
      if (args.may_reject &&
          (heuristic != CUBLAS_STATUS_SUCCESS || found_count == 0)) {
        ZE_LOG(DEBUG) << "cuBLASLt has no algorithm for epilogue "
                      << static_cast<int>(epilogue) << " (" << key
                      << "): " << cublasGetStatusString(heuristic) << ", found "
                      << found_count << "; using the unfused kernels";
        state->rejected.insert(key);
        return false;
      }
      ZE_RETURN_IF_ERROR(CublasStatus(
          heuristic,
          absl::StrCat("cublasLtMatmulAlgoGetHeuristic (", key, ")")));
      if (found_count == 0) {
        return absl::UnimplementedError(
            absl::StrCat("cuBLASLt has no algorithm for matmul (", key, ")"));
      }
      algo = results[0].algo;
      state->algos.emplace(key, algo);
    }
  }
  const cudaStream_t cuda_stream = static_cast<cudaStream_t>(stream.native());
  const float alpha = 1.0f;
  // C is args.c when set (a residual), else D itself.
  const void* c = args.c != nullptr ? args.c : args.d;
  const cublasStatus_t status = cublasLtMatmul(
      handle, desc.get(), &alpha, args.a, a_layout.get(), args.b,
      b_layout.get(), &args.beta, c, d_layout.get(), args.d, d_layout.get(),
      &algo, workspace, kLtWorkspaceBytes, cuda_stream);
  if (args.may_reject && (status == CUBLAS_STATUS_NOT_SUPPORTED ||
                          status == CUBLAS_STATUS_INVALID_VALUE)) {
    // Argument checks fail before anything is launched.
    ZE_LOG(DEBUG) << "cuBLASLt rejected epilogue " << static_cast<int>(epilogue)
                  << " (" << key << "): " << cublasGetStatusString(status)
                  << "; using the unfused kernels";
    std::lock_guard<std::mutex> lock(StateMutex());
    DeviceState& state = States()[device];
    state.algos.erase(key);
    state.rejected.insert(key);
    return false;
  }
  ZE_RETURN_IF_ERROR(
      CublasStatus(status, absl::StrCat("cublasLtMatmul (", key, ")")));
  return true;
}

absl::Status Matmul(const Stream& stream, const MatmulArgs& args) {
  ZE_ASSIGN_OR_RETURN(const bool ran, TryMatmul(stream, args));
  if (!ran) {
    return absl::InternalError("matmul with may_reject set, run as Matmul");
  }
  return absl::OkStatus();
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

// target (cols) += column sums of x (rows, cols): per-chunk partial sums in
// f32 scratch, then one deterministic reduction.
absl::Status AddColumnSums(const Stream& stream, const Tensor& x,
                           const Tensor& target, const char* what) {
  const int64_t rows = x.size(0), cols = x.size(1);
  if (rows == 0 || cols == 0) return absl::OkStatus();
  const int partial_rows = kernels::ColumnPartialSumsCount(rows);
  ZE_ASSIGN_OR_RETURN(
      void* scratch,
      Scratch(stream, RoundUp256(sizeof(float) * partial_rows * cols)));
  float* partials = static_cast<float*>(scratch);
  ZE_RETURN_IF_ERROR(
      LaunchStatus(kernels::LaunchColumnPartialSums(x.data(), rows, cols,
                                                    DTypeCode(x.dtype()),
                                                    partials, stream.native()),
                   what));
  return LaunchStatus(
      kernels::LaunchAddColumnSums(partials, partial_rows, cols, target.data(),
                                   DTypeCode(target.dtype()), stream.native()),
      what);
}

// Runs `args` (whose epilogue writes a bias gradient of `count` elements)
// with the bias gradient going to scratch, then adds it into `target`
// (accumulating, any float dtype). Asks for an f32 bias vector first, then
// one in D's dtype (`d_dtype`). False when cuBLASLt rejects both (nothing
// queued).
absl::StatusOr<bool> MatmulWithBiasGrad(const Stream& stream, MatmulArgs args,
                                        int64_t count, DType d_dtype,
                                        const Tensor& target) {
  args.may_reject = true;
  if (args.m == 0 || args.n == 0) {
    // No product to fuse into; the caller's unfused path handles it.
    return false;
  }
  ZE_ASSIGN_OR_RETURN(void* scratch,
                      Scratch(stream, RoundUp256(sizeof(float) * count)));
  args.bias = scratch;
  const DType bias_dtypes[2] = {DType::kF32, d_dtype};
  const int attempts = d_dtype == DType::kF32 ? 1 : 2;
  for (int attempt = 0; attempt < attempts; ++attempt) {
    const DType bias_dtype = bias_dtypes[attempt];
    ZE_ASSIGN_OR_RETURN(args.bias_type, CudaType(bias_dtype, "bias gradient"));
    ZE_ASSIGN_OR_RETURN(const bool ran, TryMatmul(stream, args));
    if (!ran) continue;
    const Tensor sums =
        Tensor::Wrap(scratch, {count}, bias_dtype, stream.device());
    ZE_RETURN_IF_ERROR(Add(sums, target, target, stream));
    return true;
  }
  return false;
}

}  // namespace

bool MatmulEpilogueFusionEnabledForTesting() {
  return EpilogueFusionEnabled(Epilogue::kGeluAux) &&
         EpilogueFusionEnabled(Epilogue::kDgelu) &&
         EpilogueFusionEnabled(Epilogue::kBgradb);
}

void SetMatmulEpilogueFusionForTesting(bool enabled) {
  fusion_override.store(enabled ? 1 : 0, std::memory_order_relaxed);
}

void ResetMatmulEpilogueFusionForTesting() {
  fusion_override.store(-1, std::memory_order_relaxed);
}

MatmulEpilogueStats GetMatmulEpilogueStats() {
  const EpilogueCounters& counters = Counters();
  MatmulEpilogueStats stats;
  stats.bgradb_fused = counters.bgradb_fused.load();
  stats.bgradb_fallback = counters.bgradb_fallback.load();
  stats.gelu_aux_fused = counters.gelu_aux_fused.load();
  stats.gelu_aux_fallback = counters.gelu_aux_fallback.load();
  stats.dgelu_fused = counters.dgelu_fused.load();
  stats.dgelu_fallback = counters.dgelu_fallback.load();
  return stats;
}

void ResetMatmulEpilogueStats() {
  EpilogueCounters& counters = Counters();
  for (std::atomic<int64_t>* counter :
       {&counters.bgradb_fused, &counters.bgradb_fallback,
        &counters.gelu_aux_fused, &counters.gelu_aux_fallback,
        &counters.dgelu_fused, &counters.dgelu_fallback}) {
    counter->store(0);
  }
}

namespace {

// The arguments of a Linear's forward product: Y^T (N, M) = W^T' X, i.e.
// column-major D (N, M) = op(A) B with A = weight stored column-major
// (K, N), transposed, and B = input stored column-major (K, M) as is.
absl::StatusOr<MatmulArgs> ForwardArgs(const Tensor& input,
                                       const Tensor& weight,
                                       const Tensor& output) {
  const int64_t m = input.size(0), k = input.size(1), n = weight.size(0);
  MatmulArgs args;
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
  return args;
}

}  // namespace

absl::Status LinearForward(const Tensor& input, const Tensor& weight,
                           const Tensor& bias, const Tensor& output,
                           const Stream& stream, const Tensor& residual) {
  ZE_RETURN_IF_ERROR(Enter(stream));
  ZE_RETURN_IF_ERROR(RequireSameDType("LinearForward", input, {&weight}));
  ZE_RETURN_IF_ERROR(RequireSameDType("LinearForward", output, {&residual}));
  if (bias.defined() && bias.dtype() != output.dtype()) {
    return absl::InvalidArgumentError(
        absl::StrCat("LinearForward on CUDA needs bias in the output's dtype: ",
                     bias.DebugString(), " vs ", output.DebugString()));
  }
  const int64_t k = input.size(1);
  ZE_ASSIGN_OR_RETURN(MatmulArgs args, ForwardArgs(input, weight, output));
  args.beta = 0.0f;
  if (residual.defined()) {
    // D = W^T' X + bias + residual: the residual is the product's C.
    args.c = residual.data();
    args.beta = 1.0f;
  }
  args.bias = bias.defined() ? bias.data() : nullptr;
  if (k == 0) {
    // An empty reduction: cuBLASLt may reject k = 0; the result is the bias.
    return absl::UnimplementedError("LinearForward on CUDA with K = 0");
  }
  return Annotate(Matmul(stream, args), "LinearForward");
}

namespace {

// The arguments of the input-gradient product of a Linear:
// dX^T (K, M) = W^T (K, N) dY^T (N, M), all column-major as stored.
absl::StatusOr<MatmulArgs> GradInputArgs(const Tensor& grad_output,
                                         const Tensor& weight,
                                         const Tensor& grad_input) {
  const int64_t m = grad_output.size(0), n = grad_output.size(1);
  const int64_t k = weight.size(1);
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
  ZE_ASSIGN_OR_RETURN(args.d_type, CudaType(grad_input.dtype(), "grad_input"));
  args.ldd = k;
  return args;
}

absl::Status ZeroFill(const Tensor& tensor, const Stream& stream,
                      const char* what) {
  return CudaStatus(cudaMemsetAsync(tensor.data(), 0, tensor.nbytes(),
                                    static_cast<cudaStream_t>(stream.native())),
                    what);
}

}  // namespace

absl::Status LinearBackward(const Tensor& grad_output, const Tensor& input,
                            const Tensor& weight, const Tensor& grad_input,
                            const Tensor& grad_weight, const Tensor& grad_bias,
                            const Stream& stream, const Tensor& grad_addend) {
  ZE_RETURN_IF_ERROR(Enter(stream));
  const int64_t m = grad_output.size(0), n = grad_output.size(1);
  const int64_t k = weight.size(1);
  // The weight and bias gradients first: they are input's only readers,
  // and grad_input may be input itself (same stream, so in order).
  bool bias_done = false;
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
    if (grad_bias.defined() && k > 0 && n > 0 &&
        EpilogueFusionEnabled(Epilogue::kBgradb)) {
      // The bias gradient is the column sum of op(B) = dY (M, N) over the
      // product's k = M: BGRADB, length n = N.
      MatmulArgs fused = args;
      fused.epilogue = CUBLASLT_EPILOGUE_BGRADB;
      ZE_ASSIGN_OR_RETURN(
          bias_done,
          MatmulWithBiasGrad(stream, fused, n, grad_weight.dtype(), grad_bias));
      Count(Counters().bgradb_fused, Counters().bgradb_fallback, bias_done);
    }
    if (!bias_done) {
      ZE_RETURN_IF_ERROR(
          Annotate(Matmul(stream, args), "LinearBackward grad_weight"));
    }
  }
  if (grad_bias.defined() && m > 0 && !bias_done) {
    ZE_RETURN_IF_ERROR(RequireFloatDType("LinearBackward", grad_output));
    ZE_RETURN_IF_ERROR(AddColumnSums(stream, grad_output, grad_bias,
                                     "LinearBackward grad_bias"));
  }
  if (grad_input.defined()) {
    ZE_RETURN_IF_ERROR(
        RequireSameDType("LinearBackward", grad_output, {&weight}));
    ZE_ASSIGN_OR_RETURN(MatmulArgs args,
                        GradInputArgs(grad_output, weight, grad_input));
    if (grad_addend.defined()) {
      ZE_RETURN_IF_ERROR(
          RequireSameDType("LinearBackward", grad_input, {&grad_addend}));
      // D = W^T' dY + grad_addend: the other branch's gradient is C.
      args.c = grad_addend.data();
      args.beta = 1.0f;
    }
    if (n == 0) {
      // An empty reduction: the product is zero.
      ZE_RETURN_IF_ERROR(grad_addend.defined()
                             ? Copy(grad_addend, grad_input, stream)
                             : ZeroFill(grad_input, stream,
                                        "LinearBackward zeroing grad_input"));
    } else {
      ZE_RETURN_IF_ERROR(
          Annotate(Matmul(stream, args), "LinearBackward grad_input"));
    }
  }
  return absl::OkStatus();
}

absl::Status LinearGeluForward(const Tensor& input, const Tensor& weight,
                               const Tensor& bias, const Tensor& output,
                               const Tensor& pre_activation,
                               const Stream& stream) {
  ZE_RETURN_IF_ERROR(Enter(stream));
  ZE_RETURN_IF_ERROR(RequireSameDType("LinearGeluForward", input, {&weight}));
  ZE_RETURN_IF_ERROR(
      RequireSameDType("LinearGeluForward", output, {&bias, &pre_activation}));
  const int64_t m = input.size(0), k = input.size(1), n = weight.size(0);
  if (EpilogueFusionEnabled(Epilogue::kGeluAux) && k > 0 && m > 0 && n > 0) {
    bool fused = false;
    // cuBLASLt: the GELU input matrix's leading dimension must be a multiple
    // of 8 (and at least D's rows, n).
    if (n % 8 == 0) {
      // LinearForward's product; the aux matrix (pre_activation) is laid
      // out as D.
      ZE_ASSIGN_OR_RETURN(MatmulArgs args, ForwardArgs(input, weight, output));
      args.epilogue = bias.defined() ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                     : CUBLASLT_EPILOGUE_GELU_AUX;
      args.bias = bias.defined() ? bias.data() : nullptr;
      args.aux = pre_activation.data();
      args.aux_ld = n;
      args.may_reject = true;
      ZE_ASSIGN_OR_RETURN(fused, TryMatmul(stream, args));
    }
    Count(Counters().gelu_aux_fused, Counters().gelu_aux_fallback, fused);
    if (fused) return absl::OkStatus();
  }
  ZE_RETURN_IF_ERROR(
      LinearForward(input, weight, bias, pre_activation, stream));
  return GeluForward(pre_activation, output, stream);
}

absl::Status GeluLinearBackward(
    const Tensor& grad_output, const Tensor& input, const Tensor& weight,
    const Tensor& pre_activation, const Tensor& grad_pre_activation,
    const Tensor& grad_weight, const Tensor& grad_bias,
    const Tensor& grad_pre_activation_bias, const Stream& stream) {
  ZE_RETURN_IF_ERROR(Enter(stream));
  ZE_RETURN_IF_ERROR(
      RequireSameDType("GeluLinearBackward", grad_output,
                       {&weight, &pre_activation, &grad_pre_activation}));
  const int64_t m = grad_output.size(0), n = grad_output.size(1);
  const int64_t k = weight.size(1);
  // The weight and bias gradients first, on the same stream: they are
  // input's only readers, and grad_pre_activation may be input itself.
  if (grad_weight.defined() || grad_bias.defined()) {
    ZE_RETURN_IF_ERROR(LinearBackward(grad_output, input, weight, Tensor(),
                                      grad_weight, grad_bias, stream));
  }
  if (m > 0 && k > 0) {
    if (n == 0) {
      // dY @ W is zero, and so is its GELU gradient and its sum.
      ZE_RETURN_IF_ERROR(
          ZeroFill(grad_pre_activation, stream, "GeluLinearBackward zeroing"));
    } else {
      ZE_ASSIGN_OR_RETURN(MatmulArgs args, GradInputArgs(grad_output, weight,
                                                         grad_pre_activation));
      bool fused = false;
      // cuBLASLt: the GELU input matrix's leading dimension must be a
      // multiple of 8 (and at least D's rows, k).
      const bool dgelu_bgrad = EpilogueFusionEnabled(Epilogue::kDgelu);
      const bool dgelu_colsum =
          EpilogueFusionEnabled(Epilogue::kDgeluColumnSums);
      if (dgelu_bgrad || dgelu_colsum) {
        if (k % 8 == 0) {
          MatmulArgs fused_args = args;
          fused_args.aux = pre_activation.data();
          fused_args.aux_ld = k;
          if (grad_pre_activation_bias.defined() && !dgelu_bgrad) {
            // DGELU in the product; the bias gradient by the column-sum
            // kernel.
            fused_args.epilogue = CUBLASLT_EPILOGUE_DGELU;
            fused_args.may_reject = true;
            ZE_ASSIGN_OR_RETURN(fused, TryMatmul(stream, fused_args));
            if (fused) {
              ZE_RETURN_IF_ERROR(AddColumnSums(stream, grad_pre_activation,
                                               grad_pre_activation_bias,
                                               "GeluLinearBackward bias sums"));
            }
          } else if (grad_pre_activation_bias.defined()) {
            // The bias gradient sums D (K, M) over its columns, the
            // product's n = M: length m = K.
            fused_args.epilogue = CUBLASLT_EPILOGUE_DGELU_BGRAD;
            ZE_ASSIGN_OR_RETURN(fused,
                                MatmulWithBiasGrad(stream, fused_args, k,
                                                   grad_pre_activation.dtype(),
                                                   grad_pre_activation_bias));
          } else {
            fused_args.epilogue = CUBLASLT_EPILOGUE_DGELU;
            fused_args.may_reject = true;
            ZE_ASSIGN_OR_RETURN(fused, TryMatmul(stream, fused_args));
          }
        }
        Count(Counters().dgelu_fused, Counters().dgelu_fallback, fused);
      }
      if (!fused) {
        ZE_RETURN_IF_ERROR(
            Annotate(Matmul(stream, args), "GeluLinearBackward grad_input"));
        const int dtype_code = DTypeCode(pre_activation.dtype());
        if (grad_pre_activation_bias.defined() &&
            kernels::GeluBackwardColumnSumsSupported(
                grad_pre_activation.data(), pre_activation.data(),
                grad_pre_activation.data(), k, dtype_code)) {
          // GELU's backward and fc's bias-gradient partial sums in one pass.
          const int partial_rows = kernels::ColumnPartialSumsCount(m);
          ZE_ASSIGN_OR_RETURN(
              void* scratch,
              Scratch(stream, RoundUp256(sizeof(float) * partial_rows * k)));
          float* partials = static_cast<float*>(scratch);
          ZE_RETURN_IF_ERROR(LaunchStatus(
              kernels::LaunchGeluBackwardColumnSums(
                  grad_pre_activation.data(), pre_activation.data(),
                  grad_pre_activation.data(), m, k, dtype_code, partials,
                  stream.native()),
              "GeluLinearBackward GELU and bias sums"));
          ZE_RETURN_IF_ERROR(LaunchStatus(
              kernels::LaunchAddColumnSums(
                  partials, partial_rows, k, grad_pre_activation_bias.data(),
                  DTypeCode(grad_pre_activation_bias.dtype()), stream.native()),
              "GeluLinearBackward bias sums"));
        } else {
          ZE_RETURN_IF_ERROR(LaunchStatus(
              kernels::LaunchGeluBackward(
                  grad_pre_activation.data(), pre_activation.data(),
                  grad_pre_activation.data(), grad_pre_activation.numel(),
                  dtype_code, stream.native()),
              "GeluLinearBackward GELU kernel"));
          if (grad_pre_activation_bias.defined()) {
            ZE_RETURN_IF_ERROR(AddColumnSums(stream, grad_pre_activation,
                                             grad_pre_activation_bias,
                                             "GeluLinearBackward bias sums"));
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status LayerNormForward(const Tensor& input, const Tensor& weight,
                              const Tensor& bias, const Tensor& output,
                              const Tensor& mean, const Tensor& rstd,
                              const Stream& stream) {
  ZE_RETURN_IF_ERROR(Enter(stream));
  ZE_RETURN_IF_ERROR(
      RequireSameDType("LayerNormForward", input, {&weight, &bias, &output}));
  const int64_t rows = input.size(0), cols = input.size(1);
  return LaunchStatus(
      kernels::LaunchLayerNormForward(
          input.data(), weight.data(), bias.defined() ? bias.data() : nullptr,
          output.data(), mean.defined() ? mean.data_as<float>() : nullptr,
          rstd.defined() ? rstd.data_as<float>() : nullptr, rows, cols,
          DTypeCode(input.dtype()), stream.native()),
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

// The 16-bit attention kernels move tiles with 16-byte accesses (cp.async,
// the Hopper kernels' shared-memory tiles) and store pairs of elements.
// Tensors from the allocator are 256-byte aligned and so are views that
// start at a whole row when the row is a multiple of 8 elements; any other
// view is rejected here, by name, instead of faulting inside a kernel.
absl::Status RequireAttentionAlignment(
    const char* op,
    std::initializer_list<std::pair<const char*, const Tensor*>> tensors) {
  for (const auto& [name, tensor] : tensors) {
    if (tensor->dtype() == DType::kF32) continue;  // the f32 kernels are scalar
    const uintptr_t address = reinterpret_cast<uintptr_t>(tensor->data());
    if (address % 16 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": ", name, " ", tensor->DebugString(),
          " must start at a 16-byte aligned address (it is ", address % 16,
          " bytes past one); a view starting mid-row of a 16-bit tensor is not "
          "supported, copy it first"));
    }
  }
  return absl::OkStatus();
}

absl::Status AttentionForward(const Tensor& qkv, int num_heads,
                              const Tensor& output, const Tensor& logsumexp,
                              const Stream& stream) {
  ZE_RETURN_IF_ERROR(Enter(stream));
  ZE_RETURN_IF_ERROR(RequireSameDType("AttentionForward", qkv, {&output}));
  ZE_RETURN_IF_ERROR(RequireAttentionAlignment(
      "AttentionForward", {{"qkv", &qkv}, {"output", &output}}));
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
  ZE_RETURN_IF_ERROR(RequireAttentionAlignment("AttentionBackward",
                                               {{"grad_output", &grad_output},
                                                {"qkv", &qkv},
                                                {"output", &output},
                                                {"grad_qkv", &grad_qkv}}));
  const int batch = static_cast<int>(qkv.size(0));
  const int seq_len = static_cast<int>(qkv.size(1));
  const int head_dim = static_cast<int>(qkv.size(2) / 3 / num_heads);
  if (head_dim > kernels::kMaxAttentionHeadDim) {
    return absl::UnimplementedError(
        absl::StrCat("AttentionBackward on CUDA supports head_dim <= ",
                     kernels::kMaxAttentionHeadDim, ", got ", head_dim));
  }
  ZE_ASSIGN_OR_RETURN(
      const Tensor workspace,
      CallWorkspace(stream, kernels::AttentionBackwardWorkspaceBytes(
                                batch, seq_len, num_heads, head_dim)));
  return LaunchStatus(kernels::LaunchAttentionBackward(
                          grad_output.data(), qkv.data(), output.data(),
                          logsumexp.data_as<float>(), grad_qkv.data(),
                          workspace.data(), batch, seq_len, num_heads, head_dim,
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

absl::Status EmbeddingForwardAt(const Tensor& tokens, const Tensor& starts,
                                const Tensor& token_table,
                                const Tensor& position_table,
                                const Tensor& output, const Stream& stream) {
  ZE_RETURN_IF_ERROR(Enter(stream));
  ZE_RETURN_IF_ERROR(RequireSameDType("EmbeddingForwardAt", token_table,
                                      {&position_table, &output}));
  const int64_t batch = tokens.size(0), seq_len = tokens.size(1);
  const int64_t vocab = token_table.size(0), cols = token_table.size(1);
  return LaunchStatus(
      kernels::LaunchEmbeddingForward(
          tokens.data_as<int32_t>(), token_table.data(), position_table.data(),
          output.data(), batch, seq_len, cols, vocab,
          DTypeCode(token_table.dtype()), stream.native(),
          starts.data_as<int32_t>(), position_table.size(0)),
      "EmbeddingForwardAt kernel");
}

absl::Status KvCacheWrite(const Tensor& qkv, const Tensor& rows,
                          const Tensor& starts, int num_heads,
                          const Tensor& key_cache, const Tensor& value_cache,
                          const Stream& stream) {
  ZE_RETURN_IF_ERROR(Enter(stream));
  const int64_t head_dim = qkv.size(2) / 3 / num_heads;
  return LaunchStatus(
      kernels::LaunchKvCacheWrite(
          qkv.data(), rows.data_as<int32_t>(), starts.data_as<int32_t>(),
          key_cache.data(), value_cache.data(), qkv.size(0), qkv.size(1),
          num_heads, static_cast<int>(head_dim), key_cache.size(0),
          key_cache.size(2), DTypeCode(qkv.dtype()), stream.native()),
      "KvCacheWrite kernel");
}

absl::Status CachedAttentionForward(const Tensor& qkv, const Tensor& rows,
                                    const Tensor& starts, int num_heads,
                                    const Tensor& key_cache,
                                    const Tensor& value_cache,
                                    const Tensor& output,
                                    const Stream& stream) {
  ZE_RETURN_IF_ERROR(Enter(stream));
  const int64_t head_dim = qkv.size(2) / 3 / num_heads;
  if (head_dim > kernels::kMaxCachedAttentionHeadDim) {
    return absl::UnimplementedError(
        absl::StrCat("CachedAttentionForward on CUDA supports head_dim <= ",
                     kernels::kMaxCachedAttentionHeadDim, ", got ", head_dim));
  }
  if (num_heads > 65535) {
    return absl::UnimplementedError(absl::StrCat(
        "CachedAttentionForward on CUDA supports at most 65535 heads, got ",
        num_heads));
  }
  return LaunchStatus(
      kernels::LaunchCachedAttentionForward(
          qkv.data(), rows.data_as<int32_t>(), starts.data_as<int32_t>(),
          key_cache.data(), value_cache.data(), output.data(), qkv.size(0),
          qkv.size(1), num_heads, static_cast<int>(head_dim), key_cache.size(0),
          key_cache.size(2), DTypeCode(qkv.dtype()), stream.native()),
      "CachedAttentionForward kernel");
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
  const size_t workspace_bytes =
      kernels::EmbeddingTokenBackwardWorkspaceBytes(rows, vocab);
  ZE_ASSIGN_OR_RETURN(void* workspace, Scratch(stream, workspace_bytes));
  return LaunchStatus(
      kernels::LaunchEmbeddingTokenBackward(
          grad_output.data(), dtype, tokens.data_as<int32_t>(), rows, cols,
          vocab, workspace, workspace_bytes, grad_token_table.data(),
          DTypeCode(grad_token_table.dtype()), stream.native()),
      "EmbeddingBackward token kernel");
}

absl::Status CrossEntropyForward(const Tensor& logits, const Tensor& targets,
                                 const Tensor& losses, int64_t classes,
                                 const Stream& stream,
                                 const Tensor& logsumexp) {
  ZE_RETURN_IF_ERROR(Enter(stream));
  ZE_RETURN_IF_ERROR(RequireFloatDType("CrossEntropyForward", logits));
  const int64_t vocab = logits.size(logits.dim() - 1);
  const int64_t rows = vocab == 0 ? 0 : logits.numel() / vocab;
  return LaunchStatus(
      kernels::LaunchCrossEntropyForward(
          logits.data(), targets.data_as<int32_t>(), losses.data_as<float>(),
          logsumexp.defined() ? logsumexp.data_as<float>() : nullptr, rows,
          vocab, classes, DTypeCode(logits.dtype()), stream.native()),
      "CrossEntropyForward kernel");
}

absl::Status CrossEntropySliceBackward(const Tensor& logits,
                                       const Tensor& logsumexp,
                                       const Tensor& targets, float grad_scale,
                                       const Tensor& grad_logits,
                                       int64_t offset, int64_t classes,
                                       const Stream& stream) {
  ZE_RETURN_IF_ERROR(Enter(stream));
  ZE_RETURN_IF_ERROR(
      RequireSameDType("CrossEntropySliceBackward", logits, {&grad_logits}));
  return LaunchStatus(
      kernels::LaunchCrossEntropySliceBackward(
          logits.data(), logsumexp.data_as<float>(), targets.data_as<int32_t>(),
          grad_scale, grad_logits.data(), logits.size(0), logits.size(1),
          offset, classes, DTypeCode(logits.dtype()), stream.native()),
      "CrossEntropySliceBackward kernel");
}

absl::Status CrossEntropyBackward(const Tensor& logits, const Tensor& targets,
                                  float grad_scale, const Tensor& grad_logits,
                                  int64_t classes, const Stream& stream) {
  ZE_RETURN_IF_ERROR(Enter(stream));
  ZE_RETURN_IF_ERROR(
      RequireSameDType("CrossEntropyBackward", logits, {&grad_logits}));
  const int64_t vocab = logits.size(logits.dim() - 1);
  const int64_t rows = vocab == 0 ? 0 : logits.numel() / vocab;
  return LaunchStatus(kernels::LaunchCrossEntropyBackward(
                          logits.data(), targets.data_as<int32_t>(), grad_scale,
                          grad_logits.data(), rows, vocab, classes,
                          DTypeCode(logits.dtype()), stream.native()),
                      "CrossEntropyBackward kernel");
}

// ---- Decoder (Llama / Mistral / Qwen) ops: decoder_ops.cu and
// grouped_attention.cu.

absl::Status RmsNormForward(const Tensor& input, const Tensor& weight,
                            float eps, const Tensor& output, const Tensor& rstd,
                            const Stream& stream) {
  ZE_RETURN_IF_ERROR(Enter(stream));
  ZE_RETURN_IF_ERROR(
      RequireSameDType("RmsNormForward", input, {&weight, &output}));
  return LaunchStatus(kernels::LaunchRmsNormForward(
                          input.data(), weight.data(), output.data(),
                          rstd.data_as<float>(), input.size(0), input.size(1),
                          eps, DTypeCode(input.dtype()), stream.native()),
                      "RmsNormForward kernel");
}

absl::Status RmsNormBackward(const Tensor& grad_output, const Tensor& input,
                             const Tensor& weight, const Tensor& rstd,
                             const Tensor& grad_input,
                             const Tensor& grad_weight, const Stream& stream,
                             const Tensor& grad_addend) {
  ZE_RETURN_IF_ERROR(Enter(stream));
  ZE_RETURN_IF_ERROR(
      RequireSameDType("RmsNormBackward", input,
                       {&grad_output, &weight, &grad_input, &grad_addend}));
  const int64_t rows = input.size(0), cols = input.size(1);
  if (rows == 0 || cols == 0) return absl::OkStatus();
  const int dtype = DTypeCode(input.dtype());
  // The weight gradient's partial sums first: grad_input may overwrite
  // grad_output, which they read.
  if (grad_weight.defined()) {
    const int partial_rows = kernels::ColumnPartialSumsCount(rows);
    ZE_ASSIGN_OR_RETURN(
        void* scratch,
        Scratch(stream, RoundUp256(sizeof(float) * partial_rows * cols)));
    float* partials = static_cast<float*>(scratch);
    ZE_RETURN_IF_ERROR(LaunchStatus(
        kernels::LaunchRmsNormWeightPartials(
            grad_output.data(), input.data(), rstd.data_as<float>(), partials,
            rows, cols, dtype, stream.native()),
        "RmsNormBackward grad_weight partials"));
    ZE_RETURN_IF_ERROR(
        LaunchStatus(kernels::LaunchAddColumnSums(
                         partials, partial_rows, cols, grad_weight.data(),
                         DTypeCode(grad_weight.dtype()), stream.native()),
                     "RmsNormBackward grad_weight"));
  }
  if (!grad_input.defined()) return absl::OkStatus();
  return LaunchStatus(
      kernels::LaunchRmsNormBackward(
          grad_output.data(), input.data(), weight.data(),
          rstd.data_as<float>(),
          grad_addend.defined() ? grad_addend.data() : nullptr,
          grad_input.data(), rows, cols, dtype, stream.native()),
      "RmsNormBackward kernel");
}

absl::Status RotaryEmbedding(const Tensor& input, const Tensor& inv_freq,
                             const Tensor& starts, const Tensor& output,
                             bool inverse, const Stream& stream) {
  const char* op =
      inverse ? "RotaryEmbeddingBackward" : "RotaryEmbeddingForward";
  ZE_RETURN_IF_ERROR(Enter(stream));
  ZE_RETURN_IF_ERROR(RequireSameDType(op, input, {&output}));
  return LaunchStatus(
      kernels::LaunchRotaryEmbedding(
          input.data(), inv_freq.data_as<float>(),
          starts.defined() ? starts.data_as<int32_t>() : nullptr, output.data(),
          input.size(0), input.size(1), input.size(2), input.size(3), inverse,
          DTypeCode(input.dtype()), stream.native()),
      op);
}

absl::Status SwiGluForward(const Tensor& gate, const Tensor& up,
                           const Tensor& output, const Stream& stream) {
  ZE_RETURN_IF_ERROR(Enter(stream));
  ZE_RETURN_IF_ERROR(RequireSameDType("SwiGluForward", gate, {&up, &output}));
  return LaunchStatus(kernels::LaunchSwiGluForward(
                          gate.data(), up.data(), output.data(), gate.numel(),
                          DTypeCode(gate.dtype()), stream.native()),
                      "SwiGluForward kernel");
}

absl::Status SwiGluBackward(const Tensor& grad_output, const Tensor& gate,
                            const Tensor& up, const Tensor& grad_gate,
                            const Tensor& grad_up, const Stream& stream) {
  ZE_RETURN_IF_ERROR(Enter(stream));
  ZE_RETURN_IF_ERROR(RequireSameDType(
      "SwiGluBackward", gate, {&grad_output, &up, &grad_gate, &grad_up}));
  return LaunchStatus(
      kernels::LaunchSwiGluBackward(
          grad_output.data(), gate.data(), up.data(),
          grad_gate.defined() ? grad_gate.data() : nullptr,
          grad_up.defined() ? grad_up.data() : nullptr, gate.numel(),
          DTypeCode(gate.dtype()), stream.native()),
      "SwiGluBackward kernel");
}

namespace {

// SetGroupedAttentionRouteForTesting's choice and each route's count.
std::atomic<GroupedAttentionRoute> grouped_route_for_testing{
    GroupedAttentionRoute::kProduction};
std::atomic<int64_t> grouped_route_calls[3];

void CountGroupedRoute(GroupedAttentionRoute route) {
  grouped_route_calls[static_cast<int>(route)].fetch_add(
      1, std::memory_order_relaxed);
}

// Whether every tensor's data is 16-byte aligned (both tensor-core routes
// load 16 bytes at a time).
bool AllAligned16(std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* tensor : tensors) {
    if (AlignmentOf(tensor->data()) < 16) return false;
  }
  return true;
}

// Whether grouped attention reads q, k and v where they are: the Hopper
// kernels address the three tensors directly (attention.h's
// LaunchGroupedAttention*Direct), which saves the packing below (a copy of
// q and of k and v repeated per query head, 3 * B*T*Hq*D elements written
// each way, forward and backward) and the summing of per-head dK / dV.
bool UseDirectGroupedAttention(const Tensor& q, const Tensor& k,
                               std::initializer_list<const Tensor*> tensors) {
  if (grouped_route_for_testing.load(std::memory_order_relaxed) !=
      GroupedAttentionRoute::kProduction) {
    return false;
  }
  return AllAligned16(tensors) &&
         kernels::GroupedAttentionRunsDirect(
             static_cast<int>(q.size(3)), static_cast<int>(q.size(1)),
             static_cast<int>(q.size(2)), static_cast<int>(k.size(2)),
             DTypeCode(q.dtype()));
}

// Whether grouped attention takes the packed route: attention.h's
// FlashAttention-2 family (wgmma on Hopper at D = 64, mma.sync otherwise)
// reads GPT's packed (B, T, 3C) qkv with one key/value head per query head,
// so q, k and v are packed into that layout (k and v repeated for each
// query head of their group), and its dK / dV summed back over each group
// (deterministically, in head order). The copies are O(T) against the
// kernels' O(T^2), and they leave the tuned kernels untouched. Used for
// bf16/f16 at head sizes 64 and 128 (the family's best-tuned sizes) with
// 16-byte aligned tensors; the tiled kernels take everything else.
bool UsePackedGroupedAttention(const Tensor& q,
                               std::initializer_list<const Tensor*> tensors) {
  if (grouped_route_for_testing.load(std::memory_order_relaxed) ==
      GroupedAttentionRoute::kTiled) {
    return false;
  }
  if (q.dtype() != DType::kBF16 && q.dtype() != DType::kF16) return false;
  if (q.size(3) != 64 && q.size(3) != 128) return false;
  return AllAligned16(tensors);
}

// Bytes of one packed (B, T, 3 * Hq * D) buffer, rounded to 256.
size_t PackedQkvBytes(const Tensor& q) {
  return RoundUp256(SizeOf(q.dtype()) * 3 * static_cast<size_t>(q.numel()));
}

// GroupedAttention's sizes as the kernels take them (int), or
// Unimplemented naming what does not fit.
absl::Status CheckGroupedAttentionSizes(const char* op, const Tensor& q,
                                        const Tensor& k) {
  const int64_t head_dim = q.size(3);
  if (head_dim > kernels::kMaxGroupedAttentionHeadDim) {
    return absl::UnimplementedError(
        absl::StrCat(op, " on CUDA supports head_dim <= ",
                     kernels::kMaxGroupedAttentionHeadDim, ", got ", head_dim));
  }
  constexpr int64_t kIntMax = 0x7fffffff;
  if (q.size(0) > kIntMax || q.size(1) > kIntMax || q.size(2) > kIntMax ||
      q.size(0) * q.size(2) * ((q.size(1) + 15) / 16) > kIntMax) {
    return absl::UnimplementedError(absl::StrCat(
        op, " on CUDA: q ", ShapeToString(q.shape()), " is too large"));
  }
  (void)k;
  return absl::OkStatus();
}

}  // namespace

absl::Status GroupedAttentionForward(const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& output,
                                     const Tensor& logsumexp,
                                     const Stream& stream) {
  const char* op = "GroupedAttentionForward";
  ZE_RETURN_IF_ERROR(Enter(stream));
  ZE_RETURN_IF_ERROR(RequireSameDType(op, q, {&k, &v, &output}));
  ZE_RETURN_IF_ERROR(CheckGroupedAttentionSizes(op, q, k));
  if (q.numel() == 0) return absl::OkStatus();
  if (UseDirectGroupedAttention(q, k, {&q, &k, &v, &output})) {
    CountGroupedRoute(GroupedAttentionRoute::kProduction);
    return LaunchStatus(
        kernels::LaunchGroupedAttentionForwardDirect(
            q.data(), k.data(), v.data(), output.data(),
            logsumexp.data_as<float>(), static_cast<int>(q.size(0)),
            static_cast<int>(q.size(1)), static_cast<int>(q.size(2)),
            static_cast<int>(k.size(2)), DTypeCode(q.dtype()), stream.native()),
        "GroupedAttentionForward kernel (direct)");
  }
  if (UsePackedGroupedAttention(q, {&q, &k, &v, &output})) {
    CountGroupedRoute(GroupedAttentionRoute::kPacked);
    const int q_heads = static_cast<int>(q.size(2));
    const int head_dim = static_cast<int>(q.size(3));
    ZE_ASSIGN_OR_RETURN(const Tensor packed_qkv,
                        CallWorkspace(stream, PackedQkvBytes(q)));
    void* packed = packed_qkv.data();
    ZE_RETURN_IF_ERROR(LaunchStatus(
        kernels::LaunchPackGroupedQkv(q.data(), k.data(), v.data(), packed,
                                      q.size(0) * q.size(1), q_heads,
                                      static_cast<int>(k.size(2)), head_dim,
                                      DTypeCode(q.dtype()), stream.native()),
        "GroupedAttentionForward packing"));
    return LaunchStatus(
        kernels::LaunchAttentionForward(
            packed, output.data(), logsumexp.data_as<float>(),
            static_cast<int>(q.size(0)), static_cast<int>(q.size(1)), q_heads,
            head_dim, DTypeCode(q.dtype()), stream.native()),
        "GroupedAttentionForward kernel (packed)");
  }
  return LaunchStatus(
      kernels::LaunchGroupedAttentionForward(
          q.data(), k.data(), v.data(), output.data(),
          logsumexp.data_as<float>(), static_cast<int>(q.size(0)),
          static_cast<int>(q.size(1)), static_cast<int>(q.size(2)),
          static_cast<int>(k.size(2)), static_cast<int>(q.size(3)),
          DTypeCode(q.dtype()), stream.native()),
      "GroupedAttentionForward kernel");
}

absl::Status GroupedAttentionBackward(
    const Tensor& grad_output, const Tensor& q, const Tensor& k,
    const Tensor& v, const Tensor& output, const Tensor& logsumexp,
    const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
    const Stream& stream) {
  const char* op = "GroupedAttentionBackward";
  ZE_RETURN_IF_ERROR(Enter(stream));
  ZE_RETURN_IF_ERROR(RequireSameDType(
      op, q, {&grad_output, &k, &v, &output, &grad_q, &grad_k, &grad_v}));
  ZE_RETURN_IF_ERROR(CheckGroupedAttentionSizes(op, q, k));
  const int batch = static_cast<int>(q.size(0));
  const int seq_len = static_cast<int>(q.size(1));
  const int q_heads = static_cast<int>(q.size(2));
  if (batch == 0 || seq_len == 0 || q_heads == 0) return absl::OkStatus();
  const int kv_heads = static_cast<int>(k.size(2));
  const int head_dim = static_cast<int>(q.size(3));
  if (head_dim == 0) return absl::OkStatus();
  if (UseDirectGroupedAttention(
          q, k,
          {&grad_output, &q, &k, &v, &output, &grad_q, &grad_k, &grad_v})) {
    CountGroupedRoute(GroupedAttentionRoute::kProduction);
    ZE_ASSIGN_OR_RETURN(
        const Tensor workspace,
        CallWorkspace(stream, kernels::GroupedAttentionDirectWorkspaceBytes(
                                  batch, seq_len, q_heads)));
    return LaunchStatus(
        kernels::LaunchGroupedAttentionBackwardDirect(
            grad_output.data(), q.data(), k.data(), v.data(), output.data(),
            logsumexp.data_as<float>(), grad_q.data(), grad_k.data(),
            grad_v.data(), workspace.data(), batch, seq_len, q_heads, kv_heads,
            DTypeCode(q.dtype()), stream.native()),
        "GroupedAttentionBackward kernels (direct)");
  }
  if (UsePackedGroupedAttention(
          q, {&grad_output, &q, &k, &v, &output, &grad_q, &grad_k, &grad_v})) {
    CountGroupedRoute(GroupedAttentionRoute::kPacked);
    // Scratch: packed qkv, packed dqkv, then attention.h's workspace.
    const size_t packed_bytes = PackedQkvBytes(q);
    ZE_ASSIGN_OR_RETURN(
        const Tensor scratch,
        CallWorkspace(
            stream, 2 * packed_bytes + kernels::AttentionBackwardWorkspaceBytes(
                                           batch, seq_len, q_heads, head_dim)));
    char* base = static_cast<char*>(scratch.data());
    void* packed = base;
    void* packed_grad = base + packed_bytes;
    void* attention_workspace = base + 2 * packed_bytes;
    const int64_t tokens = q.size(0) * q.size(1);
    const int dtype = DTypeCode(q.dtype());
    ZE_RETURN_IF_ERROR(LaunchStatus(
        kernels::LaunchPackGroupedQkv(q.data(), k.data(), v.data(), packed,
                                      tokens, q_heads, kv_heads, head_dim,
                                      dtype, stream.native()),
        "GroupedAttentionBackward packing"));
    ZE_RETURN_IF_ERROR(LaunchStatus(
        kernels::LaunchAttentionBackward(
            grad_output.data(), packed, output.data(),
            logsumexp.data_as<float>(), packed_grad, attention_workspace, batch,
            seq_len, q_heads, head_dim, dtype, stream.native()),
        "GroupedAttentionBackward kernels (packed)"));
    return LaunchStatus(
        kernels::LaunchUnpackGroupedQkvGrad(
            packed_grad, grad_q.data(), grad_k.data(), grad_v.data(), tokens,
            q_heads, kv_heads, head_dim, dtype, stream.native()),
        "GroupedAttentionBackward unpacking");
  }
  ZE_ASSIGN_OR_RETURN(
      const Tensor workspace,
      CallWorkspace(stream, kernels::GroupedAttentionBackwardWorkspaceBytes(
                                batch, seq_len, q_heads)));
  return LaunchStatus(
      kernels::LaunchGroupedAttentionBackward(
          grad_output.data(), q.data(), k.data(), v.data(), output.data(),
          logsumexp.data_as<float>(), grad_q.data(), grad_k.data(),
          grad_v.data(), workspace.data(), batch, seq_len, q_heads, kv_heads,
          head_dim, DTypeCode(q.dtype()), stream.native()),
      "GroupedAttentionBackward kernels");
}

absl::Status GroupedKvCacheWrite(const Tensor& k, const Tensor& v,
                                 const Tensor& rows, const Tensor& starts,
                                 const Tensor& key_cache,
                                 const Tensor& value_cache,
                                 const Stream& stream) {
  ZE_RETURN_IF_ERROR(Enter(stream));
  return LaunchStatus(
      kernels::LaunchGroupedKvCacheWrite(
          k.data(), v.data(), rows.data_as<int32_t>(),
          starts.data_as<int32_t>(), key_cache.data(), value_cache.data(),
          k.size(0), k.size(1), static_cast<int>(k.size(2)),
          static_cast<int>(k.size(3)), key_cache.size(0), key_cache.size(2),
          DTypeCode(k.dtype()), stream.native()),
      "GroupedKvCacheWrite kernel");
}

absl::Status GroupedCachedAttentionForward(const Tensor& q, const Tensor& rows,
                                           const Tensor& starts,
                                           const Tensor& key_cache,
                                           const Tensor& value_cache,
                                           const Tensor& output,
                                           const Stream& stream) {
  const char* op = "GroupedCachedAttentionForward";
  ZE_RETURN_IF_ERROR(Enter(stream));
  const int64_t head_dim = q.size(3);
  if (head_dim > kernels::kMaxCachedAttentionHeadDim) {
    return absl::UnimplementedError(
        absl::StrCat(op, " on CUDA supports head_dim <= ",
                     kernels::kMaxCachedAttentionHeadDim, ", got ", head_dim));
  }
  if (q.size(2) > 65535 || q.size(0) * q.size(1) > 0x7fffffff) {
    return absl::UnimplementedError(
        absl::StrCat(op,
                     " on CUDA supports at most 65535 heads and 2^31 - 1 query "
                     "tokens, got q ",
                     ShapeToString(q.shape())));
  }
  return LaunchStatus(
      kernels::LaunchGroupedCachedAttentionForward(
          q.data(), rows.data_as<int32_t>(), starts.data_as<int32_t>(),
          key_cache.data(), value_cache.data(), output.data(), q.size(0),
          q.size(1), static_cast<int>(q.size(2)),
          static_cast<int>(key_cache.size(1)), static_cast<int>(head_dim),
          key_cache.size(0), key_cache.size(2), DTypeCode(q.dtype()),
          stream.native()),
      "GroupedCachedAttentionForward kernel");
}

void SetGroupedAttentionRouteForTesting(GroupedAttentionRoute route) {
  grouped_route_for_testing.store(route, std::memory_order_relaxed);
}

int64_t GroupedAttentionCallsForTesting(GroupedAttentionRoute route) {
  return grouped_route_calls[static_cast<int>(route)].load(
      std::memory_order_relaxed);
}

}  // namespace cuda_backend
}  // namespace nn
}  // namespace ze
