// EngineImpl: the Engine's implementation, private to engine/ (the
// //engine:engine target's sources; nothing outside engine/ can include it).
// engine/engine.h's Engine forwards every call here, so the public header
// names none of the state below (the strategy, the training state, the step
// monitor) nor the headers behind it. The contracts are the Engine's
// (engine/engine.h); this header adds only what the implementation shares
// across engine.cc, inference.cc and the checkpoint calls.
//
// Threading: as the Engine's, one thread drives it.
#ifndef ZE_ENGINE_ENGINE_IMPL_H_
#define ZE_ENGINE_ENGINE_IMPL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "core/host_facts.h"
#include "core/safetensors/tensor_source.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "engine/checkpoint/orchestration.h"
#include "engine/engine.h"
#include "engine/offload_report.h"
#include "engine/reports.h"
#include "engine/step_monitor.h"
#include "nlohmann/json.hpp"
#include "nn/activation_offload.h"
#include "nn/loss_model.h"
#include "pipeline/executor.h"
#include "pipeline/layout.h"
#include "pipeline/partition.h"
#include "zero/plan.h"
#include "zero/strategy.h"
#include "zero/training_state.h"

namespace ze {
namespace engine {

class EngineImpl {
 public:
  EngineImpl() = default;
  // Takes this engine's activation offload (and with it the pinned memory
  // of one forward's inputs) off the model's modules: the model may outlive
  // the engine.
  ~EngineImpl();
  EngineImpl(const EngineImpl&) = delete;
  EngineImpl& operator=(const EngineImpl&) = delete;

  // The Engine's methods (engine/engine.h), one for one. Declared
  // boilerplate: the pimpl's mirror of the public declarations, which is
  // what keeps engine.h free of the implementation's headers.
  absl::StatusOr<float> Forward(const Tensor& inputs, const Tensor& targets);
  absl::Status Backward();
  absl::StatusOr<StepReport> Step();
  absl::StatusOr<StepReport> TrainBatch(
      const std::vector<std::pair<Tensor, Tensor>>& micro_batches);
  bool IsGradientAccumulationBoundary() const;
  const Counters& counters() const { return counters_; }
  double current_learning_rate() const;
  double current_loss_scale() const;
  const config::Config& config() const { return config_; }
  comm::Communicator& communicator() const { return *communicator_; }
  nn::LossModel& model() const { return *model_; }
  const MemoryBreakdown& memory_breakdown() const {
    return strategy_->memory();
  }
  const Stream& compute_stream() const { return compute_stream_; }
  CommunicationCounters communication_counters() const;
  PipelineCounters pipeline_counters() const;
  NvmeCounters nvme_counters() const;
  OffloadTimes offload_times() const;
  absl::StatusOr<std::vector<float>> GatherMasterWeights(
      const std::string& name);
  std::vector<std::string> ParameterNames() const;
  absl::StatusOr<float> EvalForward(const Tensor& inputs,
                                    const Tensor& targets);
  absl::StatusOr<Tensor> EvalOutputs(const Tensor& inputs);
  absl::StatusOr<std::vector<std::vector<int32_t>>> Generate(
      const std::vector<std::vector<int32_t>>& prompts, int max_new_tokens,
      const GenerateOptions& options);
  absl::StatusOr<std::unique_ptr<GatheredParameters>> GatherParameters(
      const std::vector<std::string>& names, int modifier_rank);
  absl::StatusOr<LoadReport> LoadWeights(const std::string& path);
  absl::StatusOr<LoadReport> LoadWeights(
      const safetensors::TensorSource& source);
  absl::Status SaveCheckpoint(const std::string& directory,
                              const std::string& tag,
                              const nlohmann::json& client_state);
  const CheckpointSaveReport& last_save_report() const {
    return last_save_report_;
  }
  absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& directory,
                                                  const std::string& tag,
                                                  bool load_optimizer_states);

  // GatheredParameters::Release: ends the scope GatherParameters opened.
  absl::Status ReleaseScope(const std::vector<std::string>& names,
                            int modifier_rank);

 private:
  friend absl::StatusOr<std::unique_ptr<Engine>> Initialize(
      std::shared_ptr<nn::LossModel> model, const config::Config& config,
      std::shared_ptr<comm::Communicator> communicator);
  // The part of Initialize after the checks: training state and strategy.
  absl::Status Setup();
  // With pipeline.stages > 1, before Setup: the layout and its groups over
  // `world` (collective); communicator_ becomes this stage's data-parallel
  // group.
  absl::Status SetUpPipelineGroups(std::shared_ptr<comm::Communicator> world);
  // Setup's pipeline part (after the strategy): checks the model is this
  // rank's stage of the partition, turns on per-layer checkpointing, builds
  // the schedule and the executor. InvalidArgument/Unimplemented naming the
  // pipeline key.
  absl::Status SetUpPipeline();
  // TrainBatch on a pipeline: the executor's step, then Step's bookkeeping
  // for each micro-batch (the last one the boundary).
  absl::StatusOr<StepReport> TrainPipelineBatch(
      const std::vector<std::pair<Tensor, Tensor>>& micro_batches);
  // FailedPrecondition naming `what` on a pipeline engine.
  absl::Status RequireNoPipeline(const char* what) const;
  absl::StatusOr<Tensor> OnModelDevice(const Tensor& tensor);
  absl::Status RequireNoPendingBackward(const char* what) const;
  // The evaluation bracket of EvalForward, EvalOutputs and Generate: runs
  // `forward` between the strategy's BeginEval and EndEval, then drops what
  // the model kept for a backward (it must not be mistaken for a training
  // forward's). Returns forward's error first, then EndEval's.
  absl::Status RunEvaluation(const std::function<absl::Status()>& forward);
  // After a boundary step: the non-finite warning, count and error (Step's
  // comment).
  absl::Status CheckFinite(const StepReport& report);
  // What the checkpoint orchestration (engine/checkpoint/orchestration.h)
  // reads and restores, borrowed for one call.
  CheckpointedState CheckpointState();
  // A pipeline engine's place in its checkpoints (pipeline_ set).
  PipelineCheckpointLayout PipelineCheckpoint() const;

  config::Config config_;
  std::shared_ptr<nn::LossModel> model_;
  std::shared_ptr<comm::Communicator> communicator_;
  Stream compute_stream_;
  Counters counters_;
  // Read from the environment once, by Setup; passed to the strategy and the
  // checkpoint orchestration.
  HostFacts host_facts_;
  CheckpointSaveReport last_save_report_;
  std::unique_ptr<zero::TrainingState> training_;
  // Built once by Setup (zero/plan.h); the strategy borrows it, so it is
  // declared before (destroyed after) the strategy.
  zero::Plan plan_;
  std::unique_ptr<zero::ZeroStrategy> strategy_;
  // activation_checkpointing.cpu_checkpointing: installed on every module
  // of the model by Setup (null when off); the modules share it.
  std::shared_ptr<nn::ActivationOffload> activation_offload_;
  // Modules of the model that are checkpointed (what the offload acts on).
  int checkpointed_modules_ = 0;
  // bf16/f32: consecutive non-finite steps so far, and whether the last
  // step applied an update despite a non-finite loss or gradient norm.
  int64_t nonfinite_streak_ = 0;
  bool last_update_nonfinite_ = false;
  double last_nonfinite_loss_ = 0;
  // This window's summed micro-batch losses (for the step's mean loss).
  double loss_sum_ = 0;
  // Timing, throughput, memory and csv_monitor (engine/step_monitor.h);
  // set by Initialize.
  std::optional<StepMonitor> monitor_;
  // Pipeline parallelism (docs/pipeline.md); unset without one. The
  // executor borrows the groups and the strategy, so it is declared last
  // (destroyed first).
  std::shared_ptr<comm::Communicator> world_;
  std::optional<pipeline::PipelineLayout> pipeline_layout_;
  pipeline::PipelineGroups pipeline_groups_;
  // Each stage's layer range (SetUpPipeline), for checkpoints.
  std::vector<pipeline::LayerRange> pipeline_ranges_;
  // The last TrainBatch's boundary step, host milliseconds
  // (PipelineCounters::boundary_ms).
  double pipeline_boundary_ms_ = 0;
  std::unique_ptr<pipeline::PipelineExecutor> pipeline_;
};

}  // namespace engine
}  // namespace ze

#endif  // ZE_ENGINE_ENGINE_IMPL_H_
