// Test-only controls of the attention kernel choice (attention.h). Not for
// production code: the default choice is the fastest measured one, and
// nothing a user configures reaches these.
#ifndef ZE_NN_CUDA_ATTENTION_TESTING_H_
#define ZE_NN_CUDA_ATTENTION_TESTING_H_

namespace ze {
namespace nn {
namespace cuda_kernels {

// While `forward` (`backward`) is true, bf16/f16 attention forward
// (backward) runs the mma.sync kernels even where the Hopper wgmma kernels
// would (compute capability 9.0, head size 64), so tests on a Hopper GPU
// cover both kernel families and their mixing. Process-wide, read at every
// launch; both false (the default) restores the production choice. Set it
// only while no attention launch runs on another thread.
void SetAttentionMmaSyncOnlyForTesting(bool forward, bool backward);

}  // namespace cuda_kernels
}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_CUDA_ATTENTION_TESTING_H_
