// The safetensors file format: element types, the header's tensor entries,
// and parsing/serialising the JSON header.
//
// A file is:
//   8 bytes   N, the header length, little-endian u64 (at most 100,000,000)
//   N bytes   JSON object {name: {"dtype", "shape", "data_offsets": [b, e]},
//             "__metadata__": {string: string}}, UTF-8, padded with spaces
//   the data  every tensor's bytes, row-major, little-endian, back to back;
//             [b, e) are byte offsets relative to the start of the data.
//
// Validation follows the reference implementation (the Rust `safetensors`
// crate): tensors, sorted by offsets, must tile the data exactly from 0 with
// no gap or overlap, each covering dtype size x number of elements bytes, and
// the file must end where the last tensor ends. Beyond the reference, this
// parser rejects duplicate names (JSON libraries silently keep one of them).
// Like the reference, unknown fields inside a tensor entry are ignored.
#ifndef ZE_CORE_SAFETENSORS_FORMAT_H_
#define ZE_CORE_SAFETENSORS_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace ze {
namespace safetensors {

// The reference implementation's limit; larger headers are rejected before
// anything is allocated for them.
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// Bytes of the little-endian header length that starts every file.
inline constexpr uint64_t kHeaderLengthBytes = 8;
// The reserved header key holding string -> string metadata.
inline constexpr char kMetadataKey[] = "__metadata__";

// The element types a file may declare (the reference's byte-sized types).
// Only kF32, kBF16, kF16 and kI32 map to a ze::DType; the others can be
// listed and read as raw bytes (Reader::ReadBytes).
enum class ElementType : uint8_t {
  kBool,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64,
};

// Bytes per element (1, 2, 4 or 8).
size_t ElementSize(ElementType type);
// The spelling used in files: "F32", "BF16", "BOOL", "F8_E4M3", ...
const char *ElementTypeName(ElementType type);
// Parses a file's spelling exactly (case-sensitive, as the reference does).
// InvalidArgument naming the text when unknown.
absl::StatusOr<ElementType> ParseElementType(absl::string_view text);
// The file element type that stores a ze::DType (always exists).
ElementType ElementTypeOf(DType dtype);
// The ze::DType of a file element type; Unimplemented for types ze has no
// tensors of (BOOL, U8, F64, I64, ...).
absl::StatusOr<DType> DTypeOf(ElementType type);

// One tensor's entry in the header.
struct TensorInfo {
  std::string name;
  ElementType dtype = ElementType::kF32;
  Shape shape;         // every dimension >= 0; {} is a scalar
  uint64_t begin = 0;  // byte offsets relative to the start of the data
  uint64_t end = 0;

  int64_t num_elements() const { return NumElements(shape); }
  uint64_t num_bytes() const { return end - begin; }
};

using Metadata = std::map<std::string, std::string>;

// A parsed, validated header.
struct Header {
  // Sorted by data offsets, i.e. in the order the bytes lie in the file.
  std::vector<TensorInfo> tensors;
  Metadata metadata;
  // Where the last tensor ends: the size of the data section.
  uint64_t data_bytes = 0;
};

// Parses and validates the N header bytes (what follows the length).
// `source` (normally the file path) starts every error message.
// Returns InvalidArgument when the text does not start with '{', is not
// valid JSON (incl. invalid UTF-8), has a duplicate key at any level, a
// tensor entry without a valid dtype/shape/data_offsets, non-string
// metadata, offsets that do not tile [0, data_bytes) in order without gaps
// or overlaps, or a byte count that disagrees with dtype x shape (overflow
// included). Does not know the file size: the caller checks
// 8 + N + data_bytes against it.
absl::StatusOr<Header> ParseHeader(absl::string_view header_text,
                                   absl::string_view source);

// A tensor to be written: offsets are assigned by SerializeHeader.
struct TensorSpec {
  std::string name;
  ElementType dtype = ElementType::kF32;
  Shape shape;
};

// Lays `tensors` out back to back in the given order and returns the header
// bytes (JSON with "__metadata__" first, then the tensors in order, padded
// with spaces to a multiple of 8 bytes so the data starts 8-byte aligned).
// `layout` (if not null) receives each tensor's assigned offsets.
// InvalidArgument (naming `source` and the tensor) for an empty/duplicate
// name, the reserved name "__metadata__", a negative dimension, a size that
// overflows, or a header over kMaxHeaderBytes.
absl::StatusOr<std::string> SerializeHeader(
    const std::vector<TensorSpec> &tensors, const Metadata &metadata,
    absl::string_view source, std::vector<TensorInfo> *layout);

}  // namespace safetensors
}  // namespace ze

#endif  // ZE_CORE_SAFETENSORS_FORMAT_H_
