#include "core/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "core/status.h"

namespace ze {

absl::Status SyncDirectory(const std::string& directory) {
  const int fd = open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "open directory", directory);
  const int result = fsync(fd);
  const int error = errno;
  close(fd);
  if (result != 0) return ErrnoToStatus(error, "fsync directory", directory);
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path,
                                 const std::string& contents) {
  std::string temp = path + ".tmp.XXXXXX";
  const int fd = mkstemp(temp.data());
  if (fd < 0) return ErrnoToStatus(errno, "create a temporary file for", path);
  fchmod(fd, 0644);
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t wrote =
        write(fd, contents.data() + done, contents.size() - done);
    if (wrote < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      close(fd);
      unlink(temp.c_str());
      return ErrnoToStatus(error, "write", temp);
    }
    done += static_cast<size_t>(wrote);
  }
  if (fsync(fd) != 0) {
    const int error = errno;
    close(fd);
    unlink(temp.c_str());
    return ErrnoToStatus(error, "fsync", temp);
  }
  close(fd);
  if (rename(temp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    unlink(temp.c_str());
    return ErrnoToStatus(error, "rename into place", path);
  }
  const std::filesystem::path parent =
      std::filesystem::path(path).parent_path();
  return SyncDirectory(parent.empty() ? "." : parent.string());
}

}  // namespace ze
