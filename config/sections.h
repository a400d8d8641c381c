// The section tables: for each config section, the Schema listing its keys.
// Internal to //config; users see config.h.
#ifndef ZE_CONFIG_SECTIONS_H_
#define ZE_CONFIG_SECTIONS_H_

#include "config/config.h"
#include "config/schema.h"

namespace ze {
namespace config {
namespace internal {

// Batch sizes stay far below this, so micro x accumulation x world size
// cannot overflow.
inline constexpr int64_t kMaxBatch = int64_t{1} << 40;

// The whole config: top-level keys and every section (sections.cc).
const Schema<Config>& TopSchema();

// "optimizer.params" and "scheduler.params": which keys are valid depends on
// the type (typed_sections.cc).
const Schema<OptimizerParams>& OptimizerParamsSchema(OptimizerType type);
const Schema<SchedulerParams>& SchedulerParamsSchema(SchedulerType type);

// The top-level "optimizer" and "scheduler" fields ({"type", "params"}),
// for TopSchema() (typed_sections.cc).
Field<Config> OptimizerField();
Field<Config> SchedulerField();

}  // namespace internal
}  // namespace config
}  // namespace ze

#endif  // ZE_CONFIG_SECTIONS_H_
