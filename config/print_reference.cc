// Prints the config reference table (Markdown) for the README. The table is
// generated from the defaults and rules the loader uses, so it cannot go
// stale: regenerate it with
//   bazel run //config:print_reference > docs/config_reference.md
#include <cstdio>

#include "config/config.h"

int main() {
  const std::string reference = ze::config::ReferenceMarkdown();
  std::fwrite(reference.data(), 1, reference.size(), stdout);
  return 0;
}
