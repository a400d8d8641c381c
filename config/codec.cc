#include "config/codec.h"

namespace ze {
namespace config {
namespace internal {

std::string Where(const std::string& path) {
  return path.empty() ? std::string("the top level") : path;
}

bool IsAutoString(const Json& value) {
  return value.is_string() && value.get_ref<const std::string&>() == "auto";
}

std::string FormatDouble(double value) { return Json(value).dump(); }

namespace {

std::string WithRule(const std::string& base, const std::string& rule) {
  return rule.empty() ? base : absl::StrCat(base, " ", rule);
}

}  // namespace

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

Codec<bool> Present() {
  Codec<bool> codec;
  codec.type = "any value";
  codec.read = [](const Json&, const std::string&, Problems&, bool* out) {
    *out = true;
    return true;
  };
  codec.write = [](const bool& v) { return Json(v); };
  return codec;
}

Codec<bool> SectionEnabled(bool enabled_by_default) {
  Codec<bool> codec;
  codec.type = "object";
  codec.read = [enabled_by_default](const Json& v, const std::string& path,
                                    Problems& problems, bool* out) {
    if (!v.is_object()) {
      TypeMismatch(v, path, "an object", problems);
      return false;
    }
    auto enabled = v.find("enabled");
    *out = enabled != v.end() && enabled->is_boolean() ? enabled->get<bool>()
                                                       : enabled_by_default;
    return true;
  };
  codec.write = [](const bool& v) { return Json(v); };
  return codec;
}

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

}  // namespace internal
}  // namespace config
}  // namespace ze
