// The schema machinery: a Field describes one JSON key of a section struct
// (how it is parsed, printed, compared and documented); a Schema is a
// section's table of fields, with aliases, rejected DeepSpeed keys and
// "did you mean" for unknown ones. Parsing, ToJson(), ReferenceMarkdown(),
// operator== and UnresolvedAutoPaths() all walk these tables, so a key added
// to a table takes part in all of them. Internal to //config.
#ifndef ZE_CONFIG_SCHEMA_H_
#define ZE_CONFIG_SCHEMA_H_

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "config/codec.h"
#include "config/strict_json.h"
#include "core/status.h"

namespace ze {
namespace config {
namespace internal {

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
  // Whether two structs agree on this key (nested sections: on every key of
  // theirs). Required: the structs' operator== is derived from it, so a key
  // added to a table takes part in equality without further code.
  std::function<bool(const S&, const S&)> equal;
  // Sections append their keys set without effect (Schema::Ineffective).
  std::function<void(const std::string& path, const S& value, const S& defaults,
                     std::vector<ConfigWarning>*)>
      nested_ineffective;
  // Appends the JSON path of every value under this key still holding
  // "auto". Empty for keys that cannot be "auto".
  std::function<void(const std::string& path, const S&,
                     std::vector<std::string>*)>
      auto_paths;
};

template <typename S>
class Schema {
 public:
  Schema& Add(Field<S> field) {
    fields_.push_back(std::move(field));
    return *this;
  }
  // `alias` is read as `canonical` (a field or an Ignored key); giving both
  // is an error, as in DeepSpeed (pydantic refuses the second spelling).
  Schema& Alias(std::string alias, std::string canonical) {
    aliases_.emplace(std::move(alias), std::move(canonical));
    return *this;
  }
  // As Alias, for a spelling DeepSpeed still reads but has deprecated: using
  // it also warns.
  Schema& Deprecated(std::string old_key, std::string canonical) {
    deprecated_.insert(old_key);
    return Alias(std::move(old_key), std::move(canonical));
  }
  // A key DeepSpeed knows that zero-engine rejects, with the reason (chiefly
  // what DeepSpeed 0.19.8 itself rejects: removed features).
  Schema& Unsupported(std::string key, std::string reason) {
    unsupported_.emplace(std::move(key), std::move(reason));
    return *this;
  }
  // A key (already added) that zero-engine accepts, so DeepSpeed configs
  // load unchanged, but that changes nothing here, with the reason. The
  // reference lists it; Ineffective() reports it when it is set.
  Schema& WithoutEffect(const std::string& key, std::string reason) {
    ZE_CHECK(Find(key) != nullptr);
    without_effect_.emplace(key, std::move(reason));
    return *this;
  }
  // A key DeepSpeed reads that zero-engine checks with `codec` and then
  // ignores (a feature it lacks, or a choice it makes itself). No struct
  // member holds it: a value other than `inert` (always, when `inert` is
  // nullopt) is a load warning naming the key and `reason`.
  template <typename T>
  Schema& Ignored(std::string key, Codec<T> codec, std::optional<T> inert,
                  std::string reason) {
    IgnoredKey ignored;
    ignored.reason = reason;
    ignored.check = [codec, inert, reason](const Json& v,
                                           const std::string& path,
                                           Problems& problems) {
      T value{};
      if (!codec.read(v, path, problems, &value)) {
        problems.MarkBad(path);
        return;
      }
      if (!inert || !(value == *inert)) {
        problems.Warn(path, absl::StrCat("is ignored: ", reason));
      }
    };
    ignored_.emplace(std::move(key), std::move(ignored));
    return *this;
  }
  // A deprecated boolean DeepSpeed still reads, which the key `replaced_by`
  // of this section superseded: true is read as `replacement` (`apply`
  // sets it), false does nothing; either warns. Given together with
  // `replaced_by` it is an error, as in DeepSpeed (even when false). ToJson()
  // prints only the replacement.
  Schema& DeprecatedFlag(std::string key, std::string replaced_by,
                         std::string replacement,
                         std::function<void(S*)> apply) {
    deprecated_flags_.emplace(
        std::move(key),
        DeprecatedFlagKey{std::move(replaced_by), std::move(replacement),
                          std::move(apply)});
    return *this;
  }
  // Unknown keys that are no near miss of a known one (no "did you mean")
  // are accepted with a warning giving `reason`, instead of being errors.
  // Only for the objects DeepSpeed reads from a plain dict, ignoring the
  // rest (the top level, aio, activation_checkpointing, checkpoint); its
  // pydantic sections (fp16, bf16, zero_optimization, csv_monitor, ...)
  // refuse unknown keys, and so do ours.
  Schema& WarnOnUnknownKeys(std::string reason) {
    unknown_reason_ = std::move(reason);
    return *this;
  }
  // Runs after the keys are read, with the object as written, for defaults
  // that depend on other keys or on whether a key was given, and for rules
  // between keys of this object.
  Schema& AfterParse(
      std::function<void(const Json&, const std::string& path, Problems&, S*)>
          hook) {
    after_parse_ = std::move(hook);
    return *this;
  }

  // Reads `object` into `out`; keys not in the JSON keep their values in
  // `out` (the defaults). Records a problem for every bad key or value, and
  // a warning for every key accepted and ignored.
  void Parse(const Json& object, const std::string& path, Problems& problems,
             S* out) const {
    if (!object.is_object()) {
      TypeMismatch(object, path, "an object", problems);
      problems.MarkBad(path);
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
      if (auto flag = deprecated_flags_.find(key);
          flag != deprecated_flags_.end()) {
        ParseDeprecatedFlag(key, flag->second, object, item.value(), path,
                            problems, out);
        continue;
      }
      const Field<S>* field = Find(canonical);
      auto ignored = ignored_.find(canonical);
      if (field == nullptr && ignored == ignored_.end()) {
        ReportUnknown(key, path, problems);
        continue;
      }
      if (auto [it, inserted] = seen_as.emplace(canonical, key); !inserted) {
        problems.Add(absl::StrCat(
            "both \"", it->second, "\" and \"", key, "\" are given at ",
            Where(path), " (", key == canonical ? it->second : key,
            " is an alias of ", canonical, "); keep one"));
        problems.MarkBad(JoinJsonPath(path, canonical));
        continue;
      }
      if (deprecated_.count(key) != 0) {
        problems.Warn(key_path,
                      absl::StrCat("is deprecated by DeepSpeed (which still "
                                   "reads it); read as ",
                                   JoinJsonPath(path, canonical),
                                   ", the spelling to use"));
      }
      if (field != nullptr) {
        field->parse(item.value(), key_path, problems, out);
      } else {
        ignored->second.check(item.value(), key_path, problems);
      }
    }
    if (after_parse_) after_parse_(object, path, problems, out);
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

  // One Markdown bullet per alias, deprecated spelling, rejected DeepSpeed
  // key, key without effect and ignored key, here and in nested sections.
  void Notes(const std::string& path, std::vector<std::string>* notes) const {
    for (const auto& [alias, canonical] : aliases_) {
      notes->push_back(absl::StrCat(
          "- `", JoinJsonPath(path, alias), "` is accepted as ",
          deprecated_.count(alias) != 0 ? "a deprecated spelling (warning)"
                                        : "an alias",
          " of `", JoinJsonPath(path, canonical), "`."));
    }
    for (const auto& [key, flag] : deprecated_flags_) {
      notes->push_back(absl::StrCat(
          "- `", JoinJsonPath(path, key),
          "` (boolean) is accepted as deprecated (warning): true is read as ",
          flag.replacement, "; not together with `",
          JoinJsonPath(path, flag.replaced_by), "`."));
    }
    for (const auto& [key, reason] : unsupported_) {
      notes->push_back(absl::StrCat("- `", JoinJsonPath(path, key),
                                    "` is rejected: ", reason, "."));
    }
    for (const auto& [key, reason] : without_effect_) {
      notes->push_back(absl::StrCat("- `", JoinJsonPath(path, key),
                                    "` is accepted but has no effect: ", reason,
                                    "."));
    }
    for (const auto& [key, ignored] : ignored_) {
      notes->push_back(absl::StrCat(
          "- `", JoinJsonPath(path, key),
          "` is accepted and ignored (warning): ", ignored.reason, "."));
    }
    if (!unknown_reason_.empty()) {
      notes->push_back(absl::StrCat(
          "- Any other key at ", Where(path),
          " is accepted and ignored (warning) unless it is a near miss of a "
          "known key (then an error with \"did you mean\"): ",
          unknown_reason_, "."));
    }
    for (const Field<S>& field : fields_) {
      if (field.nested_notes) {
        field.nested_notes(JoinJsonPath(path, field.key), notes);
      }
    }
  }

  // True when `a` and `b` agree on every key of this schema. Members that
  // are not keys (Config::world_size, Config::source) are not compared.
  bool Equal(const S& a, const S& b) const {
    for (const Field<S>& field : fields_) {
      ZE_CHECK(field.equal);  // every field must take part in equality
      if (!field.equal(a, b)) return false;
    }
    return true;
  }

  // Appends every key marked WithoutEffect (here and in nested sections)
  // whose value in `value` differs from `defaults`, in table order.
  void Ineffective(const std::string& path, const S& value, const S& defaults,
                   std::vector<ConfigWarning>* out) const {
    for (const Field<S>& field : fields_) {
      const std::string key_path = JoinJsonPath(path, field.key);
      if (field.nested_ineffective) {
        field.nested_ineffective(key_path, value, defaults, out);
        continue;
      }
      auto reason = without_effect_.find(field.key);
      if (reason != without_effect_.end() && !field.equal(value, defaults)) {
        out->push_back(
            {key_path, absl::StrCat("is set but has no effect in zero-engine: ",
                                    reason->second)});
      }
    }
  }

  // Appends the JSON path of every value in `value` still holding "auto", in
  // table order.
  void AutoPaths(const std::string& path, const S& value,
                 std::vector<std::string>* paths) const {
    for (const Field<S>& field : fields_) {
      if (field.auto_paths) {
        field.auto_paths(JoinJsonPath(path, field.key), value, paths);
      }
    }
  }

  const std::vector<Field<S>>& fields() const { return fields_; }

  std::vector<std::string> Keys() const {
    std::vector<std::string> keys;
    for (const Field<S>& field : fields_) keys.push_back(field.key);
    return keys;
  }

 private:
  struct IgnoredKey {
    std::string reason;
    std::function<void(const Json&, const std::string& path, Problems&)> check;
  };
  struct DeprecatedFlagKey {
    std::string replaced_by;
    std::string replacement;
    std::function<void(S*)> apply;
  };

  void ParseDeprecatedFlag(const std::string& key,
                           const DeprecatedFlagKey& flag, const Json& object,
                           const Json& value, const std::string& path,
                           Problems& problems, S* out) const {
    const std::string key_path = JoinJsonPath(path, key);
    bool on = false;
    if (!Boolean().read(value, key_path, problems, &on)) {
      problems.MarkBad(key_path);
      return;
    }
    if (object.contains(flag.replaced_by)) {
      problems.Add(absl::StrCat("both ", key_path, " (deprecated) and ",
                                JoinJsonPath(path, flag.replaced_by),
                                " are given; keep ", flag.replaced_by));
      problems.MarkBad(JoinJsonPath(path, flag.replaced_by));
      return;
    }
    problems.Warn(
        key_path,
        absl::StrCat("is deprecated by DeepSpeed (which still reads "
                     "it); ",
                     on ? absl::StrCat("true is read as ", flag.replacement,
                                       ", the spelling to use")
                        : std::string("false does nothing")));
    if (on) flag.apply(out);
  }

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
    // Every spelling this section knows, so that a typo of an ignored or a
    // rejected key is caught as a typo too.
    std::vector<std::string> candidates = Keys();
    for (const auto& alias : aliases_) candidates.push_back(alias.first);
    for (const auto& ignored : ignored_) candidates.push_back(ignored.first);
    for (const auto& flag : deprecated_flags_) {
      candidates.push_back(flag.first);
    }
    for (const auto& rejected : unsupported_) {
      candidates.push_back(rejected.first);
    }
    const std::string nearest = NearestCandidate(key, candidates);
    if (!nearest.empty()) {
      problems.Add(absl::StrCat("unknown key \"", key, "\" at ", key_path,
                                "; did you mean \"", nearest, "\"?"));
    } else if (!unknown_reason_.empty()) {
      problems.Warn(key_path, absl::StrCat("is ignored: ", unknown_reason_));
    } else {
      problems.Add(absl::StrCat("unknown key \"", key, "\" at ", key_path,
                                "; valid keys at ", Where(path), ": ",
                                absl::StrJoin(Keys(), ", ")));
    }
  }

  std::vector<Field<S>> fields_;
  std::map<std::string, std::string> aliases_;
  std::set<std::string> deprecated_;
  std::map<std::string, std::string> unsupported_;
  std::map<std::string, std::string> without_effect_;
  std::map<std::string, IgnoredKey> ignored_;
  std::map<std::string, DeprecatedFlagKey> deprecated_flags_;
  std::string unknown_reason_;
  std::function<void(const Json&, const std::string&, Problems&, S*)>
      after_parse_;
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
    if (codec.read(v, path, problems, &value)) {
      out->*member = std::move(value);
    } else {
      problems.MarkBad(path);
    }
  };
  field.emit = [member, codec](const S& s) -> std::optional<Json> {
    return codec.write(s.*member);
  };
  field.equal = [member](const S& a, const S& b) {
    return a.*member == b.*member;
  };
  if (codec.is_auto) {
    field.auto_paths = [member, codec](const std::string& path, const S& s,
                                       std::vector<std::string>* paths) {
      if (codec.is_auto(s.*member)) paths->push_back(path);
    };
  }
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
  field.nested_ineffective = [member, schema](const std::string& path,
                                              const S& value, const S& defaults,
                                              std::vector<ConfigWarning>* out) {
    schema->Ineffective(path, value.*member, defaults.*member, out);
  };
  field.equal = [member, schema](const S& a, const S& b) {
    return schema->Equal(a.*member, b.*member);
  };
  field.auto_paths = [member, schema](const std::string& path, const S& s,
                                      std::vector<std::string>* paths) {
    schema->AutoPaths(path, s.*member, paths);
  };
  return field;
}

// The rows as a Markdown table: key, type, default, meaning.
std::string MarkdownTable(const std::vector<ReferenceRow>& rows);

}  // namespace internal
}  // namespace config
}  // namespace ze

#endif  // ZE_CONFIG_SCHEMA_H_
