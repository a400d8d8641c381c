// A copy whose destination will not be read soon: its stores bypass the
// caches (non-temporal), so the copy costs one write of the destination
// instead of a read for ownership and a write, and evicts nothing the
// caller is about to use. For backups written once and read only on a rare
// rollback (offload/host_update.h's speculation); use std::memcpy for data
// read next.
#ifndef ZE_CORE_STREAMING_COPY_H_
#define ZE_CORE_STREAMING_COPY_H_

#include <cstddef>

namespace ze {

// Copies `bytes` from `source` to `destination` (any alignment; the ranges
// must not overlap) and fences the non-temporal stores, so the copy is
// visible to another thread once this thread publishes it by any later
// synchronisation (a mutex, a join). Thread-compatible.
void StreamingCopy(void* destination, const void* source, size_t bytes);

}  // namespace ze

#endif  // ZE_CORE_STREAMING_COPY_H_
