// Prints the config reference (Markdown) that docs/config.md holds. The table
// is generated from the defaults and rules the loader uses, so it cannot go
// stale: regenerate it with
//   (head -4 docs/config.md; bazel-bin/config/print_reference) > new.md
// and move new.md over docs/config.md (config:config_doc_test checks it).
#include <cstdio>

#include "config/config.h"

int main() {
  const std::string reference = ze::config::ReferenceMarkdown();
  std::fwrite(reference.data(), 1, reference.size(), stdout);
  return 0;
}
