// A multi-threaded, SIMD optimizer step over f32 master weights and f32
// moments in host memory (ZeRO-Offload's CPU Adam): Adam (L2), AdamW
// (decoupled weight decay) and SGD with momentum.
//
// Semantics are exactly zero/optimizer.h's (PyTorch's), with t the 1-based
// step count and g = grad * grad_scale (gradients f32, bf16 or f16):
//   Adam  (L2):        g += wd * p
//                      m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//                      p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t)
//                      + eps)
//   AdamW (decoupled): p *= 1 - lr * wd, then the Adam update without L2.
//   SGD:               g += wd * p
//                      buf = g on the first step, else
//                      buf = mu buf + (1 - dampening) g
//                      g = nesterov ? g + mu buf : buf;  p -= lr g
//                      (momentum 0: no state, plain p -= lr g)
// The per-step scalars are formed in double and rounded once to f32, and
// every element evaluates the same f32 sequence with the same fused
// multiply-adds as zero/optimizer_kernels.h, so the result is bit for bit
// the engine's FlatOptimizer (CPU and CUDA) given the same inputs.
//
// Paths: AVX-512 (16 wide), AVX2/FMA (8 wide) and scalar, chosen at run time
// from the CPU's features. All three evaluate the same operations (IEEE sqrt
// and division are correctly rounded in every path), so they agree bit for
// bit; the scalar path is the reference and handles every vector tail.
// The range is split over a small pool of threads (by default one fixed
// contiguous piece per thread; CpuSchedule); elements are independent, so
// neither the split nor the thread count ever changes the result.
#ifndef ZE_OFFLOAD_CPU_OPTIMIZER_H_
#define ZE_OFFLOAD_CPU_OPTIMIZER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "offload/moment_codec.h"
#include "offload/step_coefficients.h"

namespace ze {
namespace offload {

// The instruction set an optimizer step runs with.
enum class SimdPath { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

// "scalar", "avx2", "avx512".
const char* SimdPathName(SimdPath path);

// Whether this CPU can run `path` (scalar always; AVX2 needs avx2 and fma,
// and the F16C conversions every path uses; AVX-512 needs avx512f).
bool SimdPathSupported(SimdPath path);

// The widest supported path.
SimdPath BestSimdPath();

enum class OptimizerType { kAdam = 0, kAdamW = 1, kSgd = 2 };

// "adam", "adamw", "sgd".
const char* OptimizerTypeName(OptimizerType type);

// Hyperparameters fixed for the run (zero::OptimizerOptions' fields and
// meanings). Doubles, as the JSON config holds them: 1 - beta is formed in
// double and rounded once.
struct OptimizerOptions {
  OptimizerType type = OptimizerType::kAdamW;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  // SGD only.
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
  // Adam and AdamW: how m and v are stored (MomentFormat; the default f32
  // is exact). bf16 rounds to nearest even, or stochastically with
  // stochastic_rounding, seeded by rounding_seed (moment_codec.h). 8-bit
  // block-wise moments apply to optimizers of at least kMin8BitElements
  // elements (EffectiveMomentFormat); their update always rounds the codes
  // stochastically, seeded by rounding_seed (stochastic_rounding is for
  // bf16). SGD keeps f32 (InvalidArgument
  // otherwise).
  MomentFormat moments = MomentFormat::kF32;
  bool stochastic_rounding = false;
  uint64_t rounding_seed = 0;
};

// "f32", "bf16", "8bit".
const char* MomentFormatName(MomentFormat format);

// The moment format an optimizer over `num_elements` elements stores:
// options.moments, except f32 for 8-bit below kMin8BitElements.
MomentFormat EffectiveMomentFormat(const OptimizerOptions& options,
                                   int64_t num_elements);

// Bytes of optimizer state (beyond the master weights) an optimizer of
// `options` over `num_elements` elements holds: Adam 8 (f32), 4 (bf16) or
// 2 a element plus 8 per block of kMomentBlock (8-bit); SGD 4 with
// momentum, else 0.
// `format_elements` (default num_elements) decides the format, as
// zero::FlatOptimizer::Create's.
int64_t OptimizerStateBytes(const OptimizerOptions& options,
                            int64_t num_elements, int64_t format_elements = -1);

// Element ranges an optimizer of `format` updates must start at a multiple
// of this (and end at one, or at the end of the state): kMomentBlock for
// 8-bit (a block is requantised whole), 1 otherwise.
int64_t MomentGranule(MomentFormat format);

// What changes from step to step (zero::StepArgs' fields and meanings).
struct StepArgs {
  double lr = 0.0;
  // Multiplies every gradient before anything else.
  float grad_scale = 1.0f;
  // When set, replace beta1 / beta2 (Adam, AdamW) or the momentum (SGD).
  std::optional<double> beta1;
  std::optional<double> beta2;
};

// How a step's range is shared among the pool's threads.
enum class CpuSchedule {
  // One contiguous piece of the range per thread, the same piece on the same
  // thread every call (ThreadPool::RunOnEachThread): with the state
  // first-touched in the same split, each thread updates memory on its own
  // NUMA node, and each thread's streams are long for the prefetchers.
  kStaticSplit = 0,
  // Tiles of tile_bytes handed out in turn through an atomic counter
  // (balances uneven threads, but a tile lands on any thread).
  kDynamicTiles = 1,
};

// How the step runs; none of it changes the result. The defaults are the
// fastest measured on the H200 machine's 16-core host (bench/RESULTS.md,
// runs 28 and 36: dynamic 256 KiB tiles on pinned threads, 5-12% above a
// static split in each of three calls).
struct CpuExecutionOptions {
  // Threads in the pool, the caller's included; 0: hardware threads.
  int num_threads = 0;
  CpuSchedule schedule = CpuSchedule::kDynamicTiles;
  // kDynamicTiles: bytes of each f32 stream per tile. Rounded down to whole
  // 64-element blocks, at least one.
  int64_t tile_bytes = 256 * 1024;
  // The instruction set; unset: BestSimdPath().
  std::optional<SimdPath> simd_path;
  // Bind each worker to one CPU (ThreadPool's pin_workers), from the
  // (first_cpu + 1)-th CPU of the process's affinity mask on; the caller's
  // thread keeps its affinity. Several ranks on one host pass their own
  // first_cpu (PlanCpuShare) so that their workers never share a CPU.
  bool pin_threads = true;
  int first_cpu = 0;
  // Ask for transparent huge pages (madvise(MADV_HUGEPAGE)) on the state
  // buffers, allocated 2 MiB aligned: fewer TLB misses over the streams.
  bool huge_pages = true;
  // Write `out` with non-temporal stores (AVX-512 path): it is write-only,
  // so this saves the read a normal store's write-allocate makes.
  bool nontemporal_out = true;
  // Software prefetch this many bytes ahead in each f32 stream (AVX-512
  // path); 0: none (the hardware prefetchers alone).
  int64_t prefetch_bytes = 0;
};

// The pointers of one update of `count` elements. None may overlap another,
// with one exception: `out` may equal `grads` exactly (same address, and
// out_dtype == grad_dtype), for an in-place update of a gradient buffer into
// the new weights: every element's gradient is read before its output is
// written.
struct StepBuffers {
  // f32, updated in place; null for a split master (master_lo set).
  float* master = nullptr;
  // exp_avg (Adam) or the momentum buffer (SGD, f32), and exp_avg_sq
  // (Adam; null for SGD), stored as moment_format says: f32, bf16 bits
  // (uint16_t) or 8-bit codes (int8_t m, uint8_t v) with one f32 per
  // block of each in step0 / step1: the block's scale (moment_codec.h's
  // top; the name is from the format's first codes, whose scale was a
  // step).
  void* state0 = nullptr;
  void* state1 = nullptr;
  float* step0 = nullptr;
  float* step1 = nullptr;
  MomentFormat moment_format = MomentFormat::kF32;
  // The index of element 0 in the optimizer's state: the stochastic
  // rounding's counter; with 8-bit moments a multiple of kMomentBlock, and
  // `count` a multiple too unless the range ends the state (step0 and
  // step1 then point at element 0's block).
  int64_t first_index = 0;
  const void* grads = nullptr;     // grad_dtype
  DType grad_dtype = DType::kF32;  // f32, bf16 or f16
  void* out = nullptr;             // null, or receives p rounded to out_dtype
  DType out_dtype = DType::kBF16;  // f32, bf16 or f16 (ignored when out null)
  int64_t count = 0;
  // The exact 16+16 master (core/dtype.h's Bf16Split): when set, `master`
  // is null and the master weight i is JoinBf16Split(out[i], master_lo[i]),
  // `out` being the bf16 weights (out_dtype bf16, never equal to grads);
  // both halves are rewritten with the updated value's split, so the values
  // are those of an f32 master whose weights round ties away from zero.
  uint16_t* master_lo = nullptr;
  // With an f32 master and a bf16 `out`: out rounds ties away from zero
  // (SplitForBf16(p).hi) instead of to even: the weights of a 16+16 master
  // run whose f32 master lives here (offload: f32 is hi and lo's bits).
  bool bf16_ties_away = false;
};

// Checks the hyperparameters every optimizer of the project requires (this
// one and zero::FlatOptimizer): betas in [0, 1), eps > 0, weight decay,
// momentum and dampening >= 0, nesterov only with momentum and no
// dampening, and num_elements >= 0. InvalidArgument naming the optimizer
// and the value otherwise.
absl::Status ValidateOptimizerOptions(const OptimizerOptions& options,
                                      int64_t num_elements);

// The coefficients of update number step_count + 1 (t), formed in double and
// rounded once to f32, so every implementation (CPU paths, CUDA) sees the
// same ones. `has_momentum_buffer`: SGD keeps a momentum buffer.
// InvalidArgument for a non-finite lr or grad_scale, or a beta override
// outside [0, 1).
absl::StatusOr<StepCoefficients> ComputeStepCoefficients(
    const OptimizerOptions& options, int64_t step_count,
    const StepArgs& step_args, bool has_momentum_buffer);

// Elements [begin, begin + count) of a moment array stored in `format`
// (`data` and, for 8-bit, `steps` at the state's element 0; `second`:
// exp_avg_sq, else exp_avg or SGD's f32 buffer) as f32 into `out`: exact.
void DecodeMoments(MomentFormat format, bool second, const void* data,
                   const float* steps, int64_t begin, int64_t count,
                   float* out);
// Writes `values` over those elements of a state of `num_elements`: f32
// as is, bf16 to nearest even, 8-bit re-encoding every block the range
// touches (its other elements decoded and kept), so writing back what
// DecodeMoments read changes no bit.
void EncodeMoments(MomentFormat format, bool second, void* data, float* steps,
                   int64_t num_elements, int64_t begin, int64_t count,
                   const float* values);

// `buffers` advanced by `begin` elements and cut to `count` (with 8-bit
// moments `begin` must be a multiple of kMomentBlock).
StepBuffers SliceStepBuffers(const StepBuffers& buffers, int64_t begin,
                             int64_t count);

// One single-threaded pass of `path` over `buffers` (the kernel itself; no
// checks: the path must be supported, dtypes valid, state pointers present
// as the coefficients require). For tests and for callers with their own
// threads; CpuOptimizer::Step is the checked, threaded entry point.
void RunStepKernel(SimdPath path, const StepCoefficients& coefficients,
                   const StepBuffers& buffers);

// Memory-access choices of one kernel pass; they never change a value.
struct KernelTuning {
  // Stream `out` past the caches (AVX-512 path; other paths ignore it, as
  // does an `out` not 2-byte aligned). Ends with a store fence.
  bool nontemporal_out = false;
  // Software-prefetch each stream this many elements ahead (AVX-512 path).
  int64_t prefetch_elements = 0;
};

// RunStepKernel with explicit tuning.
void RunStepKernel(SimdPath path, const StepCoefficients& coefficients,
                   const StepBuffers& buffers, const KernelTuning& tuning);

// One range of a CpuOptimizer::StepRanges stream: StepRange's arguments.
struct RangeToUpdate {
  int64_t state_offset = 0;  // into the optimizer's state
  int64_t count = 0;
  float* master_weights = nullptr;
  const void* grads = nullptr;
  DType grad_dtype = DType::kF32;
  void* out = nullptr;  // may equal grads, as StepRange allows
  DType out_dtype = DType::kBF16;
  bool bf16_ties_away = false;  // as StepBuffers::bf16_ties_away
  // Optional: called on the tile's thread just before the kernel updates
  // the range's elements [begin, begin + count) (relative to the range), so
  // a caller can read what it needs of them first (a backup of the state, a
  // sum over the gradients) in parallel over the tiles. Must be thread-safe
  // and must not call the optimizer.
  std::function<void(int64_t begin, int64_t count)> before_update;
};

// Owns the optimizer state for one flat range of f32 master weights in host
// memory and updates it with a thread pool.
class CpuOptimizer {
 public:
  // Allocates zeroed, 64-byte aligned (2 MiB with huge_pages) f32 state for
  // `num_elements`: exp_avg and exp_avg_sq for Adam/AdamW, momentum_buffer for
  // SGD with momentum, none for plain SGD, and starts the pool. Fails with
  // InvalidArgument for bad hyperparameters (zero::FlatOptimizer::Create's
  // rules), a negative num_elements, num_threads < 0, tile_bytes < 256, or a
  // simd_path this CPU lacks; with ResourceExhausted when the state cannot be
  // allocated.
  static absl::StatusOr<std::unique_ptr<CpuOptimizer>> Create(
      const OptimizerOptions& options, int64_t num_elements,
      const CpuExecutionOptions& execution = CpuExecutionOptions());

  ~CpuOptimizer();
  CpuOptimizer(const CpuOptimizer&) = delete;
  CpuOptimizer& operator=(const CpuOptimizer&) = delete;

  // One update of `master_weights` [0, num_elements) from `grads` (f32,
  // bf16 or f16); if `out` is not null it receives the updated weights
  // rounded to nearest even to `out_dtype`. Synchronous: done on return.
  // Increments step_count(). Fails with InvalidArgument (naming the
  // parameter) on a null pointer, a bad dtype, a non-finite lr or
  // grad_scale, or a beta override outside [0, 1); nothing is modified then.
  absl::Status Step(float* master_weights, const void* grads, DType grad_dtype,
                    const StepArgs& step_args, void* out = nullptr,
                    DType out_dtype = DType::kBF16);

  // Like Step over state elements [state_offset, state_offset + count)
  // without advancing step_count() (for callers that update a partition
  // tile by tile as its gradients arrive); call AdvanceStep() once after
  // every range of one step. Also fails when the range leaves the state.
  // `out` may equal `grads` exactly when out_dtype == grad_dtype (each
  // element's gradient is read before its output is written); no other
  // overlap is allowed.
  //
  // Locality: with kStaticSplit, thread k updates the k-th of num_threads()
  // contiguous pieces of [0, count) (boundaries on 1024-element multiples).
  // The state was first-touched in that split over [0, num_elements()), so
  // whole-range calls find it on their own NUMA node; the caller's master,
  // grads and out buffers get the same by being first-touched with
  // FirstTouch() (same count) before their first use.
  absl::Status StepRange(int64_t state_offset, int64_t count,
                         float* master_weights, const void* grads,
                         DType grad_dtype, const StepArgs& step_args,
                         void* out = nullptr, DType out_dtype = DType::kBF16);
  // One update of `count` elements whose f32 master weights and state live in
  // caller memory (NVMe swap buffers): `state0` = exp_avg (Adam) or the
  // momentum buffer (SGD, null without momentum), `state1` = exp_avg_sq
  // (Adam; null for SGD). Threaded and checked like StepRange; does not
  // advance step_count() (call AdvanceStep() once per step). `out` may equal
  // `grads` when out_dtype == grad_dtype (each element's gradient is read
  // before its output is written).
  absl::Status StepExternal(int64_t count, float* master_weights, float* state0,
                            float* state1, const void* grads, DType grad_dtype,
                            const StepArgs& step_args, void* out = nullptr,
                            DType out_dtype = DType::kBF16);

  // StepRange over a sequence of ranges given one at a time, run as one
  // stream of tiles (ThreadPool::RunBatches): threads go on to the next
  // range's tiles while the last tiles of the range before still run, so a
  // step made of many ranges pays no barrier per range (StepRange's
  // schedule option does not apply: always tiles of tile_elements()).
  // Does not advance step_count().
  //
  // `next_range(&range)`: fills `range` and returns true, or false when no
  // range is left. Called by one of the pool's threads (the caller's
  // included) at a time; it may block until the range's inputs are there
  // while other threads finish the range before.
  // `range_done(index)`: once per range (numbered from 0 in the order
  // given), in order, after the range's elements and every earlier range's
  // are written; on any of the pool's threads, under the stream's lock: it
  // must be short and must not call this optimizer.
  // Errors: bad step arguments (before any range is asked for); a range
  // StepRange would refuse; an error from next_range or range_done. The
  // first ends the stream: no further range is asked for, ranges already
  // begun are finished without range_done, and the error is returned.
  absl::Status StepRanges(
      const StepArgs& step_args,
      const std::function<absl::StatusOr<bool>(RangeToUpdate*)>& next_range,
      const std::function<absl::Status(int64_t)>& range_done);

  void AdvanceStep() { ++step_count_; }

  // Zeroes `count` elements of `element_bytes` each at `data` from the pool's
  // threads in the static split StepRange(0, count, ...) uses, so that with
  // first-touch NUMA placement each thread's piece lands on its node. For
  // callers' buffers (master weights, gradients, out) before their first
  // use; memory already touched does not move.
  void FirstTouch(void* data, int64_t count, size_t element_bytes);

  // The coefficients StepRange would use now (step_count() + 1 is t).
  absl::StatusOr<StepCoefficients> Coefficients(
      const StepArgs& step_args) const;

  // The f32 state arrays (null when the optimizer has none, and for
  // compressed moments: see ReadState), num_elements() floats each;
  // writing into them restores state.
  float* exp_avg() const { return F32State(state0_, false); }
  float* exp_avg_sq() const { return F32State(state1_, false); }
  float* momentum_buffer() const { return F32State(state0_, true); }
  // How the moments are stored (EffectiveMomentFormat).
  MomentFormat moment_format() const { return moment_format_; }
  // Number of state arrays: 2 (Adam), 1 (SGD with momentum) or 0.
  int num_state_arrays() const;
  // Elements [begin, begin + count) of state array `array` (0: exp_avg or
  // the momentum buffer, 1: exp_avg_sq) as f32 into `out` (exact from
  // every format). The caller keeps the range inside the state and the
  // optimizer idle.
  void ReadState(int array, int64_t begin, int64_t count, float* out) const;
  // Writes `values` over those elements, encoded in moment_format(): bf16
  // to nearest even; 8-bit re-encodes each block the range touches (its
  // other elements decoded and kept). A state read by ReadState and
  // written back is unchanged, bit for bit.
  void WriteState(int array, int64_t begin, int64_t count, const float* values);
  // The state's storage as raw bytes, for byte-exact copies (speculation's
  // backup): each array's base and bytes per element, or, for 8-bit steps,
  // per kMomentBlock elements (per_block).
  struct RawArray {
    char* data = nullptr;
    int64_t bytes = 0;
    bool per_block = false;
  };
  std::vector<RawArray> RawStateArrays() const;

  int64_t step_count() const { return step_count_; }
  void set_step_count(int64_t count) { step_count_ = count; }
  const OptimizerOptions& options() const { return options_; }
  int64_t num_elements() const { return num_elements_; }
  SimdPath simd_path() const { return simd_path_; }
  int num_threads() const { return pool_->num_threads(); }
  int64_t tile_elements() const { return tile_elements_; }

 private:
  struct FreeDeleter {
    void operator()(void* data) const;
  };
  using StateBuffer = std::unique_ptr<char[], FreeDeleter>;
  // `buffer` as f32 when it holds f32 of this optimizer's kind (`sgd`:
  // the momentum buffer), else null.
  float* F32State(const StateBuffer& buffer, bool sgd) const {
    const bool is_sgd = options_.type == OptimizerType::kSgd;
    if (is_sgd != sgd || (!is_sgd && moment_format_ != MomentFormat::kF32)) {
      return nullptr;
    }
    return reinterpret_cast<float*>(buffer.get());
  }

  CpuOptimizer(const OptimizerOptions& options, int64_t num_elements,
               MomentFormat moment_format, SimdPath simd_path,
               int64_t tile_elements, const CpuExecutionOptions& execution,
               std::unique_ptr<ThreadPool> pool);

  OptimizerOptions options_;
  int64_t num_elements_;
  SimdPath simd_path_;
  int64_t tile_elements_;
  // The checks StepRange and StepExternal share (null pointers, dtypes).
  absl::Status CheckStepInputs(int64_t count, const float* master_weights,
                               const void* grads, DType grad_dtype,
                               const void* out, DType out_dtype) const;
  // StepExternal's checks; the buffers of one update on success.
  absl::StatusOr<StepBuffers> ExternalBuffers(
      int64_t count, float* master_weights, float* state0, float* state1,
      const void* grads, DType grad_dtype, void* out, DType out_dtype) const;
  // StepRange's checks; the buffers of `range` over this optimizer's state.
  absl::StatusOr<StepBuffers> OwnStateBuffers(const RangeToUpdate& range) const;
  KernelTuning Tuning() const;
  // Tiles of tile_elements() covering `count` elements (the last partial).
  int64_t NumTiles(int64_t count) const;
  // The kernel over tile `tile` of `buffers` on the calling thread; nothing
  // when the tile lies past buffers.count (an empty range's one task).
  void RunTile(const StepCoefficients& coefficients, const StepBuffers& buffers,
               int64_t tile, const KernelTuning& tuning) const;
  // Runs the kernel over `buffers` on the pool per execution_.
  void RunThreaded(const StepCoefficients& coefficients,
                   const StepBuffers& buffers);

  CpuExecutionOptions execution_;
  std::unique_ptr<ThreadPool> pool_;
  int64_t step_count_ = 0;
  MomentFormat moment_format_ = MomentFormat::kF32;
  // Adam's moments (or SGD's momentum buffer in state0_), and with 8-bit
  // moments their per-block steps.
  StateBuffer state0_;
  StateBuffer state1_;
  StateBuffer step0_;
  StateBuffer step1_;
};

// One update of a CpuOptimizer over scratch memory (Adam/AdamW/SGD as
// configured, bf16 gradients and weights), timed, as often as asked: the CPU
// side of the CPU/GPU split's measurements (offload::MeasureUpdateRates,
// which also runs rounds as a load while it times the link). The scratch (3 f32
// arrays, bf16 gradients and weights) is allocated and first-touched by Create
// and freed with the timer; the optimizer's own state and step_count() are
// never touched. Uses the optimizer's threads: one Round at a time, and never
// while the optimizer steps. Not thread-safe; the optimizer must outlive it.
class UpdateTimer {
 public:
  // InvalidArgument for elements < 1 or an optimizer whose moments are not
  // f32 (StepExternal's rule); ResourceExhausted when the scratch cannot be
  // allocated.
  static absl::StatusOr<UpdateTimer> Create(CpuOptimizer* optimizer,
                                            int64_t elements);
  // Seconds per element of one update over the scratch.
  absl::StatusOr<double> Round();

 private:
  UpdateTimer(CpuOptimizer* optimizer, int64_t elements);
  CpuOptimizer* optimizer_;
  int64_t elements_;
  std::vector<float> master_;
  std::vector<float> state0_;
  std::vector<float> state1_;
  std::vector<uint16_t> grads_;
  std::vector<uint16_t> out_;
};

}  // namespace offload
}  // namespace ze

#endif  // ZE_OFFLOAD_CPU_OPTIMIZER_H_
