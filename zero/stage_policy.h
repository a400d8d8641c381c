// What a ZeRO stage number means, as named booleans, so code asks "are the
// gradients partitioned?" instead of comparing the stage number (issue 26
// item 2). Derived once from zero_optimization.stage; PartitionState carries
// it and zero/plan.h exports it with the rest of the plan.
#ifndef ZE_ZERO_STAGE_POLICY_H_
#define ZE_ZERO_STAGE_POLICY_H_

namespace ze {
namespace zero {

//   stage  optimizer state  gradients    parameters
//   0      replicated       replicated   replicated
//   1      partitioned      replicated   replicated
//   2      partitioned      partitioned  replicated
//   3      partitioned      partitioned  partitioned
struct StagePolicy {
  // Each rank updates only its slice of every bucket (stage >= 1); at
  // stage 0 every rank updates whole buckets.
  bool partition_optimizer = false;
  // Gradients are reduced into this rank's slice, with no replicated
  // gradient buffer (stage >= 2).
  bool partition_gradients = false;
  // The weights are partitioned and gathered around each module's use
  // (stage >= 3).
  bool partition_parameters = false;

  // The policy of `stage`. A stage outside 0-3 (config/ refuses those)
  // maps to the nearest end: below 0 as 0, above 3 as 3.
  static constexpr StagePolicy ForStage(int stage) {
    StagePolicy policy;
    policy.partition_optimizer = stage >= 1;
    policy.partition_gradients = stage >= 2;
    policy.partition_parameters = stage >= 3;
    return policy;
  }
};

}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_STAGE_POLICY_H_
