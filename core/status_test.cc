#include "core/status.h"

#include <cerrno>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace ze {
namespace {

TEST(ErrnoToStatusTest, MapsErrnoToSpecificCodesNamingActionAndPath) {
  const absl::Status full =
      ErrnoToStatus(ENOSPC, "write", "/ckpt/rank0.safetensors");
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(
      absl::StrContains(full.message(), "write /ckpt/rank0.safetensors"))
      << full.message();
  EXPECT_EQ(ErrnoToStatus(EDQUOT, "write", "p").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoToStatus(EROFS, "open", "p").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoToStatus(EACCES, "open", "p").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoToStatus(ENOENT, "open", "p").code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ErrnoToStatus(EIO, "write", "p").code(),
            absl::StatusCode::kInternal);
}

TEST(AnnotateTest, KeepsTheCodeAndPrefixesTheMessage) {
  EXPECT_TRUE(Annotate(absl::OkStatus(), "context").ok());
  const absl::Status annotated =
      Annotate(absl::NotFoundError("no file"), "loading x");
  EXPECT_EQ(annotated.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(annotated.message(), "loading x: no file");
}

}  // namespace
}  // namespace ze
