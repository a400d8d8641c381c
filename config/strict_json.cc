#include "config/strict_json.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ze {
namespace config {
namespace {

// One open object or array while parsing, so a duplicate can be reported
// with its full path.
struct OpenContainer {
  bool is_object = false;
  std::string path;
  std::set<std::string> keys_seen;  // objects only
  std::string last_key;             // objects only
  size_t elements_seen = 0;         // arrays only
};

// The path of a value that starts now inside `parent` (or at the top).
std::string ChildPath(std::vector<OpenContainer>& stack) {
  if (stack.empty()) return "";
  OpenContainer& parent = stack.back();
  if (parent.is_object) return JoinJsonPath(parent.path, parent.last_key);
  return absl::StrCat(parent.path, "[", parent.elements_seen++, "]");
}

}  // namespace

std::string JoinJsonPath(absl::string_view parent, absl::string_view key) {
  if (parent.empty()) return std::string(key);
  return absl::StrCat(parent, ".", key);
}

absl::StatusOr<OrderedJson> ParseJsonRejectingDuplicates(
    absl::string_view text, absl::string_view source_name) {
  std::vector<OpenContainer> stack;
  std::vector<std::string> duplicates;
  using Event = OrderedJson::parse_event_t;
  auto callback = [&](int /*depth*/, Event event, OrderedJson& parsed) {
    switch (event) {
      case Event::object_start:
      case Event::array_start: {
        OpenContainer container;
        container.is_object = event == Event::object_start;
        container.path = ChildPath(stack);
        stack.push_back(std::move(container));
        break;
      }
      case Event::object_end:
      case Event::array_end:
        if (!stack.empty()) stack.pop_back();
        break;
      case Event::key: {
        OpenContainer& object = stack.back();
        object.last_key = parsed.get<std::string>();
        if (!object.keys_seen.insert(object.last_key).second) {
          duplicates.push_back(
              absl::StrCat(source_name, ": duplicate key \"", object.last_key,
                           "\" at ", JoinJsonPath(object.path, object.last_key),
                           " (JSON parsers keep only one; remove the other)"));
        }
        break;
      }
      case Event::value:
        // A scalar; inside an array it takes the next index.
        if (!stack.empty() && !stack.back().is_object) {
          ++stack.back().elements_seen;
        }
        break;
    }
    return true;  // keep everything; duplicates are reported, not dropped
  };

  OrderedJson result;
  try {
    result = OrderedJson::parse(text.begin(), text.end(), callback,
                                /*allow_exceptions=*/true);
  } catch (const OrderedJson::parse_error& error) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_name, ": invalid JSON: ", error.what()));
  } catch (const OrderedJson::out_of_range& error) {
    // A number too large for a double (1e999): the parser stopped at the
    // value of the key last read, so the open containers name its path.
    std::string path = "the top level";
    if (!stack.empty()) {
      const OpenContainer& parent = stack.back();
      path = parent.is_object
                 ? JoinJsonPath(parent.path, parent.last_key)
                 : absl::StrCat(parent.path, "[", parent.elements_seen, "]");
    }
    return absl::InvalidArgumentError(
        absl::StrCat(source_name, ": number out of range at ", path,
                     " (it overflows a double): ", error.what()));
  } catch (const OrderedJson::exception& error) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_name, ": invalid JSON: ", error.what()));
  }
  if (!duplicates.empty()) {
    return absl::InvalidArgumentError(absl::StrJoin(duplicates, "\n"));
  }
  return result;
}

int EditDistance(absl::string_view a, absl::string_view b) {
  // One row of the classic dynamic programme: row[j] is the distance between
  // the first i characters of a and the first j of b.
  std::vector<int> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    int diagonal = row[0];
    row[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      const int above = row[j];
      const int substitution = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      row[j] = std::min({above + 1, row[j - 1] + 1, substitution});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string NearestCandidate(absl::string_view word,
                             const std::vector<std::string>& candidates) {
  const int threshold = std::max<int>(2, static_cast<int>(word.size()) / 3);
  std::string best;
  int best_distance = threshold + 1;
  for (const std::string& candidate : candidates) {
    const int distance = EditDistance(word, candidate);
    if (distance < best_distance) {
      best_distance = distance;
      best = candidate;
    }
  }
  return best;
}

std::string DescribeJsonValue(const OrderedJson& value) {
  switch (value.type()) {
    case OrderedJson::value_t::string:
      return absl::StrCat("string ", value.dump());
    case OrderedJson::value_t::boolean:
      return absl::StrCat("boolean ", value.dump());
    case OrderedJson::value_t::number_integer:
    case OrderedJson::value_t::number_unsigned:
    case OrderedJson::value_t::number_float:
      return absl::StrCat("number ", value.dump());
    case OrderedJson::value_t::null:
      return "null";
    case OrderedJson::value_t::object:
      return "an object";
    case OrderedJson::value_t::array:
      return "an array";
    default:
      return "an unsupported JSON value";
  }
}

}  // namespace config
}  // namespace ze
