// Exports the Hugging Face decoder fixtures through nn/pretrained/hf_decoder
// for hf_decoder_transformers_check.py:
//   hf_decoder_export_tool FIXTURE_DIR OUT_DIR
// reads FIXTURE_DIR and writes OUT_DIR/f32 (one model.safetensors, f32) and
// OUT_DIR/sharded (bf16 shards of at most 40,000 bytes with their index).
// Exits 0 on success, 1 with the error.
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "nn/pretrained/hf_decoder.h"

namespace ze {
namespace nn {
namespace {

absl::Status Export(const std::string &fixture, const std::string &out) {
  ZE_ASSIGN_OR_RETURN(auto reader, HuggingFaceDecoderReader::Open(fixture));
  auto source = [&](const std::string &name) {
    return reader->Read(name, DType::kF32);
  };
  ZE_RETURN_IF_ERROR(ExportHuggingFaceDecoder(absl::StrCat(out, "/f32"),
                                              reader->config(), source));
  DecoderExportOptions sharded;
  sharded.dtype = DType::kBF16;
  sharded.max_shard_bytes = 40000;
  return ExportHuggingFaceDecoder(absl::StrCat(out, "/sharded"),
                                  reader->config(), source, sharded);
}

}  // namespace
}  // namespace nn
}  // namespace ze

int main(int argc, char **argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s FIXTURE_DIR OUT_DIR\n", argv[0]);
    return 1;
  }
  const absl::Status status = ze::nn::Export(argv[1], argv[2]);
  if (!status.ok()) {
    std::fprintf(stderr, "%s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
