// The manifest's training_state object holds:
//   global_steps, skipped_steps, micro_steps, global_samples  (Counters)
//   schedule_step      applied optimizer steps (the LR schedule's position;
//                      DeepSpeed's last_batch_iteration + 1)
//   optimizer_step_count  the optimizer's bias-correction step
//   optimizer          the config's optimizer type, for messages
//   loss_scaler        {cur_scale, cur_iter, last_overflow_iter,
//                      cur_hysteresis} under fp16, else null
//   learning_rate, loss_scale  informational
// The engine keeps no random state of its own (initialisation is a pure
// function of the seed and the parameter; no dropout): a trainer's data
// order or sampling state belongs in client_state.
#include "engine/checkpoint/orchestration.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/atomic_file.h"
#include "core/logging.h"
#include "core/ops.h"
#include "core/status.h"
#include "engine/agreement.h"
#include "engine/checkpoint/checkpoint_format.h"
#include "engine/checkpoint/consolidate.h"
#include "zero/strategy_checkpoint.h"

namespace ze {
namespace engine {
namespace {

// How a config stores Adam's moments: "f32", "bf16", "bf16 (stochastic
// rounding)" or "8-bit block-wise" (the keys' meanings, config/sections.cc).
std::string MomentFormatOfConfig(const nlohmann::json& config) {
  const nlohmann::json& bf16 = config.value("bf16", nlohmann::json::object());
  const nlohmann::json optimizer =
      config.value("optimizer", nlohmann::json::object());
  const nlohmann::json params =
      optimizer.is_object()
          ? optimizer.value("params", nlohmann::json::object())
          : nlohmann::json::object();
  if (params.is_object() && params.value("blockwise_8bit_moments", false)) {
    return "8-bit block-wise";
  }
  if (bf16.is_object() && bf16.value("bf16_optimizer_states", false)) {
    return bf16.value("optimizer_states_stochastic_rounding", false)
               ? "bf16 (stochastic rounding)"
               : "bf16";
  }
  return "f32";
}
std::string MomentFormatOfConfig(const config::Config& config) {
  if (config.optimizer.has_value() &&
      config.optimizer->params.blockwise_8bit_moments) {
    return "8-bit block-wise";
  }
  if (config.bf16.bf16_optimizer_states) {
    return config.bf16.optimizer_states_stochastic_rounding
               ? "bf16 (stochastic rounding)"
               : "bf16";
  }
  return "f32";
}
// What loading exact f32 moment values into `format` does to them.
const char* MomentConversion(const std::string& format) {
  if (format == "f32") return "exact";
  if (format == "8-bit block-wise") {
    return "each block of 256 re-encoded from the values: exact for values "
           "saved from 8-bit moments";
  }
  return "rounded to nearest even: exact for values saved from bf16 moments";
}

// Each rank's file record travels as six 16-bit words in f32 (exact; the
// communicator's collectives carry float types): the size's four, then the
// CRC's two.
constexpr int kRecordWords = 6;

// Every rank's file record, on every rank (a collective).
absl::StatusOr<std::vector<checkpoint::FileRecord>> GatherFileRecords(
    comm::Communicator& comm, const checkpoint::FileRecord& mine,
    const Stream& stream) {
  const int world = comm.world_size();
  std::vector<float> words;
  for (int i = 0; i < 4; ++i) {
    words.push_back(static_cast<float>((mine.bytes >> (16 * i)) & 0xFFFF));
  }
  for (int i = 0; i < 2; ++i) {
    words.push_back(static_cast<float>((mine.crc32c >> (16 * i)) & 0xFFFF));
  }
  ZE_ASSIGN_OR_RETURN(const std::vector<float> all,
                      engine::AllGatherFloats(comm, words, stream));
  std::vector<checkpoint::FileRecord> records(world);
  for (int r = 0; r < world; ++r) {
    const float* w = all.data() + r * kRecordWords;
    records[r].rank = r;
    records[r].name = checkpoint::RankFileName(r);
    for (int i = 0; i < 4; ++i) {
      records[r].bytes |= static_cast<uint64_t>(w[i]) << (16 * i);
    }
    records[r].crc32c =
        static_cast<uint32_t>(w[4]) | (static_cast<uint32_t>(w[5]) << 16);
  }
  return records;
}

// Every rank must save to, or load from, the same directory; for the tag,
// checkpoint.tag_validation (DeepSpeed's) decides: Fail refuses on every
// rank, naming both values; Warn logs and takes rank 0's tag; Ignore takes
// rank 0's silently. Returns the tag to use.
absl::StatusOr<std::string> AgreeOnDirectoryAndTag(
    comm::Communicator& comm, const std::string& what,
    const std::string& directory, const std::string& tag,
    config::TagValidation validation, const Stream& stream) {
  ZE_ASSIGN_OR_RETURN(std::string root_directory,
                      BroadcastString(comm, directory, 0, stream));
  ZE_ASSIGN_OR_RETURN(std::string root_tag,
                      BroadcastString(comm, tag, 0, stream));
  absl::Status local;
  const std::string mismatch =
      absl::StrCat(what, ": rank ", comm.rank(), " was given directory '",
                   directory, "' and tag '", tag, "', rank 0 directory '",
                   root_directory, "' and tag '", root_tag, "'");
  if (root_directory != directory ||
      (root_tag != tag && validation == config::TagValidation::kFail)) {
    local = absl::InvalidArgumentError(
        absl::StrCat(mismatch, "; every rank must pass the same"));
  } else if (root_tag != tag && validation == config::TagValidation::kWarn) {
    ZE_LOG(WARNING) << mismatch << "; using rank 0's tag "
                    << "(checkpoint.tag_validation is Warn)";
  }
  ZE_RETURN_IF_ERROR(AgreeAcrossRanks(comm, local, stream, what));
  return root_tag;
}

int64_t JsonInt(const nlohmann::json& object, const char* key) {
  return object.at(key).get<int64_t>();
}

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Threads a one-pass load reads with: enough 32 MiB reads in flight to
// keep a disk's queue full, and CRC-32C on several cores.
constexpr int kLoadReadThreads = 8;

// The host memory one rank's one-pass load may stage:
// ZE_CHECKPOINT_STAGING_LIMIT (bytes, read at engine setup into `host`) when
// set, else 3/4 of MemAvailable now, shared among the ranks on this host
// (they load at the same time).
int64_t StagingLimit(const HostFacts& host, int local_ranks) {
  if (host.checkpoint_staging_limit.has_value()) {
    return *host.checkpoint_staging_limit;
  }
  const std::optional<int64_t> available = ReadMemAvailableBytes();
  // Unknown: the two-pass path.
  return available.has_value() ? *available / 4 * 3 / std::max(1, local_ranks)
                               : 0;
}

// At an accumulation boundary (the engine checked that no backward is
// owed): FailedPrecondition naming `what` otherwise.
absl::Status RequireBoundary(const CheckpointedState& engine,
                             const char* what) {
  const int64_t accumulation =
      engine.config->gradient_accumulation_steps.value();
  const int64_t micro_steps = engine.counters->micro_steps;
  if (micro_steps % accumulation != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " on rank ", engine.comm->rank(),
                     ": in the middle of an accumulation window (micro step ",
                     micro_steps % accumulation, " of ", accumulation,
                     "); call it after the boundary Step"));
  }
  return absl::OkStatus();
}

// The manifest's training_state (the file comment lists its keys).
nlohmann::json TrainingStateJson(const CheckpointedState& engine) {
  const Counters& counters = *engine.counters;
  const config::Config& cfg = *engine.config;
  zero::TrainingState* training = engine.training;
  zero::StateCheckpoint zero_state = engine.strategy->checkpoint();
  nlohmann::json state = nlohmann::json::object();
  state["global_steps"] = counters.global_steps;
  state["skipped_steps"] = counters.skipped_steps;
  state["micro_steps"] = counters.micro_steps;
  state["global_samples"] = counters.global_samples;
  state["schedule_step"] = training->schedule_step();
  state["optimizer_step_count"] = zero_state.optimizer_step_count();
  state["optimizer"] =
      cfg.optimizer.has_value()
          ? nlohmann::json(config::OptimizerTypeName(cfg.optimizer->type))
          : nlohmann::json(nullptr);
  state["learning_rate"] = training->learning_rate();
  state["loss_scale"] = training->loss_scale();
  if (const zero::LossScaler* scaler = training->scaler()) {
    const zero::LossScalerState scaler_state = scaler->state();
    state["loss_scaler"] = {
        {"cur_scale", scaler_state.cur_scale},
        {"cur_iter", scaler_state.cur_iter},
        {"last_overflow_iter", scaler_state.last_overflow_iter},
        {"cur_hysteresis", scaler_state.cur_hysteresis}};
  } else {
    state["loss_scaler"] = nullptr;
  }
  return state;
}

// Restores what TrainingStateJson saved. InvalidArgument naming `source`
// for a missing or mistyped key.
absl::Status RestoreTrainingState(const CheckpointedState& engine,
                                  const nlohmann::json& state,
                                  const std::string& source) {
  Counters& counters = *engine.counters;
  zero::TrainingState* training = engine.training;
  try {
    counters.global_steps = JsonInt(state, "global_steps");
    counters.skipped_steps = JsonInt(state, "skipped_steps");
    counters.micro_steps = JsonInt(state, "micro_steps");
    counters.global_samples = JsonInt(state, "global_samples");
    training->set_schedule_step(JsonInt(state, "schedule_step"));
    const nlohmann::json& scaler = state.at("loss_scaler");
    if (training->scaler() != nullptr && scaler.is_object()) {
      zero::LossScalerState restored;
      restored.cur_scale = scaler.at("cur_scale").get<double>();
      restored.cur_iter = scaler.at("cur_iter").get<int64_t>();
      restored.last_overflow_iter =
          scaler.at("last_overflow_iter").get<int64_t>();
      restored.cur_hysteresis = scaler.at("cur_hysteresis").get<int>();
      ZE_RETURN_IF_ERROR(training->scaler()->Restore(restored));
    }
  } catch (const nlohmann::json::exception& error) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": training_state: ", error.what()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SaveCheckpoint(const CheckpointedState& engine,
                            const std::string& directory,
                            const std::string& tag_argument,
                            const nlohmann::json& client_state,
                            CheckpointSaveReport* save_report) {
  const char* what = "save_checkpoint";
  const Clock::time_point save_start = Clock::now();
  *save_report = CheckpointSaveReport();
  CheckpointSaveReport& report = *save_report;
  const config::Config& cfg = *engine.config;
  const Counters& counters = *engine.counters;
  nn::LossModel* model = engine.model;
  zero::StateCheckpoint zero_state = engine.strategy->checkpoint();
  ZE_RETURN_IF_ERROR(RequireBoundary(engine, what));
  if (!client_state.is_object()) {
    return absl::InvalidArgumentError(
        "save_checkpoint: client_state must be a JSON object");
  }
  const std::string own_tag =
      tag_argument.empty() ? absl::StrCat("global_step", counters.global_steps)
                           : tag_argument;
  comm::Communicator& comm = *engine.comm;
  const Stream& stream = *engine.stream;
  StreamGuard guard(stream);
  ZE_RETURN_IF_ERROR(
      AgreeAcrossRanks(comm, checkpoint::ValidateTag(own_tag), stream, what));
  ZE_ASSIGN_OR_RETURN(
      const std::string tag,
      AgreeOnDirectoryAndTag(comm, what, directory, own_tag,
                             cfg.checkpoint.tag_validation, stream));

  // A step that applied a non-finite update leaves state no run should
  // resume from (every rank knows it alike: the loss is all-reduced).
  if (engine.last_update_nonfinite) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " on rank ", comm.rank(), ": the last step's loss (",
        engine.last_nonfinite_loss,
        ") or gradient norm was not finite and its update was applied; not "
        "saved, so `latest` in ",
        directory, " still names the last good checkpoint"));
  }

  // 1. Rank 0 prepares the partial directory.
  absl::Status begun;
  if (comm.rank() == 0) begun = checkpoint::BeginSave(directory, tag);
  ZE_RETURN_IF_ERROR(AgreeAcrossRanks(comm, begun, stream, what));
  report.agree_seconds = SecondsSince(save_start);

  // 2. Every rank writes its file.
  const std::vector<zero::CheckpointKind> kinds = zero_state.CheckpointKinds();
  std::vector<std::string> kind_names;
  std::vector<DType> kind_dtypes;
  for (const auto& kind : kinds) {
    kind_names.push_back(kind.name);
    kind_dtypes.push_back(kind.dtype);
  }
  const zero::PartitionedLayout& layout = zero_state.layout();
  std::vector<checkpoint::RankFileWriter::PieceSpec> pieces;
  for (const zero::ParamShard& shard : zero_state.CheckpointPieces()) {
    pieces.push_back({layout.param(shard.param_index).name, shard.count});
  }
  checkpoint::FileRecord mine;
  absl::Status written = [&]() -> absl::Status {
    ZE_ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::RankFileWriter> writer,
                        checkpoint::RankFileWriter::Create(
                            checkpoint::PartialDirectory(directory, tag),
                            comm.rank(), kind_names, kind_dtypes, pieces));
    zero::SaveTimes times;
    // Whether the master weights hold an inf or NaN, one flag per device,
    // set as the values go by and read once after the last. Only the master
    // weights: the 16-bit weights are rounded from them, and an optimizer
    // state that is not finite makes them so at its first update; scanning
    // every kind would add a pass over the whole checkpoint (measured: +1 s
    // on a 2.5 s, 1.7 GB CPU save) for no case more.
    std::vector<Tensor> master_nonfinite;  // one flag per device
    auto check_master_finite = [&](const Tensor& values) -> absl::Status {
      Tensor* flag = nullptr;
      for (Tensor& candidate : master_nonfinite) {
        if (candidate.device() == values.device()) flag = &candidate;
      }
      if (flag == nullptr) {
        ZE_ASSIGN_OR_RETURN(
            Tensor zeros,
            Tensor::Zeros({1}, DType::kF32, values.device(), stream));
        master_nonfinite.push_back(std::move(zeros));
        flag = &master_nonfinite.back();
      }
      return HasInfOrNan(values, *flag, stream);
    };
    absl::Status saved = zero_state.SaveState(
        [&](const zero::CheckpointKind& kind, const zero::ParamShard& piece,
            const Tensor& values) {
          if (kind.name == checkpoint::kMaster) {
            ZE_RETURN_IF_ERROR(check_master_finite(values));
          }
          return writer->Append(kind.name, layout.param(piece.param_index).name,
                                values);
        },
        &times);
    report.copy_seconds = times.copy_seconds;
    report.stall_seconds = times.stall_seconds;
    report.pinned = times.pinned;
    ZE_RETURN_IF_ERROR(saved);
    bool master_nonfinite_seen = false;
    for (const Tensor& flag : master_nonfinite) {
      ZE_ASSIGN_OR_RETURN(std::vector<float> set, ToHostFloats(flag, stream));
      master_nonfinite_seen = master_nonfinite_seen || set[0] > 0;
    }
    if (master_nonfinite_seen) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, " on rank ", comm.rank(), ": this rank's ", checkpoint::kMaster,
          " values hold inf or NaN; not saved, so `latest` in ", directory,
          " still names the last good checkpoint"));
    }
    absl::StatusOr<checkpoint::FileRecord> finished = writer->Finish();
    const safetensors::Writer::Stats& stats = writer->stats();
    report.crc_seconds = stats.crc_seconds;
    report.writer_stall_seconds = stats.stall_seconds;
    report.write_seconds =
        stats.direct_io ? stats.write_seconds : stats.stall_seconds;
    report.finish_seconds = stats.finish_seconds;
    report.direct_io = stats.direct_io;
    ZE_ASSIGN_OR_RETURN(mine, std::move(finished));
    report.bytes = static_cast<int64_t>(mine.bytes);
    return absl::OkStatus();
  }();
  const Clock::time_point commit_start = Clock::now();
  ZE_RETURN_IF_ERROR(AgreeAcrossRanks(comm, written, stream, what));
  ZE_ASSIGN_OR_RETURN(std::vector<checkpoint::FileRecord> files,
                      GatherFileRecords(comm, mine, stream));

  // 3. Rank 0 writes the manifest and commits.
  absl::Status committed;
  if (comm.rank() == 0) {
    committed = [&]() -> absl::Status {
      checkpoint::Manifest manifest;
      manifest.tag = tag;
      manifest.world_size = comm.world_size();
      manifest.zero_stage = cfg.zero_optimization.stage;
      manifest.model_dtype = model->dtype();
      manifest.kinds = kind_names;
      for (const auto& kind : kinds) {
        if (kind.name == checkpoint::kExpAvg) {
          manifest.moments_dtype = kind.dtype;
        }
      }
      std::unordered_map<std::string, Shape> shapes;
      for (nn::Parameter* parameter : model->Parameters()) {
        shapes[parameter->name()] = parameter->shape();
      }
      for (int p = 0; p < layout.num_params(); ++p) {
        checkpoint::ParameterRecord record;
        record.name = layout.param(p).name;
        record.shape = shapes.at(record.name);
        for (const zero::ParamShard& shard :
             layout.LocateParamRange(p, 0, layout.param(p).numel)) {
          record.pieces.push_back(
              checkpoint::Piece{shard.rank, shard.param_begin, shard.count});
        }
        manifest.parameters.push_back(std::move(record));
      }
      manifest.files = files;
      manifest.training_state = TrainingStateJson(engine);
      manifest.config = nlohmann::json::parse(config::ToJson(cfg));
      manifest.client_state = client_state;
      ZE_RETURN_IF_ERROR(checkpoint::CommitSave(directory, manifest));
      if (cfg.zero_optimization.stage3_gather_16bit_weights_on_model_save
              .value()) {
        ZE_ASSIGN_OR_RETURN(auto reader,
                            checkpoint::CheckpointReader::Open(directory, tag));
        checkpoint::ConsolidateOptions options;
        options.output_path =
            absl::StrCat(checkpoint::TagDirectory(directory, tag),
                         "/model_16bit.safetensors");
        options.dtype = model->dtype();
        options.verify_checksums = false;  // checksummed as they were written
        ZE_RETURN_IF_ERROR(checkpoint::Consolidate(*reader, options).status());
      }
      return absl::OkStatus();
    }();
  }
  ZE_RETURN_IF_ERROR(AgreeAcrossRanks(comm, committed, stream, what));
  report.commit_seconds = SecondsSince(commit_start);
  report.total_seconds = SecondsSince(save_start);
  ZE_LOG_RANK0(INFO) << "saved checkpoint " << directory << "/" << tag << " ("
                     << comm.world_size()
                     << (comm.world_size() == 1 ? " rank file)"
                                                : " rank files)");
  return absl::OkStatus();
}

absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const CheckpointedState& engine,
                                                const std::string& directory,
                                                const std::string& tag_argument,
                                                bool load_optimizer_states) {
  const char* what = "load_checkpoint";
  const Clock::time_point load_start = Clock::now();
  LoadedCheckpoint result;
  const config::Config& cfg = *engine.config;
  const Counters& counters = *engine.counters;
  nn::LossModel* model = engine.model;
  zero::StateCheckpoint zero_state = engine.strategy->checkpoint();
  ZE_RETURN_IF_ERROR(RequireBoundary(engine, what));
  comm::Communicator& comm = *engine.comm;
  const Stream& stream = *engine.stream;
  StreamGuard guard(stream);
  // Rank 0's tag is the one loaded (as tag_validation says), and rank 0
  // resolves `latest` once, so every rank loads the same tag even if a save
  // elsewhere moves it meanwhile.
  ZE_ASSIGN_OR_RETURN(
      std::string tag,
      AgreeOnDirectoryAndTag(comm, what, directory, tag_argument,
                             cfg.checkpoint.tag_validation, stream));
  if (tag.empty()) {
    absl::StatusOr<std::string> latest = std::string();
    if (comm.rank() == 0) latest = checkpoint::ReadLatestTag(directory);
    ZE_RETURN_IF_ERROR(AgreeAcrossRanks(comm, latest.status(), stream, what));
    ZE_ASSIGN_OR_RETURN(
        tag, BroadcastString(comm, comm.rank() == 0 ? *latest : "", 0, stream));
  }

  // Validation, together, before anything changes.
  std::unique_ptr<checkpoint::CheckpointReader> reader;
  // The one-pass path's host staging, filled and verified before the
  // agreement below, applied after it.
  std::optional<zero::StagedLoad> staged;
  bool master_from_weights = false;
  bool has_weights = false;
  // The kind of the checkpoint a load's request for `kind` reads.
  auto taken_kind = [&](const std::string& kind) -> std::string {
    // A checkpoint of an f32 model has no separate weights.
    if (kind == checkpoint::kWeights && !has_weights)
      return checkpoint::kMaster;
    // zero_optimization.load_from_fp32_weights false (DeepSpeed): the master
    // weights restart from the 16-bit weights.
    if (kind == checkpoint::kMaster && master_from_weights) {
      return checkpoint::kWeights;
    }
    return kind;
  };
  absl::Status valid = [&]() -> absl::Status {
    ZE_ASSIGN_OR_RETURN(reader,
                        checkpoint::CheckpointReader::Open(directory, tag));
    const checkpoint::Manifest& manifest = reader->manifest();
    const std::string source = reader->tag_directory();
    std::vector<std::pair<std::string, Shape>> model_parameters;
    for (nn::Parameter* parameter : model->Parameters()) {
      model_parameters.emplace_back(parameter->name(), parameter->shape());
    }
    ZE_RETURN_IF_ERROR(
        checkpoint::CheckMatchesModel(manifest, model_parameters));
    if (!manifest.HasKind(checkpoint::kMaster)) {
      return absl::DataLossError(
          absl::StrCat(source, ": the manifest lists no \"master\" kind"));
    }
    if (load_optimizer_states) {
      std::vector<std::string> missing;
      for (const auto& kind : zero_state.CheckpointKinds()) {
        if (kind.name != checkpoint::kWeights && !manifest.HasKind(kind.name)) {
          missing.push_back(kind.name);
        }
      }
      if (!missing.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            source, ": the checkpoint has no ", absl::StrJoin(missing, ", "),
            " (saved with optimizer ",
            manifest.training_state.value("optimizer", nlohmann::json("?"))
                .dump(),
            "); load with load_optimizer_states = false to take only the "
            "weights"));
      }
    }
    if (load_optimizer_states) {
      // The moments travel as their exact f32 values; name how the saving
      // run stored them and how this one encodes them.
      const std::string saved = MomentFormatOfConfig(manifest.config);
      const std::string here = MomentFormatOfConfig(cfg);
      if (saved != here) {
        ZE_LOG_RANK0(INFO) << source << ": Adam moments saved as " << saved
                           << ", loaded as " << here << " ("
                           << MomentConversion(here) << ")";
      }
    }
    has_weights = manifest.HasKind(checkpoint::kWeights);
    master_from_weights =
        has_weights && !cfg.zero_optimization.load_from_fp32_weights;
    result.open_seconds = SecondsSince(load_start);
    // read_seconds includes allocating the staging (its pages are touched
    // by the reads).
    const Clock::time_point read_start = Clock::now();
    const int64_t staging_bytes =
        zero_state.StagedLoadBytes(load_optimizer_states);
    if (staging_bytes <= StagingLimit(*engine.host, comm.local_size())) {
      absl::StatusOr<zero::StagedLoad> prepared =
          zero_state.PrepareLoad(load_optimizer_states);
      // No memory after all: the two-pass path, which needs little.
      if (!absl::IsResourceExhausted(prepared.status())) {
        ZE_RETURN_IF_ERROR(prepared.status());
        staged = std::move(prepared).value();
      }
    }
    if (!staged.has_value()) {
      // Two-pass: verify this rank's share of the files, then (after the
      // agreement) read and write bucket by bucket.
      const Clock::time_point verify_start = Clock::now();
      ZE_RETURN_IF_ERROR(reader->VerifyFiles(comm.world_size(), comm.rank()));
      result.verify_seconds = SecondsSince(verify_start);
      return absl::OkStatus();
    }
    // One pass: read everything this rank needs into host staging once,
    // checksumming as it goes, then check this rank's share of the files
    // from those reads (re-reading only a file it did not read whole).
    std::vector<checkpoint::CheckpointReader::RangeRequest> requests;
    requests.reserve(staged->window.reads.size());
    for (const zero::LoadRead& read : staged->window.reads) {
      requests.push_back({taken_kind(read.kind), read.name, read.param_begin,
                          read.destination});
    }
    ZE_RETURN_IF_ERROR(reader->ReadRanges(requests, kLoadReadThreads));
    result.read_seconds = SecondsSince(read_start);
    const Clock::time_point verify_start = Clock::now();
    ZE_RETURN_IF_ERROR(reader->VerifyFilesFromReads(
        comm.world_size(), comm.rank(), &result.files_reread));
    result.verify_seconds = SecondsSince(verify_start);
    return absl::OkStatus();
  }();
  if (!valid.ok()) staged.reset();  // its memory back before waiting
  const Clock::time_point agree_start = Clock::now();
  absl::Status agreed = AgreeAcrossRanks(comm, valid, stream, what);
  if (engine.agree_also != nullptr) {
    // Every rank reaches this agreement, whatever `comm`'s said.
    agreed = AgreeAcrossRanks(*engine.agree_also, agreed, stream, what);
  }
  ZE_RETURN_IF_ERROR(agreed);
  result.verify_seconds += SecondsSince(agree_start);

  const checkpoint::Manifest& manifest = reader->manifest();
  const int64_t optimizer_step_count =
      manifest.training_state.value("optimizer_step_count", int64_t{0});
  const Clock::time_point apply_start = Clock::now();
  absl::Status loaded;
  if (staged.has_value()) {
    result.one_pass = true;
    result.bytes_staged = staged->window.bytes;
    loaded = zero_state.CommitLoad(*staged, optimizer_step_count);
    staged.reset();
  } else {
    loaded = zero_state.LoadState(
        [&](const std::string& kind, const std::string& name,
            int64_t param_begin, const Tensor& destination) {
          return reader->ReadRange(taken_kind(kind), name, param_begin,
                                   destination);
        },
        load_optimizer_states, optimizer_step_count);
  }
  result.apply_seconds = SecondsSince(apply_start);
  if (loaded.ok()) {
    loaded = RestoreTrainingState(engine, manifest.training_state,
                                  reader->tag_directory());
  }
  if (!loaded.ok()) {
    loaded = absl::DataLossError(absl::StrCat(
        "load_checkpoint on rank ", comm.rank(), " failed after validation, ",
        "with the engine's state partly loaded (load again or restart): ",
        loaded.message()));
  }
  ZE_RETURN_IF_ERROR(AgreeAcrossRanks(comm, loaded, stream, what));
  ZE_LOG_RANK0(INFO) << "loaded checkpoint " << reader->tag_directory()
                     << " (saved at world size " << manifest.world_size
                     << ", stage " << manifest.zero_stage << ") at step "
                     << counters.global_steps << " in "
                     << SecondsSince(load_start) << " s, rank 0 "
                     << (result.one_pass
                             ? absl::StrCat("in one pass, ",
                                            result.files_reread,
                                            " file(s) re-read to verify")
                             : std::string("in two passes"));
  result.tag = tag;
  result.client_state = manifest.client_state;
  result.saved_world_size = manifest.world_size;
  result.saved_stage = manifest.zero_stage;
  result.bytes_read = reader->bytes_read();
  result.total_seconds = SecondsSince(load_start);
  return result;
}

namespace {

constexpr char kPipelineFileName[] = "pipeline.json";

// One stage per rank: pipeline_stage_<s>. Several: the rank's one
// strategy state holds them all, so one checkpoint per rank.
std::string StageDirectory(const std::string& directory,
                           const PipelineCheckpointLayout& pipeline) {
  return absl::StrCat(
      directory,
      pipeline.stages_per_rank > 1 ? "/pipeline_rank_" : "/pipeline_stage_",
      pipeline.stage);
}

std::string PipelineJson(const PipelineCheckpointLayout& pipeline) {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& [first, last] : pipeline.layer_ranges) {
    layers.push_back({first, last});
  }
  nlohmann::json json;
  json["stages"] = pipeline.layer_ranges.size();
  // Absent with one stage per rank, so those checkpoints read as before.
  if (pipeline.stages_per_rank > 1) {
    json["stages_per_rank"] = pipeline.stages_per_rank;
  }
  json["layers"] = layers;
  return json.dump() + "\n";
}

// The pipeline.json in `directory`: NotFound when there is none.
absl::StatusOr<std::string> ReadPipelineJson(const std::string& directory) {
  const std::string path = absl::StrCat(directory, "/", kPipelineFileName);
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(
        path, " does not exist: ", directory,
        " holds no pipeline checkpoint (a pipeline loads only checkpoints a "
        "pipeline of the same stages saved)"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::Status RequireSameLayout(const std::string& directory,
                               const std::string& found,
                               const std::string& wanted) {
  if (found == wanted) return absl::OkStatus();
  std::string found_line = found, wanted_line = wanted;
  if (!found_line.empty() && found_line.back() == '\n') found_line.pop_back();
  if (!wanted_line.empty() && wanted_line.back() == '\n') {
    wanted_line.pop_back();
  }
  return absl::FailedPreconditionError(
      absl::StrCat(directory, "/", kPipelineFileName,
                   ": its checkpoints were saved by a "
                   "pipeline of ",
                   found_line, "; this one is ", wanted_line,
                   " (checkpoints do not move between pipeline layouts yet)"));
}

}  // namespace

absl::Status SavePipelineCheckpoint(const CheckpointedState& engine,
                                    const PipelineCheckpointLayout& pipeline,
                                    const std::string& directory,
                                    const std::string& tag_argument,
                                    const nlohmann::json& client_state,
                                    CheckpointSaveReport* report) {
  const char* what = "save_checkpoint";
  comm::Communicator& world = *pipeline.world;
  const Stream& stream = *engine.stream;
  // Every stage's step count is the same, so is the default tag.
  const std::string own_tag =
      tag_argument.empty()
          ? absl::StrCat("global_step", engine.counters->global_steps)
          : tag_argument;
  ZE_ASSIGN_OR_RETURN(
      const std::string tag,
      AgreeOnDirectoryAndTag(world, what, directory, own_tag,
                             engine.config->checkpoint.tag_validation, stream));
  const std::string layout = PipelineJson(pipeline);
  absl::Status prepared;
  if (world.rank() == 0) {
    prepared = [&]() -> absl::Status {
      std::error_code error;
      std::filesystem::create_directories(directory, error);
      if (error) {
        return absl::PermissionDeniedError(absl::StrCat(
            what, ": cannot create ", directory, ": ", error.message()));
      }
      absl::StatusOr<std::string> existing = ReadPipelineJson(directory);
      if (existing.ok()) {
        return RequireSameLayout(directory, *existing, layout);
      }
      return WriteFileAtomically(
          absl::StrCat(directory, "/", kPipelineFileName), layout);
    }();
  }
  ZE_RETURN_IF_ERROR(AgreeAcrossRanks(world, prepared, stream, what));
  const absl::Status saved = SaveCheckpoint(
      engine, StageDirectory(directory, pipeline), tag, client_state, report);
  ZE_RETURN_IF_ERROR(AgreeAcrossRanks(world, saved, stream, what));
  absl::Status committed;
  if (world.rank() == 0) {
    committed = WriteFileAtomically(
        absl::StrCat(directory, "/", checkpoint::kLatestFileName), tag + "\n");
  }
  ZE_RETURN_IF_ERROR(AgreeAcrossRanks(world, committed, stream, what));
  ZE_LOG_RANK0(INFO) << "saved pipeline checkpoint " << directory << "/" << tag
                     << " (" << pipeline.layer_ranges.size() << " stages)";
  return absl::OkStatus();
}

absl::StatusOr<LoadedCheckpoint> LoadPipelineCheckpoint(
    const CheckpointedState& engine, const PipelineCheckpointLayout& pipeline,
    const std::string& directory, const std::string& tag_argument,
    bool load_optimizer_states) {
  const char* what = "load_checkpoint";
  comm::Communicator& world = *pipeline.world;
  const Stream& stream = *engine.stream;
  ZE_ASSIGN_OR_RETURN(
      std::string tag,
      AgreeOnDirectoryAndTag(world, what, directory, tag_argument,
                             engine.config->checkpoint.tag_validation, stream));
  // World rank 0 checks the layout and resolves `latest` once for every
  // stage (a stage's own `latest` may be ahead after a crash mid-save).
  absl::StatusOr<std::string> resolved = tag;
  if (world.rank() == 0) {
    resolved = [&]() -> absl::StatusOr<std::string> {
      ZE_ASSIGN_OR_RETURN(const std::string existing,
                          ReadPipelineJson(directory));
      ZE_RETURN_IF_ERROR(
          RequireSameLayout(directory, existing, PipelineJson(pipeline)));
      if (!tag.empty()) return tag;
      return checkpoint::ReadLatestTag(directory);
    }();
  }
  ZE_RETURN_IF_ERROR(AgreeAcrossRanks(world, resolved.status(), stream, what));
  ZE_ASSIGN_OR_RETURN(
      tag,
      BroadcastString(world, world.rank() == 0 ? *resolved : "", 0, stream));
  CheckpointedState stage_engine = engine;
  stage_engine.agree_also = &world;
  absl::StatusOr<LoadedCheckpoint> loaded =
      LoadCheckpoint(stage_engine, StageDirectory(directory, pipeline), tag,
                     load_optimizer_states);
  ZE_RETURN_IF_ERROR(AgreeAcrossRanks(world, loaded.status(), stream, what));
  return loaded;
}

}  // namespace engine
}  // namespace ze
