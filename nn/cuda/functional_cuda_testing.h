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

// GroupedAttentionForward / Backward in bf16/f16 at head size 64 or 128 run
// on attention.h's tensor-core kernels through the packed-layout adapters
// (see functional_cuda.cc). true: always the tiled kernels of
// decoder_kernels.h instead (to test them on those shapes); false: the
// production choice.
void SetGroupedAttentionTiledOnlyForTesting(bool tiled_only);
// Grouped attention calls (forward and backward) that took the packed
// tensor-core route since start.
int64_t GroupedAttentionPackedCallsForTesting();

}  // namespace cuda_backend
}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_CUDA_FUNCTIONAL_CUDA_TESTING_H_
