// The loader is table-driven: each config section has a Schema listing its
// keys, how each value is read and written, and what it means. Parsing,
// ToJson() and ReferenceMarkdown() walk the same tables, and read defaults
// from default-constructed structs, so the three cannot drift apart.
#include "config/config.h"

#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "config/strict_json.h"

namespace ze {
namespace config {
namespace {

using Json = OrderedJson;

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
// Batch sizes stay far below this, so micro x accumulation x world size
// cannot overflow.
constexpr int64_t kMaxBatch = int64_t{1} << 40;

// Every problem found in one pass, each line prefixed with the source, so a
// user fixes a config in one round rather than one error at a time.
class Problems {
 public:
  explicit Problems(std::string source) : source_(std::move(source)) {}
  void Add(absl::string_view message) {
    lines_.push_back(absl::StrCat(source_, ": ", message));
  }
  bool empty() const { return lines_.empty(); }
  absl::Status ToStatus() const {
    if (lines_.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrJoin(lines_, "\n"));
  }

 private:
  std::string source_;
  std::vector<std::string> lines_;
};

std::string Where(const std::string& path) {
  return path.empty() ? std::string("the top level") : path;
}

bool IsAutoString(const Json& value) {
  return value.is_string() && value.get_ref<const std::string&>() == "auto";
}

std::string FormatDouble(double value) { return Json(value).dump(); }

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
IntRule AtLeast(int64_t min) { return IntRule{min, kInt64Max}; }
IntRule Between(int64_t min, int64_t max) { return IntRule{min, max}; }

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
DoubleRule NonNegative() { return DoubleRule{0.0, HUGE_VAL}; }
DoubleRule Positive() { return DoubleRule{0.0, HUGE_VAL, true, false}; }
DoubleRule UnitClosed() { return DoubleRule{0.0, 1.0}; }
DoubleRule UnitHalfOpen() { return DoubleRule{0.0, 1.0, false, true}; }

// ------------------------------------------------------------- codecs

// How one JSON value maps to a C++ value of type T: reading (with the type
// and range check, recording a problem on failure), writing, and the type's
// description for messages and the reference.
template <typename T>
struct Codec {
  std::string type;
  std::function<bool(const Json&, const std::string& path, Problems&, T*)> read;
  std::function<Json(const T&)> write;
};

std::string WithRule(const std::string& base, const std::string& rule) {
  return rule.empty() ? base : absl::StrCat(base, " ", rule);
}

// Records "expected <type> at <path>, got <value>", with a clearer message
// when the value is "auto" where "auto" is not accepted.
void TypeMismatch(const Json& value, const std::string& path,
                  const std::string& type, Problems& problems) {
  if (IsAutoString(value)) {
    problems.Add(absl::StrCat("\"auto\" is not accepted at ", Where(path),
                              " (expected ", type, ")"));
  } else {
    problems.Add(absl::StrCat("expected ", type, " at ", Where(path), ", got ",
                              DescribeJsonValue(value)));
  }
}

Codec<bool> Boolean() {
  Codec<bool> codec;
  codec.type = "boolean";
  codec.read = [](const Json& v, const std::string& path, Problems& problems,
                  bool* out) {
    if (!v.is_boolean()) {
      TypeMismatch(v, path, "a boolean", problems);
      return false;
    }
    *out = v.get<bool>();
    return true;
  };
  codec.write = [](const bool& v) { return Json(v); };
  return codec;
}

// Integers may be written as integral JSON floats (5e8), as DeepSpeed users
// commonly do; "5e8" as a string is a type error.
Codec<int64_t> Integer(IntRule rule) {
  Codec<int64_t> codec;
  codec.type = WithRule("integer", rule.Describe());
  codec.read = [rule](const Json& v, const std::string& path,
                      Problems& problems, int64_t* out) {
    const std::string expected = WithRule("an integer", rule.Describe());
    int64_t value = 0;
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(kInt64Max)) {
        problems.Add(absl::StrCat(Where(path), " is too large: ", v.dump()));
        return false;
      }
      value = static_cast<int64_t>(u);
    } else if (v.is_number_integer()) {
      value = v.get<int64_t>();
    } else if (v.is_number_float()) {
      const double d = v.get<double>();
      // 2^63 is exactly representable; anything at or above it overflows.
      if (d != std::floor(d) || d >= 9223372036854775808.0 ||
          d < -9223372036854775808.0) {
        problems.Add(absl::StrCat("expected ", expected, " at ", Where(path),
                                  ", got non-integral number ", v.dump()));
        return false;
      }
      value = static_cast<int64_t>(d);
    } else {
      TypeMismatch(v, path, expected, problems);
      return false;
    }
    if (!rule.Accepts(value)) {
      problems.Add(absl::StrCat(Where(path), " must be ", rule.Describe(),
                                ", got ", value));
      return false;
    }
    *out = value;
    return true;
  };
  codec.write = [](const int64_t& v) { return Json(v); };
  return codec;
}

Codec<double> Number(DoubleRule rule) {
  Codec<double> codec;
  codec.type = WithRule("number", rule.Describe());
  codec.read = [rule](const Json& v, const std::string& path,
                      Problems& problems, double* out) {
    if (!v.is_number()) {
      TypeMismatch(v, path, WithRule("a number", rule.Describe()), problems);
      return false;
    }
    const double value = v.get<double>();
    if (!rule.Accepts(value)) {
      problems.Add(absl::StrCat(Where(path), " must be ", rule.Describe(),
                                ", got ", v.dump()));
      return false;
    }
    *out = value;
    return true;
  };
  codec.write = [](const double& v) { return Json(v); };
  return codec;
}

Codec<std::string> String(bool allow_empty) {
  Codec<std::string> codec;
  codec.type = allow_empty ? "string" : "non-empty string";
  codec.read = [allow_empty](const Json& v, const std::string& path,
                             Problems& problems, std::string* out) {
    if (!v.is_string()) {
      TypeMismatch(v, path, "a string", problems);
      return false;
    }
    if (!allow_empty && v.get_ref<const std::string&>().empty()) {
      problems.Add(absl::StrCat(Where(path), " must not be empty"));
      return false;
    }
    *out = v.get<std::string>();
    return true;
  };
  codec.write = [](const std::string& v) { return Json(v); };
  return codec;
}

// Adam's betas: two numbers in [0, 1).
Codec<std::array<double, 2>> Betas() {
  Codec<std::array<double, 2>> codec;
  codec.type = "[number, number], each in [0, 1)";
  codec.read = [](const Json& v, const std::string& path, Problems& problems,
                  std::array<double, 2>* out) {
    if (!v.is_array() || v.size() != 2) {
      TypeMismatch(v, path, "an array of two numbers", problems);
      return false;
    }
    std::array<double, 2> betas{};
    bool ok = true;
    for (size_t i = 0; i < 2; ++i) {
      ok &=
          Number(UnitHalfOpen())
              .read(v[i], absl::StrCat(path, "[", i, "]"), problems, &betas[i]);
    }
    if (ok) *out = betas;
    return ok;
  };
  codec.write = [](const std::array<double, 2>& v) {
    return Json::array({v[0], v[1]});
  };
  return codec;
}

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
  return codec;
}

// ------------------------------------------------------------- schemas

struct ReferenceRow {
  std::string key;
  std::string type;
  std::string default_text;
  std::string meaning;
};

template <typename S>
struct Field {
  std::string key;
  std::string type;
  std::string meaning;
  // Printed in the reference instead of the default value when the default
  // is a rule ("true for stage 3, else false").
  std::string default_rule;
  std::function<void(const Json&, const std::string& path, Problems&, S*)>
      parse;
  // nullopt: the key is left out of ToJson() (an absent optional section).
  std::function<std::optional<Json>(const S&)> emit;
  // Sections append their own keys' rows; plain fields leave this empty.
  std::function<void(const std::string& path, const S& defaults,
                     std::vector<ReferenceRow>*)>
      nested_rows;
  // Sections append their aliases and rejected keys (Schema::Notes).
  std::function<void(const std::string& path, std::vector<std::string>*)>
      nested_notes;
};

template <typename S>
class Schema {
 public:
  Schema& Add(Field<S> field) {
    fields_.push_back(std::move(field));
    return *this;
  }
  // `alias` is read as `canonical`; giving both is an error.
  Schema& Alias(std::string alias, std::string canonical) {
    aliases_.emplace(std::move(alias), std::move(canonical));
    return *this;
  }
  // A key DeepSpeed knows that zero-engine rejects, with the reason.
  Schema& Unsupported(std::string key, std::string reason) {
    unsupported_.emplace(std::move(key), std::move(reason));
    return *this;
  }
  // Runs after the keys are read, with the object as written, for defaults
  // that depend on other keys or on whether a key was given.
  Schema& AfterParse(std::function<void(const Json&, S*)> hook) {
    after_parse_ = std::move(hook);
    return *this;
  }

  // Reads `object` into `out`; keys not in the JSON keep their values in
  // `out` (the defaults). Records a problem for every bad key or value.
  void Parse(const Json& object, const std::string& path, Problems& problems,
             S* out) const {
    if (!object.is_object()) {
      TypeMismatch(object, path, "an object", problems);
      return;
    }
    std::map<std::string, std::string> seen_as;  // canonical -> spelling used
    for (const auto& item : object.items()) {
      const std::string& key = item.key();
      const std::string key_path = JoinJsonPath(path, key);
      std::string canonical = key;
      if (auto alias = aliases_.find(key); alias != aliases_.end()) {
        canonical = alias->second;
      }
      const Field<S>* field = Find(canonical);
      if (field == nullptr) {
        ReportUnknown(key, path, problems);
        continue;
      }
      if (auto [it, inserted] = seen_as.emplace(canonical, key); !inserted) {
        problems.Add(absl::StrCat(
            "both \"", it->second, "\" and \"", key, "\" are given at ",
            Where(path), " (", key == canonical ? it->second : key,
            " is an alias of ", canonical, "); keep one"));
        continue;
      }
      field->parse(item.value(), key_path, problems, out);
    }
    if (after_parse_) after_parse_(object, out);
  }

  Json Emit(const S& value) const {
    Json object = Json::object();
    for (const Field<S>& field : fields_) {
      if (std::optional<Json> json = field.emit(value)) {
        object[field.key] = std::move(*json);
      }
    }
    return object;
  }

  void Rows(const std::string& path, const S& defaults,
            std::vector<ReferenceRow>* rows) const {
    for (const Field<S>& field : fields_) {
      const std::string key_path = JoinJsonPath(path, field.key);
      if (field.nested_rows) {
        field.nested_rows(key_path, defaults, rows);
        continue;
      }
      std::string default_text = field.default_rule;
      if (default_text.empty()) {
        std::optional<Json> json = field.emit(defaults);
        default_text = json ? absl::StrCat("`", json->dump(), "`") : "absent";
      }
      rows->push_back({key_path, field.type, default_text, field.meaning});
    }
  }

  // One Markdown bullet per alias and per rejected DeepSpeed key, here and
  // in nested sections.
  void Notes(const std::string& path, std::vector<std::string>* notes) const {
    for (const auto& [alias, canonical] : aliases_) {
      notes->push_back(absl::StrCat("- `", JoinJsonPath(path, alias),
                                    "` is accepted as an alias of `",
                                    JoinJsonPath(path, canonical), "`."));
    }
    for (const auto& [key, reason] : unsupported_) {
      notes->push_back(absl::StrCat("- `", JoinJsonPath(path, key),
                                    "` is rejected: ", reason, "."));
    }
    for (const Field<S>& field : fields_) {
      if (field.nested_notes) {
        field.nested_notes(JoinJsonPath(path, field.key), notes);
      }
    }
  }

  std::vector<std::string> Keys() const {
    std::vector<std::string> keys;
    for (const Field<S>& field : fields_) keys.push_back(field.key);
    return keys;
  }

 private:
  const Field<S>* Find(const std::string& key) const {
    for (const Field<S>& field : fields_) {
      if (field.key == key) return &field;
    }
    return nullptr;
  }

  void ReportUnknown(const std::string& key, const std::string& path,
                     Problems& problems) const {
    const std::string key_path = JoinJsonPath(path, key);
    if (auto it = unsupported_.find(key); it != unsupported_.end()) {
      problems.Add(
          absl::StrCat("\"", key, "\" at ", key_path,
                       " is not supported by zero-engine: ", it->second));
      return;
    }
    std::vector<std::string> candidates = Keys();
    for (const auto& alias : aliases_) candidates.push_back(alias.first);
    const std::string nearest = NearestCandidate(key, candidates);
    if (!nearest.empty()) {
      problems.Add(absl::StrCat("unknown key \"", key, "\" at ", key_path,
                                "; did you mean \"", nearest, "\"?"));
    } else {
      problems.Add(absl::StrCat("unknown key \"", key, "\" at ", key_path,
                                "; valid keys at ", Where(path), ": ",
                                absl::StrJoin(Keys(), ", ")));
    }
  }

  std::vector<Field<S>> fields_;
  std::map<std::string, std::string> aliases_;
  std::map<std::string, std::string> unsupported_;
  std::function<void(const Json&, S*)> after_parse_;
};

// A key holding one value.
template <typename S, typename T>
Field<S> Value(std::string key, T S::*member, Codec<T> codec,
               std::string meaning, std::string default_rule = "") {
  Field<S> field;
  field.key = std::move(key);
  field.type = codec.type;
  field.meaning = std::move(meaning);
  field.default_rule = std::move(default_rule);
  field.parse = [member, codec](const Json& v, const std::string& path,
                                Problems& problems, S* out) {
    T value = out->*member;
    if (codec.read(v, path, problems, &value)) out->*member = std::move(value);
  };
  field.emit = [member, codec](const S& s) -> std::optional<Json> {
    return codec.write(s.*member);
  };
  return field;
}

// A key holding an object with its own schema.
template <typename S, typename Sub>
Field<S> Section(std::string key, Sub S::*member, const Schema<Sub>* schema,
                 std::string meaning) {
  Field<S> field;
  field.key = std::move(key);
  field.type = "object";
  field.meaning = std::move(meaning);
  field.parse = [member, schema](const Json& v, const std::string& path,
                                 Problems& problems, S* out) {
    schema->Parse(v, path, problems, &(out->*member));
  };
  field.emit = [member, schema](const S& s) -> std::optional<Json> {
    return schema->Emit(s.*member);
  };
  field.nested_rows = [member, schema](const std::string& path,
                                       const S& defaults,
                                       std::vector<ReferenceRow>* rows) {
    schema->Rows(path, defaults.*member, rows);
  };
  field.nested_notes = [schema](const std::string& path,
                                std::vector<std::string>* notes) {
    schema->Notes(path, notes);
  };
  return field;
}

// ------------------------------------------------------ section schemas

const Codec<OptimizerType>& OptimizerTypeCodec() {
  static const auto* codec = new Codec<OptimizerType>(Enum<OptimizerType>(
      {{"Adam", OptimizerType::kAdam},
       {"AdamW", OptimizerType::kAdamW},
       {"SGD", OptimizerType::kSgd}},
      /*case_insensitive=*/true,
      {"Lamb", "OneBitAdam", "ZeroOneAdam", "OneBitLamb", "Adagrad", "Lion",
       "MuAdam", "MuAdamW", "MuSGD", "Adafactor"}));
  return *codec;
}

const Codec<SchedulerType>& SchedulerTypeCodec() {
  static const auto* codec = new Codec<SchedulerType>(
      Enum<SchedulerType>({{"WarmupLR", SchedulerType::kWarmupLR},
                           {"WarmupDecayLR", SchedulerType::kWarmupDecayLR},
                           {"WarmupCosineLR", SchedulerType::kWarmupCosineLR},
                           {"OneCycle", SchedulerType::kOneCycle}},
                          /*case_insensitive=*/false, {"LRRangeTest"}));
  return *codec;
}

Codec<OffloadDevice> OffloadDeviceCodec() {
  return Enum<OffloadDevice>({{"none", OffloadDevice::kNone},
                              {"cpu", OffloadDevice::kCpu},
                              {"nvme", OffloadDevice::kNvme}},
                             /*case_insensitive=*/false);
}

// Adam and AdamW share keys; adam_w_mode matters for Adam only but DeepSpeed
// reads it for both.
const Schema<OptimizerParams>& AdamParamsSchema() {
  static const auto* schema = [] {
    auto* s = new Schema<OptimizerParams>();
    s->Add(Value("lr", &OptimizerParams::lr, AutoOr(Number(NonNegative())),
                 "Learning rate (the peak, when a scheduler warms up)."))
        .Add(Value("betas", &OptimizerParams::betas, AutoOr(Betas()),
                   "Decay rates of the first and second moment estimates."))
        .Add(Value("eps", &OptimizerParams::eps, AutoOr(Number(NonNegative())),
                   "Added to the denominator for numerical stability."))
        .Add(Value("weight_decay", &OptimizerParams::weight_decay,
                   AutoOr(Number(NonNegative())),
                   "Weight decay; decoupled (AdamW) unless type is Adam with "
                   "adam_w_mode false."))
        .Add(Value("torch_adam", &OptimizerParams::torch_adam, Boolean(),
                   "DeepSpeed: use torch.optim.Adam. Accepted; zero-engine has "
                   "one Adam implementation."))
        .Add(
            Value("adam_w_mode", &OptimizerParams::adam_w_mode, Boolean(),
                  "Type Adam: true applies decoupled weight decay (DeepSpeed's "
                  "default), false adds it to the gradient (L2). Must not be "
                  "false for AdamW."));
    return s;
  }();
  return *schema;
}

const Schema<OptimizerParams>& SgdParamsSchema() {
  static const auto* schema = [] {
    auto* s = new Schema<OptimizerParams>();
    s->Add(Value("lr", &OptimizerParams::lr, AutoOr(Number(NonNegative())),
                 "Learning rate."))
        .Add(Value("momentum", &OptimizerParams::momentum,
                   Number(UnitHalfOpen()), "Momentum factor (0 = plain SGD)."))
        .Add(Value("weight_decay", &OptimizerParams::weight_decay,
                   AutoOr(Number(NonNegative())),
                   "L2 penalty added to the gradient, as in torch.optim.SGD."));
    return s;
  }();
  return *schema;
}

const Schema<OptimizerParams>& OptimizerParamsSchema(OptimizerType type) {
  return type == OptimizerType::kSgd ? SgdParamsSchema() : AdamParamsSchema();
}

// The keys each scheduler type accepts, in one list so the reference and
// the parser agree.
enum SchedulerKeys : unsigned {
  kWarmup = 1u << 0,       // WarmupLR
  kWarmupDecay = 1u << 1,  // WarmupDecayLR
  kCosine = 1u << 2,       // WarmupCosineLR
  kCycle = 1u << 3,        // OneCycle
  kAll = kWarmup | kWarmupDecay | kCosine | kCycle,
};

unsigned SchedulerBit(SchedulerType type) {
  switch (type) {
    case SchedulerType::kWarmupLR:
      return kWarmup;
    case SchedulerType::kWarmupDecayLR:
      return kWarmupDecay;
    case SchedulerType::kWarmupCosineLR:
      return kCosine;
    case SchedulerType::kOneCycle:
      return kCycle;
  }
  return 0;
}

std::vector<std::pair<unsigned, Field<SchedulerParams>>> SchedulerFields() {
  using P = SchedulerParams;
  const Codec<WarmupType> warmup_type = Enum<WarmupType>(
      {{"log", WarmupType::kLog}, {"linear", WarmupType::kLinear}},
      /*case_insensitive=*/false);
  return {
      {kWarmup | kWarmupDecay,
       Value("warmup_min_lr", &P::warmup_min_lr, AutoOr(Number(NonNegative())),
             "Learning rate at the start of warmup.")},
      {kWarmup | kWarmupDecay,
       Value("warmup_max_lr", &P::warmup_max_lr, AutoOr(Number(NonNegative())),
             "Learning rate at the end of warmup.")},
      {kWarmup | kWarmupDecay | kCosine,
       Value("warmup_num_steps", &P::warmup_num_steps,
             AutoOr(Integer(AtLeast(0))), "Steps of warmup.")},
      {kWarmup | kWarmupDecay | kCosine,
       Value("warmup_type", &P::warmup_type, warmup_type,
             "Warmup curve: log or linear in the step.")},
      {kWarmupDecay | kCosine,
       Value(
           "total_num_steps", &P::total_num_steps, AutoOr(Integer(AtLeast(1))),
           "Total training steps; the decay ends here. Required.", "required")},
      {kCosine,
       Value("warmup_min_ratio", &P::warmup_min_ratio, Number(UnitClosed()),
             "Warmup starts at this fraction of the optimizer's lr.")},
      {kCosine, Value("cos_min_ratio", &P::cos_min_ratio, Number(UnitClosed()),
                      "The cosine decays to this fraction of the optimizer's "
                      "lr.")},
      {kCycle,
       Value("cycle_min_lr", &P::cycle_min_lr, Nullable(Number(NonNegative())),
             "Lower learning rate of the cycle. Required.", "required")},
      {kCycle,
       Value("cycle_max_lr", &P::cycle_max_lr, Nullable(Number(NonNegative())),
             "Upper learning rate of the cycle. Required.", "required")},
      {kCycle, Value("decay_lr_rate", &P::decay_lr_rate, Number(NonNegative()),
                     "Learning-rate decay rate after the cycle.")},
      {kCycle, Value("cycle_first_step_size", &P::cycle_first_step_size,
                     Integer(AtLeast(1)), "Steps of the rising half-cycle.")},
      {kCycle, Value("cycle_second_step_size", &P::cycle_second_step_size,
                     Integer(AtLeast(1)), "Steps of the falling half-cycle.",
                     "cycle_first_step_size")},
      {kCycle, Value("cycle_first_stair_count", &P::cycle_first_stair_count,
                     Integer(AtLeast(0)),
                     "Stairs in the rising half (0 = continuous).")},
      {kCycle, Value("cycle_second_stair_count", &P::cycle_second_stair_count,
                     Integer(AtLeast(0)), "Stairs in the falling half.",
                     "cycle_first_stair_count")},
      {kCycle,
       Value("decay_step_size", &P::decay_step_size, Integer(AtLeast(0)),
             "Steps between decays after the cycle (0 = no decay).")},
      {kCycle, Value("cycle_momentum", &P::cycle_momentum, Boolean(),
                     "Cycle momentum (beta1) inversely to the learning rate.")},
      {kCycle, Value("cycle_min_mom", &P::cycle_min_mom, Number(UnitClosed()),
                     "Lower momentum of the cycle.")},
      {kCycle, Value("cycle_max_mom", &P::cycle_max_mom, Number(UnitClosed()),
                     "Upper momentum of the cycle.")},
      {kCycle,
       Value("decay_mom_rate", &P::decay_mom_rate, Number(NonNegative()),
             "Momentum decay rate after the cycle.")},
      {kAll, Value("last_batch_iteration", &P::last_batch_iteration,
                   Integer(AtLeast(-1)),
                   "Last step already taken; -1 starts from the beginning.")},
  };
}

const Schema<SchedulerParams>& SchedulerParamsSchema(SchedulerType type) {
  static const auto* schemas = [] {
    auto* by_type = new std::map<SchedulerType, Schema<SchedulerParams>>();
    for (SchedulerType t :
         {SchedulerType::kWarmupLR, SchedulerType::kWarmupDecayLR,
          SchedulerType::kWarmupCosineLR, SchedulerType::kOneCycle}) {
      Schema<SchedulerParams>& schema = (*by_type)[t];
      for (auto& [types, field] : SchedulerFields()) {
        if (types & SchedulerBit(t)) schema.Add(field);
      }
      // DeepSpeed: an absent second half mirrors the first.
      schema.AfterParse([](const Json& object, SchedulerParams* params) {
        if (!object.contains("cycle_second_step_size")) {
          params->cycle_second_step_size = params->cycle_first_step_size;
        }
        if (!object.contains("cycle_second_stair_count")) {
          params->cycle_second_stair_count = params->cycle_first_stair_count;
        }
      });
    }
    return by_type;
  }();
  return schemas->at(type);
}

const Schema<Fp16Config>& Fp16Schema() {
  static const auto* schema = [] {
    using F = Fp16Config;
    auto* s = new Schema<F>();
    s->Add(Value("enabled", &F::enabled, AutoOr(Boolean()),
                 "Train in fp16 with fp32 master weights."))
        .Add(Value("auto_cast", &F::auto_cast, Boolean(),
                   "DeepSpeed: cast inputs to fp16. Parsed; zero-engine runs "
                   "the whole model in fp16."))
        .Add(Value("loss_scale", &F::loss_scale, Number(NonNegative()),
                   "0 = dynamic loss scaling; a positive value is a static "
                   "scale."))
        .Add(Value("initial_scale_power", &F::initial_scale_power,
                   Integer(Between(0, 63)),
                   "Dynamic scaling starts at 2^initial_scale_power."))
        .Add(Value("loss_scale_window", &F::loss_scale_window,
                   Integer(AtLeast(1)),
                   "Clean steps after which the dynamic scale doubles."))
        .Add(Value("hysteresis", &F::hysteresis, Integer(AtLeast(1)),
                   "Overflows tolerated before the scale is halved."))
        .Add(Value("consecutive_hysteresis", &F::consecutive_hysteresis,
                   Boolean(), "A clean step refills the hysteresis budget."))
        .Add(Value("min_loss_scale", &F::min_loss_scale, Number(Positive()),
                   "The dynamic scale never drops below this."));
    return s;
  }();
  return *schema;
}

const Schema<Bf16Config>& Bf16Schema() {
  static const auto* schema = [] {
    auto* s = new Schema<Bf16Config>();
    s->Add(Value("enabled", &Bf16Config::enabled, AutoOr(Boolean()),
                 "Train in bf16 with fp32 master weights."));
    return s;
  }();
  return *schema;
}

const Schema<OffloadOptimizerConfig>& OffloadOptimizerSchema() {
  static const auto* schema = [] {
    using O = OffloadOptimizerConfig;
    auto* s = new Schema<O>();
    s->Add(Value("device", &O::device, OffloadDeviceCodec(),
                 "Where optimizer state lives: none (GPU), cpu (stage 1-3), "
                 "nvme (stage 3)."))
        .Add(Value("nvme_path", &O::nvme_path, Nullable(String(false)),
                   "Directory for NVMe swap files; required for nvme."))
        .Add(Value("pin_memory", &O::pin_memory, Boolean(),
                   "Use page-locked CPU buffers."))
        .Add(Value("buffer_count", &O::buffer_count, Integer(AtLeast(1)),
                   "Swap buffers for optimizer state (NVMe)."))
        .Add(Value("pipeline_read", &O::pipeline_read, Boolean(),
                   "Overlap reading the next sub-group with the step (NVMe)."))
        .Add(Value("pipeline_write", &O::pipeline_write, Boolean(),
                   "Overlap writing the last sub-group with the step (NVMe)."))
        .Add(Value("fast_init", &O::fast_init, Boolean(),
                   "Faster initialisation when offloading to NVMe."))
        .Add(Value("ratio", &O::ratio,
                   Number(DoubleRule{0.0, 1.0, true, false}),
                   "Fraction of the optimizer step done on the CPU."));
    return s;
  }();
  return *schema;
}

const Schema<OffloadParamConfig>& OffloadParamSchema() {
  static const auto* schema = [] {
    using O = OffloadParamConfig;
    auto* s = new Schema<O>();
    s->Add(Value("device", &O::device, OffloadDeviceCodec(),
                 "Where partitioned parameters live: none (GPU), cpu, nvme. "
                 "Stage 3 only."))
        .Add(Value("nvme_path", &O::nvme_path, Nullable(String(false)),
                   "Directory for NVMe swap files; required for nvme."))
        .Add(Value("pin_memory", &O::pin_memory, Boolean(),
                   "Use page-locked CPU buffers."))
        .Add(Value("buffer_count", &O::buffer_count, Integer(AtLeast(1)),
                   "Swap buffers for parameters (NVMe)."))
        .Add(Value("buffer_size", &O::buffer_size, Integer(AtLeast(1)),
                   "Elements per parameter swap buffer (NVMe)."))
        .Add(Value("max_in_cpu", &O::max_in_cpu, Integer(AtLeast(0)),
                   "Elements of parameters kept in CPU memory (NVMe)."));
    return s;
  }();
  return *schema;
}

const Schema<ZeroConfig>& ZeroSchema() {
  static const auto* schema = [] {
    using Z = ZeroConfig;
    auto* s = new Schema<Z>();
    s->Add(Value("stage", &Z::stage, Integer(Between(0, 3)),
                 "0: data parallel; 1: partition optimizer state; 2: also "
                 "gradients; 3: also parameters."))
        .Add(Value("contiguous_gradients", &Z::contiguous_gradients, Boolean(),
                   "Copy gradients into one contiguous buffer as they are "
                   "produced."))
        .Add(Value("overlap_comm", &Z::overlap_comm, Boolean(),
                   "Overlap gradient reduction with backward.",
                   "true for stage 3, else false"))
        .Add(Value("reduce_scatter", &Z::reduce_scatter, Boolean(),
                   "Reduce gradients with reduce-scatter rather than "
                   "all-reduce (stage 2)."))
        .Add(Value("reduce_bucket_size", &Z::reduce_bucket_size,
                   AutoOr(Integer(AtLeast(1))),
                   "Elements reduced at a time. \"auto\": hidden_size^2."))
        .Add(Value("allgather_partitions", &Z::allgather_partitions, Boolean(),
                   "All-gather updated parameters rather than broadcast them "
                   "(stage 1, 2)."))
        .Add(Value("allgather_bucket_size", &Z::allgather_bucket_size,
                   Integer(AtLeast(1)), "Elements all-gathered at a time."))
        .Add(Value("round_robin_gradients", &Z::round_robin_gradients,
                   Boolean(),
                   "Stage 1/2 with CPU offload: spread gradient "
                   "copies over ranks."))
        .Add(Value("load_from_fp32_weights", &Z::load_from_fp32_weights,
                   Boolean(),
                   "Restore fp32 master weights from the checkpoint rather "
                   "than from the 16-bit weights."))
        .Add(Value("elastic_checkpoint", &Z::elastic_checkpoint, Boolean(),
                   "Allow loading a checkpoint at another world size (stage "
                   "1, 2); zero-engine reshards regardless."))
        .Add(Value("ignore_unused_parameters", &Z::ignore_unused_parameters,
                   Boolean(),
                   "Tolerate parameters that get no gradient (stage 1, 2)."))
        .Add(Section("offload_optimizer", &Z::offload_optimizer,
                     &OffloadOptimizerSchema(), "Optimizer state offload."))
        .Add(Section("offload_param", &Z::offload_param, &OffloadParamSchema(),
                     "Parameter offload (stage 3)."))
        .Add(Value("stage3_prefetch_bucket_size",
                   &Z::stage3_prefetch_bucket_size, AutoOr(Integer(AtLeast(0))),
                   "Elements of parameters prefetched ahead of use. \"auto\": "
                   "0.9 hidden_size^2."))
        .Add(Value("stage3_param_persistence_threshold",
                   &Z::stage3_param_persistence_threshold,
                   AutoOr(Integer(AtLeast(0))),
                   "Parameters smaller than this stay gathered. \"auto\": 10 "
                   "hidden_size."))
        .Add(Value("stage3_model_persistence_threshold",
                   &Z::stage3_model_persistence_threshold, Integer(AtLeast(0)),
                   "Upper bound on the elements kept gathered by the "
                   "persistence threshold."))
        .Add(Value("stage3_max_live_parameters", &Z::stage3_max_live_parameters,
                   Integer(AtLeast(0)),
                   "Most elements gathered at once before releasing."))
        .Add(Value("stage3_max_reuse_distance", &Z::stage3_max_reuse_distance,
                   Integer(AtLeast(0)),
                   "Keep a parameter gathered if it is reused within this "
                   "many elements of fetches."))
        .Add(Value("stage3_gather_16bit_weights_on_model_save",
                   &Z::stage3_gather_16bit_weights_on_model_save, Boolean(),
                   "Consolidate 16-bit weights when saving the model. Alias: "
                   "stage3_gather_fp16_weights_on_model_save."))
        .Add(Value("sub_group_size", &Z::sub_group_size, Integer(AtLeast(0)),
                   "Elements per optimizer-step sub-group (stage 3)."))
        .Add(Value("zero_hpz_partition_size", &Z::zero_hpz_partition_size,
                   Integer(AtLeast(1)),
                   "ZeRO++ secondary partition size (1 = off)."))
        .Add(Value("zero_quantized_weights", &Z::zero_quantized_weights,
                   Boolean(), "ZeRO++: quantize weights for all-gather."))
        .Add(Value("zero_quantized_gradients", &Z::zero_quantized_gradients,
                   Boolean(), "ZeRO++: quantize gradients for reduction."))
        .Add(Value("mics_shard_size", &Z::mics_shard_size,
                   Integer(IntRule{1, kInt64Max, -1}),
                   "MiCS shard group size (-1 = off)."))
        .Add(Value("mics_hierarchical_params_gather",
                   &Z::mics_hierarchical_params_gather, Boolean(),
                   "MiCS: hierarchical all-gather."))
        .Alias("stage3_gather_fp16_weights_on_model_save",
               "stage3_gather_16bit_weights_on_model_save")
        .Unsupported("cpu_offload",
                     "removed by DeepSpeed; use \"offload_optimizer\": "
                     "{\"device\": \"cpu\"}")
        .Unsupported("cpu_offload_params",
                     "removed by DeepSpeed; use \"offload_param\": "
                     "{\"device\": \"cpu\"}")
        .AfterParse([](const Json& object, Z* zero) {
          // DeepSpeed's rule: stage 3 overlaps communication by default.
          if (!object.contains("overlap_comm")) {
            zero->overlap_comm = zero->stage == 3;
          }
        });
    return s;
  }();
  return *schema;
}

const Schema<AioConfig>& AioSchema() {
  static const auto* schema = [] {
    using A = AioConfig;
    auto* s = new Schema<A>();
    s->Add(Value("block_size", &A::block_size, Integer(AtLeast(1)),
                 "Bytes per I/O request."))
        .Add(Value("queue_depth", &A::queue_depth, Integer(AtLeast(1)),
                   "I/O requests in flight."))
        .Add(Value("thread_count", &A::thread_count, Integer(AtLeast(1)),
                   "I/O threads."))
        .Add(Value("single_submit", &A::single_submit, Boolean(),
                   "Submit requests one at a time rather than in batches."))
        .Add(Value("overlap_events", &A::overlap_events, Boolean(),
                   "Overlap submitting requests with reaping completions."));
    return s;
  }();
  return *schema;
}

const Schema<ActivationCheckpointingConfig>& ActivationCheckpointingSchema() {
  static const auto* schema = [] {
    using A = ActivationCheckpointingConfig;
    auto* s = new Schema<A>();
    s->Add(Value("partition_activations", &A::partition_activations, Boolean(),
                 "Partition saved activations across ranks."))
        .Add(Value("cpu_checkpointing", &A::cpu_checkpointing, Boolean(),
                   "Keep saved activations in CPU memory."))
        .Add(Value("contiguous_memory_optimization",
                   &A::contiguous_memory_optimization, Boolean(),
                   "Copy saved activations into one contiguous buffer."))
        .Add(Value("number_checkpoints", &A::number_checkpoints,
                   Nullable(Integer(AtLeast(1))),
                   "Checkpoints per forward (for the contiguous buffer)."))
        .Add(Value("synchronize_checkpoint_boundary",
                   &A::synchronize_checkpoint_boundary, Boolean(),
                   "Synchronize the device at each checkpoint boundary."))
        .Add(Value("profile", &A::profile, Boolean(),
                   "Time the checkpointed forward and recompute."));
    return s;
  }();
  return *schema;
}

const Schema<ParallelWriteConfig>& ParallelWriteSchema() {
  static const auto* schema = [] {
    auto* s = new Schema<ParallelWriteConfig>();
    s->Add(Value("pipeline_stage", &ParallelWriteConfig::pipeline_stage,
                 Boolean(), "Write checkpoint shards per pipeline stage."));
    return s;
  }();
  return *schema;
}

const Schema<CheckpointConfig>& CheckpointSchema() {
  static const auto* schema = [] {
    using C = CheckpointConfig;
    auto* s = new Schema<C>();
    s->Add(Value("tag_validation", &C::tag_validation,
                 Enum<TagValidation>({{"Ignore", TagValidation::kIgnore},
                                      {"Warn", TagValidation::kWarn},
                                      {"Fail", TagValidation::kFail}},
                                     /*case_insensitive=*/true),
                 "What to do when ranks save under different tags."))
        .Add(Value("load_universal", &C::load_universal, Boolean(),
                   "Load a DeepSpeed universal checkpoint."))
        .Add(Value("use_node_local_storage", &C::use_node_local_storage,
                   Boolean(), "Each node writes to its own local storage."))
        .Add(Section("parallel_write", &C::parallel_write,
                     &ParallelWriteSchema(), "Parallel checkpoint writing."));
    return s;
  }();
  return *schema;
}

const Schema<CsvMonitorConfig>& CsvMonitorSchema() {
  static const auto* schema = [] {
    using M = CsvMonitorConfig;
    auto* s = new Schema<M>();
    s->Add(Value("enabled", &M::enabled, Boolean(),
                 "Write training metrics to CSV files."))
        .Add(Value("output_path", &M::output_path, String(true),
                   "Directory for the CSV files (\"\" = current directory)."))
        .Add(Value("job_name", &M::job_name, String(false),
                   "Subdirectory naming this run."));
    return s;
  }();
  return *schema;
}

// "optimizer" and "scheduler": {"type": ..., "params": {...}} where the valid
// params depend on the type, so "type" is read first.
template <typename Section, typename Type, typename Params>
void ParseTypedSection(
    const Json& v, const std::string& path, const Codec<Type>& type_codec,
    const std::function<const Schema<Params>&(Type)>& schema_for,
    Problems& problems, std::optional<Section>* out) {
  if (!v.is_object()) {
    TypeMismatch(v, path, "an object", problems);
    return;
  }
  for (const auto& item : v.items()) {
    if (item.key() != "type" && item.key() != "params") {
      const std::string nearest =
          NearestCandidate(item.key(), {"type", "params"});
      problems.Add(absl::StrCat(
          "unknown key \"", item.key(), "\" at ",
          JoinJsonPath(path, item.key()),
          nearest.empty() ? "; valid keys at " + path + ": type, params"
                          : absl::StrCat("; did you mean \"", nearest, "\"?")));
    }
  }
  const std::string type_path = JoinJsonPath(path, "type");
  if (!v.contains("type")) {
    problems.Add(absl::StrCat("missing required key ", type_path, " (expected ",
                              type_codec.type, ")"));
    return;
  }
  Section section;
  if (!type_codec.read(v["type"], type_path, problems, &section.type)) return;
  if (v.contains("params")) {
    schema_for(section.type)
        .Parse(v["params"], JoinJsonPath(path, "params"), problems,
               &section.params);
  }
  *out = std::move(section);
}

const Schema<Config>& TopSchema() {
  static const auto* schema = [] {
    using C = Config;
    auto* s = new Schema<C>();
    const Codec<Autoable<int64_t>> batch =
        AutoOr(Integer(Between(1, kMaxBatch)));
    // Batch sizes not given stay out of ToJson(); once inferred they print.
    auto batch_field = [&](std::string key, Autoable<int64_t> C::*member,
                           std::string meaning) {
      Field<C> field =
          Value(std::move(key), member, batch, std::move(meaning), "inferred");
      field.emit = [member, batch](const C& c) -> std::optional<Json> {
        const Autoable<int64_t>& value = c.*member;
        if (!value.is_auto() && value.raw_value() == 0) return std::nullopt;
        return batch.write(value);
      };
      return field;
    };
    s->Add(batch_field("train_batch_size", &C::train_batch_size,
                       "Samples per optimizer step over all ranks = micro x "
                       "accumulation x world size."))
        .Add(batch_field("train_micro_batch_size_per_gpu",
                         &C::train_micro_batch_size_per_gpu,
                         "Samples per forward/backward on one rank."))
        .Add(batch_field("gradient_accumulation_steps",
                         &C::gradient_accumulation_steps,
                         "Micro-batches accumulated per optimizer step."))
        .Add(Value("steps_per_print", &C::steps_per_print, Integer(AtLeast(1)),
                   "Log progress every this many optimizer steps."))
        .Add(Value("gradient_clipping", &C::gradient_clipping,
                   AutoOr(Number(NonNegative())),
                   "Clip gradients to this global L2 norm (0 = off)."))
        .Add(Value("prescale_gradients", &C::prescale_gradients, Boolean(),
                   "Divide gradients before the all-reduce rather than "
                   "after."))
        .Add(Value("gradient_predivide_factor", &C::gradient_predivide_factor,
                   Number(Positive()),
                   "Divide gradients by this before the all-reduce and by "
                   "world size / factor after."))
        .Add(Value("communication_data_type", &C::communication_data_type,
                   Nullable(Enum<CommDataType>({{"fp32", CommDataType::kFp32},
                                                {"fp16", CommDataType::kFp16},
                                                {"bf16", CommDataType::kBf16},
                                                {"bfp16", CommDataType::kBf16}},
                                               /*case_insensitive=*/false)),
                   "Data type of gradient communication (null = the model's)."))
        .Add(Value("wall_clock_breakdown", &C::wall_clock_breakdown, Boolean(),
                   "Time forward, backward and step separately."))
        .Add(Value("memory_breakdown", &C::memory_breakdown, Boolean(),
                   "Log memory use at each phase."))
        .Add(Value("seed", &C::seed, Integer(AtLeast(0)),
                   "zero-engine extension: seed of parameter init and every "
                   "other random stream."));

    Field<C> optimizer;
    optimizer.key = "optimizer";
    optimizer.type = "object";
    optimizer.parse = [](const Json& v, const std::string& path,
                         Problems& problems, C* out) {
      ParseTypedSection<OptimizerConfig, OptimizerType, OptimizerParams>(
          v, path, OptimizerTypeCodec(), OptimizerParamsSchema, problems,
          &out->optimizer);
    };
    optimizer.emit = [](const C& c) -> std::optional<Json> {
      if (!c.optimizer) return std::nullopt;
      Json json = Json::object();
      json["type"] = OptimizerTypeCodec().write(c.optimizer->type);
      json["params"] =
          OptimizerParamsSchema(c.optimizer->type).Emit(c.optimizer->params);
      return json;
    };
    // Its params depend on its type: ReferenceMarkdown() lists them in
    // tables of their own.
    optimizer.nested_rows = [](const std::string& path, const C&,
                               std::vector<ReferenceRow>* rows) {
      rows->push_back(
          {JoinJsonPath(path, "type"),
           absl::StrCat(OptimizerTypeCodec().type, " (case-insensitive)"),
           "required when `optimizer` is given",
           "The optimizer; its `params` are listed below."});
    };
    s->Add(std::move(optimizer));

    Field<C> scheduler;
    scheduler.key = "scheduler";
    scheduler.type = "object";
    scheduler.parse = [](const Json& v, const std::string& path,
                         Problems& problems, C* out) {
      ParseTypedSection<SchedulerConfig, SchedulerType, SchedulerParams>(
          v, path, SchedulerTypeCodec(), SchedulerParamsSchema, problems,
          &out->scheduler);
    };
    scheduler.emit = [](const C& c) -> std::optional<Json> {
      if (!c.scheduler) return std::nullopt;
      Json json = Json::object();
      json["type"] = SchedulerTypeCodec().write(c.scheduler->type);
      json["params"] =
          SchedulerParamsSchema(c.scheduler->type).Emit(c.scheduler->params);
      return json;
    };
    // Its params depend on its type: ReferenceMarkdown() lists them in
    // tables of their own.
    scheduler.nested_rows = [](const std::string& path, const C&,
                               std::vector<ReferenceRow>* rows) {
      rows->push_back(
          {JoinJsonPath(path, "type"),
           absl::StrCat(SchedulerTypeCodec().type, " (case-sensitive)"),
           "required when `scheduler` is given",
           "The scheduler; its `params` are listed below."});
    };
    s->Add(std::move(scheduler));

    s->Add(Section("fp16", &C::fp16, &Fp16Schema(), "fp16 training."))
        .Add(Section("bf16", &C::bf16, &Bf16Schema(), "bf16 training."))
        .Add(Section("zero_optimization", &C::zero_optimization, &ZeroSchema(),
                     "ZeRO."))
        .Add(Section("aio", &C::aio, &AioSchema(), "NVMe I/O."))
        .Add(Section("activation_checkpointing", &C::activation_checkpointing,
                     &ActivationCheckpointingSchema(),
                     "Activation checkpointing."))
        .Add(Section("checkpoint", &C::checkpoint, &CheckpointSchema(),
                     "Checkpoints."))
        .Add(Section("csv_monitor", &C::csv_monitor, &CsvMonitorSchema(),
                     "CSV metrics."))
        .Alias("bfloat16", "bf16");
    const std::string monitor =
        "zero-engine logs through csv_monitor only; remove this section or "
        "use \"csv_monitor\"";
    s->Unsupported("tensorboard", monitor)
        .Unsupported("wandb", monitor)
        .Unsupported("comet", monitor)
        .Unsupported("flops_profiler", "not implemented; remove this section")
        .Unsupported("amp", "use \"bf16\" or \"fp16\" instead of Apex AMP")
        .Unsupported("zero_allow_untested_optimizer",
                     "only Adam, AdamW and SGD exist, all supported by every "
                     "stage; remove this key")
        .Unsupported("zero_force_ds_cpu_optimizer",
                     "zero-engine picks the CPU optimizer for offload itself; "
                     "remove this key")
        .Unsupported("elasticity", "elastic training is not implemented")
        .Unsupported("pipeline", "pipeline parallelism is not implemented")
        .Unsupported("sparse_attention", "not implemented")
        .Unsupported("compression_training", "not implemented")
        .Unsupported("data_efficiency", "not implemented")
        .Unsupported("autotuning", "not implemented");
    return s;
  }();
  return *schema;
}

// --------------------------------------------------------- validation

// The batch triple, following DeepSpeed's _configure_train_batch_size: two
// given values determine the third, one given value sets accumulation to 1,
// and the three must satisfy train = micro x accumulation x world size.
void InferBatchTriple(Config* config, Problems& problems) {
  const int64_t world = config->world_size;
  int64_t train = config->train_batch_size.raw_value();
  int64_t micro = config->train_micro_batch_size_per_gpu.raw_value();
  int64_t accum = config->gradient_accumulation_steps.raw_value();
  auto shown = [](int64_t v) {
    return v > 0 ? absl::StrCat(v) : std::string("not given");
  };
  const std::string given = absl::StrCat(
      " (train_batch_size ", shown(train), ", train_micro_batch_size_per_gpu ",
      shown(micro), ", gradient_accumulation_steps ", shown(accum),
      ", world size ", world, ")");

  auto divide = [&](int64_t dividend, int64_t divisor, const std::string& what,
                    const std::string& divisor_text, int64_t* quotient) {
    if (dividend % divisor != 0) {
      problems.Add(absl::StrCat("train_batch_size (", dividend,
                                ") is not divisible by ", divisor_text, " = ",
                                divisor, ", so ", what, " cannot be inferred",
                                given));
      return false;
    }
    *quotient = dividend / divisor;
    return true;
  };

  if (train > 0 && micro > 0 && accum > 0) {
    // All given: checked below.
  } else if (train > 0 && micro > 0) {
    if (!divide(train, micro * world, "gradient_accumulation_steps",
                "train_micro_batch_size_per_gpu x world size", &accum)) {
      return;
    }
  } else if (train > 0 && accum > 0) {
    if (!divide(train, accum * world, "train_micro_batch_size_per_gpu",
                "gradient_accumulation_steps x world size", &micro)) {
      return;
    }
  } else if (micro > 0 && accum > 0) {
    train = micro * accum * world;
  } else if (train > 0) {
    accum = 1;
    if (!divide(train, world, "train_micro_batch_size_per_gpu", "world size",
                &micro)) {
      return;
    }
  } else if (micro > 0) {
    accum = 1;
    train = micro * world;
  } else {
    problems.Add(absl::StrCat(
        "train_batch_size or train_micro_batch_size_per_gpu must be given; "
        "gradient_accumulation_steps alone does not determine the batch",
        given));
    return;
  }
  if (train != micro * accum * world) {
    problems.Add(absl::StrCat(
        "inconsistent batch sizes at train_batch_size: train_batch_size (",
        train, ") must equal train_micro_batch_size_per_gpu (", micro,
        ") x gradient_accumulation_steps (", accum, ") x world size (", world,
        ") = ", micro * accum * world));
    return;
  }
  config->train_batch_size = train;
  config->train_micro_batch_size_per_gpu = micro;
  config->gradient_accumulation_steps = accum;
}

bool IsTrue(const Autoable<bool>& value) {
  return !value.is_auto() && value.raw_value();
}

// Rules spanning several keys. Runs on a config whose values each passed
// their own checks; fills in the batch triple when none of it is "auto".
void ValidateAcrossKeys(Config* config, Problems& problems) {
  if (IsTrue(config->fp16.enabled) && IsTrue(config->bf16.enabled)) {
    problems.Add(
        "fp16.enabled and bf16.enabled are both true; enable at most one");
  }
  if (config->communication_data_type == CommDataType::kFp16 &&
      !config->fp16.enabled.is_auto() && !config->fp16.enabled.raw_value()) {
    // Stricter than DeepSpeed: without fp16's loss scaling and overflow
    // check, gradients outside fp16's range would silently become inf or 0
    // in the reduction (and an inf norm would zero the update).
    problems.Add(
        "communication_data_type \"fp16\" needs fp16.enabled (its loss "
        "scaling keeps the gradients in fp16's range and its overflow check "
        "skips a step that leaves it); use \"bf16\" or \"fp32\"");
  }

  const ZeroConfig& zero = config->zero_optimization;
  const std::string stage = absl::StrCat(zero.stage);
  auto check_nvme_path = [&](OffloadDevice device,
                             const std::optional<std::string>& nvme_path,
                             const std::string& section) {
    if (device == OffloadDevice::kNvme && !nvme_path) {
      problems.Add(absl::StrCat(section, ".device is \"nvme\" but ", section,
                                ".nvme_path is not set"));
    }
  };
  const std::string offload_optimizer = "zero_optimization.offload_optimizer";
  const std::string offload_param = "zero_optimization.offload_param";
  check_nvme_path(zero.offload_optimizer.device,
                  zero.offload_optimizer.nvme_path, offload_optimizer);
  check_nvme_path(zero.offload_param.device, zero.offload_param.nvme_path,
                  offload_param);
  if (zero.offload_optimizer.device != OffloadDevice::kNone &&
      zero.stage == 0) {
    problems.Add(absl::StrCat(offload_optimizer,
                              ".device needs zero_optimization.stage 1, 2 or "
                              "3; stage is 0"));
  }
  if (zero.offload_optimizer.device == OffloadDevice::kNvme &&
      zero.stage != 3) {
    problems.Add(absl::StrCat(offload_optimizer,
                              ".device \"nvme\" needs zero_optimization.stage "
                              "3 (ZeRO-Infinity); stage is ",
                              stage));
  }
  if (zero.offload_param.device != OffloadDevice::kNone && zero.stage != 3) {
    problems.Add(absl::StrCat(offload_param,
                              ".device needs zero_optimization.stage 3; "
                              "stage is ",
                              stage));
  }

  if (config->optimizer && config->optimizer->type == OptimizerType::kAdamW &&
      !config->optimizer->params.adam_w_mode) {
    problems.Add(
        "optimizer.params.adam_w_mode is false but optimizer.type is AdamW, "
        "which always decouples weight decay; use type Adam for L2 decay");
  }

  if (config->scheduler) {
    const SchedulerParams& p = config->scheduler->params;
    const SchedulerType type = config->scheduler->type;
    const char* type_name = SchedulerTypeName(type);
    if ((type == SchedulerType::kWarmupDecayLR ||
         type == SchedulerType::kWarmupCosineLR) &&
        !p.total_num_steps.is_auto() && p.total_num_steps.raw_value() == 0) {
      problems.Add(
          absl::StrCat("missing required key "
                       "scheduler.params.total_num_steps (",
                       type_name, " decays until that step)"));
    }
    if (type == SchedulerType::kOneCycle) {
      for (const auto& [value, key] :
           {std::make_pair(&p.cycle_min_lr, "cycle_min_lr"),
            std::make_pair(&p.cycle_max_lr, "cycle_max_lr")}) {
        if (!*value) {
          problems.Add(absl::StrCat("missing required key scheduler.params.",
                                    key,
                                    " (OneCycle needs both ends of the "
                                    "cycle)"));
        }
      }
      if (p.cycle_min_lr && p.cycle_max_lr &&
          *p.cycle_min_lr > *p.cycle_max_lr) {
        problems.Add(absl::StrCat("scheduler.params.cycle_min_lr (",
                                  FormatDouble(*p.cycle_min_lr),
                                  ") exceeds scheduler.params.cycle_max_lr (",
                                  FormatDouble(*p.cycle_max_lr), ")"));
      }
      if (p.cycle_min_mom > p.cycle_max_mom) {
        problems.Add(absl::StrCat("scheduler.params.cycle_min_mom (",
                                  FormatDouble(p.cycle_min_mom),
                                  ") exceeds scheduler.params.cycle_max_mom (",
                                  FormatDouble(p.cycle_max_mom), ")"));
      }
    }
    if ((type == SchedulerType::kWarmupLR ||
         type == SchedulerType::kWarmupDecayLR) &&
        !p.warmup_min_lr.is_auto() && !p.warmup_max_lr.is_auto() &&
        p.warmup_min_lr.raw_value() > p.warmup_max_lr.raw_value()) {
      problems.Add(absl::StrCat("scheduler.params.warmup_min_lr (",
                                FormatDouble(p.warmup_min_lr.raw_value()),
                                ") exceeds scheduler.params.warmup_max_lr (",
                                FormatDouble(p.warmup_max_lr.raw_value()),
                                ")"));
    }
  }

  if (!config->train_batch_size.is_auto() &&
      !config->train_micro_batch_size_per_gpu.is_auto() &&
      !config->gradient_accumulation_steps.is_auto()) {
    InferBatchTriple(config, problems);
  }
}

absl::StatusOr<Config> LoadParsed(const Json& json, int world_size,
                                  absl::string_view source_name) {
  const std::string source(source_name);
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": world size must be at least 1, got ", world_size));
  }
  Config config;
  config.world_size = world_size;
  config.source = source;
  Problems problems(source);
  TopSchema().Parse(json, "", problems, &config);
  // Cross-key rules on top of broken values would only add noise.
  if (!problems.empty()) return problems.ToStatus();
  ValidateAcrossKeys(&config, problems);
  ZE_RETURN_IF_ERROR(problems.ToStatus());
  return config;
}

std::string MarkdownTable(const std::vector<ReferenceRow>& rows) {
  std::string out = "| key | type | default | meaning |\n|---|---|---|---|\n";
  for (const ReferenceRow& row : rows) {
    absl::StrAppend(&out, "| `", row.key, "` | ", row.type, " | ",
                    row.default_text, " | ", row.meaning, " |\n");
  }
  return out;
}

}  // namespace

// ------------------------------------------------------------ public API

const char* OptimizerTypeName(OptimizerType type) {
  switch (type) {
    case OptimizerType::kAdam:
      return "Adam";
    case OptimizerType::kAdamW:
      return "AdamW";
    case OptimizerType::kSgd:
      return "SGD";
  }
  return "?";
}

const char* SchedulerTypeName(SchedulerType type) {
  switch (type) {
    case SchedulerType::kWarmupLR:
      return "WarmupLR";
    case SchedulerType::kWarmupDecayLR:
      return "WarmupDecayLR";
    case SchedulerType::kWarmupCosineLR:
      return "WarmupCosineLR";
    case SchedulerType::kOneCycle:
      return "OneCycle";
  }
  return "?";
}

const char* OffloadDeviceName(OffloadDevice device) {
  switch (device) {
    case OffloadDevice::kNone:
      return "none";
    case OffloadDevice::kCpu:
      return "cpu";
    case OffloadDevice::kNvme:
      return "nvme";
  }
  return "?";
}

bool OptimizerConfig::DecoupledWeightDecay() const {
  switch (type) {
    case OptimizerType::kAdamW:
      return true;
    case OptimizerType::kAdam:
      return params.adam_w_mode;
    case OptimizerType::kSgd:
      return false;
  }
  return false;
}

TrainingPrecision GetTrainingPrecision(const Config& config) {
  if (config.bf16.enabled.value()) return TrainingPrecision::kBf16;
  if (config.fp16.enabled.value()) return TrainingPrecision::kFp16;
  return TrainingPrecision::kFp32;
}

std::vector<std::string> Config::UnresolvedAutoPaths() const {
  std::vector<std::string> paths;
  auto note = [&paths](bool is_auto, const char* path) {
    if (is_auto) paths.push_back(path);
  };
  note(train_batch_size.is_auto(), "train_batch_size");
  note(train_micro_batch_size_per_gpu.is_auto(),
       "train_micro_batch_size_per_gpu");
  note(gradient_accumulation_steps.is_auto(), "gradient_accumulation_steps");
  note(gradient_clipping.is_auto(), "gradient_clipping");
  if (optimizer) {
    const OptimizerParams& p = optimizer->params;
    note(p.lr.is_auto(), "optimizer.params.lr");
    note(p.betas.is_auto(), "optimizer.params.betas");
    note(p.eps.is_auto(), "optimizer.params.eps");
    note(p.weight_decay.is_auto(), "optimizer.params.weight_decay");
  }
  if (scheduler) {
    const SchedulerParams& p = scheduler->params;
    note(p.warmup_min_lr.is_auto(), "scheduler.params.warmup_min_lr");
    note(p.warmup_max_lr.is_auto(), "scheduler.params.warmup_max_lr");
    note(p.warmup_num_steps.is_auto(), "scheduler.params.warmup_num_steps");
    note(p.total_num_steps.is_auto(), "scheduler.params.total_num_steps");
  }
  note(fp16.enabled.is_auto(), "fp16.enabled");
  note(bf16.enabled.is_auto(), "bf16.enabled");
  note(zero_optimization.reduce_bucket_size.is_auto(),
       "zero_optimization.reduce_bucket_size");
  note(zero_optimization.stage3_prefetch_bucket_size.is_auto(),
       "zero_optimization.stage3_prefetch_bucket_size");
  note(zero_optimization.stage3_param_persistence_threshold.is_auto(),
       "zero_optimization.stage3_param_persistence_threshold");
  return paths;
}

absl::StatusOr<Config> LoadConfigString(absl::string_view json_text,
                                        int world_size,
                                        absl::string_view source_name) {
  ZE_ASSIGN_OR_RETURN(Json json,
                      ParseJsonRejectingDuplicates(json_text, source_name));
  return LoadParsed(json, world_size, source_name);
}

absl::StatusOr<Config> LoadConfigFile(const std::string& path, int world_size) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return absl::NotFoundError(
        absl::StrCat(path, ": cannot open the config file"));
  }
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) {
    return absl::DataLossError(
        absl::StrCat(path, ": reading the config file failed"));
  }
  return LoadConfigString(text.str(), world_size, path);
}

absl::StatusOr<Config> LoadConfigJson(const nlohmann::json& json,
                                      int world_size,
                                      absl::string_view source_name) {
  // Re-reading the dump gives the ordered representation the loader walks;
  // configs are small.
  return LoadParsed(Json::parse(json.dump()), world_size, source_name);
}

absl::StatusOr<Config> Resolve(const Config& config,
                               const ResolutionContext& context) {
  if (context.world_size != 0 && context.world_size != config.world_size) {
    return absl::FailedPreconditionError(
        absl::StrCat(config.source, ": the config was loaded for world size ",
                     config.world_size, " but Resolve was given world size ",
                     context.world_size));
  }
  Config resolved = config;
  Problems problems(config.source);

  // Replaces an "auto" value from `hint`, or records which hint is missing.
  auto fill = [&problems](auto* value, const auto& hint, const char* path,
                          const char* hint_name) {
    if (!value->is_auto()) return;
    if (hint) {
      *value = *hint;
    } else {
      problems.Add(absl::StrCat(path, " is \"auto\" but ResolutionContext::",
                                hint_name, " was not given"));
    }
  };

  // An "auto" batch size without a hint is treated as absent and inferred.
  auto batch = [](Autoable<int64_t>* value, std::optional<int64_t> hint) {
    if (value->is_auto()) *value = hint.value_or(0);
  };
  batch(&resolved.train_micro_batch_size_per_gpu,
        context.micro_batch_size_per_gpu);
  batch(&resolved.gradient_accumulation_steps,
        context.gradient_accumulation_steps);
  batch(&resolved.train_batch_size, std::nullopt);
  fill(&resolved.gradient_clipping, context.gradient_clipping,
       "gradient_clipping", "gradient_clipping");

  if (resolved.optimizer) {
    OptimizerParams& p = resolved.optimizer->params;
    fill(&p.lr, context.learning_rate, "optimizer.params.lr", "learning_rate");
    fill(&p.betas, context.betas, "optimizer.params.betas", "betas");
    fill(&p.eps, context.eps, "optimizer.params.eps", "eps");
    fill(&p.weight_decay, context.weight_decay, "optimizer.params.weight_decay",
         "weight_decay");
  }
  if (resolved.scheduler) {
    SchedulerParams& p = resolved.scheduler->params;
    // Hugging Face's rules: the warmup starts from 0 and peaks at the
    // optimizer's learning rate.
    if (p.warmup_min_lr.is_auto()) p.warmup_min_lr = 0.0;
    std::optional<double> peak = context.learning_rate;
    if (!peak && resolved.optimizer &&
        !resolved.optimizer->params.lr.is_auto()) {
      peak = resolved.optimizer->params.lr.raw_value();
    }
    fill(&p.warmup_max_lr, peak, "scheduler.params.warmup_max_lr",
         "learning_rate");
    fill(&p.warmup_num_steps, context.warmup_num_steps,
         "scheduler.params.warmup_num_steps", "warmup_num_steps");
    fill(&p.total_num_steps, context.total_num_steps,
         "scheduler.params.total_num_steps", "total_num_steps");
  }

  std::optional<bool> fp16, bf16;
  if (context.precision) {
    fp16 = *context.precision == TrainingPrecision::kFp16;
    bf16 = *context.precision == TrainingPrecision::kBf16;
  }
  fill(&resolved.fp16.enabled, fp16, "fp16.enabled", "precision");
  fill(&resolved.bf16.enabled, bf16, "bf16.enabled", "precision");

  ZeroConfig& zero = resolved.zero_optimization;
  std::optional<int64_t> square, prefetch, persistence;
  if (context.hidden_size) {
    const int64_t h = *context.hidden_size;
    if (h < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(config.source,
                       ": ResolutionContext::hidden_size must be positive, "
                       "got ",
                       h));
    }
    square = h * h;
    prefetch = static_cast<int64_t>(0.9 * static_cast<double>(h * h));
    persistence = 10 * h;
  }
  fill(&zero.reduce_bucket_size, square, "zero_optimization.reduce_bucket_size",
       "hidden_size");
  fill(&zero.stage3_prefetch_bucket_size, prefetch,
       "zero_optimization.stage3_prefetch_bucket_size", "hidden_size");
  fill(&zero.stage3_param_persistence_threshold, persistence,
       "zero_optimization.stage3_param_persistence_threshold", "hidden_size");

  ZE_RETURN_IF_ERROR(problems.ToStatus());

  // Hints are user input too: check them with the same rules as the file by
  // reloading the resolved config, then apply the cross-key rules.
  Json json = TopSchema().Emit(resolved);
  return LoadParsed(json, resolved.world_size, config.source);
}

std::string ToJson(const Config& config) {
  return TopSchema().Emit(config).dump(2);
}

std::string ReferenceMarkdown() {
  std::string out =
      "Keys follow DeepSpeed's `ds_config.json`: same names, meanings and "
      "defaults. zero-engine is stricter: unknown or duplicate keys, wrong "
      "types and out-of-range values are errors. Values marked `\"auto\"` "
      "are filled in from the model and run (Hugging Face style). "
      "This reference is generated from the code (`config/print_reference`).\n"
      "\n## Top level and sections\n\n";
  std::vector<ReferenceRow> rows;
  TopSchema().Rows("", Config{}, &rows);
  absl::StrAppend(&out, MarkdownTable(rows));
  std::vector<std::string> notes;
  TopSchema().Notes("", &notes);
  absl::StrAppend(&out, "\nAliases and DeepSpeed keys zero-engine rejects:\n\n",
                  absl::StrJoin(notes, "\n"), "\n");

  absl::StrAppend(&out,
                  "\n## optimizer\n\nWithout an `optimizer` section the "
                  "client supplies the optimizer. `optimizer.params` by "
                  "`optimizer.type`:\n");
  for (OptimizerType type : {OptimizerType::kAdam, OptimizerType::kSgd}) {
    rows.clear();
    OptimizerParamsSchema(type).Rows("optimizer.params", OptimizerParams{},
                                     &rows);
    absl::StrAppend(&out, "\n### ",
                    type == OptimizerType::kSgd ? "SGD" : "Adam, AdamW", "\n\n",
                    MarkdownTable(rows));
  }

  absl::StrAppend(&out,
                  "\n## scheduler\n\nWithout a `scheduler` section the "
                  "learning rate is constant. `scheduler.params` by "
                  "`scheduler.type`:\n");
  for (SchedulerType type :
       {SchedulerType::kWarmupLR, SchedulerType::kWarmupDecayLR,
        SchedulerType::kWarmupCosineLR, SchedulerType::kOneCycle}) {
    rows.clear();
    SchedulerParamsSchema(type).Rows("scheduler.params", SchedulerParams{},
                                     &rows);
    absl::StrAppend(&out, "\n### ", SchedulerTypeName(type), "\n\n",
                    MarkdownTable(rows));
  }
  return out;
}

// ------------------------------------------------------------- equality

bool OptimizerParams::operator==(const OptimizerParams& o) const {
  return std::tie(lr, betas, eps, weight_decay, momentum, torch_adam,
                  adam_w_mode) == std::tie(o.lr, o.betas, o.eps, o.weight_decay,
                                           o.momentum, o.torch_adam,
                                           o.adam_w_mode);
}

bool OptimizerConfig::operator==(const OptimizerConfig& o) const {
  return type == o.type && params == o.params;
}

bool SchedulerParams::operator==(const SchedulerParams& o) const {
  return std::tie(warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type,
                  total_num_steps, warmup_min_ratio, cos_min_ratio,
                  cycle_min_lr, cycle_max_lr, decay_lr_rate,
                  cycle_first_step_size, cycle_second_step_size,
                  cycle_first_stair_count, cycle_second_stair_count,
                  decay_step_size, cycle_momentum, cycle_min_mom, cycle_max_mom,
                  decay_mom_rate, last_batch_iteration) ==
         std::tie(o.warmup_min_lr, o.warmup_max_lr, o.warmup_num_steps,
                  o.warmup_type, o.total_num_steps, o.warmup_min_ratio,
                  o.cos_min_ratio, o.cycle_min_lr, o.cycle_max_lr,
                  o.decay_lr_rate, o.cycle_first_step_size,
                  o.cycle_second_step_size, o.cycle_first_stair_count,
                  o.cycle_second_stair_count, o.decay_step_size,
                  o.cycle_momentum, o.cycle_min_mom, o.cycle_max_mom,
                  o.decay_mom_rate, o.last_batch_iteration);
}

bool SchedulerConfig::operator==(const SchedulerConfig& o) const {
  return type == o.type && params == o.params;
}

bool Fp16Config::operator==(const Fp16Config& o) const {
  return std::tie(enabled, auto_cast, loss_scale, initial_scale_power,
                  loss_scale_window, hysteresis, consecutive_hysteresis,
                  min_loss_scale) ==
         std::tie(o.enabled, o.auto_cast, o.loss_scale, o.initial_scale_power,
                  o.loss_scale_window, o.hysteresis, o.consecutive_hysteresis,
                  o.min_loss_scale);
}

bool Bf16Config::operator==(const Bf16Config& o) const {
  return enabled == o.enabled;
}

bool OffloadOptimizerConfig::operator==(const OffloadOptimizerConfig& o) const {
  return std::tie(device, nvme_path, pin_memory, buffer_count, pipeline_read,
                  pipeline_write, fast_init, ratio) ==
         std::tie(o.device, o.nvme_path, o.pin_memory, o.buffer_count,
                  o.pipeline_read, o.pipeline_write, o.fast_init, o.ratio);
}

bool OffloadParamConfig::operator==(const OffloadParamConfig& o) const {
  return std::tie(device, nvme_path, pin_memory, buffer_count, buffer_size,
                  max_in_cpu) == std::tie(o.device, o.nvme_path, o.pin_memory,
                                          o.buffer_count, o.buffer_size,
                                          o.max_in_cpu);
}

bool ZeroConfig::operator==(const ZeroConfig& o) const {
  return std::tie(
             stage, contiguous_gradients, overlap_comm, reduce_scatter,
             reduce_bucket_size, allgather_partitions, allgather_bucket_size,
             round_robin_gradients, load_from_fp32_weights, elastic_checkpoint,
             ignore_unused_parameters, offload_optimizer, offload_param,
             stage3_prefetch_bucket_size, stage3_param_persistence_threshold,
             stage3_model_persistence_threshold, stage3_max_live_parameters,
             stage3_max_reuse_distance,
             stage3_gather_16bit_weights_on_model_save, sub_group_size,
             zero_hpz_partition_size, zero_quantized_weights,
             zero_quantized_gradients, mics_shard_size,
             mics_hierarchical_params_gather) ==
         std::tie(o.stage, o.contiguous_gradients, o.overlap_comm,
                  o.reduce_scatter, o.reduce_bucket_size,
                  o.allgather_partitions, o.allgather_bucket_size,
                  o.round_robin_gradients, o.load_from_fp32_weights,
                  o.elastic_checkpoint, o.ignore_unused_parameters,
                  o.offload_optimizer, o.offload_param,
                  o.stage3_prefetch_bucket_size,
                  o.stage3_param_persistence_threshold,
                  o.stage3_model_persistence_threshold,
                  o.stage3_max_live_parameters, o.stage3_max_reuse_distance,
                  o.stage3_gather_16bit_weights_on_model_save, o.sub_group_size,
                  o.zero_hpz_partition_size, o.zero_quantized_weights,
                  o.zero_quantized_gradients, o.mics_shard_size,
                  o.mics_hierarchical_params_gather);
}

bool AioConfig::operator==(const AioConfig& o) const {
  return std::tie(block_size, queue_depth, thread_count, single_submit,
                  overlap_events) == std::tie(o.block_size, o.queue_depth,
                                              o.thread_count, o.single_submit,
                                              o.overlap_events);
}

bool ActivationCheckpointingConfig::operator==(
    const ActivationCheckpointingConfig& o) const {
  return std::tie(partition_activations, cpu_checkpointing,
                  contiguous_memory_optimization, number_checkpoints,
                  synchronize_checkpoint_boundary, profile) ==
         std::tie(o.partition_activations, o.cpu_checkpointing,
                  o.contiguous_memory_optimization, o.number_checkpoints,
                  o.synchronize_checkpoint_boundary, o.profile);
}

bool ParallelWriteConfig::operator==(const ParallelWriteConfig& o) const {
  return pipeline_stage == o.pipeline_stage;
}

bool CheckpointConfig::operator==(const CheckpointConfig& o) const {
  return std::tie(tag_validation, load_universal, use_node_local_storage,
                  parallel_write) ==
         std::tie(o.tag_validation, o.load_universal, o.use_node_local_storage,
                  o.parallel_write);
}

bool CsvMonitorConfig::operator==(const CsvMonitorConfig& o) const {
  return std::tie(enabled, output_path, job_name) ==
         std::tie(o.enabled, o.output_path, o.job_name);
}

bool Config::operator==(const Config& o) const {
  return std::tie(
             train_batch_size, train_micro_batch_size_per_gpu,
             gradient_accumulation_steps, steps_per_print, gradient_clipping,
             prescale_gradients, gradient_predivide_factor,
             communication_data_type, wall_clock_breakdown, memory_breakdown,
             seed, optimizer, scheduler, fp16, bf16, zero_optimization, aio,
             activation_checkpointing, checkpoint, csv_monitor, world_size) ==
         std::tie(o.train_batch_size, o.train_micro_batch_size_per_gpu,
                  o.gradient_accumulation_steps, o.steps_per_print,
                  o.gradient_clipping, o.prescale_gradients,
                  o.gradient_predivide_factor, o.communication_data_type,
                  o.wall_clock_breakdown, o.memory_breakdown, o.seed,
                  o.optimizer, o.scheduler, o.fp16, o.bf16, o.zero_optimization,
                  o.aio, o.activation_checkpointing, o.checkpoint,
                  o.csv_monitor, o.world_size);
}

}  // namespace config
}  // namespace ze
