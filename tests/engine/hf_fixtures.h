// The Hugging Face decoder fixtures (nn/pretrained/testdata: tiny models
// transformers wrote, with reference.json) as the engine's parity tests
// read them, on the CPU and on the GPU.
#ifndef ZE_TESTS_ENGINE_HF_FIXTURES_H_
#define ZE_TESTS_ENGINE_HF_FIXTURES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "nlohmann/json.hpp"

namespace ze {
namespace enginetest {

// Every fixture directory's name.
const std::vector<std::string>& HfFixtureNames();
// $TEST_SRCDIR/zero_engine/nn/pretrained/testdata/<name> (the runfiles'
// copy, as Bazel and tools/run_gpu_tests.sh set TEST_SRCDIR).
std::string HfFixtureDir(const std::string& name);
// <dir>/reference.json, parsed. Aborts the test program (with the path) when
// it cannot be read: a fixture is part of the test, not input.
nlohmann::json ReadHfReference(const std::string& name);
// Rows [begin, begin + count) of a (B, T) JSON table of token ids: a
// (count, T) i32 CPU tensor that owns its storage.
Tensor TokenRows(const nlohmann::json& table, int64_t begin, int64_t count);
// A DeepSpeed config for the fixtures' AdamW training (reference.json's
// "train": lr, betas, eps, weight decay; no clipping, no scheduler):
// train_batch_size `batch` split evenly over `world` ranks, ZeRO `stage`,
// optimizer (and at stage 3 optionally parameter) offload to the CPU, and
// bf16 mixed precision when asked. Small buckets, so stage 3 gathers and
// reduces in several pieces.
std::string HfTrainingConfig(const nlohmann::json& train, int64_t batch,
                             int world, int stage, bool offload_optimizer,
                             bool offload_param, bool bf16);

}  // namespace enginetest
}  // namespace ze

#endif  // ZE_TESTS_ENGINE_HF_FIXTURES_H_
