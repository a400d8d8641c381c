// A Hugging Face decoder directory as a safetensors::TensorSource under our
// parameter names, so Engine::LoadWeights streams it straight into the
// partition: stage 3 reads only each rank's element ranges from the shards,
// stages 0-2 one parameter at a time; nothing converts the directory first.
//
//   ZE_ASSIGN_OR_RETURN(auto source, nn::HuggingFaceDecoderSource::Open(dir));
//   ZE_ASSIGN_OR_RETURN(auto report, engine->LoadWeights(*source));
#ifndef ZE_NN_PRETRAINED_HF_DECODER_SOURCE_H_
#define ZE_NN_PRETRAINED_HF_DECODER_SOURCE_H_

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/safetensors/tensor_source.h"
#include "nn/decoder_config.h"
#include "nn/pretrained/hf_decoder.h"

namespace ze {
namespace nn {

class HuggingFaceDecoderSource : public safetensors::TensorSource {
 public:
  // Opens and checks `directory` (HuggingFaceDecoderReader::Open: every
  // problem reported at once, before anything is read); its errors.
  static absl::StatusOr<std::unique_ptr<HuggingFaceDecoderSource>> Open(
      const std::string& directory, const DecoderLoadOptions& options = {});

  const DecoderConfig& config() const { return reader_->config(); }
  const HuggingFaceDecoderReader& reader() const { return *reader_; }

  // "DIR (Hugging Face LlamaForCausalLM)": what load errors name.
  std::string description() const override;
  // Our name -> the parameter's shape and its dtype in the files; null for
  // a name the model does not have. (begin/end are not file offsets: the
  // parameter's bytes may lie in any shard; num_bytes() is its size.)
  const safetensors::TensorInfo* Find(absl::string_view name) const override;
  absl::StatusOr<Tensor> ReadTensor(
      absl::string_view name, Allocator* allocator = nullptr) const override;
  absl::Status ReadRange(absl::string_view name, int64_t element_begin,
                         int64_t element_count,
                         const Tensor& destination) const override;

 private:
  explicit HuggingFaceDecoderSource(
      std::unique_ptr<HuggingFaceDecoderReader> reader);

  std::unique_ptr<HuggingFaceDecoderReader> reader_;
  std::map<std::string, safetensors::TensorInfo, std::less<>> infos_;
};

}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_PRETRAINED_HF_DECODER_SOURCE_H_
