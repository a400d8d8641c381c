// Test-only controls of functional_cuda.h's cuBLASLt epilogue fusions. Not
// for production code: the production choice (GELU_AUX_BIAS forward, DGELU
// followed by the column-sum kernel backward) is fixed in
// functional_cuda.cc as the fastest measured, and nothing a user configures
// reaches these. Process-wide; each takes effect for calls queued
// afterwards.
#ifndef ZE_NN_CUDA_FUNCTIONAL_CUDA_TESTING_H_
#define ZE_NN_CUDA_FUNCTIONAL_CUDA_TESTING_H_

#include <cstdint>

namespace ze {
namespace nn {
namespace cuda_backend {

// true: every fused epilogue is attempted (GELU_AUX_BIAS, DGELU_BGRAD,
// BGRADB; DGELU with the column-sum kernel where DGELU_BGRAD is not);
// false: none (the plain products plus the GELU and column-sum kernels).
// Overrides the production choice until ResetMatmulEpilogueFusionForTesting.
void SetMatmulEpilogueFusionForTesting(bool enabled);

// Back to the production choice.
void ResetMatmulEpilogueFusionForTesting();

// Whether GELU_AUX_BIAS, DGELU_BGRAD and BGRADB are all attempted: true
// only after SetMatmulEpilogueFusionForTesting(true) (the production choice
// leaves DGELU_BGRAD and BGRADB off).
bool MatmulEpilogueFusionEnabledForTesting();

// GroupedAttentionForward / Backward in bf16/f16: on a compute capability
// 9.0 GPU at head size 64 the Hopper kernels read q, k and v directly
// (kProduction counts those calls); at head size 64 or 128 otherwise,
// attention.h's tensor-core kernels through the packed-layout adapters
// (kPacked); else the tiled kernels of decoder_kernels.h (kTiled). A forced
// route (kPacked or kTiled) makes every call that can take it do so, to
// test it on shapes the production choice gives another route;
// kProduction restores the production choice.
enum class GroupedAttentionRoute { kProduction = 0, kPacked = 1, kTiled = 2 };
void SetGroupedAttentionRouteForTesting(GroupedAttentionRoute route);
// Grouped attention calls (forward and backward) that took `route` since
// start (kProduction: the direct Hopper route; kTiled is not counted).
int64_t GroupedAttentionCallsForTesting(GroupedAttentionRoute route);

}  // namespace cuda_backend
}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_CUDA_FUNCTIONAL_CUDA_TESTING_H_
