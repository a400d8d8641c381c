// The definitions of the offloaded update's diagnostics that
// engine/reports.h declares (Engine::nvme_counters, Engine::offload_times):
// include this to call those. Each is the producing unit's own struct
// (offload::NvmeStore::Counters, zero::PartitionState::OffloadTimes), so a
// result converts to it by copy; the engine's names exist only so that
// engine/engine.h can declare the methods without including offload/.
#ifndef ZE_ENGINE_OFFLOAD_REPORT_H_
#define ZE_ENGINE_OFFLOAD_REPORT_H_

#include "engine/reports.h"
#include "offload/nvme_store.h"
#include "zero/partition_state.h"

namespace ze {
namespace engine {

// Bytes and seconds of swap-file I/O (offload_optimizer nvme and
// offload_param nvme, summed; zeros otherwise); `busy` is the two files'
// shared in-flight clock (offload::IoActivity), not a sum.
struct NvmeCounters : offload::NvmeStore::Counters {};

// Where the offloaded update's worker spent its time, summed over every
// update (zeros without offload_optimizer).
struct OffloadTimes : zero::PartitionState::OffloadTimes {};

}  // namespace engine
}  // namespace ze

#endif  // ZE_ENGINE_OFFLOAD_REPORT_H_
