// Interop helper for interop_check.py:
//   interop_tool write PATH   writes the file interop_check.py verifies
//   interop_tool check PATH   verifies the file interop_check.py wrote
// Exits 0 on success, 1 with a message on any mismatch.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/safetensors/reader.h"
#include "core/safetensors/writer.h"
#include "core/status.h"

namespace ze {
namespace safetensors {
namespace {

Tensor FloatTensor(const Shape &shape, DType dtype,
                   const std::vector<float> &values) {
  Tensor tensor = Tensor::Empty(shape, dtype, Device::Cpu()).value();
  for (size_t i = 0; i < values.size(); ++i) {
    StoreFromFloat(tensor.data(), dtype, i, values[i]);
  }
  return tensor;
}

absl::Status Write(const std::string &path) {
  Tensor ids = Tensor::Empty({3}, DType::kI32, Device::Cpu()).value();
  const int32_t id_values[] = {-3, 0, 50256};
  std::memcpy(ids.data(), id_values, sizeof(id_values));
  // The values interop_check.py expects; keep the two in step.
  return WriteFile(
      path,
      {{"f32", FloatTensor({2, 3}, DType::kF32, {-1, -0.5, 0, 0.5, 1, 1.5})},
       {"bf16",
        FloatTensor({4}, DType::kBF16, {1.5f, -2.0f, 0.0078125f, 3.0e38f})},
       {"f16",
        FloatTensor({2, 2}, DType::kF16, {0.5f, -1.25f, 65504.0f, 0.0f})},
       {"i32", ids},
       {"scalar", FloatTensor({}, DType::kF32, {7.25f})},
       {"empty", FloatTensor({0, 4}, DType::kF32, {})}},
      {{"format", "pt"}, {"writer", "zero-engine"}});
}

template <typename T>
absl::Status ExpectRaw(const Reader &reader, const std::string &name,
                       const char *dtype, const Shape &shape,
                       const std::vector<T> &expected) {
  ZE_ASSIGN_OR_RETURN(const TensorInfo *info, reader.Get(name));
  if (std::string(ElementTypeName(info->dtype)) != dtype ||
      info->shape != shape) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": got ", ElementTypeName(info->dtype), " ",
                     ShapeToString(info->shape), ", expected ", dtype, " ",
                     ShapeToString(shape)));
  }
  std::vector<T> values(expected.size());
  ZE_RETURN_IF_ERROR(
      reader.ReadBytes(name, 0, values.size() * sizeof(T), values.data()));
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] != expected[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, "[", i, "] differs from what Python wrote"));
    }
  }
  return absl::OkStatus();
}

absl::Status Check(const std::string &path) {
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<Reader> reader, Reader::Open(path));
  auto source = reader->metadata().find("source");
  if (source == reader->metadata().end() || source->second != "python") {
    return absl::InvalidArgumentError("metadata \"source\" != \"python\"");
  }
  std::vector<float> f32;
  for (int i = 0; i < 12; ++i) f32.push_back(i / 4.0f);
  ZE_RETURN_IF_ERROR(ExpectRaw<float>(*reader, "f32", "F32", {3, 4}, f32));
  ZE_ASSIGN_OR_RETURN(Tensor half, reader->ReadTensor("f16"));
  const float half_expected[] = {0.5f, -1.25f, 65504.0f};
  for (int i = 0; i < 3; ++i) {
    if (LoadAsFloat(half.data(), DType::kF16, i) != half_expected[i]) {
      return absl::InvalidArgumentError(absl::StrCat("f16[", i, "] differs"));
    }
  }
  ZE_RETURN_IF_ERROR(
      ExpectRaw<int32_t>(*reader, "i32", "I32", {3}, {-3, 0, 7}));
  ZE_RETURN_IF_ERROR(
      ExpectRaw<double>(*reader, "f64", "F64", {1}, {1.0 / 3.0}));
  ZE_RETURN_IF_ERROR(
      ExpectRaw<int64_t>(*reader, "i64", "I64", {2}, {-(int64_t{1} << 40), 5}));
  ZE_RETURN_IF_ERROR(ExpectRaw<uint8_t>(*reader, "u8", "U8", {2}, {0, 255}));
  ZE_RETURN_IF_ERROR(
      ExpectRaw<uint8_t>(*reader, "mask", "BOOL", {3}, {1, 0, 1}));
  ZE_RETURN_IF_ERROR(ExpectRaw<float>(*reader, "scalar", "F32", {}, {2.5f}));
  ZE_RETURN_IF_ERROR(ExpectRaw<float>(*reader, "empty", "F32", {0, 3}, {}));
  if (reader->tensors().size() != 10) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected 10 tensors, got ", reader->tensors().size()));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace safetensors
}  // namespace ze

int main(int argc, char **argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s write|check PATH\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  absl::Status status =
      mode == "write" ? ze::safetensors::Write(argv[2])
      : mode == "check"
          ? ze::safetensors::Check(argv[2])
          : absl::InvalidArgumentError("mode must be write or check");
  if (!status.ok()) {
    std::fprintf(stderr, "interop_tool %s: %s\n", argv[1],
                 status.ToString().c_str());
    return 1;
  }
  std::printf("interop_tool %s %s: ok\n", argv[1], argv[2]);
  return 0;
}
