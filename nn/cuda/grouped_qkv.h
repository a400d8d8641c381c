// CUDA launchers that let grouped-query attention run on the tensor-core
// flash-attention family of nn/cuda/attention.h, which reads GPT's packed
// layout: qkv (B, T, 3C), per token [q | k | v], each (H, D), C = H * D.
// A grouped-query layer's q (B, T, Hq, D) and k, v (B, T, Hkv, D) are
// packed into that layout with each key/value head repeated for its
// Hq / Hkv query heads (transformers' repeat_kv), and the packed gradient
// is unpacked with each key/value head's gradient summed over its group.
// The copies move 3 B T Hq D elements each way, a small fraction of the
// attention's cost at the sizes that use them.
//
// Conventions as kernels.h: device pointers, `dtype` a ze::DType value
// shared by every tensor, `stream` a cudaStream_t as void*, returns the
// cudaError_t of the launch as int, nothing synchronises. Host-only header;
// grouped_qkv.cu implements it.
#ifndef ZE_NN_CUDA_GROUPED_QKV_H_
#define ZE_NN_CUDA_GROUPED_QKV_H_

#include <cstdint>

namespace ze {
namespace nn {
namespace cuda_kernels {

// packed (B*T, 3, Hq, D) = [q | repeat_kv(k) | repeat_kv(v)].
int LaunchPackGroupedQkv(const void* q, const void* k, const void* v,
                         void* packed, int64_t tokens, int q_heads,
                         int kv_heads, int head_dim, int dtype, void* stream);

// grad_q = the q part of grad_packed; grad_k / grad_v (B*T, Hkv, D) = the
// k / v parts summed over each key/value head's group of query heads (in
// f32, in head order). All three overwritten.
int LaunchUnpackGroupedQkvGrad(const void* grad_packed, void* grad_q,
                               void* grad_k, void* grad_v, int64_t tokens,
                               int q_heads, int kv_heads, int head_dim,
                               int dtype, void* stream);

}  // namespace cuda_kernels
}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_CUDA_GROUPED_QKV_H_
