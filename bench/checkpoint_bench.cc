// Checkpoint save and load throughput through the public API: a GPT trains
// one step (so the moments are real), then Engine::SaveCheckpoint and
// Engine::LoadCheckpoint run `repeats` times each into --dir. Prints one
// JSON object per phase: seconds, bytes of the checkpoint's files and GB/s,
// with the configuration, and rank 0's split of the time:
//   save: agree_s, copy_s (state to host staging), stall_s (waiting for a
//         free staging buffer: the writer is behind), crc_s,
//         writer_stall_s (the writer waiting for the disk: direct I/O, a
//         free block; buffered, the write() calls), write_s (inside
//         pwrite/write), finish_s (last writes, fsync, rename), commit_s
//         (manifest, `latest`), direct_io, pinned. The copy, the writer and
//         the I/O thread run concurrently, so these do not add up to
//         seconds; a disk-bound save has write_s close to seconds.
//   load: open_s, read_s (one pass: staging allocated and filled, with
//         CRCs), verify_s (checksums compared, re-reads, agreement),
//         apply_s (state written into place; two-pass: read and written),
//         one_pass, bytes_staged, files_reread.
// Compare with the disk's own sequential bandwidth (dd with direct I/O)
// measured in the same run by the caller.
//
//   checkpoint_bench --model=1.3B --dir=/tmp/ckpt [--stage=2] [--batch=4]
//       [--seq=1024] [--repeats=2] [--device=cuda] [--offload=none|optimizer]
//       [--keep=0]
#include <sys/stat.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "bench/gpt_bench_util.h"
#include "comm/factory.h"
#include "core/status.h"
#include "engine/engine.h"
#include "nn/gpt.h"

namespace ze {
namespace bench {
namespace {

using Clock = std::chrono::steady_clock;

int64_t DirectoryBytes(const std::string& path) {
  int64_t bytes = 0;
  for (const auto& entry :
       std::filesystem::recursive_directory_iterator(path)) {
    if (entry.is_regular_file()) bytes += entry.file_size();
  }
  return bytes;
}

absl::Status Run(int argc, char** argv) {
  ZE_ASSIGN_OR_RETURN(Flags flags, Flags::Parse(argc, argv));
  const std::string model_name = flags.GetString("model", "1.3B");
  const std::string directory = flags.GetString("dir", "/tmp/ze_checkpoint");
  ZE_ASSIGN_OR_RETURN(int64_t stage, flags.GetInt("stage", 2, 0, 3));
  ZE_ASSIGN_OR_RETURN(int64_t batch, flags.GetInt("batch", 4, 1, 1024));
  ZE_ASSIGN_OR_RETURN(int64_t seq, flags.GetInt("seq", 1024, 1, 1 << 20));
  ZE_ASSIGN_OR_RETURN(int64_t repeats, flags.GetInt("repeats", 2, 1, 100));
  ZE_ASSIGN_OR_RETURN(bool keep, flags.GetBool("keep", false));
  const std::string device_name = flags.GetString("device", "cuda");
  const std::string offload = flags.GetString("offload", "none");
  ZE_RETURN_IF_ERROR(flags.CheckAllUsed());

  comm::CommOptions comm_options;
  comm_options.device = device_name;
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> created_comm,
                      comm::CreateCommunicator(comm_options));
  std::shared_ptr<comm::Communicator> communicator(std::move(created_comm));
  ZE_ASSIGN_OR_RETURN(nn::GptConfig config, ModelConfig(model_name, seq));
  nn::GptOptions options;
  options.device = communicator->device();
  options.dtype = DType::kBF16;
  options.materialize = false;
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<nn::GptModel> created_model,
                      nn::GptModel::Create(config, options));
  std::shared_ptr<nn::GptModel> model(std::move(created_model));
  const std::string json = absl::StrCat(
      R"({"train_micro_batch_size_per_gpu": )", batch,
      R"(, "gradient_accumulation_steps": 1, "bf16": {"enabled": true},)",
      R"("optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},)",
      R"("zero_optimization": {"stage": )", stage,
      offload == "optimizer"
          ? R"(, "offload_optimizer": {"device": "cpu", "pin_memory": true})"
          : "",
      "}}");
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> engine,
                      engine::Initialize(model, json, communicator));
  ZE_ASSIGN_OR_RETURN(
      TokenBatch tokens,
      RandomBatch(batch, seq, config.vocab_size, 1, communicator->device(),
                  engine->compute_stream()));
  ZE_RETURN_IF_ERROR(engine->Forward(tokens.tokens, tokens.targets).status());
  ZE_RETURN_IF_ERROR(engine->Backward());
  ZE_RETURN_IF_ERROR(engine->Step().status());

  Json base;
  base["bench"] = "checkpoint";
  base["model"] = model_name;
  base["parameters"] = config.NumParameters();
  base["stage"] = stage;
  base["world_size"] = communicator->world_size();
  base["offload"] = offload;
  base["device"] = DeviceName(communicator->device());
  base["directory"] = directory;
  for (int64_t repeat = 0; repeat < repeats; ++repeat) {
    const std::string tag = absl::StrCat("bench", repeat);
    ZE_RETURN_IF_ERROR(communicator->Barrier());
    const auto save_start = Clock::now();
    ZE_RETURN_IF_ERROR(engine->SaveCheckpoint(directory, tag));
    const double save_seconds =
        std::chrono::duration<double>(Clock::now() - save_start).count();
    const int64_t bytes = DirectoryBytes(absl::StrCat(directory, "/", tag));
    // Loading right after saving would read from the page cache; drop it
    // for this directory's files so the load reads the disk (best effort:
    // needs root; reported).
    const bool dropped =
        communicator->rank() == 0 &&
        std::system("sync; echo 1 > /proc/sys/vm/drop_caches 2>/dev/null") == 0;
    ZE_RETURN_IF_ERROR(communicator->Barrier());
    const auto load_start = Clock::now();
    ZE_ASSIGN_OR_RETURN(engine::Engine::LoadedCheckpoint loaded,
                        engine->LoadCheckpoint(directory, tag));
    const double load_seconds =
        std::chrono::duration<double>(Clock::now() - load_start).count();
    for (const auto& [phase, seconds] :
         {std::make_pair("save", save_seconds),
          std::make_pair("load", load_seconds)}) {
      Json line = base;
      line["phase"] = phase;
      line["repeat"] = repeat;
      line["seconds"] = seconds;
      line["checkpoint_bytes"] = bytes;
      line["gb_per_s"] = bytes / seconds / 1e9;
      if (std::string(phase) == "load") {
        line["bytes_read_rank0"] = loaded.bytes_read;
        line["page_cache_dropped"] = dropped;
        line["one_pass"] = loaded.one_pass;
        line["bytes_staged"] = loaded.bytes_staged;
        line["files_reread"] = loaded.files_reread;
        line["open_s"] = loaded.open_seconds;
        line["read_s"] = loaded.read_seconds;
        line["verify_s"] = loaded.verify_seconds;
        line["apply_s"] = loaded.apply_seconds;
      } else {
        const engine::Engine::CheckpointSaveReport& report =
            engine->last_save_report();
        line["direct_io"] = report.direct_io;
        line["pinned"] = report.pinned;
        line["agree_s"] = report.agree_seconds;
        line["copy_s"] = report.copy_seconds;
        line["stall_s"] = report.stall_seconds;
        line["crc_s"] = report.crc_seconds;
        line["writer_stall_s"] = report.writer_stall_seconds;
        line["write_s"] = report.write_seconds;
        line["finish_s"] = report.finish_seconds;
        line["commit_s"] = report.commit_seconds;
      }
      PrintJson(line);
    }
    if (!keep && communicator->rank() == 0) {
      std::filesystem::remove_all(absl::StrCat(directory, "/", tag));
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace bench
}  // namespace ze

int main(int argc, char** argv) {
  absl::Status status = ze::bench::Run(argc, argv);
  if (!status.ok()) {
    std::fprintf(stderr, "checkpoint_bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
