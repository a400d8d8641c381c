// Files that live only as long as the process that made them (the NVMe
// tier's swap files): removed however the process ends, if it can run code
// at all. One process-wide registry, because signal handlers are
// process-wide:
//
//   - the owner of such a file (offload::NvmeStore) registers its path and
//     unregisters it when it removes the file itself;
//   - a normal exit (returning from main, exit()) removes what is still
//     registered (atexit);
//   - SIGINT, SIGTERM and SIGHUP remove it too, once the program (the
//     engine's Initialize, for every job built on it) has called
//     InstallFileRemovalSignalHandlers: the handler unlinks the registered
//     paths and re-raises the signal with its default action, so the
//     process still ends by that signal (exit status 128 + signal number
//     under a shell, as without the handler).
//
// SIGKILL (and a power cut) leaves the files behind; their owner must
// recognise such leftovers itself (NvmeStore does by a lock held while the
// file is in use).
//
// A layer never installs handlers on its own: only the program, or the
// engine acting for it, decides the process's signal policy. A program with
// its own handler for these signals keeps it (Install leaves any
// disposition other than the default alone); that handler may call
// RemoveRegisteredFiles, which is async-signal-safe.
#ifndef ZE_CORE_FILE_CLEANUP_H_
#define ZE_CORE_FILE_CLEANUP_H_

#include <string>

#include "absl/status/status.h"

namespace ze {

// Adds `path` (made absolute against the current directory, so a later
// chdir does not matter) to the registry. Thread-safe. ResourceExhausted
// when the registry (kMaxRegisteredFiles paths) is full, InvalidArgument
// for an empty path or one longer than PATH_MAX. Registering a path twice
// keeps two entries (each unregistered separately).
inline constexpr int kMaxRegisteredFiles = 128;
absl::Status RegisterFileForRemoval(const std::string& path);

// Removes one entry of `path` (as given to RegisterFileForRemoval) from the
// registry; the file itself is left as it is. Thread-safe; unknown paths
// are ignored.
void UnregisterFileForRemoval(const std::string& path);

// Unlinks every registered path and empties the registry. Only paths this
// process registered: a forked child that exits does not remove its
// parent's files. Async-signal-safe.
void RemoveRegisteredFiles();

// Installs, once per process, the handler described above for SIGINT,
// SIGTERM and SIGHUP, each only where its disposition is still the default
// (SIG_DFL): a signal the program ignores (SIG_IGN, e.g. SIGHUP under
// nohup, SIGINT in a background job) or handles itself is left alone.
// Later calls do nothing.
void InstallFileRemovalSignalHandlers();

}  // namespace ze

#endif  // ZE_CORE_FILE_CLEANUP_H_
