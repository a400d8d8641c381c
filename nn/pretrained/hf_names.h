// What the Hugging Face name tables of both families (hf_gpt2.cc,
// hf_decoder.cc) need to read a per-layer tensor name.
#ifndef ZE_NN_PRETRAINED_HF_NAMES_H_
#define ZE_NN_PRETRAINED_HF_NAMES_H_

#include "absl/strings/string_view.h"

namespace ze {
namespace nn {

// Splits "<prefix><index>.<rest>" (e.g. "model.layers.3.mlp.up_proj.weight"
// with prefix "model.layers.") into index and rest. False for any other
// form: no prefix, no digits, more than 6 digits, nothing after the dot,
// or a leading zero or sign, so "layers.01" cannot alias "layers.1".
bool SplitIndexedName(absl::string_view name, absl::string_view prefix,
                      int *index, absl::string_view *rest);

}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_PRETRAINED_HF_NAMES_H_
