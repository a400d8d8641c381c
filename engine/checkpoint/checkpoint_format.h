// The on-disk checkpoint format: a directory per tag, one safetensors file
// per rank, a manifest that says where every parameter's elements are, and
// the crash-safe protocol that writes them. Knows no engine and no ZeRO
// stage: the engine (engine/checkpoint/orchestration.cc) decides what goes in,
// and the CLI (tools/ze_checkpoint) inspects, verifies and consolidates through
// the same reader.
//
// Layout of a checkpoint directory `dir`:
//
//   dir/latest                       the newest complete tag, one line
//   dir/<tag>/manifest.json          written last, by rank 0 (Manifest)
//   dir/<tag>/rank_00000.safetensors one per rank of the saving job
//   dir/.<tag>.partial/              a save in progress (or one that died)
//   dir/.<tag>.old/                  the previous save of <tag> while
//                                    CommitSave replaces it; read in its
//                                    place when <tag> is missing (a crash
//                                    between the two renames), see
//                                    ResolveTagDirectory
//
// Rank files hold pieces of parameters, never padding. A piece is the
// contiguous run of one parameter's elements that one rank owned when it
// saved: parameter elements [begin, begin + count). For every kind of
// per-element state ("master", "exp_avg", "exp_avg_sq", "momentum_buffer",
// "weights") the rank file has one 1-D tensor per piece, named
// "<kind>/<parameter name>" (at most one piece of a parameter per rank), of
// `count` elements: f32 for the optimizer's kinds (the moments in bf16 when
// the manifest's moments_dtype says so), the model's dtype for "weights". Which
// kinds exist is in the manifest; "weights" is absent when the model trains in
// f32 (the master weights are the weights).
//
// Because the manifest records every piece, a reader can fetch any element
// range of any parameter from the files that hold it, reading only those
// bytes: that is how a checkpoint saved at one world size and ZeRO stage
// loads at any other (resharding without conversion), and how consolidation
// streams one parameter at a time.
//
// Crash safety (SaveProtocol below): rank files and the manifest are
// written under temporary names, fsynced and renamed inside the
// .<tag>.partial directory; when all of them are complete, the directory is
// renamed to <tag> and then `latest` is replaced atomically (temporary
// file, fsync, rename, fsync of `dir`). A process killed at any moment
// leaves `latest` naming a complete checkpoint (or absent if none was ever
// completed) and every complete tag intact.
//
// Integrity: the manifest records each rank file's size and CRC-32C
// (core/crc32c.h) over all its bytes; the reader checks sizes at Open and
// checksums in VerifyFiles (reading the files), or in VerifyFilesFromReads
// from the CRCs of what ReadRanges already read (a one-pass load).
#ifndef ZE_ENGINE_CHECKPOINT_CHECKPOINT_FORMAT_H_
#define ZE_ENGINE_CHECKPOINT_CHECKPOINT_FORMAT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "core/safetensors/reader.h"
#include "core/safetensors/writer.h"
#include "core/tensor.h"
#include "nlohmann/json.hpp"

namespace ze {
namespace checkpoint {

// "format" in every manifest, and the version this code writes. A manifest
// with another format string or a higher version is rejected by name.
inline constexpr char kFormatName[] = "zero-engine-checkpoint";
inline constexpr int kFormatVersion = 1;
inline constexpr char kManifestFileName[] = "manifest.json";
inline constexpr char kLatestFileName[] = "latest";

// Kinds of per-element state. The optimizer kinds are f32.
inline constexpr char kMaster[] = "master";
inline constexpr char kExpAvg[] = "exp_avg";
inline constexpr char kExpAvgSq[] = "exp_avg_sq";
inline constexpr char kMomentumBuffer[] = "momentum_buffer";
inline constexpr char kWeights[] = "weights";  // the model's dtype

// "rank_00003.safetensors".
std::string RankFileName(int rank);
// "<kind>/<parameter>": a piece's tensor name in a rank file.
std::string PieceTensorName(const std::string& kind,
                            const std::string& parameter);

// One contiguous run of a parameter's elements held by one rank's file.
struct Piece {
  int rank = 0;
  int64_t begin = 0;  // first element within the (flattened) parameter
  int64_t count = 0;  // > 0
};

struct ParameterRecord {
  std::string name;
  Shape shape;
  // Ascending `begin`, tiling [0, numel) exactly (no gap, no overlap); at
  // most one per rank. Empty for a parameter with no elements.
  std::vector<Piece> pieces;
  int64_t numel() const;
};

struct FileRecord {
  std::string name;  // RankFileName(rank), relative to the tag directory
  int rank = 0;
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};

struct Manifest {
  int format_version = kFormatVersion;
  std::string tag;
  int world_size = 1;               // ranks of the saving job (one file each)
  int zero_stage = 0;               // informational: any stage can load it
  DType model_dtype = DType::kF32;  // dtype of the "weights" kind
  // dtype of "exp_avg" and "exp_avg_sq": f32, or bf16 when the saving run
  // kept bf16 moments (bf16.bf16_optimizer_states: stored as they are).
  // The manifest key "moments_dtype" is written only when not f32.
  DType moments_dtype = DType::kF32;
  // Every per-element kind present in every rank file, in file order per
  // piece (e.g. {"master", "exp_avg", "exp_avg_sq", "weights"}).
  std::vector<std::string> kinds;
  // Model parameters in the saving engine's layout order.
  std::vector<ParameterRecord> parameters;
  // One per rank, in rank order.
  std::vector<FileRecord> files;
  // Opaque to this layer: the engine's counters, scheduler, loss scaler and
  // optimizer step (engine/checkpoint/orchestration.cc documents the keys), the
  // resolved config, and the user's client_state. Each a JSON object.
  nlohmann::json training_state = nlohmann::json::object();
  nlohmann::json config = nlohmann::json::object();
  nlohmann::json client_state = nlohmann::json::object();
  std::string saved_at;  // UTC, ISO 8601; informational

  // The parameter called `name`, or null.
  const ParameterRecord* Find(const std::string& name) const;
  bool HasKind(const std::string& kind) const;
};

// Whether `manifest` describes exactly `parameters` (name, shape): the
// model a caller is about to load it into. InvalidArgument listing, by
// name, every parameter the checkpoint lacks, every one it has that the
// model does not, and every shape that differs.
absl::Status CheckMatchesModel(
    const Manifest& manifest,
    const std::vector<std::pair<std::string, Shape>>& parameters);

// The manifest as JSON text (pretty-printed, keys in a fixed order).
std::string SerializeManifest(const Manifest& manifest);
// Parses and validates manifest text; `source` (the file's path) starts
// every error message. InvalidArgument naming the key or parameter for:
// bad JSON, a missing or mistyped key, another "format", format_version
// above kFormatVersion (FailedPrecondition: "written by a newer version"),
// world_size < 1, a stage outside 0-3, an unknown dtype or kind, a
// parameter whose pieces do not tile it exactly or name a rank outside
// [0, world_size), duplicate parameter names, files not one per rank.
absl::StatusOr<Manifest> ParseManifest(const std::string& text,
                                       const std::string& source);

// ----------------------------------------------------------------- writing

// Writes one rank's file: the pieces this rank holds, every kind of each,
// streamed in the declared order, with the CRC-32C computed as the bytes
// go out (nothing is read back). Atomic like safetensors::Writer: until
// Finish succeeds the file does not exist under its name.
class RankFileWriter {
 public:
  // What the file will hold: for each of `pieces` (ascending parameter
  // order, as the caller will append them), one tensor per kind of
  // `kinds`, of dtype `kind_dtypes[i]`. Creates the temporary file in
  // `tag_directory`. Errors as safetensors::Writer::Create.
  struct PieceSpec {
    std::string parameter;
    int64_t count = 0;
  };
  static absl::StatusOr<std::unique_ptr<RankFileWriter>> Create(
      const std::string& tag_directory, int rank,
      const std::vector<std::string>& kinds,
      const std::vector<DType>& kind_dtypes,
      const std::vector<PieceSpec>& pieces);
  ~RankFileWriter();
  RankFileWriter(const RankFileWriter&) = delete;
  RankFileWriter& operator=(const RankFileWriter&) = delete;

  // Appends elements of tensor PieceTensorName(kind, parameter), which must
  // be the next incomplete one in declaration order (FailedPrecondition
  // otherwise). `values`: a CPU tensor of the kind's dtype, any shape.
  // Write errors name the file (ResourceExhausted for a full disk).
  absl::Status Append(const std::string& kind, const std::string& parameter,
                      const Tensor& values);
  // Completes the file (fsync, rename, fsync of the directory) and returns
  // its record: name, rank, size, CRC-32C.
  absl::StatusOr<FileRecord> Finish();

  // Where the time went. The file is written with direct I/O where the
  // file system allows it (safetensors::WriterOptions).
  const safetensors::Writer::Stats& stats() const;

 private:
  RankFileWriter() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The crash-safe sequence around a save. Every rank of a job calls the
// steps it is named for, with barriers between them (the caller's job).
//   1. rank 0:   BeginSave      .<tag>.partial/ created empty; every
//                               .*.partial/ a failed save left (of any tag)
//                               is removed first, each logged with its path
//                               and size (RemovePartialSaves): a directory
//                               takes the saves of one job at a time
//   2. all:      RankFileWriter::Create(PartialDirectory(...)), Append...,
//                Finish
//   3. rank 0:   CommitSave     writes manifest.json into the partial
//                               directory, renames it to <tag> (an existing
//                               <tag> is moved aside first and removed
//                               after), then replaces `latest`
// Errors name the path and the operation (ResourceExhausted for a full
// disk, PermissionDenied, ...). A failure leaves `latest` and every
// complete tag as they were.
std::string PartialDirectory(const std::string& directory,
                             const std::string& tag);
std::string TagDirectory(const std::string& directory, const std::string& tag);
// InvalidArgument for an empty tag, or one with '/', a leading '.', or
// characters outside [A-Za-z0-9._-] (it names a directory and is written
// into `latest`).
absl::Status ValidateTag(const std::string& tag);
absl::Status BeginSave(const std::string& directory, const std::string& tag);
absl::Status CommitSave(const std::string& directory, const Manifest& manifest);

// A save that never completed: `directory`/.<tag>.partial/, left by a job
// that failed or was killed while saving. Never read as a checkpoint;
// listed by `ze_checkpoint inspect`, removed by the next save (BeginSave)
// or by `ze_checkpoint clean`.
struct PartialSave {
  std::string path;    // the directory
  std::string tag;     // <tag> of .<tag>.partial
  uint64_t bytes = 0;  // the sizes of the regular files under it, summed
};
// Every partial save in `directory`, sorted by name. NotFound when
// `directory` does not exist; other errors name the path.
absl::StatusOr<std::vector<PartialSave>> ListPartialSaves(
    const std::string& directory);
// Removes every partial save in `directory` and returns them (none when
// `directory` does not exist). Do not run it while a job saves into
// `directory`: its save in progress is one of them. Errors name the path.
absl::StatusOr<std::vector<PartialSave>> RemovePartialSaves(
    const std::string& directory);

// The tag `latest` names in `directory`. NotFound naming the path when
// there is none; InvalidArgument when its content is not a valid tag.
// Recovery: if CommitSave died between moving an existing <tag> aside and
// renaming the new one in, <tag> is missing and .<tag>.old holds the
// previous complete save; CheckpointReader::Open reads that one.
absl::StatusOr<std::string> ReadLatestTag(const std::string& directory);

// The directory CheckpointReader::Open reads for `tag` (empty: the one
// `latest` names): `directory`/<tag>, or `directory`/.<tag>.old when only
// that exists (the recovery rule above). NotFound naming the directory and
// tag when neither exists; ReadLatestTag's and ValidateTag's errors.
absl::StatusOr<std::string> ResolveTagDirectory(const std::string& directory,
                                                const std::string& tag);

// Reads and parses `tag_directory`/manifest.json (ParseManifest), checking
// nothing else: for tools that describe a checkpoint whose files may be
// damaged. NotFound when the manifest is missing (the save did not
// complete); ParseManifest's errors.
absl::StatusOr<Manifest> ReadManifest(const std::string& tag_directory);

// ----------------------------------------------------------------- reading

// Opens one checkpoint for reading. Thread-compatible: concurrent reads
// from several threads are fine (rank files are opened once, lazily, under
// a lock; reads are preads).
class CheckpointReader {
 public:
  // `tag` empty: the one `latest` names. Reads and validates the manifest
  // (ParseManifest), then checks that every rank file exists with the size
  // the manifest records and a header declaring exactly the tensors the
  // manifest implies (names, dtypes, element counts). Nothing is read
  // beyond headers. Errors name the directory, tag, file or parameter:
  // NotFound for a missing directory, tag, manifest or rank file
  // ("rank_00002.safetensors of tag global_step10 is missing"); DataLoss for
  // a size mismatch (truncated) or a header that disagrees with the
  // manifest; the manifest's errors.
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(
      const std::string& directory, const std::string& tag = "");
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const Manifest& manifest() const { return manifest_; }
  const std::string& tag_directory() const { return tag_directory_; }

  // Reads every byte of the files whose rank r satisfies r % stride ==
  // offset (all files: stride 1, offset 0; ranks of a loading job share
  // the work this way) and compares size and CRC-32C with the manifest.
  // DataLoss naming the first bad file, with the expected and actual
  // checksum; read errors name the file.
  absl::Status VerifyFiles(int stride = 1, int offset = 0) const;

  // Elements [begin, begin + destination.numel()) of parameter `parameter`'s
  // `kind`, flattened row-major, into `destination` (a CPU tensor of any
  // float dtype: values are converted, rounding to nearest even), reading
  // only the bytes of the pieces that overlap. NotFound naming the
  // parameter or kind when absent; OutOfRange when the range leaves the
  // parameter; read errors name the file.
  absl::Status ReadRange(const std::string& kind, const std::string& parameter,
                         int64_t begin, const Tensor& destination) const;

  // Bytes read by ReadRange and ReadRanges so far (for load-time reports).
  int64_t bytes_read() const;

  // Many ReadRange calls as one schedule, for a load that reads each byte
  // once: every request's bytes are located in the rank files, sorted by
  // file and offset, cut into reads of at most kReadChunkBytes and read by
  // `threads` threads taking them in that order (large, nearly sequential
  // reads, several in flight), each straight into its destination unless
  // the dtype is converted. The CRC-32C of every read is kept, so that
  // VerifyFilesFromReads can check a file that was read whole without
  // reading it again. Requests as ReadRange's (their errors, the first one
  // returned); destinations must not overlap.
  struct RangeRequest {
    std::string kind;
    std::string parameter;
    int64_t begin = 0;
    Tensor destination;
  };
  static constexpr uint64_t kReadChunkBytes = uint64_t{32} << 20;
  absl::Status ReadRanges(const std::vector<RangeRequest>& requests,
                          int threads);

  // VerifyFiles for the files whose rank r satisfies r % stride == offset,
  // using what ReadRanges read: a file whose every data byte was read
  // (exactly once, or in identical repeated reads) has its checksum
  // combined from those reads and its header, and is not read again; any
  // other file is read in full, as VerifyFiles does. Same errors as
  // VerifyFiles. `*reread_files`, if given: how many were read again.
  absl::Status VerifyFilesFromReads(int stride, int offset,
                                    int* reread_files = nullptr) const;

 private:
  CheckpointReader() = default;
  absl::StatusOr<const safetensors::Reader*> RankFile(int rank) const;
  // One file's size and CRC-32C against the manifest, reading it in full.
  absl::Status VerifyFile(const FileRecord& file) const;

  // A read ReadRanges made: bytes [offset, offset + bytes) of a rank file
  // and their CRC-32C.
  struct ReadRecord {
    uint64_t offset = 0;
    uint64_t bytes = 0;
    uint32_t crc32c = 0;
  };
  mutable std::vector<std::vector<ReadRecord>> reads_;  // per rank file

  std::string tag_directory_;
  Manifest manifest_;
  mutable std::mutex mutex_;
  mutable std::vector<std::unique_ptr<safetensors::Reader>> files_;
  mutable int64_t bytes_read_ = 0;
};

}  // namespace checkpoint
}  // namespace ze

#endif  // ZE_ENGINE_CHECKPOINT_CHECKPOINT_FORMAT_H_
