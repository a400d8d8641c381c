// Streams and events: the ordering primitives every asynchronous API takes.
//
// On CUDA a Stream wraps a cudaStream_t; work queued on it runs in order, and
// an Event marks a point in a stream that another stream or the host can wait
// for. On the CPU, work runs when it is issued, so a CPU stream is already
// complete and its events are always ready.
//
// Both are small value types sharing ownership of the underlying handle; the
// last copy destroys it.
//
// Each thread has a current stream per device (StreamGuard sets it, c10
// style): the stream device memory allocated by this thread is ordered on.
// The caching CUDA allocator (core/allocator.h) gives a block to the current
// stream and may hand it back to that stream as soon as it is freed, so code
// that allocates device memory should do it under a guard for the stream its
// work runs on.
#ifndef ZE_CORE_STREAM_H_
#define ZE_CORE_STREAM_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/device.h"

namespace ze {

class Stream {
 public:
  // The CPU stream (immediate).
  Stream() = default;

  // The legacy default stream of `device` (CPU: the immediate stream).
  static Stream Default(const Device& device);
  // A new non-blocking stream on `device`, optionally high priority (used
  // for communication so it is not starved by compute).
  static absl::StatusOr<Stream> Create(const Device& device,
                                       bool high_priority = false);

  const Device& device() const { return device_; }
  // The cudaStream_t as void* (null: CPU stream or CUDA default stream).
  void* native() const { return handle_ ? handle_->stream : nullptr; }

  // Blocks the host until all work queued so far has finished.
  absl::Status Synchronize() const;

 private:
  struct Handle {
    void* stream = nullptr;
    int device_index = 0;
    ~Handle();
  };
  Device device_ = Device::Cpu();
  std::shared_ptr<Handle> handle_;
};

// The stream this thread's allocations on `device` are ordered on: that of
// the innermost live StreamGuard for `device`, else Stream::Default(device)
// (the legacy default stream; the CPU stream for the CPU).
Stream CurrentStream(const Device& device);

// Makes `stream` the current stream of its device for this thread until the
// guard is destroyed, which restores the previous one. Guards nest and must
// be destroyed in reverse order of construction on the thread that made them
// (they are scoped objects: not copyable or movable). The guard keeps a copy
// of `stream`, so the stream outlives it.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  friend Stream CurrentStream(const Device& device);
  Stream stream_;
  const StreamGuard* enclosing_;  // the guard this one shadows, or null
};

// Caches keyed by CUDA stream (nn/cuda keeps a cuBLASLt workspace and a
// scratch buffer per stream) register here to release what they hold for a
// stream when it goes away. When the last copy of a Stream created by
// Stream::Create is destroyed, every registered callback runs with the
// stream's device index and cudaStream_t (as void*), then the stream is
// destroyed. The stream may still have work queued: device memory allocated
// on the stream (under a StreamGuard of it) may be freed at once, since the
// caching allocator orders its reuse after that work; a callback that
// releases anything else that work may use must synchronise the stream
// first, and only a callback that holds something for the stream should (so
// destroying a stream nobody cached anything for never blocks, e.g. one
// whose last collective will not complete). Callbacks run on the destroying
// thread, must not throw or create or destroy streams, and stay registered for
// the process's lifetime. Thread-safe.
using StreamReleaseCallback = void (*)(int device_index, void* native_stream);
void AddStreamReleaseCallback(StreamReleaseCallback callback);

class Event {
 public:
  // A CPU event (always complete).
  Event() = default;
  // A new event on `device` (timing enabled when `timing`).
  static absl::StatusOr<Event> Create(const Device& device,
                                      bool timing = false);

  // Marks the current end of `stream`'s queue.
  absl::Status Record(const Stream& stream);
  // Makes future work on `stream` wait until this event completes (does not
  // block the host).
  absl::Status StreamWait(const Stream& stream) const;
  // Blocks the host until the event completes.
  absl::Status Synchronize() const;
  // True when the work before the recorded point has finished.
  bool Query() const;
  // Milliseconds between two recorded timing events (after completion).
  static absl::StatusOr<float> ElapsedMs(const Event& start, const Event& end);

 private:
  struct Handle {
    void* event = nullptr;
    int device_index = 0;
    ~Handle();
  };
  Device device_ = Device::Cpu();
  std::shared_ptr<Handle> handle_;
};

}  // namespace ze

#endif  // ZE_CORE_STREAM_H_
