// Small files written so a crash leaves the old version or the new one,
// never a mixture: manifests, `latest`, config.json, an index.
#ifndef ZE_CORE_ATOMIC_FILE_H_
#define ZE_CORE_ATOMIC_FILE_H_

#include <string>

#include "absl/status/status.h"

namespace ze {

// Writes `contents` to `path` atomically: a temporary file beside it
// ("<path>.tmp.XXXXXX", mode 0644), fsync, rename over `path`, fsync of
// the directory. On failure the temporary file is removed and `path` is as
// it was. Errors (translated errno, core/status.h) name the path.
absl::Status WriteFileAtomically(const std::string& path,
                                 const std::string& contents);

// fsyncs `directory` itself, so a rename or a new entry in it is durable.
// Errors name the directory.
absl::Status SyncDirectory(const std::string& directory);

}  // namespace ze

#endif  // ZE_CORE_ATOMIC_FILE_H_
