#include "offload/cpu_optimizer.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "core/status.h"

namespace ze {
namespace offload {
namespace {

// Tiles are whole multiples of this many elements, so every tile but the
// last runs entirely in the vector body (64 f32 = one 256-byte block, a
// multiple of both vector widths and of the 64-byte cache line).
constexpr int64_t kTileGranule = 64;

// Static-split boundaries are multiples of this many elements: a 4 KiB page
// of f32, so (page-aligned buffers) no small page is shared by two threads.
constexpr int64_t kSplitGranule = 1024;

// Transparent huge page size on x86-64.
constexpr size_t kHugePageBytes = size_t{2} << 20;

// Piece `index` of `pieces` of [0, count): [begin, end).
void StaticPiece(int64_t count, int index, int pieces, int64_t* begin,
                 int64_t* end) {
  auto boundary = [&](int64_t k) {
    if (k >= pieces) return count;
    return std::min(count, count * k / pieces / kSplitGranule * kSplitGranule);
  };
  *begin = boundary(index);
  *end = boundary(index + 1);
}

bool IsBeta(double beta) { return beta >= 0.0 && beta < 1.0; }

// Bytes per element of a state array in `format` (SGD's buffer: f32).
int64_t MomentBytes(MomentFormat format) {
  switch (format) {
    case MomentFormat::kBf16:
      return 2;
    case MomentFormat::kBlockwise8:
      return 1;
    case MomentFormat::kF32:
      break;
  }
  return 4;
}

int64_t NumBlocks(int64_t elements) {
  return (elements + kMomentBlock - 1) / kMomentBlock;
}

}  // namespace

StepBuffers SliceStepBuffers(const StepBuffers& buffers, int64_t begin,
                             int64_t count) {
  StepBuffers slice = buffers;
  if (slice.master != nullptr) slice.master += begin;
  if (slice.master_lo != nullptr) slice.master_lo += begin;
  const int64_t state_bytes = MomentBytes(buffers.moment_format);
  if (slice.state0 != nullptr) {
    slice.state0 = static_cast<char*>(slice.state0) + begin * state_bytes;
  }
  if (slice.state1 != nullptr) {
    slice.state1 = static_cast<char*>(slice.state1) + begin * state_bytes;
  }
  if (slice.step0 != nullptr) slice.step0 += begin / kMomentBlock;
  if (slice.step1 != nullptr) slice.step1 += begin / kMomentBlock;
  slice.first_index += begin;
  if (slice.grads != nullptr) {
    slice.grads = static_cast<const char*>(buffers.grads) +
                  begin * SizeOf(buffers.grad_dtype);
  }
  if (slice.out != nullptr) {
    slice.out =
        static_cast<char*>(buffers.out) + begin * SizeOf(buffers.out_dtype);
  }
  slice.count = count;
  return slice;
}

void DecodeMoments(MomentFormat format, bool second, const void* data,
                   const float* steps, int64_t begin, int64_t count,
                   float* out) {
  switch (format) {
    case MomentFormat::kF32:
      std::memcpy(out, static_cast<const float*>(data) + begin,
                  count * sizeof(float));
      return;
    case MomentFormat::kBf16:
      for (int64_t i = 0; i < count; ++i) {
        out[i] = Bf16ToFloat(static_cast<const uint16_t*>(data)[begin + i]);
      }
      return;
    case MomentFormat::kBlockwise8:
      for (int64_t i = 0; i < count; ++i) {
        const int64_t at = begin + i;
        const float step = steps[at / kMomentBlock];
        out[i] = second ? DecodeV(static_cast<const uint8_t*>(data)[at], step)
                        : DecodeM(static_cast<const int8_t*>(data)[at], step);
      }
      return;
  }
}

void EncodeMoments(MomentFormat format, bool second, void* data, float* steps,
                   int64_t num_elements, int64_t begin, int64_t count,
                   const float* values) {
  if (format == MomentFormat::kF32) {
    std::memcpy(static_cast<float*>(data) + begin, values,
                count * sizeof(float));
    return;
  }
  if (format == MomentFormat::kBf16) {
    uint16_t* bits = static_cast<uint16_t*>(data) + begin;
    for (int64_t i = 0; i < count; ++i) bits[i] = NearestBf16(values[i]);
    return;
  }
  float block[kMomentBlock];
  for (int64_t first = begin / kMomentBlock * kMomentBlock;
       first < begin + count; first += kMomentBlock) {
    const int64_t n = std::min(kMomentBlock, num_elements - first);
    DecodeMoments(format, second, data, steps, first, n, block);
    const int64_t low = std::max(first, begin);
    const int64_t high = std::min(first + n, begin + count);
    std::memcpy(block + (low - first), values + (low - begin),
                (high - low) * sizeof(float));
    float* step = steps + first / kMomentBlock;
    if (second) {
      EncodeVBlock(block, n, static_cast<uint8_t*>(data) + first, step);
    } else {
      EncodeMBlock(block, n, static_cast<int8_t*>(data) + first, step);
    }
  }
}

const char* MomentFormatName(MomentFormat format) {
  switch (format) {
    case MomentFormat::kF32:
      return "f32";
    case MomentFormat::kBf16:
      return "bf16";
    case MomentFormat::kBlockwise8:
      return "8bit";
  }
  return "unknown";
}

MomentFormat EffectiveMomentFormat(const OptimizerOptions& options,
                                   int64_t num_elements) {
  if (options.type == OptimizerType::kSgd) return MomentFormat::kF32;
  if (options.moments == MomentFormat::kBlockwise8 &&
      num_elements < kMin8BitElements) {
    return MomentFormat::kF32;
  }
  return options.moments;
}

int64_t OptimizerStateBytes(const OptimizerOptions& options,
                            int64_t num_elements, int64_t format_elements) {
  if (options.type == OptimizerType::kSgd) {
    return options.momentum != 0.0 ? 4 * num_elements : 0;
  }
  const MomentFormat format = EffectiveMomentFormat(
      options, format_elements >= 0 ? format_elements : num_elements);
  int64_t bytes = 2 * MomentBytes(format) * num_elements;
  if (format == MomentFormat::kBlockwise8) {
    bytes += 2 * int64_t{sizeof(float)} * NumBlocks(num_elements);
  }
  return bytes;
}

int64_t MomentGranule(MomentFormat format) {
  return format == MomentFormat::kBlockwise8 ? kMomentBlock : 1;
}

const char* SimdPathName(SimdPath path) {
  switch (path) {
    case SimdPath::kScalar:
      return "scalar";
    case SimdPath::kAvx2:
      return "avx2";
    case SimdPath::kAvx512:
      return "avx512";
  }
  return "unknown";
}

bool SimdPathSupported(SimdPath path) {
  __builtin_cpu_init();
  // Every path converts 16-bit values with F16C (part of x86-64-v3, which
  // the whole build requires), so the vector paths need nothing more than
  // their own arithmetic.
  switch (path) {
    case SimdPath::kScalar:
      return true;
    case SimdPath::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case SimdPath::kAvx512:
      return __builtin_cpu_supports("avx512f");
  }
  return false;
}

SimdPath BestSimdPath() {
  if (SimdPathSupported(SimdPath::kAvx512)) return SimdPath::kAvx512;
  if (SimdPathSupported(SimdPath::kAvx2)) return SimdPath::kAvx2;
  return SimdPath::kScalar;
}

const char* OptimizerTypeName(OptimizerType type) {
  switch (type) {
    case OptimizerType::kAdam:
      return "adam";
    case OptimizerType::kAdamW:
      return "adamw";
    case OptimizerType::kSgd:
      return "sgd";
  }
  return "unknown";
}

void CpuOptimizer::FreeDeleter::operator()(void* data) const {
  std::free(data);
}

absl::Status ValidateOptimizerOptions(const OptimizerOptions& options,
                                      int64_t num_elements) {
  const std::string name = OptimizerTypeName(options.type);
  if (num_elements < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": num_elements must be >= 0, got ", num_elements));
  }
  if (!(options.weight_decay >= 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": weight_decay must be >= 0, got ", options.weight_decay));
  }
  if (options.type == OptimizerType::kSgd) {
    if (!(options.momentum >= 0.0) || !(options.dampening >= 0.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": momentum and dampening must be >= 0, got ",
                       options.momentum, " and ", options.dampening));
    }
    if (options.nesterov &&
        (options.momentum <= 0.0 || options.dampening != 0.0)) {
      return absl::InvalidArgumentError(
          "sgd: nesterov requires a momentum and zero dampening");
    }
    if (options.moments != MomentFormat::kF32) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sgd: compressed moments (", MomentFormatName(options.moments),
          ") are for Adam and AdamW; SGD's momentum buffer stays f32"));
    }
  } else {
    if (!IsBeta(options.beta1) || !IsBeta(options.beta2)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": betas must be in [0, 1), got (", options.beta1,
                       ", ", options.beta2, ")"));
    }
    if (!(options.eps > 0.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": eps must be > 0, got ", options.eps));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StepCoefficients> ComputeStepCoefficients(
    const OptimizerOptions& options, int64_t step_count,
    const StepArgs& step_args, bool has_momentum_buffer) {
  if (!std::isfinite(step_args.lr) || !std::isfinite(step_args.grad_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer step: lr ", step_args.lr, " and grad_scale ",
                     step_args.grad_scale, " must be finite"));
  }
  const bool is_sgd = options.type == OptimizerType::kSgd;
  const double beta1 =
      step_args.beta1.value_or(is_sgd ? options.momentum : options.beta1);
  const double beta2 = step_args.beta2.value_or(options.beta2);
  if (step_args.beta1.has_value() && !IsBeta(beta1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer step: beta1 override ", beta1, " is outside [0, 1)"));
  }
  if (step_args.beta2.has_value() && !IsBeta(beta2)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer step: beta2 override ", beta2, " is outside [0, 1)"));
  }
  // In double, rounded once to f32.
  const double lr = step_args.lr;
  const double weight_decay = options.weight_decay;
  const int64_t t = step_count + 1;
  StepCoefficients c;
  c.grad_scale = step_args.grad_scale;
  if (is_sgd) {
    c.is_sgd = true;
    c.l2 = static_cast<float>(weight_decay);
    c.neg_step_size = static_cast<float>(-lr);
    c.momentum = static_cast<float>(beta1);
    c.one_minus_dampening = static_cast<float>(1.0 - options.dampening);
    c.has_momentum_buffer = has_momentum_buffer;
    c.nesterov = options.nesterov;
    c.first_step = step_count == 0;
  } else {
    const bool decoupled = options.type == OptimizerType::kAdamW;
    c.l2 = decoupled ? 0.0f : static_cast<float>(weight_decay);
    c.decay_factor =
        decoupled ? static_cast<float>(1.0 - lr * weight_decay) : 1.0f;
    const double bias_correction1 = 1.0 - std::pow(beta1, t);
    const double bias_correction2 = 1.0 - std::pow(beta2, t);
    c.neg_step_size = static_cast<float>(-lr / bias_correction1);
    c.inv_sqrt_bias_correction2 =
        static_cast<float>(1.0 / std::sqrt(bias_correction2));
    c.beta1 = static_cast<float>(beta1);
    c.one_minus_beta1 = static_cast<float>(1.0 - beta1);
    c.beta2 = static_cast<float>(beta2);
    c.one_minus_beta2 = static_cast<float>(1.0 - beta2);
    c.eps = static_cast<float>(options.eps);
    c.stochastic_rounding = options.stochastic_rounding;
    c.round_key_m = RoundingKey(options.rounding_seed, t, 0);
    c.round_key_v = RoundingKey(options.rounding_seed, t, 1);
  }
  return c;
}

CpuOptimizer::CpuOptimizer(const OptimizerOptions& options,
                           int64_t num_elements, MomentFormat moment_format,
                           SimdPath simd_path, int64_t tile_elements,
                           const CpuExecutionOptions& execution,
                           std::unique_ptr<ThreadPool> pool)
    : options_(options),
      num_elements_(num_elements),
      moment_format_(moment_format),
      simd_path_(simd_path),
      tile_elements_(tile_elements),
      execution_(execution),
      pool_(std::move(pool)) {}

CpuOptimizer::~CpuOptimizer() = default;

absl::StatusOr<std::unique_ptr<CpuOptimizer>> CpuOptimizer::Create(
    const OptimizerOptions& options, int64_t num_elements,
    const CpuExecutionOptions& execution) {
  const std::string name = OptimizerTypeName(options.type);
  ZE_RETURN_IF_ERROR(ValidateOptimizerOptions(options, num_elements));
  if (execution.num_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": num_threads must be >= 0 (0: hardware threads)",
                     ", got ", execution.num_threads));
  }
  if (execution.prefetch_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": prefetch_bytes must be >= 0, got ", execution.prefetch_bytes));
  }
  if (execution.tile_bytes < kTileGranule * 4) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": tile_bytes must be >= ", kTileGranule * 4,
                     ", got ", execution.tile_bytes));
  }
  const SimdPath simd_path = execution.simd_path.value_or(BestSimdPath());
  if (!SimdPathSupported(simd_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": simd_path ", SimdPathName(simd_path),
                     " is not supported by this CPU"));
  }
  int num_threads = execution.num_threads;
  if (num_threads == 0) {
    num_threads = std::max(1u, std::thread::hardware_concurrency());
  }
  const MomentFormat moment_format =
      EffectiveMomentFormat(options, num_elements);
  // Whole blocks per tile: a tile requantises its 8-bit blocks itself.
  const int64_t granule = std::max(kTileGranule, MomentGranule(moment_format));
  const int64_t tile_elements =
      std::max(granule, execution.tile_bytes / 4 / granule * granule);

  std::unique_ptr<CpuOptimizer> optimizer(new CpuOptimizer(
      options, num_elements, moment_format, simd_path, tile_elements, execution,
      std::make_unique<ThreadPool>(num_threads, execution.pin_threads,
                                   execution.first_cpu)));
  // 64-byte aligned (a cache line, one AVX-512 vector); with huge_pages and
  // at least one huge page of state, 2 MiB aligned and advised, so the
  // kernel's streams walk few TLB entries. Zeroed by the threads that will
  // update it (FirstTouch) so that pages land on their NUMA nodes.
  auto allocate = [&](StateBuffer* buffer, const char* state_name,
                      int64_t count, size_t element_bytes) -> absl::Status {
    const size_t state_bytes =
        (static_cast<size_t>(count) * element_bytes + 63) / 64 * 64;
    const bool huge = execution.huge_pages && state_bytes >= kHugePageBytes;
    const size_t alignment = huge ? kHugePageBytes : 64;
    const size_t bytes = (std::max<size_t>(state_bytes, 64) + alignment - 1) /
                         alignment * alignment;
    void* data = std::aligned_alloc(alignment, bytes);
    if (data == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat(name, ": cannot allocate ", bytes, " bytes of ",
                       state_name, " in host memory"));
    }
    buffer->reset(static_cast<char*>(data));
    // Advice only: a kernel without THP leaves small pages, same result.
    if (huge) madvise(data, bytes, MADV_HUGEPAGE);
    optimizer->FirstTouch(data, count, element_bytes);
    return absl::OkStatus();
  };
  if (options.type == OptimizerType::kSgd) {
    if (options.momentum != 0.0) {
      ZE_RETURN_IF_ERROR(allocate(&optimizer->state0_, "momentum_buffer",
                                  num_elements, sizeof(float)));
    }
  } else {
    const size_t bytes = MomentBytes(moment_format);
    ZE_RETURN_IF_ERROR(
        allocate(&optimizer->state0_, "exp_avg", num_elements, bytes));
    ZE_RETURN_IF_ERROR(
        allocate(&optimizer->state1_, "exp_avg_sq", num_elements, bytes));
    if (moment_format == MomentFormat::kBlockwise8) {
      ZE_RETURN_IF_ERROR(allocate(&optimizer->step0_, "exp_avg steps",
                                  NumBlocks(num_elements), sizeof(float)));
      ZE_RETURN_IF_ERROR(allocate(&optimizer->step1_, "exp_avg_sq steps",
                                  NumBlocks(num_elements), sizeof(float)));
    }
  }
  return optimizer;
}

int CpuOptimizer::num_state_arrays() const {
  return (state0_ != nullptr ? 1 : 0) + (state1_ != nullptr ? 1 : 0);
}

std::vector<CpuOptimizer::RawArray> CpuOptimizer::RawStateArrays() const {
  std::vector<RawArray> arrays;
  const int64_t bytes = options_.type == OptimizerType::kSgd
                            ? int64_t{sizeof(float)}
                            : MomentBytes(moment_format_);
  for (const StateBuffer* state : {&state0_, &state1_}) {
    if (*state != nullptr) arrays.push_back({state->get(), bytes, false});
  }
  for (const StateBuffer* step : {&step0_, &step1_}) {
    if (*step != nullptr) {
      arrays.push_back({step->get(), int64_t{sizeof(float)}, true});
    }
  }
  return arrays;
}

void CpuOptimizer::ReadState(int array, int64_t begin, int64_t count,
                             float* out) const {
  DecodeMoments(
      options_.type == OptimizerType::kSgd ? MomentFormat::kF32
                                           : moment_format_,
      array == 1, (array == 0 ? state0_ : state1_).get(),
      reinterpret_cast<const float*>((array == 0 ? step0_ : step1_).get()),
      begin, count, out);
}

void CpuOptimizer::WriteState(int array, int64_t begin, int64_t count,
                              const float* values) {
  EncodeMoments(options_.type == OptimizerType::kSgd ? MomentFormat::kF32
                                                     : moment_format_,
                array == 1, (array == 0 ? state0_ : state1_).get(),
                reinterpret_cast<float*>((array == 0 ? step0_ : step1_).get()),
                num_elements_, begin, count, values);
}

absl::StatusOr<StepCoefficients> CpuOptimizer::Coefficients(
    const StepArgs& step_args) const {
  return ComputeStepCoefficients(
      options_, step_count_, step_args,
      options_.type == OptimizerType::kSgd && state0_ != nullptr);
}

absl::Status CpuOptimizer::Step(float* master_weights, const void* grads,
                                DType grad_dtype, const StepArgs& step_args,
                                void* out, DType out_dtype) {
  ZE_RETURN_IF_ERROR(StepRange(0, num_elements_, master_weights, grads,
                               grad_dtype, step_args, out, out_dtype));
  AdvanceStep();
  return absl::OkStatus();
}

void CpuOptimizer::FirstTouch(void* data, int64_t count, size_t element_bytes) {
  if (count <= 0) return;
  const int pieces = pool_->num_threads();
  pool_->RunOnEachThread([&](int index) {
    int64_t begin, end;
    StaticPiece(count, index, pieces, &begin, &end);
    if (end > begin) {
      std::memset(static_cast<char*>(data) + begin * element_bytes, 0,
                  (end - begin) * element_bytes);
    }
  });
}

absl::Status CpuOptimizer::CheckStepInputs(int64_t count,
                                           const float* master_weights,
                                           const void* grads, DType grad_dtype,
                                           const void* out,
                                           DType out_dtype) const {
  if (count > 0 && (master_weights == nullptr || grads == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer step: ",
        master_weights == nullptr ? "master_weights" : "grads", " is null"));
  }
  if (!IsFloatingPoint(grad_dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer step: grad_dtype ", DTypeName(grad_dtype),
                     " must be f32, bf16 or f16"));
  }
  if (out != nullptr && !IsFloatingPoint(out_dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer step: out_dtype ", DTypeName(out_dtype),
                     " must be f32, bf16 or f16"));
  }
  return absl::OkStatus();
}

KernelTuning CpuOptimizer::Tuning() const {
  KernelTuning tuning;
  tuning.nontemporal_out = execution_.nontemporal_out;
  tuning.prefetch_elements = execution_.prefetch_bytes / 4;
  return tuning;
}

void CpuOptimizer::RunThreaded(const StepCoefficients& coefficients,
                               const StepBuffers& buffers) {
  const KernelTuning tuning = Tuning();
  const int64_t count = buffers.count;
  if (execution_.schedule == CpuSchedule::kStaticSplit) {
    const int pieces = pool_->num_threads();
    pool_->RunOnEachThread([&](int index) {
      int64_t begin, end;
      StaticPiece(count, index, pieces, &begin, &end);
      if (end > begin) {
        RunStepKernel(simd_path_, coefficients,
                      SliceStepBuffers(buffers, begin, end - begin), tuning);
      }
    });
    return;
  }
  pool_->ParallelFor(NumTiles(count), [&](int64_t tile) {
    RunTile(coefficients, buffers, tile, tuning);
  });
}

int64_t CpuOptimizer::NumTiles(int64_t count) const {
  return (count + tile_elements_ - 1) / tile_elements_;
}

void CpuOptimizer::RunTile(const StepCoefficients& coefficients,
                           const StepBuffers& buffers, int64_t tile,
                           const KernelTuning& tuning) const {
  const int64_t begin = tile * tile_elements_;
  const int64_t count = std::min(tile_elements_, buffers.count - begin);
  if (count > 0) {
    RunStepKernel(simd_path_, coefficients,
                  SliceStepBuffers(buffers, begin, count), tuning);
  }
}

absl::StatusOr<StepBuffers> CpuOptimizer::OwnStateBuffers(
    const RangeToUpdate& range) const {
  const int64_t state_offset = range.state_offset;
  const int64_t count = range.count;
  if (state_offset < 0 || count < 0 || state_offset + count > num_elements_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer step: range [", state_offset, ", ", state_offset + count,
        ") leaves the optimizer state of ", num_elements_, " elements"));
  }
  const int64_t granule = MomentGranule(moment_format_);
  if (state_offset % granule != 0 ||
      (count % granule != 0 && state_offset + count != num_elements_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer step: range [", state_offset, ", ",
                     state_offset + count, ") does not cover whole blocks of ",
                     granule, " elements, as 8-bit moments need"));
  }
  // Checked as f32 (the pointers only need to be there), then the storage.
  float* const placeholder = reinterpret_cast<float*>(state0_.get());
  ZE_ASSIGN_OR_RETURN(
      StepBuffers buffers,
      ExternalBuffers(count, range.master_weights, placeholder,
                      reinterpret_cast<float*>(state1_.get()), range.grads,
                      range.grad_dtype, range.out, range.out_dtype));
  // The state from state_offset on (SliceStepBuffers' rule for the state
  // alone: the other buffers are the range's own).
  StepBuffers state;
  state.moment_format = moment_format_;
  state.state0 = buffers.state0 != nullptr ? state0_.get() : nullptr;
  state.state1 = buffers.state1 != nullptr ? state1_.get() : nullptr;
  state.step0 = reinterpret_cast<float*>(step0_.get());
  state.step1 = reinterpret_cast<float*>(step1_.get());
  state = SliceStepBuffers(state, state_offset, 0);
  buffers.moment_format = moment_format_;
  buffers.state0 = state.state0;
  buffers.state1 = state.state1;
  buffers.step0 = state.step0;
  buffers.step1 = state.step1;
  buffers.first_index = state.first_index;
  buffers.bf16_ties_away = range.bf16_ties_away;
  return buffers;
}

absl::StatusOr<StepBuffers> CpuOptimizer::ExternalBuffers(
    int64_t count, float* master_weights, float* state0, float* state1,
    const void* grads, DType grad_dtype, void* out, DType out_dtype) const {
  if (count < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer step_external: count must be >= 0, got ", count));
  }
  ZE_RETURN_IF_ERROR(CheckStepInputs(count, master_weights, grads, grad_dtype,
                                     out, out_dtype));
  // The state this optimizer type reads and writes must be there; SGD
  // without momentum has none, and a momentum buffer is used iff given.
  const bool is_sgd = options_.type == OptimizerType::kSgd;
  const bool needs_state0 = !is_sgd || options_.momentum != 0.0;
  if (count > 0 && needs_state0 && state0 == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer step_external: state0 (",
                     is_sgd ? "momentum buffer" : "exp_avg", ") is null"));
  }
  if (count > 0 && !is_sgd && state1 == nullptr) {
    return absl::InvalidArgumentError(
        "optimizer step_external: state1 (exp_avg_sq) is null");
  }
  StepBuffers buffers;
  buffers.master = master_weights;
  buffers.state0 = needs_state0 ? state0 : nullptr;
  buffers.state1 = is_sgd ? nullptr : state1;
  buffers.grads = grads;
  buffers.grad_dtype = grad_dtype;
  buffers.out = out;
  buffers.out_dtype = out_dtype;
  buffers.count = count;
  return buffers;
}

absl::Status CpuOptimizer::StepRange(int64_t state_offset, int64_t count,
                                     float* master_weights, const void* grads,
                                     DType grad_dtype,
                                     const StepArgs& step_args, void* out,
                                     DType out_dtype) {
  RangeToUpdate range;
  range.state_offset = state_offset;
  range.count = count;
  range.master_weights = master_weights;
  range.grads = grads;
  range.grad_dtype = grad_dtype;
  range.out = out;
  range.out_dtype = out_dtype;
  ZE_ASSIGN_OR_RETURN(const StepBuffers buffers, OwnStateBuffers(range));
  ZE_ASSIGN_OR_RETURN(const StepCoefficients coefficients,
                      Coefficients(step_args));
  if (count > 0) RunThreaded(coefficients, buffers);
  return absl::OkStatus();
}

UpdateTimer::UpdateTimer(CpuOptimizer* optimizer, int64_t elements)
    : optimizer_(optimizer), elements_(elements) {}

absl::StatusOr<UpdateTimer> UpdateTimer::Create(CpuOptimizer* optimizer,
                                                int64_t elements) {
  if (elements < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("UpdateTimer: elements must be >= 1, not ", elements));
  }
  if (optimizer->moment_format() != MomentFormat::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat("UpdateTimer: times f32 moments; this optimizer stores ",
                     MomentFormatName(optimizer->moment_format())));
  }
  UpdateTimer timer(optimizer, elements);
  const auto size = static_cast<size_t>(elements);
  try {
    // Zero-filled by the vectors (on this thread: the pages' placement does
    // not matter for a rate).
    timer.master_.assign(size, 0.0f);
    timer.state0_.assign(size, 0.0f);
    timer.state1_.assign(size, 0.0f);
    timer.grads_.assign(size, 0x3c00);
    timer.out_.assign(size, 0);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("UpdateTimer: cannot allocate ", elements * 18,
                     " bytes of scratch to time the CPU optimizer"));
  }
  return timer;
}

absl::StatusOr<double> UpdateTimer::Round() {
  const OptimizerOptions& options = optimizer_->options();
  StepArgs args;
  args.lr = 1e-4;
  const auto start = std::chrono::steady_clock::now();
  ZE_RETURN_IF_ERROR(optimizer_->StepExternal(
      elements_, master_.data(),
      options.type != OptimizerType::kSgd || options.momentum > 0
          ? state0_.data()
          : nullptr,
      options.type == OptimizerType::kSgd ? nullptr : state1_.data(),
      grads_.data(), DType::kBF16, args, out_.data(), DType::kBF16));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return seconds / static_cast<double>(elements_);
}

absl::Status CpuOptimizer::StepExternal(int64_t count, float* master_weights,
                                        float* state0, float* state1,
                                        const void* grads, DType grad_dtype,
                                        const StepArgs& step_args, void* out,
                                        DType out_dtype) {
  if (moment_format_ != MomentFormat::kF32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer step_external: caller-held state is f32; this optimizer "
        "stores ",
        MomentFormatName(moment_format_), " moments"));
  }
  ZE_ASSIGN_OR_RETURN(const StepBuffers buffers,
                      ExternalBuffers(count, master_weights, state0, state1,
                                      grads, grad_dtype, out, out_dtype));
  ZE_ASSIGN_OR_RETURN(const StepCoefficients coefficients,
                      Coefficients(step_args));
  if (count > 0) RunThreaded(coefficients, buffers);
  return absl::OkStatus();
}

absl::Status CpuOptimizer::StepRanges(
    const StepArgs& step_args,
    const std::function<absl::StatusOr<bool>(RangeToUpdate*)>& next_range,
    const std::function<absl::Status(int64_t)>& range_done) {
  ZE_ASSIGN_OR_RETURN(const StepCoefficients coefficients,
                      Coefficients(step_args));
  const KernelTuning tuning = Tuning();
  // Guards `ranges` (read by every tile while next_range's thread appends)
  // and `status`.
  std::mutex mutex;
  std::deque<StepBuffers> ranges;
  std::deque<std::function<void(int64_t, int64_t)>> before_update;
  absl::Status status;
  auto fail = [&](const absl::Status& error) {
    std::lock_guard<std::mutex> lock(mutex);
    status.Update(error);
  };
  pool_->RunBatches(
      [&]() -> int64_t {
        {
          std::lock_guard<std::mutex> lock(mutex);
          if (!status.ok()) return 0;
        }
        RangeToUpdate range;
        absl::StatusOr<bool> more = next_range(&range);
        if (!more.ok()) {
          fail(more.status());
          return 0;
        }
        if (!*more) return 0;
        absl::StatusOr<StepBuffers> buffers = OwnStateBuffers(range);
        if (!buffers.ok()) {
          fail(buffers.status());
          return 0;
        }
        std::lock_guard<std::mutex> lock(mutex);
        ranges.push_back(*buffers);
        before_update.push_back(std::move(range.before_update));
        // An empty range is one task that writes nothing, so that it is
        // still reported done in its place.
        return std::max<int64_t>(1, NumTiles(range.count));
      },
      [&](int64_t index, int64_t tile) {
        StepBuffers range;
        const std::function<void(int64_t, int64_t)>* before = nullptr;
        {
          std::lock_guard<std::mutex> lock(mutex);
          range = ranges[index];
          // deque elements stay where they are while others are appended.
          if (before_update[index]) before = &before_update[index];
        }
        const int64_t begin = tile * tile_elements_;
        if (before != nullptr && begin < range.count) {
          (*before)(begin, std::min(tile_elements_, range.count - begin));
        }
        RunTile(coefficients, range, tile, tuning);
      },
      [&](int64_t index) {
        {
          std::lock_guard<std::mutex> lock(mutex);
          if (!status.ok()) return;
        }
        const absl::Status done = range_done(index);
        if (!done.ok()) fail(done);
      });
  return status;
}

}  // namespace offload
}  // namespace ze
