// copy_bench: pinned host <-> device bandwidth through the project's own
// allocators (PinnedHostMemory, CudaMemory), streams and timing events.
// Prints one JSON object per line:
//
//   {"bench":"copy","direction":"h2d","bytes":1073741824,"iters":20,
//    "time_us":19650.1,"GBps":54.6}
//
// GB/s is 1e9 bytes per second, measured between two events around `iters`
// back-to-back copies on one stream. Reference on an H200 (PyTorch, pinned):
// 54.7 GB/s host-to-device, 55.3 GB/s device-to-host.
//
// Flags: --min_bytes=1048576 --max_bytes=1073741824 --iters=20 --device=0
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/allocator.h"
#include "core/ops.h"
#include "core/status.h"
#include "core/stream.h"
#include "core/tensor.h"

namespace {

absl::Status Run(int64_t min_bytes, int64_t max_bytes, int iters,
                 int device_index) {
  const ze::Device device = ze::Device::Cuda(device_index);
  ZE_RETURN_IF_ERROR(ze::SetCurrentDevice(device));
  ZE_ASSIGN_OR_RETURN(ze::Stream stream, ze::Stream::Create(device));
  ZE_ASSIGN_OR_RETURN(ze::Event start, ze::Event::Create(device, true));
  ZE_ASSIGN_OR_RETURN(ze::Event end, ze::Event::Create(device, true));
  const int64_t max_count = max_bytes / 4;
  ZE_ASSIGN_OR_RETURN(
      ze::Tensor host,
      ze::Tensor::Empty({max_count}, ze::DType::kF32, ze::Device::Cpu(),
                        ze::PinnedHostMemory()));
  ZE_ASSIGN_OR_RETURN(ze::Tensor gpu,
                      ze::Tensor::Empty({max_count}, ze::DType::kF32, device,
                                        ze::CudaMemory(device_index)));
  ZE_RETURN_IF_ERROR(ze::Fill(host, 1.0f, ze::Stream()));
  for (const char *direction : {"h2d", "d2h"}) {
    const bool h2d = std::string(direction) == "h2d";
    for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
      const int64_t count = bytes / 4;
      const ze::Tensor src = h2d ? host.Slice(0, count) : gpu.Slice(0, count);
      const ze::Tensor dst = h2d ? gpu.Slice(0, count) : host.Slice(0, count);
      for (int i = 0; i < 2; ++i)
        ZE_RETURN_IF_ERROR(ze::Copy(src, dst, stream));
      ZE_RETURN_IF_ERROR(start.Record(stream));
      for (int i = 0; i < iters; ++i) {
        ZE_RETURN_IF_ERROR(ze::Copy(src, dst, stream));
      }
      ZE_RETURN_IF_ERROR(end.Record(stream));
      ZE_RETURN_IF_ERROR(end.Synchronize());
      ZE_ASSIGN_OR_RETURN(float ms, ze::Event::ElapsedMs(start, end));
      const double seconds = ms / 1e3;
      std::printf(
          "{\"bench\":\"copy\",\"direction\":\"%s\",\"bytes\":%lld,"
          "\"iters\":%d,\"time_us\":%.1f,\"GBps\":%.2f}\n",
          direction, static_cast<long long>(count * 4), iters,
          seconds * 1e6 / iters,
          static_cast<double>(count * 4) * iters / seconds / 1e9);
      std::fflush(stdout);
    }
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char **argv) {
  int64_t min_bytes = int64_t{1} << 20;
  int64_t max_bytes = int64_t{1} << 30;
  int iters = 20;
  int device_index = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&](const char *name) -> const char * {
      const std::string prefix = std::string("--") + name + "=";
      return arg.rfind(prefix, 0) == 0 ? argv[i] + prefix.size() : nullptr;
    };
    if (const char *v = value("min_bytes")) {
      min_bytes = std::atoll(v);
    } else if (const char *v = value("max_bytes")) {
      max_bytes = std::atoll(v);
    } else if (const char *v = value("iters")) {
      iters = std::max(1, std::atoi(v));
    } else if (const char *v = value("device")) {
      device_index = std::atoi(v);
    } else {
      std::fprintf(stderr, "copy_bench: unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  const absl::Status status = Run(min_bytes, max_bytes, iters, device_index);
  if (!status.ok()) {
    std::fprintf(stderr, "copy_bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
