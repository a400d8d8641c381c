// Validates a DeepSpeed-style config file the way the engine will, and prints
// the config with every default filled in (or every problem found).
//
//   check_config ds_config.json [world_size]
//
// Exit status: 0 valid (warnings, if any, on stderr); 2 bad input: an
// invalid config, a file that cannot be read, or bad arguments. "auto"
// values are reported as such; they are resolved only when the engine knows
// the model.
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "config/config.h"

namespace {

constexpr int kBadInput = 2;

void PrintUsage(std::FILE* out, const char* program) {
  std::fprintf(
      out,
      "usage: %s CONFIG.json [WORLD_SIZE]\n"
      "\n"
      "Loads a DeepSpeed ds_config.json as zero-engine's trainer does, for a\n"
      "run of WORLD_SIZE ranks (default 1; the batch triple is checked\n"
      "against it), and prints it with every default filled in. Warnings\n"
      "(keys accepted and ignored, deprecated spellings, keys without\n"
      "effect) go to stderr; so does every problem of an invalid config,\n"
      "one per line, each naming the file and the key.\n"
      "\n"
      "Exit status: 0 the config is valid; 2 bad input (an invalid config,\n"
      "a file that cannot be read, bad arguments).\n",
      program);
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 ||
        std::strcmp(argv[i], "-h") == 0) {
      PrintUsage(stdout, argv[0]);
      return 0;
    }
  }
  if (argc < 2 || argc > 3 || argv[1][0] == '-') {
    PrintUsage(stderr, argv[0]);
    return kBadInput;
  }
  int world_size = 1;
  if (argc == 3 &&
      (!absl::SimpleAtoi(argv[2], &world_size) || world_size < 1)) {
    std::fprintf(stderr,
                 "%s: WORLD_SIZE must be a positive integer, got \"%s\"\n",
                 argv[0], argv[2]);
    return kBadInput;
  }
  absl::StatusOr<ze::config::Config> config =
      ze::config::LoadConfigFile(argv[1], world_size);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n",
                 std::string(config.status().message()).c_str());
    return kBadInput;
  }
  std::printf("%s\n", ze::config::ToJson(*config).c_str());
  for (const ze::config::ConfigWarning& warning :
       ze::config::ConfigWarnings(*config)) {
    std::fprintf(stderr, "warning: %s: %s %s\n", config->source.c_str(),
                 warning.key.c_str(), warning.message.c_str());
  }
  for (const std::string& path : config->UnresolvedAutoPaths()) {
    std::fprintf(stderr, "note: %s is \"auto\", resolved by the engine\n",
                 path.c_str());
  }
  return 0;
}
