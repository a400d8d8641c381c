// What zero/ reports to the layers above: the boundary step's outcome, the
// collective volume of a step, a weight load, and the per-rank memory plan.
// Plain values with no dependency, so the engine's public header
// (engine/engine.h) can speak in them without pulling in the strategies,
// the partition state or offload/ (which produce them).
#ifndef ZE_ZERO_REPORTS_H_
#define ZE_ZERO_REPORTS_H_

#include <cstdint>
#include <string>

namespace ze {
namespace zero {

// What became of a step's offloaded update begun during backward (issue 27:
// zero/boundary_step.h).
enum class SpeculationOutcome {
  kNone,           // no offloaded bucket this step (or the step failed)
  kNotSpeculated,  // offloaded, nothing updated before the norm was known
  kCommitted,      // updated during backward and kept: the exact update
  kRedone,         // speculated, then undone: redone with the clip factor,
                   // or restored on a skipped step
};
const char* SpeculationOutcomeName(SpeculationOutcome outcome);

// What a boundary step did (for logs and tests).
struct StepReport {
  bool boundary = false;  // false: only accumulated
  bool skipped = false;   // fp16 overflow, or nonfinite (see below)
  // bf16/f32: the loss or the global gradient norm was inf or NaN. The
  // update is then skipped (skipped is true), except when an offloaded
  // update already began during backward (PartitionState::BeginUpdate: no
  // clipping), which cannot be taken back. fp16 reports overflow through
  // skipped alone.
  bool nonfinite = false;
  double loss = 0;           // mean over ranks and micro-batches
  double grad_norm = 0;      // global norm before clipping (0 if unknown)
  double learning_rate = 0;  // used for this update
  double loss_scale = 1;     // in effect for this step's backward
  SpeculationOutcome speculation = SpeculationOutcome::kNone;
  // This rank stopped speculating before the norm was known: its own
  // gradients already exceeded gradient_clipping (or were not finite).
  bool speculation_stopped_by_norm = false;
};

// Collective volume, in elements (padded buckets, as sent), over one
// optimizer step. Stage 3 counts its parameter all-gathers (output size) and
// gradient reduce-scatters (input size); other stages report zeros.
struct CommunicationCounters {
  int64_t all_gathered_elements = 0;
  int64_t reduce_scattered_elements = 0;
  int64_t all_gathers = 0;
  int64_t reduce_scatters = 0;
  // Of all_gathers: those one rank served in place (its slice is the whole
  // bucket, so the parameters read the weights where they are; no copy).
  int64_t all_gathers_in_place = 0;
  // Stage 3: time the compute stream (CUDA, timing events) or the host
  // (CPU) waited for parameter all-gathers to complete; near zero when
  // prefetching hides them.
  double wait_ms = 0;
  // Stage 3: buckets kept gathered for reuse (stage3_max_reuse_distance)
  // and gathered buckets released early to stay within
  // stage3_max_live_parameters.
  int64_t kept_for_reuse = 0;
  int64_t early_releases = 0;
  // Stage 3: the most gathered elements alive at once during the step.
  int64_t peak_gathered_elements = 0;
};

// Engine::LoadWeights's report.
struct LoadReport {
  int64_t tensors = 0;     // parameters loaded
  int64_t bytes_read = 0;  // tensor bytes this rank read from the file
};

// The memory plan the engine reports and allocates by (per rank).
struct MemoryBreakdown {
  int64_t parameter_elements = 0;  // Psi: trainable parameter elements
  int64_t model_weight_bytes = 0;  // 16-bit (or f32) weights held
  int64_t gradient_bytes = 0;      // gradients held between steps
  int64_t master_weight_bytes = 0;
  int64_t optimizer_state_bytes = 0;  // moments, without the master weights
  int64_t total_bytes() const {
    return model_weight_bytes + gradient_bytes + master_weight_bytes +
           optimizer_state_bytes;
  }
  // Where it lives (offload). staging_bytes: the host buffers offloaded
  // buckets' gradients and updated weights travel through (not in
  // total_bytes()). device_bytes + host_bytes + nvme_bytes = total_bytes()
  // + staging_bytes + speculation_bytes (+ the swap buffers in host_bytes
  // with NVMe);
  // pinned_host_bytes is the part of host_bytes that is page-locked (what
  // the device copies to and from, with pin_memory).
  int64_t staging_bytes = 0;
  int64_t device_bytes = 0;
  int64_t host_bytes = 0;
  int64_t pinned_host_bytes = 0;
  // Swap files: offload_optimizer nvme's master weights and moments, and
  // offload_param nvme's weights beyond max_in_cpu (whose swap buffers are
  // in host_bytes and, with pin_memory, pinned_host_bytes).
  int64_t nvme_bytes = 0;
  // Part of host_bytes (not of total_bytes()): the speculative update's
  // backup of master weights and optimizer state
  // (offload_optimizer.speculation_buffer_size; issue 27).
  int64_t speculation_bytes = 0;
  // Where each part lives, so a mixed placement reads off directly. The
  // master weights and optimizer state of the buckets whose optimizer is on
  // the device (all of them without offload_optimizer; the rest beyond
  // `ratio` with it), in host memory (offload_optimizer cpu) and in a swap
  // file (nvme):
  //   device_optimizer_bytes + host_optimizer_bytes + nvme_optimizer_bytes
  //     = master_weight_bytes + optimizer_state_bytes.
  // The weights (this rank's 16-bit or f32 copy) on the device, in host
  // memory (offload_param cpu, or nvme's max_in_cpu part) and in their swap
  // file (offload_param nvme):
  //   device_weight_bytes + host_weight_bytes + nvme_weight_bytes
  //     = model_weight_bytes.
  // swap_buffer_bytes: the host buffers both swap files are read and
  // written through. So device_bytes = device_weight_bytes + gradient_bytes
  // + device_optimizer_bytes; host_bytes = host_optimizer_bytes +
  // host_weight_bytes + staging_bytes + swap_buffer_bytes +
  // speculation_bytes; nvme_bytes = nvme_optimizer_bytes +
  // nvme_weight_bytes.
  int64_t device_optimizer_bytes = 0;
  int64_t host_optimizer_bytes = 0;
  int64_t nvme_optimizer_bytes = 0;
  int64_t device_weight_bytes = 0;
  int64_t host_weight_bytes = 0;
  int64_t nvme_weight_bytes = 0;
  int64_t swap_buffer_bytes = 0;
  // The paper's figure for this stage, precision and world size (16 Psi,
  // 4 Psi + 12 Psi / N, 2 Psi + 14 Psi / N, 16 Psi / N for mixed-precision
  // Adam), exact (no rounding of Psi / N).
  double paper_bytes = 0;
  std::string ToString() const;
};

// `bytes` as "1.234 GiB" (three decimals), for memory messages.
std::string FormatGiB(int64_t bytes);
// `bytes` at a glance: "5.5 GiB" from 1 GiB on, else "12.3 MiB" (the
// pipeline's per-stage plan, the "auto" offload ratio's log line).
std::string FormatGiBOrMiB(double bytes);

}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_REPORTS_H_
