#include "core/host_facts.h"

#include <cstdlib>

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

}  // namespace ze
