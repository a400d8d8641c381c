#include "core/host_facts.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/numbers.h"

namespace ze {

HostFacts ReadHostFacts(const std::function<const char*(const char*)>& getenv) {
  HostFacts facts;
  if (const char* omp = getenv("OMP_NUM_THREADS"); omp != nullptr) {
    int requested = 0;
    if (absl::SimpleAtoi(omp, &requested) && requested > 0) {
      facts.omp_num_threads = requested;
    }
  }
  if (const char* text = getenv("ZE_CHECKPOINT_STAGING_LIMIT")) {
    facts.checkpoint_staging_limit = std::strtoll(text, nullptr, 10);
  }
  return facts;
}

std::optional<int64_t> ReadMemAvailableBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  int64_t kilobytes = 0;
  while (meminfo >> key >> kilobytes >> unit) {
    if (key == "MemAvailable:") return kilobytes * 1024;
  }
  return std::nullopt;
}

HostFacts ReadProcessHostFacts(int local_ranks) {
  HostFacts facts =
      ReadHostFacts([](const char* name) { return std::getenv(name); });
  facts.memory_available_bytes = ReadMemAvailableBytes();
  facts.local_ranks = local_ranks;
  return facts;
}

}  // namespace ze
