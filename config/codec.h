// Typed reading and writing of one JSON value: range rules, and a Codec per
// C++ value type (boolean, integer, number, string, betas, enums, nullable,
// "auto"-able). Internal to //config: the section tables (sections.cc) build
// their fields from these.
#ifndef ZE_CONFIG_CODEC_H_
#define ZE_CONFIG_CODEC_H_

#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "config/config.h"
#include "config/strict_json.h"

namespace ze {
namespace config {
namespace internal {

using Json = OrderedJson;

inline constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
inline constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();

// Every problem found in one pass, each line prefixed with the source, so a
// user fixes a config in one round rather than one error at a time; and the
// warnings (keys accepted but ignored, deprecated spellings) found on the
// way, which the loader keeps in Config::load_warnings.
class Problems {
 public:
  explicit Problems(std::string source) : source_(std::move(source)) {}
  void Add(absl::string_view message) {
    lines_.push_back(absl::StrCat(source_, ": ", message));
  }
  // Records that the value at `path` was rejected, so that the rules spanning
  // several keys can skip what they would only misjudge (the value kept is
  // the default, not what the user wrote).
  void MarkBad(const std::string& path) { bad_paths_.push_back(path); }
  // Whether the value at `path`, or an object containing it, was rejected.
  bool IsBad(absl::string_view path) const {
    for (const std::string& bad : bad_paths_) {
      if (path == bad ||
          (absl::StartsWith(path, bad) && path.size() > bad.size() &&
           path[bad.size()] == '.')) {
        return true;
      }
    }
    return false;
  }
  // A warning about the key at `path`; `message` follows the key in the
  // sentence ("is deprecated ...").
  void Warn(const std::string& path, std::string message) {
    warnings_.push_back({path, std::move(message)});
  }
  bool empty() const { return lines_.empty(); }
  absl::Status ToStatus() const {
    if (lines_.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrJoin(lines_, "\n"));
  }
  const std::vector<ConfigWarning>& warnings() const { return warnings_; }

 private:
  std::string source_;
  std::vector<std::string> lines_;
  std::vector<std::string> bad_paths_;
  std::vector<ConfigWarning> warnings_;
};

// `path` for messages: "the top level" for the root object.
std::string Where(const std::string& path);

// True for the JSON string "auto" (Hugging Face's placeholder).
bool IsAutoString(const Json& value);

// A double as JSON prints it (shortest round-trip form), for messages.
std::string FormatDouble(double value);

// ------------------------------------------------------------- value rules

struct IntRule {
  int64_t min = kInt64Min;
  int64_t max = kInt64Max;
  // One value outside [min, max] that is also valid (a sentinel such as -1).
  std::optional<int64_t> also = std::nullopt;

  bool Accepts(int64_t v) const {
    return (v >= min && v <= max) || (also && v == *also);
  }
  std::string Describe() const {
    std::string text;
    if (min != kInt64Min && max != kInt64Max) {
      text = absl::StrCat("in [", min, ", ", max, "]");
    } else if (min != kInt64Min) {
      text = absl::StrCat(">= ", min);
    } else if (max != kInt64Max) {
      text = absl::StrCat("<= ", max);
    }
    if (also) absl::StrAppend(&text, text.empty() ? "" : " or ", *also);
    return text;
  }
};
inline IntRule AtLeast(int64_t min) { return IntRule{min, kInt64Max}; }
inline IntRule Between(int64_t min, int64_t max) { return IntRule{min, max}; }

struct DoubleRule {
  double min = -HUGE_VAL;
  double max = HUGE_VAL;
  bool min_open = false;
  bool max_open = false;

  bool Accepts(double v) const {
    if (!std::isfinite(v)) return false;
    if (min_open ? v <= min : v < min) return false;
    if (max_open ? v >= max : v > max) return false;
    return true;
  }
  std::string Describe() const {
    const bool has_min = min != -HUGE_VAL, has_max = max != HUGE_VAL;
    if (has_min && has_max) {
      return absl::StrCat("in ", min_open ? "(" : "[", FormatDouble(min), ", ",
                          FormatDouble(max), max_open ? ")" : "]");
    }
    if (has_min)
      return absl::StrCat(min_open ? "> " : ">= ", FormatDouble(min));
    if (has_max)
      return absl::StrCat(max_open ? "< " : "<= ", FormatDouble(max));
    return "";
  }
};
inline DoubleRule NonNegative() { return DoubleRule{0.0, HUGE_VAL}; }
inline DoubleRule Positive() { return DoubleRule{0.0, HUGE_VAL, true, false}; }
inline DoubleRule UnitClosed() { return DoubleRule{0.0, 1.0}; }
inline DoubleRule UnitHalfOpen() { return DoubleRule{0.0, 1.0, false, true}; }

// ------------------------------------------------------------- codecs

// How one JSON value maps to a C++ value of type T: reading (with the type
// and range check, recording a problem on failure), writing, and the type's
// description for messages and the reference.
template <typename T>
struct Codec {
  std::string type;
  std::function<bool(const Json&, const std::string& path, Problems&, T*)> read;
  std::function<Json(const T&)> write;
  // Set only by AutoOr(): whether a value still holds "auto". The schema
  // derives Config::UnresolvedAutoPaths() from it.
  std::function<bool(const T&)> is_auto;
};

// Records "expected <type> at <path>, got <value>", with a clearer message
// when the value is "auto" where "auto" is not accepted.
void TypeMismatch(const Json& value, const std::string& path,
                  const std::string& type, Problems& problems);

Codec<bool> Boolean();
// Any JSON value; reads as true. For keys accepted and ignored whatever they
// hold.
Codec<bool> Present();
// A section (an object) that does something only when enabled: reads its
// "enabled" key when it is a boolean, else `enabled_by_default`.
Codec<bool> SectionEnabled(bool enabled_by_default);
// Integers may be written as integral JSON floats (5e8), as DeepSpeed users
// commonly do; "5e8" as a string is a type error.
Codec<int64_t> Integer(IntRule rule);
Codec<double> Number(DoubleRule rule);
Codec<std::string> String(bool allow_empty);
// Adam's betas: two numbers in [0, 1).
Codec<std::array<double, 2>> Betas();

template <typename E>
struct Spelling {
  std::string name;
  E value;
};

// An enum written as a string. The first spelling of each value is the
// canonical one ToJson() writes; later ones are accepted aliases.
// `unsupported` names values DeepSpeed knows and zero-engine does not
// implement, so the message can say so instead of "unknown".
template <typename E>
Codec<E> Enum(std::vector<Spelling<E>> spellings, bool case_insensitive,
              std::vector<std::string> unsupported = {}) {
  std::vector<std::string> canonical;
  std::map<E, std::string> name_of;
  for (const auto& spelling : spellings) {
    if (name_of.emplace(spelling.value, spelling.name).second) {
      canonical.push_back(absl::StrCat("\"", spelling.name, "\""));
    }
  }
  Codec<E> codec;
  codec.type = absl::StrCat("one of ", absl::StrJoin(canonical, ", "));
  codec.read = [spellings, case_insensitive, unsupported, canonical](
                   const Json& v, const std::string& path, Problems& problems,
                   E* out) {
    const std::string expected =
        absl::StrCat("one of ", absl::StrJoin(canonical, ", "));
    if (!v.is_string()) {
      TypeMismatch(v, path, expected, problems);
      return false;
    }
    const std::string& given = v.get_ref<const std::string&>();
    auto same = [&](const std::string& a, const std::string& b) {
      return case_insensitive ? absl::EqualsIgnoreCase(a, b) : a == b;
    };
    for (const auto& spelling : spellings) {
      if (same(given, spelling.name)) {
        *out = spelling.value;
        return true;
      }
    }
    for (const std::string& name : unsupported) {
      if (absl::EqualsIgnoreCase(given, name)) {
        problems.Add(absl::StrCat(
            Where(path), " is \"", given,
            "\", which DeepSpeed knows but zero-engine does not implement; "
            "use ",
            expected));
        return false;
      }
    }
    // Suggestions ignore case even where matching does not, so "warmuplr"
    // suggests "WarmupLR".
    auto fold = [](const std::string& text) {
      return absl::AsciiStrToLower(text);
    };
    std::vector<std::string> candidates;
    for (const auto& spelling : spellings) {
      candidates.push_back(fold(spelling.name));
    }
    const std::string nearest = NearestCandidate(fold(given), candidates);
    std::string hint;
    for (const auto& spelling : spellings) {
      if (!nearest.empty() && fold(spelling.name) == nearest) {
        hint = absl::StrCat("; did you mean \"", spelling.name, "\"?");
        break;
      }
    }
    problems.Add(absl::StrCat("unknown value \"", given, "\" at ", Where(path),
                              ": expected ", expected, hint));
    return false;
  };
  codec.write = [name_of](const E& v) { return Json(name_of.at(v)); };
  return codec;
}

// The JSON value null stands for an unset optional.
template <typename T>
Codec<std::optional<T>> Nullable(Codec<T> inner) {
  Codec<std::optional<T>> codec;
  codec.type = absl::StrCat(inner.type, ", or null");
  codec.read = [inner](const Json& v, const std::string& path,
                       Problems& problems, std::optional<T>* out) {
    if (v.is_null()) {
      out->reset();
      return true;
    }
    T value{};
    if (!inner.read(v, path, problems, &value)) return false;
    *out = std::move(value);
    return true;
  };
  codec.write = [inner](const std::optional<T>& v) {
    return v ? inner.write(*v) : Json(nullptr);
  };
  return codec;
}

// The string "auto" stands for a value Resolve() fills in.
template <typename T>
Codec<Autoable<T>> AutoOr(Codec<T> inner) {
  Codec<Autoable<T>> codec;
  codec.type = absl::StrCat(inner.type, ", or \"auto\"");
  codec.read = [inner](const Json& v, const std::string& path,
                       Problems& problems, Autoable<T>* out) {
    if (IsAutoString(v)) {
      *out = Autoable<T>::Auto();
      return true;
    }
    T value{};
    if (!inner.read(v, path, problems, &value)) return false;
    *out = Autoable<T>(std::move(value));
    return true;
  };
  codec.write = [inner](const Autoable<T>& v) {
    return v.is_auto() ? Json("auto") : inner.write(v.raw_value());
  };
  codec.is_auto = [](const Autoable<T>& v) { return v.is_auto(); };
  return codec;
}

}  // namespace internal
}  // namespace config
}  // namespace ze

#endif  // ZE_CONFIG_CODEC_H_
