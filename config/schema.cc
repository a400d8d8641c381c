#include "config/schema.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ze {
namespace config {
namespace internal {

std::string MarkdownTable(const std::vector<ReferenceRow>& rows) {
  std::string out = "| key | type | default | meaning |\n|---|---|---|---|\n";
  for (const ReferenceRow& row : rows) {
    absl::StrAppend(&out, "| `", row.key, "` | ", row.type, " | ",
                    row.default_text, " | ", row.meaning, " |\n");
  }
  return out;
}

}  // namespace internal

}  // namespace config
}  // namespace ze
