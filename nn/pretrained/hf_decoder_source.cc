#include "nn/pretrained/hf_decoder_source.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace ze {
namespace nn {

HuggingFaceDecoderSource::HuggingFaceDecoderSource(
    std::unique_ptr<HuggingFaceDecoderReader> reader)
    : reader_(std::move(reader)) {
  for (const HuggingFaceDecoderReader::Source& source : reader_->parameters()) {
    safetensors::TensorInfo info;
    info.name = source.our_name;
    info.dtype = source.dtype;
    info.shape = source.shape;
    info.begin = 0;
    info.end = source.num_bytes;
    infos_.emplace(source.our_name, std::move(info));
  }
}

absl::StatusOr<std::unique_ptr<HuggingFaceDecoderSource>>
HuggingFaceDecoderSource::Open(const std::string& directory,
                               const DecoderLoadOptions& options) {
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<HuggingFaceDecoderReader> reader,
                      HuggingFaceDecoderReader::Open(directory, options));
  return std::unique_ptr<HuggingFaceDecoderSource>(
      new HuggingFaceDecoderSource(std::move(reader)));
}

std::string HuggingFaceDecoderSource::description() const {
  return absl::StrCat(reader_->directory(), " (Hugging Face ",
                      DecoderFamilyName(reader_->config().family), ")");
}

const safetensors::TensorInfo* HuggingFaceDecoderSource::Find(
    absl::string_view name) const {
  auto found = infos_.find(name);
  return found == infos_.end() ? nullptr : &found->second;
}

absl::StatusOr<Tensor> HuggingFaceDecoderSource::ReadTensor(
    absl::string_view name, Allocator* allocator) const {
  const safetensors::TensorInfo* info = Find(name);
  if (info == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("parameter '", name, "' is not in ", description()));
  }
  ZE_ASSIGN_OR_RETURN(DType dtype, safetensors::DTypeOf(info->dtype));
  if (allocator == nullptr) return reader_->Read(name, dtype);
  ZE_ASSIGN_OR_RETURN(Tensor tensor, Tensor::Empty(info->shape, dtype,
                                                   Device::Cpu(), allocator));
  ZE_RETURN_IF_ERROR(reader_->ReadRange(name, 0, tensor));
  return tensor;
}

absl::Status HuggingFaceDecoderSource::ReadRange(
    absl::string_view name, int64_t element_begin, int64_t element_count,
    const Tensor& destination) const {
  if (destination.numel() != element_count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reading ", element_count, " elements of '", name, "' from ",
        description(), " into a tensor of ", destination.numel()));
  }
  return reader_->ReadRange(name, element_begin, destination);
}

}  // namespace nn
}  // namespace ze
