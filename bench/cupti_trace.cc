// libze_cupti_trace.so: a CUDA injection library that records every kernel,
// copy and fill the process runs on the GPU (CUPTI's activity API), for
// machines without nsys. Load it into any binary with
//   CUDA_INJECTION64_PATH=/path/libze_cupti_trace.so \
//   ZE_CUPTI_TRACE=/tmp/trace.csv  <command>
// At exit it writes one CSV row per record, in the columns of nsys's
// cuda_gpu_trace report that bench/gpu_gap_summary.py reads:
//   "Start (ns)","Duration (ns)","Name"
// (kernel names as the driver reports them, mangled; copies and fills as
// "[CUDA memcpy]" / "[CUDA memset]"). Timestamps are CUPTI's GPU clock in
// ns. Failure of any CUPTI call prints one line to stderr naming it and
// leaves the traced program running untraced.
//
// Threads: CUPTI calls BufferCompleted on its own thread and at the final
// flush; records are appended under a mutex. Memory: records are kept in
// host memory until exit (40 bytes each: a 1B-parameter training step of
// about 1,000 kernels costs 40 KB a step).
#include <cupti.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Row {
  uint64_t start = 0, end = 0;
  std::string name;
};

std::mutex& Mutex() {
  static auto* mutex = new std::mutex;
  return *mutex;
}
std::vector<Row>& Rows() {
  static auto* rows = new std::vector<Row>;
  return *rows;
}

constexpr size_t kBufferBytes = 8 << 20;

bool Check(CUptiResult result, const char* what) {
  if (result == CUPTI_SUCCESS) return true;
  const char* message = nullptr;
  cuptiGetResultString(result, &message);
  std::fprintf(stderr, "ze_cupti_trace: %s failed: %s\n", what,
               message != nullptr ? message : "unknown error");
  return false;
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size,
                              size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t,
                              size_t valid_size) {
  std::vector<Row> rows;
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid_size, &record) ==
         CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* kernel =
            reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        rows.push_back({kernel->start, kernel->end,
                        kernel->name != nullptr ? kernel->name : "?"});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* copy =
            reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        rows.push_back({copy->start, copy->end, "[CUDA memcpy]"});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* fill =
            reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        rows.push_back({fill->start, fill->end, "[CUDA memset]"});
        break;
      }
      default:
        break;
    }
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(Mutex());
  for (Row& row : rows) Rows().push_back(std::move(row));
}

// Names may hold commas and quotes (templates): CSV-quoted.
std::string Quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

void WriteTrace() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  const char* path = std::getenv("ZE_CUPTI_TRACE");
  if (path == nullptr || *path == '\0') path = "ze_cupti_trace.csv";
  std::FILE* file = std::fopen(path, "w");
  if (file == nullptr) {
    std::fprintf(stderr, "ze_cupti_trace: cannot write %s: %s\n", path,
                 std::strerror(errno));
    return;
  }
  std::lock_guard<std::mutex> lock(Mutex());
  std::fprintf(file, "\"Start (ns)\",\"Duration (ns)\",\"Name\"\n");
  for (const Row& row : Rows()) {
    std::fprintf(file, "%llu,%llu,%s\n",
                 static_cast<unsigned long long>(row.start),
                 static_cast<unsigned long long>(row.end - row.start),
                 Quoted(row.name).c_str());
  }
  const bool ok = std::fclose(file) == 0;
  std::fprintf(stderr, "ze_cupti_trace: %zu records %s %s\n", Rows().size(),
               ok ? "written to" : "NOT fully written to", path);
}

}  // namespace

// Called by the CUDA driver when it loads this library
// (CUDA_INJECTION64_PATH), before the program's first CUDA call returns.
extern "C" int InitializeInjection() {
  if (!Check(cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted),
             "cuptiActivityRegisterCallbacks")) {
    return 1;
  }
  for (CUpti_ActivityKind kind :
       {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
        CUPTI_ACTIVITY_KIND_MEMSET}) {
    if (!Check(cuptiActivityEnable(kind), "cuptiActivityEnable")) return 1;
  }
  std::atexit(WriteTrace);
  return 1;
}
