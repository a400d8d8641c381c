// Facts about the host a run needs that come from the environment, read
// once by the engine at setup (ReadHostFacts) and passed down, so no code
// below the engine's setup reads the environment mid-stack (issue 26 item
// 2): the ZeRO plan and strategies take OMP_NUM_THREADS from here, the
// checkpoint load its staging limit.
#ifndef ZE_CORE_HOST_FACTS_H_
#define ZE_CORE_HOST_FACTS_H_

#include <cstdint>
#include <functional>
#include <optional>

namespace ze {

struct HostFacts {
  // OMP_NUM_THREADS as a positive integer: it sets the CPU optimizer's
  // threads, as it sets DeepSpeed's CPU Adam (the user's way to leave cores
  // to data loading); 0 when unset or not a positive integer.
  int omp_num_threads = 0;
  // ZE_CHECKPOINT_STAGING_LIMIT: the host memory (bytes) one rank's one-pass
  // checkpoint load may stage; unset, the load uses 3/4 of MemAvailable
  // shared among the host's ranks (measured when it loads). Parsed as
  // strtoll does (leading digits, 0 for none), so "0" forces the two-pass
  // load.
  std::optional<int64_t> checkpoint_staging_limit;
  // Not from the environment: the engine fills these at setup (the plan
  // sizes host-side buffers by them). MemAvailable from /proc/meminfo, in
  // bytes (ReadMemAvailableBytes; unset where unknown), and the processes
  // of this run on this host, which share it.
  std::optional<int64_t> memory_available_bytes;
  int local_ranks = 1;
};

// The facts from the variables `getenv` returns (a lookup returning null
// for an unset name; std::getenv in production, a map in tests). Pure
// otherwise; never fails (an invalid value reads as unset, above).
HostFacts ReadHostFacts(const std::function<const char*(const char*)>& getenv);

// MemAvailable of /proc/meminfo in bytes now; nullopt where it cannot be
// read (not Linux).
std::optional<int64_t> ReadMemAvailableBytes();

// This process's facts as the engine plans by them: the environment's
// (std::getenv), MemAvailable now, and `local_ranks`.
HostFacts ReadProcessHostFacts(int local_ranks);

}  // namespace ze

#endif  // ZE_CORE_HOST_FACTS_H_
