#include "core/file_cleanup.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace ze {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

bool Exists(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0;
}

void Touch(const std::string& path) {
  FILE* file = std::fopen(path.c_str(), "w");
  ASSERT_NE(file, nullptr) << path;
  std::fclose(file);
}

// Runs `body` in a forked child and returns its wait status.
template <typename Body>
int InChild(Body body) {
  const pid_t child = fork();
  if (child == 0) {
    body();
    std::_Exit(0);
  }
  int status = 0;
  EXPECT_EQ(waitpid(child, &status, 0), child);
  return status;
}

class SignalTest : public ::testing::TestWithParam<int> {};

// The handler removes the registered file and the process still ends by the
// signal itself, as it would without the handler.
TEST_P(SignalTest, RemovesRegisteredFilesAndEndsByTheSignal) {
  const int signal_number = GetParam();
  const std::string path =
      TempPath("registered_" + std::to_string(signal_number));
  const std::string other =
      TempPath("unregistered_" + std::to_string(signal_number));
  Touch(path);
  Touch(other);
  const int status = InChild([&] {
    InstallFileRemovalSignalHandlers();
    if (!RegisterFileForRemoval(path).ok()) std::_Exit(3);
    if (!RegisterFileForRemoval(other).ok()) std::_Exit(3);
    UnregisterFileForRemoval(other);
    raise(signal_number);
    std::_Exit(4);  // not reached: the signal ends the process
  });
  ASSERT_TRUE(WIFSIGNALED(status)) << status;
  EXPECT_EQ(WTERMSIG(status), signal_number);
  EXPECT_FALSE(Exists(path));
  EXPECT_TRUE(Exists(other));
  unlink(other.c_str());
}

INSTANTIATE_TEST_SUITE_P(Signals, SignalTest,
                         ::testing::Values(SIGINT, SIGTERM, SIGHUP));

// An ignored signal stays ignored (nohup, a background job's SIGINT), and a
// program's own handler stays installed.
TEST(FileCleanupTest, KeepsTheProgramsOwnDispositions) {
  const std::string path = TempPath("kept");
  Touch(path);
  const int status = InChild([&] {
    signal(SIGHUP, SIG_IGN);
    static volatile sig_atomic_t handled = 0;
    signal(SIGTERM, [](int) { handled = 1; });
    InstallFileRemovalSignalHandlers();
    if (!RegisterFileForRemoval(path).ok()) std::_Exit(3);
    raise(SIGHUP);
    raise(SIGTERM);
    if (handled != 1) std::_Exit(5);
    UnregisterFileForRemoval(path);
    std::_Exit(0);
  });
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_TRUE(Exists(path));
  unlink(path.c_str());
}

TEST(FileCleanupTest, NormalExitRemovesRegisteredFiles) {
  const std::string path = TempPath("at_exit");
  Touch(path);
  const int status = InChild([&] {
    if (!RegisterFileForRemoval(path).ok()) std::_Exit(3);
    std::exit(0);
  });
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_FALSE(Exists(path));
}

// A forked child inherits the table but not the files: its exit leaves the
// parent's file alone.
TEST(FileCleanupTest, ForkedChildDoesNotRemoveItsParentsFiles) {
  const std::string path = TempPath("parents");
  Touch(path);
  ASSERT_TRUE(RegisterFileForRemoval(path).ok());
  const int status = InChild([] { std::exit(0); });
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_TRUE(Exists(path));
  RemoveRegisteredFiles();
  EXPECT_FALSE(Exists(path));
}

TEST(FileCleanupTest, RelativePathsAreMadeAbsolute) {
  const std::string directory = TempPath("relative");
  ASSERT_EQ(mkdir(directory.c_str(), 0755), 0);
  Touch(directory + "/file");
  const int status = InChild([&] {
    if (chdir(directory.c_str()) != 0) std::_Exit(3);
    if (!RegisterFileForRemoval("file").ok()) std::_Exit(3);
    if (chdir("/") != 0) std::_Exit(3);
    RemoveRegisteredFiles();
  });
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_FALSE(Exists(directory + "/file"));
}

TEST(FileCleanupTest, FullRegistryIsAnError) {
  const int status = InChild([] {
    for (int i = 0; i < kMaxRegisteredFiles; ++i) {
      if (!RegisterFileForRemoval("/nonexistent/" + std::to_string(i)).ok()) {
        std::_Exit(3);
      }
    }
    const absl::Status full = RegisterFileForRemoval("/nonexistent/last");
    std::_Exit(absl::IsResourceExhausted(full) ? 0 : 4);
  });
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_TRUE(absl::IsInvalidArgument(RegisterFileForRemoval("")));
}

}  // namespace
}  // namespace ze
