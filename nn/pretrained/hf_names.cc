#include "nn/pretrained/hf_names.h"

#include <cctype>
#include <string>

#include "absl/strings/strip.h"

namespace ze {
namespace nn {

bool SplitIndexedName(absl::string_view name, absl::string_view prefix,
                      int *index, absl::string_view *rest) {
  if (!absl::ConsumePrefix(&name, prefix)) return false;
  size_t digits = 0;
  while (digits < name.size() &&
         std::isdigit(static_cast<unsigned char>(name[digits]))) {
    ++digits;
  }
  if (digits == 0 || digits > 6 || digits >= name.size() ||
      name[digits] != '.' || (digits > 1 && name[0] == '0')) {
    return false;
  }
  *index = std::stoi(std::string(name.substr(0, digits)));
  *rest = name.substr(digits + 1);
  return true;
}

}  // namespace nn
}  // namespace ze
