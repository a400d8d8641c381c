// JSON helpers for the config loader: parsing that rejects duplicate keys,
// JSON paths, and the edit distance behind "did you mean ...?".
#ifndef ZE_CONFIG_STRICT_JSON_H_
#define ZE_CONFIG_STRICT_JSON_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace ze {
namespace config {

// Object keys keep their document order, so errors and printed configs follow
// the file.
using OrderedJson = nlohmann::ordered_json;

// Parses `text` as JSON. Unlike nlohmann::json::parse, which silently keeps
// the last of two equal keys, a key repeated within one object is an error.
// Errors: InvalidArgument starting with `source_name`; for duplicates it names
// the JSON path of every repeated key ("duplicate key \"stage\" at
// zero_optimization.stage"); for malformed JSON it carries the parser's line
// and column.
absl::StatusOr<OrderedJson> ParseJsonRejectingDuplicates(
    absl::string_view text, absl::string_view source_name);

// "parent.key", or "key" at the top level.
std::string JoinJsonPath(absl::string_view parent, absl::string_view key);

// Levenshtein distance: insertions, deletions and substitutions, each 1.
int EditDistance(absl::string_view a, absl::string_view b);

// The candidate closest to `word` when it is close enough to be a plausible
// typo (distance at most max(2, |word| / 3)); empty otherwise.
std::string NearestCandidate(absl::string_view word,
                             const std::vector<std::string>& candidates);

// A short description of a JSON value for messages: string "5e8",
// number 3.5, boolean true, null, an object, an array.
std::string DescribeJsonValue(const OrderedJson& value);

}  // namespace config
}  // namespace ze

#endif  // ZE_CONFIG_STRICT_JSON_H_
