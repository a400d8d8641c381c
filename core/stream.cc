#include "core/stream.h"

#include <cuda_runtime_api.h>

#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ze {

namespace {

struct ReleaseCallbacks {
  std::mutex mutex;
  std::vector<StreamReleaseCallback> callbacks;
};

// Leaked: streams may be destroyed during static destruction.
ReleaseCallbacks& Callbacks() {
  static auto* callbacks = new ReleaseCallbacks;
  return *callbacks;
}

// The innermost live guard of this thread (a stack threaded through the
// guards themselves, so setting a stream allocates nothing).
thread_local const StreamGuard* innermost_guard = nullptr;

}  // namespace

StreamGuard::StreamGuard(const Stream& stream)
    : stream_(stream), enclosing_(innermost_guard) {
  innermost_guard = this;
}

StreamGuard::~StreamGuard() { innermost_guard = enclosing_; }

Stream CurrentStream(const Device& device) {
  for (const StreamGuard* guard = innermost_guard; guard != nullptr;
       guard = guard->enclosing_) {
    if (guard->stream_.device() == device) return guard->stream_;
  }
  return Stream::Default(device);
}

void AddStreamReleaseCallback(StreamReleaseCallback callback) {
  ReleaseCallbacks& registry = Callbacks();
  std::lock_guard<std::mutex> lock(registry.mutex);
  registry.callbacks.push_back(callback);
}

Stream::Handle::~Handle() {
  if (stream == nullptr) return;
  cudaSetDevice(device_index);
  std::vector<StreamReleaseCallback> callbacks;
  {
    ReleaseCallbacks& registry = Callbacks();
    std::lock_guard<std::mutex> lock(registry.mutex);
    callbacks = registry.callbacks;
  }
  for (StreamReleaseCallback callback : callbacks) {
    callback(device_index, stream);
  }
  cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

Stream Stream::Default(const Device& device) {
  Stream stream;
  stream.device_ = device;
  return stream;
}

absl::StatusOr<Stream> Stream::Create(const Device& device,
                                      bool high_priority) {
  Stream stream;
  stream.device_ = device;
  if (device.is_cpu()) return stream;
  absl::Status status = SetCurrentDevice(device);
  if (!status.ok()) return status;
  int least = 0, greatest = 0;
  cudaDeviceGetStreamPriorityRange(&least, &greatest);
  cudaStream_t raw = nullptr;
  status =
      CudaStatus(cudaStreamCreateWithPriority(&raw, cudaStreamNonBlocking,
                                              high_priority ? greatest : least),
                 absl::StrCat("cudaStreamCreate on ", device.ToString()));
  if (!status.ok()) return status;
  stream.handle_ = std::make_shared<Handle>();
  stream.handle_->stream = raw;
  stream.handle_->device_index = device.index;
  return stream;
}

absl::Status Stream::Synchronize() const {
  if (device_.is_cpu()) return absl::OkStatus();
  if (native() == nullptr) {
    absl::Status status = SetCurrentDevice(device_);
    if (!status.ok()) return status;
    return CudaStatus(cudaStreamSynchronize(nullptr),
                      "cudaStreamSynchronize(default stream)");
  }
  return CudaStatus(
      cudaStreamSynchronize(static_cast<cudaStream_t>(native())),
      absl::StrCat("cudaStreamSynchronize on ", device_.ToString()));
}

Event::Handle::~Handle() {
  if (event != nullptr) {
    cudaSetDevice(device_index);
    cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }
}

absl::StatusOr<Event> Event::Create(const Device& device, bool timing) {
  Event event;
  event.device_ = device;
  if (device.is_cpu()) return event;
  absl::Status status = SetCurrentDevice(device);
  if (!status.ok()) return status;
  cudaEvent_t raw = nullptr;
  status =
      CudaStatus(cudaEventCreateWithFlags(
                     &raw, timing ? cudaEventDefault : cudaEventDisableTiming),
                 absl::StrCat("cudaEventCreate on ", device.ToString()));
  if (!status.ok()) return status;
  event.handle_ = std::make_shared<Handle>();
  event.handle_->event = raw;
  event.handle_->device_index = device.index;
  return event;
}

absl::Status Event::Record(const Stream& stream) {
  if (device_.is_cpu() || handle_ == nullptr) return absl::OkStatus();
  return CudaStatus(cudaEventRecord(static_cast<cudaEvent_t>(handle_->event),
                                    static_cast<cudaStream_t>(stream.native())),
                    "cudaEventRecord");
}

absl::Status Event::StreamWait(const Stream& stream) const {
  if (device_.is_cpu() || handle_ == nullptr || stream.device().is_cpu()) {
    return absl::OkStatus();
  }
  return CudaStatus(
      cudaStreamWaitEvent(static_cast<cudaStream_t>(stream.native()),
                          static_cast<cudaEvent_t>(handle_->event), 0),
      "cudaStreamWaitEvent");
}

absl::Status Event::Synchronize() const {
  if (device_.is_cpu() || handle_ == nullptr) return absl::OkStatus();
  return CudaStatus(
      cudaEventSynchronize(static_cast<cudaEvent_t>(handle_->event)),
      "cudaEventSynchronize");
}

bool Event::Query() const {
  if (device_.is_cpu() || handle_ == nullptr) return true;
  const cudaError_t error =
      cudaEventQuery(static_cast<cudaEvent_t>(handle_->event));
  if (error == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  return true;
}

absl::StatusOr<float> Event::ElapsedMs(const Event& start, const Event& end) {
  if (start.handle_ == nullptr || end.handle_ == nullptr) return 0.0f;
  float ms = 0;
  absl::Status status = CudaStatus(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.handle_->event),
                           static_cast<cudaEvent_t>(end.handle_->event)),
      "cudaEventElapsedTime");
  if (!status.ok()) return status;
  return ms;
}

}  // namespace ze
