#include "engine/checkpoint/test_checkpoint.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "gtest/gtest.h"

namespace ze {
namespace checkpoint {
namespace testing {
namespace {

uint64_t Mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t HashKind(const std::string& kind) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  for (char c : kind) {
    hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  }
  return hash;
}

DType StoredDType(const std::string& kind, DType model_dtype) {
  return kind == kWeights ? model_dtype : DType::kF32;
}

}  // namespace

NamesAndShapes AwkwardModel() {
  return {
      {"embed.table", {7, 5}},   // 35 elements, rank 0 at world size 3
      {"layer.big", {16, 15}},   // 240: ranks 0, 1 and 2 (shares of 128)
      {"layer.vector", {53}},    // prime
      {"layer.scalar", {1}},     //
      {"layer.empty", {0, 4}},   // no elements, no pieces
      {"layer.matrix", {6, 9}},  // 54; the total, 383, needs padding
  };
}

std::vector<ParameterRecord> PartitionLikeZero(const NamesAndShapes& parameters,
                                               int world_size) {
  std::vector<ParameterRecord> records;
  int64_t total = 0;
  for (const auto& [name, shape] : parameters) {
    ParameterRecord record;
    record.name = name;
    record.shape = shape;
    total += record.numel();
    records.push_back(std::move(record));
  }
  const int64_t share = (total + world_size - 1) / world_size;
  int64_t offset = 0;  // of the parameter in the flat buffer
  for (ParameterRecord& record : records) {
    const int64_t end = offset + record.numel();
    for (int rank = 0; rank < world_size; ++rank) {
      const int64_t low = std::max(offset, rank * share);
      const int64_t high = std::min(end, (rank + 1) * share);
      if (high > low) record.pieces.push_back({rank, low - offset, high - low});
    }
    offset = end;
  }
  return records;
}

float TestValue(const std::string& kind, int parameter, int64_t element,
                int generation) {
  const uint64_t hash =
      Mix(HashKind(kind) ^ Mix((static_cast<uint64_t>(parameter) << 40) ^
                               (static_cast<uint64_t>(generation) << 32) ^
                               static_cast<uint64_t>(element)));
  const int64_t bits = static_cast<int64_t>(hash & 0xFFFFF) - 0x80000;
  return static_cast<float>(bits) / 16384.0f;
}

float StoredTestValue(const std::string& kind, int parameter, int64_t element,
                      DType stored, int generation) {
  uint32_t rounded = 0;  // big enough for any dtype's element
  StoreFromFloat(&rounded, stored, 0,
                 TestValue(kind, parameter, element, generation));
  return LoadAsFloat(&rounded, stored, 0);
}

absl::StatusOr<Tensor> ExpectedParameter(const std::string& kind, int parameter,
                                         const Shape& shape, DType stored,
                                         DType dtype, int generation) {
  ZE_ASSIGN_OR_RETURN(Tensor value, Tensor::Empty(shape, dtype, Device::Cpu()));
  for (int64_t element = 0; element < value.numel(); ++element) {
    StoreFromFloat(
        value.data(), dtype, static_cast<size_t>(element),
        StoredTestValue(kind, parameter, element, stored, generation));
  }
  return value;
}

absl::StatusOr<Manifest> WriteTestCheckpoint(
    const std::string& directory, const NamesAndShapes& parameters,
    const TestCheckpointOptions& options) {
  ZE_RETURN_IF_ERROR(BeginSave(directory, options.tag));
  Manifest manifest;
  manifest.tag = options.tag;
  manifest.world_size = options.world_size;
  manifest.zero_stage = options.zero_stage;
  manifest.model_dtype = options.model_dtype;
  manifest.kinds = options.kinds;
  manifest.parameters = PartitionLikeZero(parameters, options.world_size);
  manifest.training_state = {{"global_steps", options.global_steps},
                             {"skipped_steps", 0},
                             {"micro_steps", 2 * options.global_steps},
                             {"global_samples", 8 * options.global_steps}};
  manifest.config = {{"train_micro_batch_size_per_gpu", 4}};
  manifest.client_state = {{"note", "written by test_checkpoint"}};

  std::vector<DType> kind_dtypes;
  for (const std::string& kind : options.kinds) {
    kind_dtypes.push_back(StoredDType(kind, options.model_dtype));
  }
  const std::string partial = PartialDirectory(directory, options.tag);
  for (int rank = 0; rank < options.world_size; ++rank) {
    if (options.ranks_to_write >= 0 && rank >= options.ranks_to_write) break;
    // This rank's pieces in parameter order: (parameter index, piece).
    std::vector<std::pair<int, Piece>> held;
    std::vector<RankFileWriter::PieceSpec> specs;
    for (size_t index = 0; index < manifest.parameters.size(); ++index) {
      const ParameterRecord& record = manifest.parameters[index];
      for (const Piece& piece : record.pieces) {
        if (piece.rank != rank) continue;
        held.push_back({static_cast<int>(index), piece});
        specs.push_back({record.name, piece.count});
      }
    }
    ZE_ASSIGN_OR_RETURN(std::unique_ptr<RankFileWriter> writer,
                        RankFileWriter::Create(partial, rank, options.kinds,
                                               kind_dtypes, specs));
    for (const auto& [index, piece] : held) {
      for (size_t k = 0; k < options.kinds.size(); ++k) {
        ZE_ASSIGN_OR_RETURN(
            Tensor values,
            Tensor::Empty({piece.count}, kind_dtypes[k], Device::Cpu()));
        for (int64_t i = 0; i < piece.count; ++i) {
          StoreFromFloat(values.data(), kind_dtypes[k], static_cast<size_t>(i),
                         TestValue(options.kinds[k], index, piece.begin + i,
                                   options.generation));
        }
        ZE_RETURN_IF_ERROR(writer->Append(
            options.kinds[k], manifest.parameters[index].name, values));
      }
    }
    ZE_ASSIGN_OR_RETURN(FileRecord file, writer->Finish());
    manifest.files.push_back(file);
  }
  if (options.commit) ZE_RETURN_IF_ERROR(CommitSave(directory, manifest));
  return manifest;
}

std::string FreshTestDirectory() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string directory = absl::StrCat(
      ::testing::TempDir(), "/", info->test_suite_name(), ".", info->name());
  std::filesystem::remove_all(directory);
  return directory;
}

}  // namespace testing
}  // namespace checkpoint
}  // namespace ze
