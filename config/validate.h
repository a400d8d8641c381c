// Loading a parsed JSON document into a Config: every key through its
// section table, then the rules spanning several keys (fp16 vs bf16, offload
// vs stage, scheduler requirements) and the batch triple. Internal to
// //config; LoadConfigFile/String/Json and Resolve() call it.
#ifndef ZE_CONFIG_VALIDATE_H_
#define ZE_CONFIG_VALIDATE_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "config/codec.h"
#include "config/config.h"

namespace ze {
namespace config {
namespace internal {

// Reads `json` for a run of `world_size` ranks and validates it. The rules
// spanning several keys run in the same pass as each key's own checks (a
// rule is skipped only when one of its keys was itself rejected), so every
// problem of a file is reported at once; the batch triple is inferred unless
// one of its three values is still "auto". Warnings go to
// Config::load_warnings. Errors: InvalidArgument listing every problem, one
// per line, each starting with `source_name`; also for a world size below 1.
absl::StatusOr<Config> ParseAndValidate(const Json& json, int world_size,
                                        absl::string_view source_name);

}  // namespace internal
}  // namespace config
}  // namespace ze

#endif  // ZE_CONFIG_VALIDATE_H_
