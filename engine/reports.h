// The values the Engine's public API reports (engine/engine.h includes this
// header; programs need not). Plain structs with no dependency on how the
// engine computes them, so the checkpoint orchestration
// (engine/checkpoint/orchestration.h) can fill them without the Engine.
#ifndef ZE_ENGINE_REPORTS_H_
#define ZE_ENGINE_REPORTS_H_

#include <cstdint>
#include <string>

#include "nlohmann/json.hpp"
#include "pipeline/step_time.h"
#include "zero/reports.h"

namespace ze {
namespace engine {

// The zero/ reports the public API speaks in (zero/reports.h).
using MemoryBreakdown = zero::MemoryBreakdown;  // per-rank model state
using CommunicationCounters = zero::CommunicationCounters;
using LoadReport = zero::LoadReport;
using StepReport = zero::StepReport;

struct Counters {
  int64_t global_steps = 0;    // optimizer steps taken or skipped
  int64_t skipped_steps = 0;   // fp16 overflows; bf16/f32 non-finite steps
  int64_t micro_steps = 0;     // Forward/Backward pairs
  int64_t global_samples = 0;  // samples over all ranks
  // Steps with an offloaded update, by what became of its speculation
  // (zero::SpeculationOutcome; issue 27). Diagnostics: not checkpointed.
  int64_t speculation_committed = 0;
  int64_t speculation_redone = 0;
  int64_t speculation_not_speculated = 0;
};

// This pipeline rank's last TrainBatch (Engine::pipeline_counters; zeros
// without a pipeline): pipeline/executor.h.
struct PipelineCounters {
  // Forwards of a (stage, micro-batch) that ran more than once: 0, every
  // forward's activations are kept until its backward.
  int recomputed_forwards = 0;
  // The most micro-batches (over the rank's stages) whose saved
  // activations the rank held at once, measured from the modules; at most
  // activation_bound.
  int peak_saved_micro_batches = 0;
  // The schedule's bound for this rank (pipeline::ActivationBound).
  int activation_bound = 0;

  // Time of the last TrainBatch on this rank (pipeline/step_time.h,
  // pipeline/executor.h "Time"): wall_ms, from the rank's first action to
  // the end of the step's closing loss exchange (every rank's step ends
  // with the slowest rank's), split into busy_ms, its compute actions
  // (forward_ms + backward_ms + weight_gradient_ms + reduce_ms; on a GPU
  // each until its kernels finished), and idle_ms = wall_ms - busy_ms, of
  // which wait_ms was blocked on messages. times.bubble_fraction() is the
  // rank's measured bubble.
  pipeline::StepTimes times;
  // After the step: the boundary step (the data-parallel reduction and the
  // optimizer), the host's wall time of that call (not synchronised with
  // the device: a GPU may still be running its last kernels).
  double boundary_ms = 0;
  // What the schedule predicts, in its own units (pipeline::SimulateSchedule
  // with forward 1, backward 2, the split halves 1 each, free messages):
  // this rank's idle share (rank_bubble) and the pipeline's
  // (bubble_fraction, the mean over ranks).
  double schedule_rank_bubble = 0;
  double schedule_bubble = 0;
};

// Where this rank's last SaveCheckpoint spent its time (seconds), for
// benchmarks. The copy and the writer run concurrently (a pipeline), so
// the phases overlap; `total` is the call's wall time.
struct CheckpointSaveReport {
  double total_seconds = 0;
  double agree_seconds = 0;  // tag agreement and the partial directory
  double copy_seconds = 0;   // state copied to host staging (this thread)
  double stall_seconds = 0;  // this thread waiting for a free buffer
  double crc_seconds = 0;    // writer thread: CRC-32C
  double writer_stall_seconds = 0;  // writer thread waiting for the disk
                                    // (direct I/O: for a free block)
  double write_seconds = 0;         // writing: the I/O thread in pwrite (direct
                                    // I/O), else the write() calls
  double finish_seconds = 0;        // the file's last writes, fsync, rename
  double commit_seconds = 0;        // records gathered, manifest, `latest`
  bool direct_io = false;           // the rank file was written with O_DIRECT
  bool pinned = false;              // the staging buffers were page-locked
  int64_t bytes = 0;                // this rank's file
};

// What LoadCheckpoint loaded, how this rank loaded it (see
// Engine::LoadCheckpoint) and where its time went (seconds).
struct LoadedCheckpoint {
  std::string tag;
  nlohmann::json client_state;
  int saved_world_size = 0;
  int saved_stage = 0;
  int64_t bytes_read = 0;     // by this rank
  bool one_pass = false;      // staged in host memory as read, then applied
  int64_t bytes_staged = 0;   // host staging (one_pass)
  int files_reread = 0;       // files this rank verified by reading them
                              // again (a partial read: resharding)
  double open_seconds = 0;    // tag agreement, manifest, headers, checks
  double read_seconds = 0;    // one_pass: reading (with CRCs) into staging
  double verify_seconds = 0;  // checksums checked (one_pass: from the
                              // reads, plus any re-read); agreement
  double apply_seconds = 0;   // writing the state into place (two-pass:
                              // reading and writing, bucket by bucket)
  double total_seconds = 0;
};

// The offloaded update's diagnostics (Engine::nvme_counters,
// Engine::offload_times), for benchmarks. Only declared here: their
// definitions (engine/offload_report.h) name offload/'s and the partition
// state's types, which a program that does not read them should not
// include.
struct NvmeCounters;
struct OffloadTimes;

}  // namespace engine
}  // namespace ze

#endif  // ZE_ENGINE_REPORTS_H_
