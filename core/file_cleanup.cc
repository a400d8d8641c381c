#include "core/file_cleanup.h"

#include <limits.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace ze {
namespace {

// A fixed table, so that the signal handler reads it without allocating or
// locking. A slot's state says who may touch its path: kFree (nobody uses
// it), kBusy (one thread is writing or unlinking it), kReady (registered:
// the handler may claim it). Mutators also hold Mutex() among themselves;
// the handler takes slots by compare-and-swap only.
enum SlotState : int { kFree = 0, kBusy = 1, kReady = 2 };
struct Slot {
  std::atomic<int> state;
  pid_t owner;  // the process that registered it (fork keeps the table)
  char path[PATH_MAX];
};
Slot g_slots[kMaxRegisteredFiles];  // zero-initialised: every slot kFree
static_assert(std::atomic<int>::is_always_lock_free,
              "the signal handler needs lock-free atomics");

std::mutex& Mutex() {
  static std::mutex* mutex = new std::mutex;
  return *mutex;
}

// Unlinks `slot`'s path if this process registered it and nobody else is
// using the slot. Async-signal-safe.
void RemoveSlot(Slot& slot, pid_t self) {
  int expected = kReady;
  if (!slot.state.compare_exchange_strong(expected, kBusy)) return;
  if (slot.owner == self) {
    unlink(slot.path);
    slot.state.store(kFree);
  } else {
    slot.state.store(kReady);  // the parent's entry, inherited by fork
  }
}

void RemoveAtExit() { RemoveRegisteredFiles(); }

void RemoveAndReraise(int signal_number) {
  const int saved_errno = errno;
  RemoveRegisteredFiles();
  // The default action once the handler returns: the signal is blocked
  // while its handler runs, so raise() leaves it pending until then.
  struct sigaction default_action;
  std::memset(&default_action, 0, sizeof(default_action));
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  sigaction(signal_number, &default_action, nullptr);
  raise(signal_number);
  errno = saved_errno;
}

}  // namespace

absl::Status RegisterFileForRemoval(const std::string& path) {
  if (path.empty()) {
    return absl::InvalidArgumentError("RegisterFileForRemoval: empty path");
  }
  std::string absolute = path;
  if (path[0] != '/') {
    char directory[PATH_MAX];
    if (getcwd(directory, sizeof(directory)) == nullptr) {
      return absl::InternalError(
          absl::StrCat("RegisterFileForRemoval ", path,
                       ": getcwd failed: ", std::strerror(errno)));
    }
    absolute = absl::StrCat(directory, "/", path);
  }
  if (absolute.size() >= PATH_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RegisterFileForRemoval: path longer than PATH_MAX: ", absolute));
  }
  static const bool at_exit = (std::atexit(RemoveAtExit), true);
  (void)at_exit;
  std::lock_guard<std::mutex> lock(Mutex());
  for (Slot& slot : g_slots) {
    int expected = kFree;
    if (!slot.state.compare_exchange_strong(expected, kBusy)) continue;
    std::memcpy(slot.path, absolute.c_str(), absolute.size() + 1);
    slot.owner = getpid();
    slot.state.store(kReady);
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("RegisterFileForRemoval ", absolute, ": already ",
                   kMaxRegisteredFiles, " files registered"));
}

void UnregisterFileForRemoval(const std::string& path) {
  std::string absolute = path;
  if (!path.empty() && path[0] != '/') {
    char directory[PATH_MAX];
    if (getcwd(directory, sizeof(directory)) == nullptr) return;
    absolute = absl::StrCat(directory, "/", path);
  }
  std::lock_guard<std::mutex> lock(Mutex());
  const pid_t self = getpid();
  for (Slot& slot : g_slots) {
    if (slot.state.load() != kReady || slot.owner != self ||
        absolute != slot.path) {
      continue;
    }
    int expected = kReady;
    // Fails only if the signal handler claimed it meanwhile.
    if (slot.state.compare_exchange_strong(expected, kFree)) return;
  }
}

void RemoveRegisteredFiles() {
  const pid_t self = getpid();
  for (Slot& slot : g_slots) RemoveSlot(slot, self);
}

void InstallFileRemovalSignalHandlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
    for (int signal_number : kSignals) {
      struct sigaction current;
      if (sigaction(signal_number, nullptr, &current) != 0) continue;
      if ((current.sa_flags & SA_SIGINFO) != 0 ||
          current.sa_handler != SIG_DFL) {
        continue;  // the program's own choice
      }
      struct sigaction action;
      std::memset(&action, 0, sizeof(action));
      action.sa_handler = RemoveAndReraise;
      sigemptyset(&action.sa_mask);
      for (int other : kSignals) sigaddset(&action.sa_mask, other);
      sigaction(signal_number, &action, nullptr);
    }
  });
}

}  // namespace ze
