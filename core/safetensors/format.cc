#include "core/safetensors/format.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"

namespace ze {
namespace safetensors {
namespace {

struct ElementTypeEntry {
  ElementType type;
  const char *name;
  size_t size;
};

// One table so names, sizes and the enum cannot drift apart.
constexpr ElementTypeEntry kElementTypes[] = {
    {ElementType::kBool, "BOOL", 1},      {ElementType::kU8, "U8", 1},
    {ElementType::kI8, "I8", 1},          {ElementType::kF8E5M2, "F8_E5M2", 1},
    {ElementType::kF8E4M3, "F8_E4M3", 1}, {ElementType::kI16, "I16", 2},
    {ElementType::kU16, "U16", 2},        {ElementType::kF16, "F16", 2},
    {ElementType::kBF16, "BF16", 2},      {ElementType::kI32, "I32", 4},
    {ElementType::kU32, "U32", 4},        {ElementType::kF32, "F32", 4},
    {ElementType::kF64, "F64", 8},        {ElementType::kI64, "I64", 8},
    {ElementType::kU64, "U64", 8},
};

const ElementTypeEntry &EntryOf(ElementType type) {
  for (const ElementTypeEntry &entry : kElementTypes) {
    if (entry.type == type) return entry;
  }
  // Every enumerator is in the table; reaching here is a bug.
  ZE_CHECK(false);
  return kElementTypes[0];
}

using Json = nlohmann::json;

// Builds a DOM like nlohmann's own parser, but refuses a key that already
// exists in the object being built. nlohmann::json::parse keeps the last of
// two equal keys silently, which would let a file hide a tensor.
class DuplicateRejectingBuilder : public nlohmann::json_sax<Json> {
 public:
  explicit DuplicateRejectingBuilder(Json *root) : root_(root) {}

  bool null() override { return Add(Json(nullptr)); }
  bool boolean(bool value) override { return Add(Json(value)); }
  bool number_integer(number_integer_t value) override {
    return Add(Json(value));
  }
  bool number_unsigned(number_unsigned_t value) override {
    return Add(Json(value));
  }
  bool number_float(number_float_t value, const string_t &) override {
    return Add(Json(value));
  }
  bool string(string_t &value) override { return Add(Json(std::move(value))); }
  bool binary(binary_t &value) override {
    return Add(Json::binary(std::move(value)));
  }
  bool start_object(std::size_t) override {
    Json *object = Place(Json::object());
    if (object == nullptr) return false;
    stack_.push_back(object);
    return true;
  }
  bool key(string_t &value) override {
    Json *object = stack_.back();
    if (object->contains(value)) {
      error_ = absl::StrCat("duplicate key \"", value, "\"",
                            stack_.size() > 1 ? " inside a nested object" : "");
      return false;
    }
    pending_key_ = std::move(value);
    return true;
  }
  bool end_object() override {
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    Json *array = Place(Json::array());
    if (array == nullptr) return false;
    stack_.push_back(array);
    return true;
  }
  bool end_array() override {
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t position, const std::string &,
                   const nlohmann::detail::exception &error) override {
    error_ =
        absl::StrCat("not valid JSON (at byte ", position, "): ", error.what());
    return false;
  }

  const std::string &error() const { return error_; }

 private:
  // Stores `value` where the parser is (root, array element or the value of
  // the pending key) and returns its address inside the DOM.
  Json *Place(Json value) {
    if (stack_.empty()) {
      *root_ = std::move(value);
      return root_;
    }
    Json *parent = stack_.back();
    if (parent->is_array()) {
      parent->push_back(std::move(value));
      return &parent->back();
    }
    Json &slot = (*parent)[pending_key_];
    slot = std::move(value);
    return &slot;
  }
  bool Add(Json value) { return Place(std::move(value)) != nullptr; }

  Json *root_;
  std::vector<Json *> stack_;
  std::string pending_key_;
  std::string error_;
};

// Reads a JSON non-negative integer that fits in an int64 (dimensions and
// offsets beyond that cannot describe real data).
bool AsNonNegativeInt(const Json &value, uint64_t *out) {
  if (!value.is_number_unsigned() && !value.is_number_integer()) return false;
  if (value.is_number_integer() && !value.is_number_unsigned() &&
      value.get<int64_t>() < 0) {
    return false;
  }
  const uint64_t number = value.get<uint64_t>();
  if (number > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return false;
  }
  *out = number;
  return true;
}

absl::Status EntryError(absl::string_view source, absl::string_view name,
                        absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(
      source, ": safetensors header: tensor \"", name, "\": ", problem));
}

absl::StatusOr<TensorInfo> ParseTensorEntry(const std::string &name,
                                            const Json &entry,
                                            absl::string_view source) {
  if (!entry.is_object()) {
    return EntryError(
        source, name,
        absl::StrCat("entry is a JSON ", entry.type_name(), ", not an object"));
  }
  TensorInfo info;
  info.name = name;

  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return EntryError(source, name, "missing or non-string \"dtype\"");
  }
  const std::string dtype_text = dtype_it->get<std::string>();
  absl::StatusOr<ElementType> dtype = ParseElementType(dtype_text);
  if (!dtype.ok()) return EntryError(source, name, dtype.status().message());
  info.dtype = *dtype;

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) {
    return EntryError(source, name, "missing or non-array \"shape\"");
  }
  // Element count and byte size with overflow checks, as the reference does.
  uint64_t elements = 1;
  bool overflow = false;
  for (const Json &dimension : *shape_it) {
    uint64_t size = 0;
    if (!AsNonNegativeInt(dimension, &size)) {
      return EntryError(source, name,
                        absl::StrCat("shape entry ", dimension.dump(),
                                     " is not a non-negative integer"));
    }
    info.shape.push_back(static_cast<int64_t>(size));
    if (size != 0 && elements > std::numeric_limits<uint64_t>::max() / size) {
      overflow = true;
    }
    elements *= size;
  }
  const uint64_t element_size = ElementSize(info.dtype);
  if (overflow ||
      elements > std::numeric_limits<uint64_t>::max() / element_size) {
    return EntryError(source, name,
                      absl::StrCat("shape ", ShapeToString(info.shape), " x ",
                                   dtype_text, " overflows 64 bits"));
  }
  const uint64_t expected_bytes = elements * element_size;

  auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end() || !offsets_it->is_array() ||
      offsets_it->size() != 2 ||
      !AsNonNegativeInt((*offsets_it)[0], &info.begin) ||
      !AsNonNegativeInt((*offsets_it)[1], &info.end)) {
    return EntryError(
        source, name,
        "\"data_offsets\" must be [begin, end] with non-negative integers");
  }
  if (info.end < info.begin) {
    return EntryError(source, name,
                      absl::StrCat("data_offsets [", info.begin, ", ", info.end,
                                   "] end before they begin"));
  }
  if (info.end - info.begin != expected_bytes) {
    return EntryError(
        source, name,
        absl::StrCat("data_offsets [", info.begin, ", ", info.end, "] span ",
                     info.end - info.begin, " bytes but ", dtype_text, " x ",
                     ShapeToString(info.shape), " needs ", expected_bytes));
  }
  return info;
}

absl::StatusOr<Metadata> ParseMetadata(const Json &value,
                                       absl::string_view source) {
  Metadata metadata;
  // The reference reads the field as an optional map: null means none.
  if (value.is_null()) return metadata;
  if (!value.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": safetensors header: \"", kMetadataKey,
                     "\" is a JSON ", value.type_name(), ", not an object"));
  }
  for (const auto &[key, item] : value.items()) {
    if (!item.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": safetensors header: metadata value for key \"", key,
          "\" is a JSON ", item.type_name(),
          "; metadata values must be strings"));
    }
    metadata.emplace(key, item.get<std::string>());
  }
  return metadata;
}

}  // namespace

size_t ElementSize(ElementType type) { return EntryOf(type).size; }

const char *ElementTypeName(ElementType type) { return EntryOf(type).name; }

absl::StatusOr<ElementType> ParseElementType(absl::string_view text) {
  for (const ElementTypeEntry &entry : kElementTypes) {
    if (text == entry.name) return entry.type;
  }
  std::vector<std::string> known;
  for (const ElementTypeEntry &entry : kElementTypes) {
    known.push_back(entry.name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown or unsupported dtype \"", text,
                   "\" (known: ", absl::StrJoin(known, ", "), ")"));
}

ElementType ElementTypeOf(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ElementType::kF32;
    case DType::kBF16:
      return ElementType::kBF16;
    case DType::kF16:
      return ElementType::kF16;
    case DType::kI32:
      return ElementType::kI32;
  }
  ZE_CHECK(false);
  return ElementType::kF32;
}

absl::StatusOr<DType> DTypeOf(ElementType type) {
  switch (type) {
    case ElementType::kF32:
      return DType::kF32;
    case ElementType::kBF16:
      return DType::kBF16;
    case ElementType::kF16:
      return DType::kF16;
    case ElementType::kI32:
      return DType::kI32;
    default:
      return absl::UnimplementedError(
          absl::StrCat("safetensors dtype ", ElementTypeName(type),
                       " has no ze tensor dtype (read it as raw bytes)"));
  }
}

absl::StatusOr<Header> ParseHeader(absl::string_view header_text,
                                   absl::string_view source) {
  // The reference (since 0.4) insists on '{' first; it also catches files
  // that are not safetensors at all with a clearer message than a JSON error.
  if (header_text.empty() || header_text.front() != '{') {
    return absl::InvalidArgumentError(
        absl::StrCat(source,
                     ": safetensors header does not start with '{' (not a "
                     "safetensors file, or a corrupt header)"));
  }
  Json root;
  DuplicateRejectingBuilder builder(&root);
  // strict = true: only whitespace (the padding) may follow the object.
  const bool parsed = Json::sax_parse(header_text.begin(), header_text.end(),
                                      &builder, Json::input_format_t::json,
                                      /*strict=*/true);
  if (!parsed) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": safetensors header is ",
        builder.error().empty() ? "not valid JSON" : builder.error()));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": safetensors header is a JSON ",
                     root.type_name(), ", not an object"));
  }

  Header header;
  for (const auto &[name, entry] : root.items()) {
    if (name == kMetadataKey) {
      ZE_ASSIGN_OR_RETURN(header.metadata, ParseMetadata(entry, source));
      continue;
    }
    ZE_ASSIGN_OR_RETURN(TensorInfo info, ParseTensorEntry(name, entry, source));
    header.tensors.push_back(std::move(info));
  }

  // Files need not list tensors in data order (the reference's writer sorts
  // by dtype, older ones by name), so order by offsets, then require the
  // tensors to tile the data exactly.
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const TensorInfo &a, const TensorInfo &b) {
              if (a.begin != b.begin) return a.begin < b.begin;
              if (a.end != b.end) return a.end < b.end;
              return a.name < b.name;
            });
  uint64_t position = 0;
  const TensorInfo *previous = nullptr;
  for (const TensorInfo &info : header.tensors) {
    if (info.begin != position) {
      std::string problem;
      if (previous == nullptr) {
        problem = absl::StrCat("the first tensor's data starts at byte ",
                               info.begin, ", not 0");
      } else if (info.begin < position) {
        problem = absl::StrCat("data [", info.begin, ", ", info.end,
                               ") overlaps tensor \"", previous->name,
                               "\" which ends at ", position);
      } else {
        problem = absl::StrCat("data starts at ", info.begin,
                               " leaving a gap after tensor \"", previous->name,
                               "\" which ends at ", position);
      }
      return EntryError(source, info.name, problem);
    }
    position = info.end;
    previous = &info;
  }
  header.data_bytes = position;
  return header;
}

absl::StatusOr<std::string> SerializeHeader(
    const std::vector<TensorSpec> &tensors, const Metadata &metadata,
    absl::string_view source, std::vector<TensorInfo> *layout) {
  // ordered_json keeps "__metadata__" first and tensors in data order, which
  // makes the header readable; readers do not depend on it.
  nlohmann::ordered_json root = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json metadata_json = nlohmann::ordered_json::object();
    for (const auto &[key, value] : metadata) metadata_json[key] = value;
    root[kMetadataKey] = std::move(metadata_json);
  }
  std::set<absl::string_view> names;
  std::vector<TensorInfo> infos;
  uint64_t offset = 0;
  for (const TensorSpec &spec : tensors) {
    if (spec.name.empty() || spec.name == kMetadataKey) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": cannot write a tensor named \"", spec.name,
                       "\" (empty or reserved)"));
    }
    if (!names.insert(spec.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": tensor \"", spec.name, "\" is declared twice"));
    }
    uint64_t bytes = ElementSize(spec.dtype);
    for (int64_t size : spec.shape) {
      if (size < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": tensor \"", spec.name,
                         "\" has a negative dimension in shape ",
                         ShapeToString(spec.shape)));
      }
      const uint64_t dimension = static_cast<uint64_t>(size);
      if (dimension != 0 &&
          bytes > std::numeric_limits<uint64_t>::max() / dimension) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": tensor \"", spec.name, "\" of shape ",
                         ShapeToString(spec.shape), " overflows 64 bits"));
      }
      bytes *= dimension;
    }
    if (offset > std::numeric_limits<uint64_t>::max() - bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": total data size overflows 64 bits at \"",
                       spec.name, "\""));
    }
    TensorInfo info{spec.name, spec.dtype, spec.shape, offset, offset + bytes};
    offset += bytes;
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = ElementTypeName(spec.dtype);
    entry["shape"] = spec.shape;
    entry["data_offsets"] = {info.begin, info.end};
    root[spec.name] = std::move(entry);
    infos.push_back(std::move(info));
  }
  std::string text;
  try {
    text = root.dump();
  } catch (const nlohmann::json::exception &error) {
    // dump() throws on names or metadata that are not valid UTF-8.
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": cannot serialise the header: ", error.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": header would be ", text.size(),
                     " bytes, over the format's limit of ", kMaxHeaderBytes));
  }
  if (layout != nullptr) *layout = std::move(infos);
  return text;
}

}  // namespace safetensors
}  // namespace ze
