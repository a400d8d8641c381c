#include "offload/host_update.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "core/ops.h"
#include "core/status.h"
#include "core/streaming_copy.h"
#include "core/thread_pool.h"

namespace ze {
namespace offload {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

// The sum of squares of `count` values load(i): eight independent f32 lanes
// (vectorisable without reassociating) per block of 4096, blocks summed in
// double. For speculation's stop only, where its rounding never reaches a
// result; the per-element LoadAsFloat switch would cost as much as the
// optimizer's tile itself.
template <typename Load>
double SumOfSquaresOf(int64_t count, const Load& load) {
  constexpr int kLanes = 8;
  constexpr int64_t kBlock = 4096;
  double total = 0;
  for (int64_t block = 0; block < count; block += kBlock) {
    const int64_t end = std::min(count, block + kBlock);
    float lanes[kLanes] = {};
    int64_t i = block;
    for (; i + kLanes <= end; i += kLanes) {
      for (int lane = 0; lane < kLanes; ++lane) {
        const float value = load(i + lane);
        lanes[lane] += value * value;
      }
    }
    for (; i < end; ++i) {
      const float value = load(i);
      lanes[0] += value * value;
    }
    for (float lane : lanes) total += lane;
  }
  return total;
}

double GradientSumOfSquares(const void* data, DType dtype, int64_t count) {
  switch (dtype) {
    case DType::kBF16: {
      const uint16_t* bits = static_cast<const uint16_t*>(data);
      return SumOfSquaresOf(
          count, [bits](int64_t i) { return Bf16BitsToFloat(bits[i]); });
    }
    case DType::kF16: {
      const uint16_t* bits = static_cast<const uint16_t*>(data);
      return SumOfSquaresOf(
          count, [bits](int64_t i) { return F16BitsToFloat(bits[i]); });
    }
    default: {
      const float* values = static_cast<const float*>(data);
      return SumOfSquaresOf(count, [values](int64_t i) { return values[i]; });
    }
  }
}

}  // namespace

namespace {

// `bytes` up and `bytes` down at once, on two streams, page-locked host
// memory, timed, as often as asked (MeasureUpdateRates). Round runs on the
// thread that calls it, which it makes `device` current on.
class LinkTimer {
 public:
  static absl::StatusOr<LinkTimer> Create(const Device& device, int64_t bytes) {
    if (!device.is_cuda()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "MeasureUpdateRates: ", device.ToString(), " is not CUDA"));
    }
    ZE_RETURN_IF_ERROR(SetCurrentDevice(device));
    ZE_ASSIGN_OR_RETURN(Stream up, Stream::Create(device));
    ZE_ASSIGN_OR_RETURN(Stream down, Stream::Create(device));
    const int64_t elements = std::max<int64_t>(1, bytes / 4);
    ZE_ASSIGN_OR_RETURN(Tensor host_up,
                        Tensor::Zeros({elements}, DType::kF32, Device::Cpu(),
                                      PinnedHostMemory()));
    ZE_ASSIGN_OR_RETURN(Tensor host_down,
                        Tensor::Zeros({elements}, DType::kF32, Device::Cpu(),
                                      PinnedHostMemory()));
    ZE_ASSIGN_OR_RETURN(Tensor device_up,
                        Tensor::Zeros({elements}, DType::kF32, device, up));
    ZE_ASSIGN_OR_RETURN(Tensor device_down,
                        Tensor::Zeros({elements}, DType::kF32, device, down));
    ZE_RETURN_IF_ERROR(up.Synchronize());
    return LinkTimer(device, std::move(up), std::move(down), std::move(host_up),
                     std::move(host_down), std::move(device_up),
                     std::move(device_down));
  }

  // Bytes per second each way of one round.
  absl::StatusOr<double> Round() {
    ZE_RETURN_IF_ERROR(SetCurrentDevice(device_));
    const auto start = std::chrono::steady_clock::now();
    ZE_RETURN_IF_ERROR(Copy(host_up_, device_up_, up_));
    ZE_RETURN_IF_ERROR(Copy(device_down_, host_down_, down_));
    ZE_RETURN_IF_ERROR(up_.Synchronize());
    ZE_RETURN_IF_ERROR(down_.Synchronize());
    return static_cast<double>(host_up_.numel() * 4) / SecondsSince(start);
  }

 private:
  LinkTimer(const Device& device, Stream up, Stream down, Tensor host_up,
            Tensor host_down, Tensor device_up, Tensor device_down)
      : device_(device),
        up_(std::move(up)),
        down_(std::move(down)),
        host_up_(std::move(host_up)),
        host_down_(std::move(host_down)),
        device_up_(std::move(device_up)),
        device_down_(std::move(device_down)) {}

  Device device_;
  Stream up_;
  Stream down_;
  Tensor host_up_;
  Tensor host_down_;
  Tensor device_up_;
  Tensor device_down_;
};

// The best (largest) of `rounds` values of `round`, after one that pays the
// first use.
absl::StatusOr<double> BestRound(
    int rounds, const std::function<absl::StatusOr<double>()>& round) {
  ZE_RETURN_IF_ERROR(round().status());
  double best = 0;
  for (int i = 0; i < rounds; ++i) {
    ZE_ASSIGN_OR_RETURN(const double value, round());
    best = std::max(best, value);
  }
  return best;
}

// `measure` while `load` runs round after round on another thread (begun
// before, stopped after); the load's first error wins over measure's
// result.
absl::StatusOr<double> MeasureUnderLoad(
    const std::function<absl::StatusOr<double>()>& measure,
    const std::function<absl::StatusOr<double>()>& load) {
  std::atomic<bool> stop{false};
  std::atomic<int> rounds{0};
  absl::Status load_status;
  std::thread loader([&] {
    while (!stop.load()) {
      absl::StatusOr<double> round = load();
      if (!round.ok()) {
        load_status = round.status();
        break;
      }
      rounds.fetch_add(1);
    }
    rounds.store(1 << 30);  // never leave the measure waiting
  });
  // Once the load has run a round it is in its steady state.
  while (rounds.load() == 0) std::this_thread::yield();
  absl::StatusOr<double> measured = measure();
  stop.store(true);
  loader.join();
  ZE_RETURN_IF_ERROR(load_status);
  return measured;
}

}  // namespace

absl::StatusOr<UpdateRates> MeasureUpdateRates(const Device& device,
                                               CpuOptimizer* optimizer,
                                               int64_t cpu_elements,
                                               int64_t link_bytes) {
  ZE_ASSIGN_OR_RETURN(LinkTimer link, LinkTimer::Create(device, link_bytes));
  ZE_ASSIGN_OR_RETURN(UpdateTimer cpu,
                      UpdateTimer::Create(optimizer, cpu_elements));
  // Elements per second, so that BestRound's largest is the fastest.
  const auto cpu_round = [&cpu]() -> absl::StatusOr<double> {
    ZE_ASSIGN_OR_RETURN(const double seconds, cpu.Round());
    return 1.0 / seconds;
  };
  const auto link_round = [&link] { return link.Round(); };
  UpdateRates rates;
  ZE_ASSIGN_OR_RETURN(const double cpu_alone, BestRound(2, cpu_round));
  ZE_ASSIGN_OR_RETURN(rates.link_bytes_per_second, BestRound(3, link_round));
  ZE_ASSIGN_OR_RETURN(
      const double cpu_shared,
      MeasureUnderLoad([&] { return BestRound(2, cpu_round); }, link_round));
  ZE_ASSIGN_OR_RETURN(
      rates.link_bytes_per_second_shared,
      MeasureUnderLoad([&] { return BestRound(3, link_round); }, cpu_round));
  rates.cpu_seconds_per_element = 1.0 / cpu_alone;
  rates.cpu_seconds_per_element_shared = 1.0 / cpu_shared;
  return rates;
}

size_t ChooseBucketToUpdate(const std::deque<int>& ready, bool handed_over_all,
                            bool begun_early,
                            const std::function<bool(int)>& landed,
                            const std::function<int(int)>& forward_position) {
  if (handed_over_all) {
    size_t first_read = 0;
    for (size_t i = 1; i < ready.size(); ++i) {
      if (forward_position(ready[i]) < forward_position(ready[first_read])) {
        first_read = i;
      }
    }
    return first_read;
  }
  if (begun_early) {
    for (size_t i = ready.size(); i-- > 0;) {
      if (landed(ready[i])) return i;
    }
  }
  return 0;
}

HostUpdate::HostUpdate(const HostUpdateOptions& options,
                       std::vector<HostUpdateSlot> slots,
                       CpuOptimizer* optimizer, SwappedState* swapped)
    : options_(options),
      slots_(std::move(slots)),
      optimizer_(optimizer),
      swapped_(swapped) {}

HostUpdate::~HostUpdate() = default;

absl::StatusOr<std::unique_ptr<HostUpdate>> HostUpdate::Create(
    const HostUpdateOptions& options, std::vector<HostUpdateSlot> slots,
    CpuOptimizer* optimizer, SwappedState* swapped) {
  if (optimizer == nullptr) {
    return absl::InvalidArgumentError("HostUpdate: no CPU optimizer");
  }
  if (options.chunk_elements < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("HostUpdate: chunk_elements must be >= 1, not ",
                     options.chunk_elements));
  }
  if (options.weights_swapped && !options.weights_on_host) {
    return absl::InvalidArgumentError(
        "HostUpdate: swapped weights are host weights (weights_on_host)");
  }
  if (options.delayed_update && options.weights_on_host) {
    return absl::InvalidArgumentError(
        "HostUpdate: a delayed update needs the weights on the device");
  }
  for (size_t s = 0; s < slots.size(); ++s) {
    const HostUpdateSlot& slot = slots[s];
    auto bad = [s](const char* what) {
      return absl::InvalidArgumentError(
          absl::StrCat("HostUpdate: slot ", s, ": ", what));
    };
    const int64_t n = slot.gradients.numel();
    if (!slot.gradients.defined() || !slot.staging.defined()) {
      return bad("gradients and staging are required");
    }
    if (slot.staging.numel() != n ||
        slot.staging.dtype() != slot.gradients.dtype() ||
        !slot.staging.device().is_cpu()) {
      return bad(
          "staging must be a host tensor of the gradients' size and "
          "dtype");
    }
    if (slot.first_swapped_chunk >= 0) {
      if (swapped == nullptr) return bad("swapped, but no SwappedState");
      if (slot.master.defined()) return bad("swapped, yet has a master");
    } else if (!slot.master.defined() || slot.master.numel() != n ||
               slot.master.dtype() != DType::kF32 ||
               !slot.master.device().is_cpu()) {
      return bad("master must be a host f32 tensor of the gradients' size");
    } else if (slot.state_offset < 0 ||
               slot.state_offset + n > optimizer->num_elements()) {
      return bad("state_offset leaves the CPU optimizer's state");
    }
    const bool weights_needed =
        !options.weights_on_host || slot.weights.defined();
    if (weights_needed &&
        (!slot.weights.defined() || slot.weights.numel() != n ||
         slot.weights.dtype() != slot.gradients.dtype())) {
      return bad("weights must be of the gradients' size and dtype");
    }
    if (options.weights_on_host && !slot.weights.device().is_cpu() &&
        slot.weights.defined()) {
      return bad("weights_on_host, but the weights are on a device");
    }
    if (options.delayed_update != slot.delayed.defined() ||
        (slot.delayed.defined() && slot.delayed.numel() != n)) {
      return bad("delayed is required with delayed_update, and only then");
    }
    if (slot.update_on_device &&
        (slot.first_swapped_chunk >= 0 || options.weights_on_host ||
         optimizer->moment_format() != MomentFormat::kF32 ||
         options.delayed_update || options.bf16_ties_away ||
         !options.device_step || slot.weights.device() != options.device)) {
      return bad(
          "update_on_device needs a host master, f32 moments, the weights on "
          "the device, no delayed update, no ties-away rounding and a "
          "device_step");
    }
  }
  if (options.speculation_elements < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("HostUpdate: speculation_elements must be >= 0, not ",
                     options.speculation_elements));
  }
  std::unique_ptr<HostUpdate> update(
      new HostUpdate(options, std::move(slots), optimizer, swapped));
  if (update->CanSpeculate()) {
    // One region per array: the f32 master, then the optimizer's raw
    // arrays (8-bit steps: a float per block; backups start on blocks).
    const int64_t elements = options.speculation_elements;
    int64_t bytes = 0;
    update->backup_regions_.push_back(bytes);
    bytes += elements * int64_t{sizeof(float)};
    for (const CpuOptimizer::RawArray& array : optimizer->RawStateArrays()) {
      update->backup_regions_.push_back(bytes);
      bytes += array.per_block
                   ? (elements + kMomentBlock - 1) / kMomentBlock * array.bytes
                   : elements * array.bytes;
    }
    ZE_ASSIGN_OR_RETURN(
        update->backup_,
        Tensor::Empty({(bytes + 3) / 4}, DType::kF32, Device::Cpu()));
  }
  if (options.device.is_cuda()) {
    ZE_ASSIGN_OR_RETURN(update->to_host_stream_,
                        Stream::Create(options.device));
    if (!options.weights_on_host) {
      ZE_ASSIGN_OR_RETURN(update->to_device_stream_,
                          Stream::Create(options.device));
    }
  }
  ZE_RETURN_IF_ERROR(update->PrepareDeviceSlots());
  update->gradients_on_host_.resize(update->slots_.size());
  update->weights_uploaded_.resize(update->slots_.size());
  for (int s = 0; s < update->num_slots(); ++s) {
    for (int64_t chunk = 0; chunk < update->num_chunks(s); ++chunk) {
      ZE_ASSIGN_OR_RETURN(Event down, Event::Create(options.device));
      ZE_ASSIGN_OR_RETURN(Event up, Event::Create(options.device));
      update->gradients_on_host_[s].push_back(std::move(down));
      update->weights_uploaded_[s].push_back(std::move(up));
    }
  }
  return update;
}

absl::Status HostUpdate::PrepareDeviceSlots() {
  gradients_final_.resize(slots_.size());
  for (const HostUpdateSlot& slot : slots_) {
    num_device_slots_ += slot.update_on_device ? 1 : 0;
    (slot.update_on_device ? times_.device_elements : times_.cpu_elements) +=
        slot.gradients.numel();
  }
  if (num_device_slots_ == 0) return absl::OkStatus();
  if (options_.device.is_cuda()) {
    ZE_ASSIGN_OR_RETURN(state_up_stream_, Stream::Create(options_.device));
    ZE_ASSIGN_OR_RETURN(state_down_stream_, Stream::Create(options_.device));
  }
  const Stream up = state_up_stream_ ? *state_up_stream_ : Stream();
  const int64_t arrays = BackupBytesPerElement(optimizer_->options()) / 4;
  for (int buffer = 0; buffer < 2; ++buffer) {
    ZE_ASSIGN_OR_RETURN(Tensor device_buffer,
                        Tensor::Zeros({arrays * options_.chunk_elements},
                                      DType::kF32, options_.device, up));
    device_buffers_.push_back(std::move(device_buffer));
    ZE_ASSIGN_OR_RETURN(Event updated, Event::Create(options_.device));
    ZE_ASSIGN_OR_RETURN(Event down, Event::Create(options_.device));
    buffer_updated_.push_back(std::move(updated));
    buffer_down_.push_back(std::move(down));
  }
  for (int s = 0; s < num_slots(); ++s) {
    if (!slots_[s].update_on_device) continue;
    ZE_ASSIGN_OR_RETURN(gradients_final_[s], Event::Create(options_.device));
  }
  if (!options_.device.is_cuda()) return absl::OkStatus();
  // Page-lock what travels: per host array, one span from the first
  // device-updated element to the last (the CPU-updated slots between them
  // are locked too, which costs them nothing). Small arrays share pages:
  // HostRegistration merges what overlaps.
  std::vector<HostRegistration::Span> spans;
  for (size_t a = 0; a < static_cast<size_t>(arrays); ++a) {
    char* first = nullptr;
    char* end = nullptr;
    for (int s = 0; s < num_slots(); ++s) {
      if (!slots_[s].update_on_device) continue;
      char* begin = StateSpans(s, 0, elements(s), 0)[a].data;
      char* stop = begin + elements(s) * sizeof(float);
      first = first == nullptr ? begin : std::min(first, begin);
      end = std::max(end, stop);
    }
    spans.push_back({first, static_cast<size_t>(end - first)});
  }
  ZE_ASSIGN_OR_RETURN(registration_, HostRegistration::Create(spans));
  return absl::OkStatus();
}

bool HostUpdate::CanBeginEarly() const {
  return swapped_ == nullptr && !options_.delayed_update &&
         !options_.weights_swapped;
}

int64_t HostUpdate::BackupBytesPerElement(const OptimizerOptions& optimizer) {
  int64_t bytes = 4;  // the master weights
  if (optimizer.type != OptimizerType::kSgd) {
    // exp_avg, exp_avg_sq; 8-bit steps rounded up to a byte an element.
    bytes += optimizer.moments == MomentFormat::kBlockwise8 ? 3
             : optimizer.moments == MomentFormat::kBf16     ? 4
                                                            : 8;
  } else if (optimizer.momentum > 0) {
    bytes += 4;  // momentum_buffer
  }
  return bytes;
}

SpeculationReport HostUpdate::last_speculation() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return speculation_report_;
}

std::vector<HostUpdate::StateSpan> HostUpdate::StateSpans(int slot,
                                                          int64_t begin,
                                                          int64_t count,
                                                          int64_t at) const {
  const int64_t state_at = slots_[slot].state_offset + begin;
  std::vector<StateSpan> spans = {
      {reinterpret_cast<char*>(slots_[slot].master.data_as<float>() + begin),
       count * int64_t{sizeof(float)},
       backup_regions_.empty() ? 0 : backup_regions_[0] + at * 4}};
  const std::vector<CpuOptimizer::RawArray> arrays =
      optimizer_->RawStateArrays();
  for (size_t a = 0; a < arrays.size(); ++a) {
    const CpuOptimizer::RawArray& array = arrays[a];
    // No backup (no speculation): offsets unused.
    const int64_t region = backup_regions_.empty() ? 0 : backup_regions_[a + 1];
    if (array.per_block) {
      // 8-bit ranges (and `at`) start on a block.
      spans.push_back({array.data + state_at / kMomentBlock * array.bytes,
                       (count + kMomentBlock - 1) / kMomentBlock * array.bytes,
                       region + at / kMomentBlock * array.bytes});
    } else {
      spans.push_back({array.data + state_at * array.bytes, count * array.bytes,
                       region + at * array.bytes});
    }
  }
  return spans;
}

int64_t HostUpdate::num_chunks(int slot) const {
  return std::max<int64_t>(1, (elements(slot) + options_.chunk_elements - 1) /
                                  options_.chunk_elements);
}

HostUpdate::ChunkSpan HostUpdate::chunk_span(int slot, int64_t chunk) const {
  ChunkSpan span;
  span.begin = chunk * options_.chunk_elements;
  span.count = std::min(options_.chunk_elements, elements(slot) - span.begin);
  return span;
}

HostUpdateTimes HostUpdate::times() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return times_;
}

std::vector<int> HostUpdate::last_order() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return taken_;
}

absl::StatusOr<InFlightUpdate> HostUpdate::Start(
    const StepArgs& step_args, bool begun_early,
    std::optional<Speculation> speculation) {
  if (speculation.has_value() && (!begun_early || !CanSpeculate())) {
    return absl::FailedPreconditionError(
        "HostUpdate::Start: speculation needs an early start and a backup "
        "(speculation_elements > 0)");
  }
  if (active_) {
    return absl::FailedPreconditionError(
        "HostUpdate::Start: the previous update has not been joined");
  }
  if (begun_early && !CanBeginEarly()) {
    return absl::FailedPreconditionError(
        "HostUpdate::Start: an early start needs host slots (not NVMe), no "
        "delayed update and the weights on the device");
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    written_from_.assign(slots_.size(), std::numeric_limits<int64_t>::max());
    // A rolled-back update may leave slots no worker took: the redo hands
    // them over again.
    ready_.clear();
    device_ready_.clear();
    taken_.clear();
    begun_early_ = begun_early;
    closed_ = false;
    failed_ = false;
    status_ = absl::OkStatus();
    decision_ = speculation ? Decision::kPending : Decision::kNone;
    speculation_ = speculation.value_or(Speculation());
    running_sum_of_squares_ = 0;
    speculation_stopped_ = false;
    backups_.clear();
    backup_used_ = 0;
    speculation_report_ = SpeculationReport();
  }
  // Before the CPU worker can advance the step count.
  StepCoefficients coefficients;
  if (num_device_slots_ > 0) {
    ZE_ASSIGN_OR_RETURN(coefficients, optimizer_->Coefficients(step_args));
  }
  InFlightUpdate in_flight;
  in_flight.owner_ = this;
  in_flight.open_ = begun_early;
  in_flight.handed_over_.assign(slots_.size(), false);
  active_ = true;
  in_flight.worker_ = std::thread([this, step_args] {
    const absl::Status status = Run(step_args);
    if (!status.ok()) Fail(status);
  });
  if (num_device_slots_ > 0) {
    in_flight.device_worker_ = std::thread([this, coefficients] {
      const absl::Status status = RunOnDevice(coefficients);
      if (!status.ok()) Fail(status);
    });
  }
  return in_flight;
}

void HostUpdate::Fail(const absl::Status& status) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failed_) status_ = status;
  failed_ = true;
  progress_.notify_all();
}

absl::Status HostUpdate::SendGradientsDown(int slot, const Stream& stream) {
  if (slots_[slot].update_on_device) {
    // Nothing goes down: the kernel reads the gradients where they are,
    // after this event.
    ZE_RETURN_IF_ERROR(gradients_final_[slot].Record(stream));
    std::lock_guard<std::mutex> lock(mutex_);
    device_ready_.push_back(slot);
    progress_.notify_all();
    return absl::OkStatus();
  }
  const Stream& down = to_host_stream_ ? *to_host_stream_ : stream;
  ZE_ASSIGN_OR_RETURN(Event gradients_final, Event::Create(options_.device));
  ZE_RETURN_IF_ERROR(gradients_final.Record(stream));
  ZE_RETURN_IF_ERROR(gradients_final.StreamWait(down));
  const Tensor& gradients = slots_[slot].gradients;
  const Tensor& staging = slots_[slot].staging;
  // From the slot's end: the order the worker takes the chunks in.
  for (int64_t chunk = num_chunks(slot) - 1; chunk >= 0; --chunk) {
    const auto [begin, count] = chunk_span(slot, chunk);
    ZE_RETURN_IF_ERROR(
        Copy(gradients.Slice(begin, count), staging.Slice(begin, count), down));
    ZE_RETURN_IF_ERROR(gradients_on_host_[slot][chunk].Record(down));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  ready_.push_back(slot);
  progress_.notify_all();
  return absl::OkStatus();
}

int HostUpdate::NextSlot() {
  // Slots as they are handed over (all at once in the forward's reading
  // order, or, begun early, as backward finishes them), each from its end,
  // chunk by chunk. Handed over all at once: in that order. Begun early,
  // while more may come: the newest whose first chunk has landed (else the
  // oldest, whose copy lands first), so that what is left when backward
  // ends is, besides the first layers (final last), the layers the next
  // forward reads last. Once every slot is handed over: the one the next
  // forward reads first. The next forward then follows the update and,
  // when the update ends, has few layers left to run.
  std::unique_lock<std::mutex> lock(mutex_);
  progress_.wait(lock, [&] { return !ready_.empty() || closed_; });
  if (ready_.empty() || decision_ == Decision::kRolledBack) return -1;
  return TakeChosen(&ready_, [this](int s) {
    return gradients_on_host_[s][num_chunks(s) - 1].Query();
  });
}

int HostUpdate::TakeChosen(std::deque<int>* queue,
                           const std::function<bool(int)>& landed) {
  const size_t chosen = ChooseBucketToUpdate(
      *queue, closed_, begun_early_, landed,
      [this](int s) { return slots_[s].forward_position; });
  const int slot = (*queue)[chosen];
  queue->erase(queue->begin() + static_cast<std::ptrdiff_t>(chosen));
  taken_.push_back(slot);
  return slot;
}

absl::Status HostUpdate::Run(const StepArgs& step_args) {
  const auto worker_start = std::chrono::steady_clock::now();
  struct Record {
    HostUpdate& update;
    std::chrono::steady_clock::time_point start;
    ~Record() {
      std::lock_guard<std::mutex> lock(update.mutex_);
      ++update.times_.updates;
      update.times_.worker_seconds += SecondsSince(start);
    }
  } record{*this, worker_start};
  if (options_.device.is_cuda()) {
    ZE_RETURN_IF_ERROR(SetCurrentDevice(options_.device));
  }
  if (swapped_ != nullptr) {
    // NVMe is never begun early: every slot is handed over at once.
    std::vector<std::pair<int, int64_t>> order;  // (slot, chunk)
    for (int s = NextSlot(); s >= 0; s = NextSlot()) {
      for (int64_t chunk = num_chunks(s) - 1; chunk >= 0; --chunk) {
        order.emplace_back(s, chunk);
      }
    }
    // NVMe: each chunk's master and moments are read in ahead of the step
    // and written back behind it.
    std::vector<int> swapped_order;
    for (const auto& [s, chunk] : order) {
      swapped_order.push_back(slots_[s].first_swapped_chunk +
                              static_cast<int>(chunk));
    }
    const int arrays = swapped_->arrays();
    size_t next = 0;
    ZE_RETURN_IF_ERROR(swapped_->Update(
        swapped_order, [&](int, float* const* state) -> absl::Status {
          const auto [s, chunk] = order[next++];
          return UpdateSwappedChunk(s, chunk, step_args, state[0],
                                    arrays > 1 ? state[1] : nullptr,
                                    arrays > 2 ? state[2] : nullptr);
        }));
  } else {
    // Host memory: the chunks as one stream of tiles over the CPU
    // optimizer's threads, which go on to the next chunk while the last
    // tiles of the one before still run (a chunk at a time would idle all
    // but one thread at each chunk's end). Chunk k is range k.
    std::mutex order_mutex;
    std::vector<std::pair<int, int64_t>> order;  // (slot, chunk)
    int slot = -1;
    int64_t next_chunk = -1;
    const auto stream_start = std::chrono::steady_clock::now();
    const double waited_before = [this] {
      std::lock_guard<std::mutex> lock(mutex_);
      return times_.gradient_wait_seconds;
    }();
    const absl::Status status = optimizer_->StepRanges(
        step_args,
        [&](RangeToUpdate* range) -> absl::StatusOr<bool> {
          // Any of the CPU optimizer's threads may ask; the events it
          // queries and waits for are the device's.
          if (options_.device.is_cuda()) {
            ZE_RETURN_IF_ERROR(SetCurrentDevice(options_.device));
          }
          if (next_chunk < 0) {
            slot = NextSlot();
            if (slot < 0) return false;
            next_chunk = num_chunks(slot) - 1;
          }
          const int64_t chunk = next_chunk--;
          ZE_RETURN_IF_ERROR(WaitForHostGradients(slot, chunk));
          *range = ChunkRange(slot, chunk);
          ZE_ASSIGN_OR_RETURN(const bool update_now,
                              Speculate(slot, chunk, range));
          if (!update_now) return false;  // rolled back
          std::lock_guard<std::mutex> lock(order_mutex);
          order.emplace_back(slot, chunk);
          return true;
        },
        [&](int64_t index) -> absl::Status {
          std::pair<int, int64_t> chunk;
          {
            std::lock_guard<std::mutex> lock(order_mutex);
            chunk = order[index];
          }
          return ChunkUpdated(chunk.first, chunk.second);
        });
    {
      // The stream's span less its waits for gradients.
      std::lock_guard<std::mutex> lock(mutex_);
      times_.optimizer_seconds +=
          SecondsSince(stream_start) -
          (times_.gradient_wait_seconds - waited_before);
    }
    ZE_RETURN_IF_ERROR(status);
  }
  {
    // A rolled-back update is undone: its step never happened.
    std::lock_guard<std::mutex> lock(mutex_);
    if (decision_ == Decision::kRolledBack) return absl::OkStatus();
  }
  optimizer_->AdvanceStep();
  return absl::OkStatus();
}

int HostUpdate::NextDeviceSlot() {
  std::unique_lock<std::mutex> lock(mutex_);
  progress_.wait(lock, [&] {
    return !device_ready_.empty() || closed_ || failed_ ||
           decision_ == Decision::kRolledBack;
  });
  if (device_ready_.empty() || failed_ || decision_ == Decision::kRolledBack) {
    return -1;
  }
  // As the CPU worker chooses (ChooseBucketToUpdate); nothing travels down,
  // so every slot handed over has "landed".
  return TakeChosen(&device_ready_, [](int) { return true; });
}

absl::Status HostUpdate::RunOnDevice(const StepCoefficients& coefficients) {
  const auto start = std::chrono::steady_clock::now();
  if (options_.device.is_cuda()) {
    ZE_RETURN_IF_ERROR(SetCurrentDevice(options_.device));
  }
  absl::Status status;
  int buffer = 0;
  for (int slot = NextDeviceSlot(); slot >= 0 && status.ok();
       slot = NextDeviceSlot()) {
    for (int64_t chunk = num_chunks(slot) - 1; chunk >= 0; --chunk) {
      absl::StatusOr<bool> queued =
          UpdateChunkOnDevice(slot, chunk, buffer, coefficients);
      if (!queued.ok()) status = queued.status();
      if (!queued.ok() || !*queued) break;
      buffer = 1 - buffer;
    }
  }
  // Every chunk's state back in host memory (and nothing left reading the
  // device buffers) before the update can be joined.
  for (const Event& down : buffer_down_) {
    const absl::Status synced = down.Synchronize();
    if (status.ok()) status = synced;
  }
  if (state_up_stream_) {
    const absl::Status synced = state_up_stream_->Synchronize();
    if (status.ok()) status = synced;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  times_.device_seconds += SecondsSince(start);
  return status;
}

absl::StatusOr<bool> HostUpdate::UpdateChunkOnDevice(
    int slot, int64_t chunk, int buffer, const StepCoefficients& coefficients) {
  const HostUpdateSlot& spec = slots_[slot];
  const auto [begin, count] = chunk_span(slot, chunk);
  const Stream up = state_up_stream_ ? *state_up_stream_ : Stream();
  const Stream down = state_down_stream_ ? *state_down_stream_ : Stream();
  // The buffer's previous chunk must be down before this one goes up.
  ZE_RETURN_IF_ERROR(buffer_down_[buffer].Synchronize());
  // f32 master and moments (Create refuses compressed ones here).
  const std::vector<StateSpan> host = StateSpans(slot, begin, count, 0);
  std::vector<Tensor> host_arrays;
  std::vector<Tensor> device_arrays;
  for (size_t a = 0; a < host.size(); ++a) {
    host_arrays.push_back(
        Tensor::Wrap(host[a].data, {count}, DType::kF32, Device::Cpu()));
    device_arrays.push_back(device_buffers_[buffer].Slice(
        static_cast<int64_t>(a) * options_.chunk_elements, count));
    ZE_RETURN_IF_ERROR(Copy(host_arrays[a], device_arrays[a], up));
  }
  {
    // The kernel's arguments are the step's only once the speculation is
    // decided (the copies up go on meanwhile).
    const auto wait_start = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(mutex_);
    progress_.wait(lock,
                   [&] { return decision_ != Decision::kPending || failed_; });
    times_.device_decision_wait_seconds += SecondsSince(wait_start);
    if (decision_ == Decision::kRolledBack || failed_) return false;
  }
  ZE_RETURN_IF_ERROR(gradients_final_[slot].StreamWait(up));
  StepBuffers buffers;
  buffers.master = device_arrays[0].data_as<float>();
  buffers.state0 =
      device_arrays.size() > 1 ? device_arrays[1].data_as<float>() : nullptr;
  buffers.state1 =
      device_arrays.size() > 2 ? device_arrays[2].data_as<float>() : nullptr;
  buffers.moment_format = MomentFormat::kF32;
  buffers.first_index = spec.state_offset + begin;
  const Tensor gradients = spec.gradients.Slice(begin, count);
  const Tensor weights = spec.weights.Slice(begin, count);
  buffers.grads = gradients.data();
  buffers.grad_dtype = gradients.dtype();
  buffers.out = weights.data();
  buffers.out_dtype = weights.dtype();
  buffers.count = count;
  ZE_RETURN_IF_ERROR(options_.device_step(coefficients, buffers, up));
  ZE_RETURN_IF_ERROR(weights_uploaded_[slot][chunk].Record(up));
  ZE_RETURN_IF_ERROR(buffer_updated_[buffer].Record(up));
  ZE_RETURN_IF_ERROR(buffer_updated_[buffer].StreamWait(down));
  for (size_t a = 0; a < host.size(); ++a) {
    ZE_RETURN_IF_ERROR(Copy(device_arrays[a], host_arrays[a], down));
  }
  ZE_RETURN_IF_ERROR(buffer_down_[buffer].Record(down));
  std::lock_guard<std::mutex> lock(mutex_);
  written_from_[slot] = begin;
  progress_.notify_all();
  return true;
}

absl::StatusOr<bool> HostUpdate::Speculate(int slot, int64_t chunk,
                                           RangeToUpdate* range) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (decision_ == Decision::kNone || decision_ == Decision::kCommitted) {
    return true;
  }
  if (decision_ == Decision::kRolledBack) return false;
  if (!speculation_stopped_) {
    const auto [begin, count] = chunk_span(slot, chunk);
    // The running sum holds the tiles backed up so far (those of the
    // chunks before may still be running): a stop may come a chunk late,
    // which costs a restore, never a wrong result.
    if (!(running_sum_of_squares_ <= speculation_.sum_of_squares_limit)) {
      speculation_stopped_ = true;
      speculation_report_.stopped_by_norm = true;
    } else if (backup_used_ + Reserved(count) > options_.speculation_elements) {
      speculation_stopped_ = true;
      speculation_report_.stopped_by_budget = true;
    } else {
      const int64_t at = backup_used_;
      backups_.push_back({slot, begin, count, at});
      backup_used_ += Reserved(count);
      ++speculation_report_.chunks;
      speculation_report_.elements += count;
      // Each tile, on its own thread, before the kernel changes it.
      range->before_update = [this, slot, begin = begin, at](
                                 int64_t tile_begin, int64_t tile_count) {
        BackUp(slot, begin + tile_begin, at + tile_begin, tile_count);
      };
      return true;
    }
  }
  // Nothing more is updated before the boundary decides.
  progress_.wait(lock, [&] { return decision_ != Decision::kPending; });
  return decision_ == Decision::kCommitted;
}

int64_t HostUpdate::Reserved(int64_t count) const {
  const int64_t granule = MomentGranule(optimizer_->moment_format());
  return (count + granule - 1) / granule * granule;
}

void HostUpdate::BackUp(int slot, int64_t begin, int64_t at, int64_t count) {
  // The backup is read only if the step rolls back: streamed past the
  // caches, which keep the tile the update reads next, and without the
  // read for ownership a cached store costs (cpu_adam_bench's backup_*
  // figures: the backed-up step 3-10% faster than with memcpy on the 2-core
  // development VM; not yet measured on the GPU machine's host).
  char* backup = static_cast<char*>(backup_.data());
  for (const StateSpan& span : StateSpans(slot, begin, count, at)) {
    StreamingCopy(backup + span.backup_offset, span.data, span.bytes);
  }
  const Tensor grads = slots_[slot].staging.Slice(begin, count);
  const double sum = GradientSumOfSquares(grads.data(), grads.dtype(), count);
  std::lock_guard<std::mutex> lock(mutex_);
  running_sum_of_squares_ += sum;
}

std::vector<HostUpdate::Backup> HostUpdate::BackupPieces() const {
  // 1M elements: many pieces per thread even for a few large chunks.
  constexpr int64_t kPiece = int64_t{1} << 20;
  std::vector<Backup> pieces;
  for (const Backup& backup : backups_) {
    for (int64_t done = 0; done < backup.count; done += kPiece) {
      pieces.push_back({backup.slot, backup.begin + done,
                        std::min(kPiece, backup.count - done),
                        backup.at + done});
    }
  }
  return pieces;
}

void HostUpdate::RestoreBackups() {
  const std::vector<Backup> pieces = BackupPieces();
  if (pieces.empty()) return;
  // Up to the whole host state: one thread would copy it at a fraction of
  // the memory bandwidth the optimizer's threads reach.
  ThreadPool pool(optimizer_->num_threads());
  pool.ParallelFor(static_cast<int64_t>(pieces.size()), [&](int64_t i) {
    const Backup& piece = pieces[i];
    const char* backup = static_cast<const char*>(backup_.data());
    for (const StateSpan& span :
         StateSpans(piece.slot, piece.begin, piece.count, piece.at)) {
      std::memcpy(span.data, backup + span.backup_offset, span.bytes);
    }
  });
}

absl::Status HostUpdate::WaitForHostGradients(int slot, int64_t chunk) {
  const auto wait_start = std::chrono::steady_clock::now();
  ZE_RETURN_IF_ERROR(gradients_on_host_[slot][chunk].Synchronize());
  std::lock_guard<std::mutex> lock(mutex_);
  times_.gradient_wait_seconds += SecondsSince(wait_start);
  return absl::OkStatus();
}

RangeToUpdate HostUpdate::ChunkRange(int slot, int64_t chunk) const {
  const HostUpdateSlot& spec = slots_[slot];
  const auto [begin, count] = chunk_span(slot, chunk);
  Tensor grads = spec.staging.Slice(begin, count);
  RangeToUpdate range;
  range.state_offset = spec.state_offset + begin;
  range.count = count;
  // Swapped slots: the caller's swap buffer instead.
  if (spec.master.defined()) {
    range.master_weights = spec.master.data_as<float>() + begin;
  }
  range.grads = grads.data();
  range.grad_dtype = grads.dtype();
  // The 16-bit result goes straight into host weights, or over the
  // gradients in the staging buffer (each element's gradient is read before
  // its weight is written), from where it is uploaded.
  if (!options_.weights_on_host) {
    range.out = grads.data();
  } else if (spec.weights.defined()) {
    range.out = spec.weights.Slice(begin, count).data();
  }
  range.out_dtype = spec.staging.dtype();
  range.bf16_ties_away = options_.bf16_ties_away;
  return range;
}

absl::Status HostUpdate::ChunkUpdated(int slot, int64_t chunk) {
  const HostUpdateSlot& spec = slots_[slot];
  const auto [begin, count] = chunk_span(slot, chunk);
  if (!options_.weights_on_host) {
    // Any thread of the CPU optimizer's may run this.
    if (options_.device.is_cuda()) {
      ZE_RETURN_IF_ERROR(SetCurrentDevice(options_.device));
    }
    const Stream up = to_device_stream_ ? *to_device_stream_ : Stream();
    const Tensor& destination =
        options_.delayed_update ? spec.delayed : spec.weights;
    ZE_RETURN_IF_ERROR(Copy(spec.staging.Slice(begin, count),
                            destination.Slice(begin, count), up));
    ZE_RETURN_IF_ERROR(weights_uploaded_[slot][chunk].Record(up));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  written_from_[slot] = begin;
  progress_.notify_all();
  return absl::OkStatus();
}

absl::Status HostUpdate::UpdateSwappedChunk(int slot, int64_t chunk,
                                            const StepArgs& step_args,
                                            float* master, float* state0,
                                            float* state1) {
  ZE_RETURN_IF_ERROR(WaitForHostGradients(slot, chunk));
  const RangeToUpdate range = ChunkRange(slot, chunk);
  const auto step_start = std::chrono::steady_clock::now();
  ZE_RETURN_IF_ERROR(optimizer_->StepExternal(
      range.count, master, state0, state1, range.grads, range.grad_dtype,
      step_args, range.out, range.out_dtype));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    times_.optimizer_seconds += SecondsSince(step_start);
  }
  return ChunkUpdated(slot, chunk);
}

InFlightUpdate::InFlightUpdate(InFlightUpdate&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)),
      worker_(std::move(other.worker_)),
      device_worker_(std::move(other.device_worker_)),
      open_(std::exchange(other.open_, false)),
      handed_over_(std::move(other.handed_over_)) {}

InFlightUpdate& InFlightUpdate::operator=(InFlightUpdate&& other) noexcept {
  if (this != &other) {
    Abandon();
    owner_ = std::exchange(other.owner_, nullptr);
    worker_ = std::move(other.worker_);
    device_worker_ = std::move(other.device_worker_);
    open_ = std::exchange(other.open_, false);
    handed_over_ = std::move(other.handed_over_);
  }
  return *this;
}

InFlightUpdate::~InFlightUpdate() { Abandon(); }

void InFlightUpdate::Abandon() {
  if (owner_ == nullptr) return;
  {
    // An update begun early whose step never came (a failed backward) is
    // still waiting for slots: release it.
    std::lock_guard<std::mutex> lock(owner_->mutex_);
    owner_->closed_ = true;
    if (owner_->decision_ == HostUpdate::Decision::kPending) {
      owner_->decision_ = HostUpdate::Decision::kRolledBack;
    }
    owner_->progress_.notify_all();
  }
  if (worker_.joinable()) worker_.join();
  if (device_worker_.joinable()) device_worker_.join();
  if (owner_->decision_ == HostUpdate::Decision::kRolledBack) {
    owner_->RestoreBackups();
  }
  owner_->active_ = false;
  owner_ = nullptr;
  open_ = false;
}

absl::Status InFlightUpdate::CloseAndJoin(bool roll_back) {
  HostUpdate& update = *owner_;
  const auto wait_start = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(update.mutex_);
    if (roll_back) {
      update.decision_ = HostUpdate::Decision::kRolledBack;
      update.speculation_report_.rolled_back = true;
    }
    update.closed_ = true;
    update.progress_.notify_all();
  }
  worker_.join();
  if (device_worker_.joinable()) device_worker_.join();
  update.active_ = false;
  owner_ = nullptr;
  open_ = false;
  std::lock_guard<std::mutex> lock(update.mutex_);
  update.times_.engine_wait_seconds += SecondsSince(wait_start);
  return update.status_;
}

absl::Status InFlightUpdate::HandOver(int slot, const Stream& stream) {
  if (owner_ == nullptr || handed_over_[slot]) return absl::OkStatus();
  handed_over_[slot] = true;
  return owner_->SendGradientsDown(slot, stream);
}

absl::Status InFlightUpdate::Close(const Stream& stream) {
  if (owner_ == nullptr) return absl::OkStatus();
  // Slots not handed over yet travel now, in the order the forward reads
  // them (the worker's order).
  std::vector<int> forward_order(owner_->slots_.size());
  std::iota(forward_order.begin(), forward_order.end(), 0);
  std::stable_sort(forward_order.begin(), forward_order.end(),
                   [this](int a, int b) {
                     return owner_->slots_[a].forward_position <
                            owner_->slots_[b].forward_position;
                   });
  for (int s : forward_order) ZE_RETURN_IF_ERROR(HandOver(s, stream));
  {
    std::lock_guard<std::mutex> lock(owner_->mutex_);
    owner_->closed_ = true;
    owner_->progress_.notify_all();
  }
  open_ = false;
  // Gradients are zeroed or overwritten on `stream` after the step: not
  // before they are copied.
  const Stream& down =
      owner_->to_host_stream_ ? *owner_->to_host_stream_ : stream;
  ZE_ASSIGN_OR_RETURN(Event copied, Event::Create(owner_->options_.device));
  ZE_RETURN_IF_ERROR(copied.Record(down));
  return copied.StreamWait(stream);
}

bool InFlightUpdate::SlotWritten(int slot) const {
  if (owner_ == nullptr) return true;
  std::lock_guard<std::mutex> lock(owner_->mutex_);
  return owner_->written_from_[slot] == 0;
}

absl::Status InFlightUpdate::WaitForWeights(int slot, int64_t own_begin,
                                            const Stream& stream) {
  if (owner_ == nullptr || owner_->options_.delayed_update || open_) {
    return absl::OkStatus();
  }
  HostUpdate& update = *owner_;
  const int64_t chunk =
      std::max<int64_t>(0, std::min(own_begin, update.elements(slot) - 1) /
                               update.options_.chunk_elements);
  const int64_t chunk_begin = update.chunk_span(slot, chunk).begin;
  {
    const auto wait_start = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(update.mutex_);
    update.progress_.wait(lock, [&] {
      return update.written_from_[slot] <= chunk_begin || update.failed_;
    });
    update.times_.engine_wait_seconds += SecondsSince(wait_start);
    if (update.written_from_[slot] > chunk_begin) {
      // The update failed before this chunk. Not an error here: a forward
      // on one rank failing alone would leave the others waiting in a
      // collective. Join reports it (the next boundary step, on every
      // rank), before anything else is updated.
      return absl::OkStatus();
    }
  }
  if (!update.options_.weights_on_host) {
    // The upload stream runs in order: this chunk's event covers the
    // chunks written before it too.
    return update.weights_uploaded_[slot][chunk].StreamWait(stream);
  }
  return absl::OkStatus();
}

absl::StatusOr<UpdateJoined> InFlightUpdate::Join(const Stream& stream) {
  if (owner_ == nullptr) return UpdateJoined();
  if (open_) {
    return absl::FailedPreconditionError(
        "an offloaded optimizer update begun during backward is still taking "
        "gradients: the step (engine Step) must hand over the rest before "
        "the model state is read");
  }
  HostUpdate& update = *owner_;
  // Closed already, unless Close failed halfway: the worker then updates
  // what it was handed rather than wait for the rest forever.
  const absl::Status status = CloseAndJoin(/*roll_back=*/false);
  if (update.to_device_stream_) {
    ZE_ASSIGN_OR_RETURN(Event uploaded, Event::Create(update.options_.device));
    ZE_RETURN_IF_ERROR(uploaded.Record(*update.to_device_stream_));
    ZE_RETURN_IF_ERROR(uploaded.StreamWait(stream));
  }
  ZE_RETURN_IF_ERROR(status);
  if (update.options_.delayed_update) {
    // The delayed update takes effect now.
    for (const HostUpdateSlot& slot : update.slots_) {
      ZE_RETURN_IF_ERROR(Copy(slot.delayed, slot.weights, stream));
    }
  }
  return UpdateJoined();
}

absl::Status InFlightUpdate::WaitForGradientsRead(const Stream& stream) {
  if (owner_ == nullptr || owner_->num_device_slots_ == 0) {
    return absl::OkStatus();
  }
  HostUpdate& update = *owner_;
  for (int s = 0; s < update.num_slots(); ++s) {
    if (!update.slots_[s].update_on_device || !handed_over_[s]) continue;
    {
      const auto wait_start = std::chrono::steady_clock::now();
      std::unique_lock<std::mutex> lock(update.mutex_);
      update.progress_.wait(
          lock, [&] { return update.written_from_[s] == 0 || update.failed_; });
      update.times_.engine_wait_seconds += SecondsSince(wait_start);
      if (update.written_from_[s] != 0) return absl::OkStatus();
    }
    // Chunk 0 is the slot's last kernel (the state-up stream runs in order).
    ZE_RETURN_IF_ERROR(update.weights_uploaded_[s][0].StreamWait(stream));
  }
  return absl::OkStatus();
}

bool InFlightUpdate::speculating() const {
  if (owner_ == nullptr) return false;
  std::lock_guard<std::mutex> lock(owner_->mutex_);
  return owner_->decision_ == HostUpdate::Decision::kPending;
}

absl::Status InFlightUpdate::Commit() {
  if (!speculating()) {
    return absl::FailedPreconditionError(
        "InFlightUpdate::Commit: no speculative update awaits a decision");
  }
  std::lock_guard<std::mutex> lock(owner_->mutex_);
  owner_->decision_ = HostUpdate::Decision::kCommitted;
  owner_->speculation_report_.committed = true;
  owner_->progress_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<UpdateJoined> InFlightUpdate::Rollback(const Stream& stream,
                                                      bool resend_weights) {
  if (!speculating()) {
    return absl::FailedPreconditionError(
        "InFlightUpdate::Rollback: no speculative update awaits a decision");
  }
  HostUpdate& update = *owner_;
  const absl::Status status = CloseAndJoin(/*roll_back=*/true);
  update.RestoreBackups();
  if (!resend_weights) {
    ZE_RETURN_IF_ERROR(status);
    return UpdateJoined();
  }
  // The speculated chunks' weights went up (or, in host memory, were
  // overwritten) already: send (write) the restored ones. Staging is
  // rewritten only after the uploads that read it.
  if (update.to_device_stream_) {
    ZE_RETURN_IF_ERROR(update.to_device_stream_->Synchronize());
  }
  const Stream up =
      update.to_device_stream_ ? *update.to_device_stream_ : Stream();
  // Rounded as the optimizer's fused write (to nearest even, or ties away
  // for a 16+16 master): the weights the synchronous path leaves. On the
  // optimizer's thread count, as the restore.
  const std::vector<HostUpdate::Backup> pieces = update.BackupPieces();
  ThreadPool pool(update.optimizer_->num_threads());
  ZE_RETURN_IF_ERROR(pool.TryParallelFor(
      static_cast<int64_t>(pieces.size()), [&](int, int64_t i) -> absl::Status {
        const HostUpdate::Backup& piece = pieces[i];
        const HostUpdateSlot& slot = update.slots_[piece.slot];
        // Host weights are written where they live (none where the f32
        // master is the weights: the restore rewrote them); device
        // weights go through staging.
        const bool on_host = update.options_.weights_on_host;
        if (on_host && !slot.weights.defined()) return absl::OkStatus();
        const Tensor& out = on_host ? slot.weights : slot.staging;
        if (update.options_.bf16_ties_away && out.dtype() == DType::kBF16) {
          const float* master = slot.master.data_as<float>() + piece.begin;
          uint16_t* weights = out.data_as<uint16_t>() + piece.begin;
          for (int64_t k = 0; k < piece.count; ++k) {
            weights[k] = SplitForBf16(master[k]).hi;
          }
          return absl::OkStatus();
        }
        return CopyConverting(slot.master.Slice(piece.begin, piece.count),
                              out.Slice(piece.begin, piece.count), Stream());
      }));
  if (update.options_.weights_on_host) {
    ZE_RETURN_IF_ERROR(status);
    return UpdateJoined();
  }
  for (const HostUpdate::Backup& backup : update.backups_) {
    const HostUpdateSlot& slot = update.slots_[backup.slot];
    const Tensor& destination =
        update.options_.delayed_update ? slot.delayed : slot.weights;
    ZE_RETURN_IF_ERROR(Copy(slot.staging.Slice(backup.begin, backup.count),
                            destination.Slice(backup.begin, backup.count), up));
  }
  if (update.to_device_stream_) {
    ZE_ASSIGN_OR_RETURN(Event uploaded, Event::Create(update.options_.device));
    ZE_RETURN_IF_ERROR(uploaded.Record(*update.to_device_stream_));
    ZE_RETURN_IF_ERROR(uploaded.StreamWait(stream));
  }
  ZE_RETURN_IF_ERROR(status);
  return UpdateJoined();
}

}  // namespace offload
}  // namespace ze
