// Validates a DeepSpeed-style config file the way the engine will, and prints
// the config with every default filled in (or every problem found).
//
//   check_config ds_config.json [world_size]
//
// Exit status: 0 valid, 1 invalid, 2 usage. "auto" values are reported as
// such; they are resolved only when the engine knows the model.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "config/config.h"

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: %s CONFIG.json [WORLD_SIZE]\n", argv[0]);
    return 2;
  }
  const int world_size = argc == 3 ? std::atoi(argv[2]) : 1;
  absl::StatusOr<ze::config::Config> config =
      ze::config::LoadConfigFile(argv[1], world_size);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n",
                 std::string(config.status().message()).c_str());
    return 1;
  }
  std::printf("%s\n", ze::config::ToJson(*config).c_str());
  for (const std::string& path : config->UnresolvedAutoPaths()) {
    std::fprintf(stderr, "note: %s is \"auto\", resolved by the engine\n",
                 path.c_str());
  }
  return 0;
}
