#include "core/atomic_file.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace ze {
namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(AtomicFileTest, ReplacesTheFileAndLeavesNoTemporary) {
  const std::string directory =
      std::string(std::getenv("TEST_TMPDIR")) + "/atomic";
  std::filesystem::create_directories(directory);
  const std::string path = directory + "/config.json";
  ASSERT_TRUE(WriteFileAtomically(path, "old").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "{\"new\": 1}").ok());
  EXPECT_EQ(Read(path), "{\"new\": 1}");
  struct stat info;
  ASSERT_EQ(stat(path.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0644);
  int entries = 0;
  for (const auto& entry : std::filesystem::directory_iterator(directory)) {
    (void)entry;
    ++entries;
  }
  EXPECT_EQ(entries, 1);
}

TEST(AtomicFileTest, ErrorsNameThePath) {
  const absl::Status status =
      WriteFileAtomically("/no/such/directory/file.json", "x");
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(status.message().find("/no/such/directory/file.json"),
            std::string::npos)
      << status;
  EXPECT_FALSE(SyncDirectory("/no/such/directory").ok());
}

}  // namespace
}  // namespace ze
