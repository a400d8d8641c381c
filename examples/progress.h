// The trainer's progress report: one line per update, which train_gpt
// either redraws in place on a terminal ('\r', then clear to the end of the
// line) or prints as a plain line in a log. Pure formatting and arithmetic,
// so the figures (ETA, tokens/s, MFU) are unit-tested without a model.
#ifndef ZE_EXAMPLES_PROGRESS_H_
#define ZE_EXAMPLES_PROGRESS_H_

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

namespace ze {
namespace examples {

// Training FLOPs per token of a GPT (forward and backward, no
// recomputation): 6 N for the matrix products with the weights plus
// 12 L T C for attention's scores and weighted sum (4 L T C forward, twice
// that backward; T the sequence length, C the width; the causal mask's
// skipped half is counted, as is usual), the estimate of the PaLM paper's
// appendix B (12 L H Q T there, with H Q = C).
double TrainingFlopsPerToken(double num_parameters, int num_layers,
                             int64_t channels, int64_t sequence_length);

// Model FLOPs utilisation: the fraction of the devices' peak that the
// model's own FLOPs (TrainingFlopsPerToken) at this throughput amount to.
//   tokens_per_second: over all ranks; num_devices: the ranks' devices;
//   peak_flops_per_device: e.g. 989e12 for an H100/H200 SXM's dense bf16.
// 0 when any argument is not positive.
double ModelFlopsUtilization(double flops_per_token, double tokens_per_second,
                             int num_devices, double peak_flops_per_device);

// Seconds left, extrapolating the mean pace of the steps done so far:
// elapsed * (total - done) / done. nullopt before the first step is done
// (no pace yet); 0 when done >= total.
std::optional<double> EstimateRemainingSeconds(int64_t steps_done,
                                               int64_t total_steps,
                                               double elapsed_seconds);

// "42s", "3m05s", "2h07m": at most two units, rounded down.
std::string FormatDuration(double seconds);

// "812 B", "1.5 KiB", "3.2 MiB", "1.00 GiB": three significant figures.
std::string FormatBytes(int64_t bytes);

// One update's figures.
struct ProgressSnapshot {
  int64_t step = 0;              // steps done (the last one's number, 1-based)
  int64_t total_steps = 0;       // the run's last step
  double loss = 0;               // the last step's loss (mean over ranks)
  double tokens_per_second = 0;  // over all ranks, recent
  std::optional<double> mfu;     // fraction; absent on the CPU
  std::optional<double> remaining_seconds;
  int64_t memory_allocated_bytes = 0;  // the model device's allocator
  int64_t memory_peak_bytes = 0;
};

// "step 120/600 | loss 1.2345 | 15.2k tok/s | MFU 41.3% | ETA 3m05s |
// mem 1.2 GiB (peak 1.5 GiB)" (one line, no newline; MFU and ETA only when
// known).
std::string FormatProgressLine(const ProgressSnapshot& snapshot);

// Writes progress lines to `out` (not owned; must outlive the printer).
// In place (a terminal): each Update returns the cursor to the start of the
// line and clears it ("\r...\x1b[K"), so the line changes where it stands;
// Finish ends it with a newline. Otherwise each Update is a line of its own
// and Finish does nothing. Every call flushes.
class ProgressPrinter {
 public:
  ProgressPrinter(std::FILE* out, bool in_place)
      : out_(out), in_place_(in_place) {}
  ProgressPrinter(const ProgressPrinter&) = delete;
  ProgressPrinter& operator=(const ProgressPrinter&) = delete;

  bool in_place() const { return in_place_; }
  void Update(const ProgressSnapshot& snapshot);
  // Ends an in-place line (before other output, such as an evaluation's
  // lines, so they do not overwrite it); the next Update starts a new one.
  void Finish();

 private:
  std::FILE* out_;
  bool in_place_;
  bool line_open_ = false;
};

}  // namespace examples
}  // namespace ze

#endif  // ZE_EXAMPLES_PROGRESS_H_
