// custom_model: a model of the user's own, not GptModel, trained data-parallel
// under ZeRO stage 3 through ze::engine::Initialize (docs/custom_model.md
// walks through it).
//
//   mpirun --oversubscribe --bind-to none -np 2 custom_model
//       [--config=examples/custom_model/zero3.json] [--steps=200]
//       [--device=auto|cpu|cuda] [--min_loss_drop=0.2]
//
// The model is a residual MLP classifier written as a user writes one: a
// nn::LossModel root, a container of its own (ResidualBlock) and a leaf with
// its own parameters (ClassifierHead), around nn's Embedding, Linear,
// LayerNorm and Mlp. Nothing in it knows about ZeRO: the engine's hooks
// gather each module's parameters just before it runs and release them
// after.
//
// The data is built in: a sample is 8 random digits and its class is their
// sum divided by 8 (0..9), so a wrong model starts at a loss near ln 10 =
// 2.30 and learning shows within a few dozen steps. Sample g is a pure
// function of g, and rank r of W feeds samples (s*W + r)*B .. +B-1 at step s
// (micro-batch B), so the run sees the same data at every world size and
// matches a one-rank run whose micro-batch is W*B.
//
// Output (rank 0): "step N loss L" after every optimizer step (the engine's
// mean over ranks and micro-batches, 9 significant digits), then one line
// "custom_model: ..." with the first and last losses and the held-out loss.
// Exit status 0 when the run finished; 1 only when --min_loss_drop=F asked
// for a loss drop it did not reach (the mean of the last fifth of the steps
// must be at least F below the first fifth's; 0, the default: no check); 2
// for a bad flag or any error.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "comm/factory.h"
#include "config/config.h"
#include "core/ops.h"
#include "core/status.h"
#include "engine/engine.h"
#include "nn/functional.h"
#include "nn/layers.h"
#include "nn/loss_model.h"
#include "nn/module.h"

namespace ze {
namespace {

constexpr int64_t kDigits = 8;    // tokens per sample (T)
constexpr int64_t kVocab = 10;    // the digits 0..9
constexpr int64_t kClasses = 10;  // digit sum / 8, 0..9
constexpr int64_t kEmbed = 16;    // channels per token
constexpr int64_t kWidth = 64;    // the residual stream's width
constexpr int kBlocks = 2;

// x (B, W) -> x + mlp(norm(x)) (B, W). A container of the user's own: it
// runs its children through their public Forward and Backward, so the hooks
// that gather their parameters fire around each, and adds the skip
// connection itself in both directions.
class ResidualBlock : public nn::Module {
 public:
  ResidualBlock(int64_t width, int num_blocks, const nn::LayerOptions& options)
      : nn::Module("ResidualBlock") {
    norm_ =
        RegisterChild("norm", std::make_unique<nn::LayerNorm>(width, options));
    mlp_ = RegisterChild("mlp",
                         std::make_unique<nn::Mlp>(width, num_blocks, options));
  }

 protected:
  absl::StatusOr<Tensor> ForwardImpl(const Tensor& x,
                                     const Stream& stream) override {
    ZE_ASSIGN_OR_RETURN(Tensor h, norm_->Forward(x, stream));
    ZE_ASSIGN_OR_RETURN(Tensor y, mlp_->Forward(h, stream));
    ZE_RETURN_IF_ERROR(Add(x, y, y, stream));  // y is ours: add in place
    return y;
  }
  absl::StatusOr<Tensor> BackwardImpl(const Tensor& grad_y,
                                      const Stream& stream) override {
    ZE_ASSIGN_OR_RETURN(Tensor grad_h, mlp_->Backward(grad_y, stream));
    ZE_ASSIGN_OR_RETURN(Tensor grad_x, norm_->Backward(grad_h, stream));
    ZE_RETURN_IF_ERROR(Add(grad_x, grad_y, grad_x, stream));  // the skip
    return grad_x;
  }

 private:
  nn::LayerNorm* norm_;
  nn::Mlp* mlp_;
};

// logits (B, K) = x (B, W) @ weight (K, W)^T + bias (K). nn::Linear does the
// same; this leaf is written out to show how a module registers parameters
// and reads them.
class ClassifierHead : public nn::Module {
 public:
  ClassifierHead(int64_t width, int64_t classes,
                 const nn::LayerOptions& options)
      : nn::Module("ClassifierHead") {
    // Shapes only, no storage: the engine creates it (under stage 3 only
    // this rank's slice, initialised from (seed, "head.weight", index)).
    weight_ = RegisterParameter("weight", {classes, width}, options.dtype,
                                options.device, nn::Initializer::Normal(0.02f));
    bias_ = RegisterParameter("bias", {classes}, options.dtype, options.device,
                              nn::Initializer::Zeros());
  }

 protected:
  absl::StatusOr<Tensor> ForwardImpl(const Tensor& x,
                                     const Stream& stream) override {
    // Asked for on every call, never kept: under stage 3 the full weight
    // exists only between this module's pre- and post-forward hooks.
    ZE_ASSIGN_OR_RETURN(Tensor weight, weight_->data());
    ZE_ASSIGN_OR_RETURN(Tensor bias, bias_->data());
    ZE_ASSIGN_OR_RETURN(
        Tensor logits,
        Tensor::Empty({x.size(0), weight.size(0)}, x.dtype(), x.device()));
    ZE_RETURN_IF_ERROR(nn::LinearForward(x, weight, bias, logits, stream));
    saved_inputs_.Save(x);  // what backward needs, one record per call
    return logits;
  }
  absl::StatusOr<Tensor> BackwardImpl(const Tensor& grad_logits,
                                      const Stream& stream) override {
    ZE_RETURN_IF_ERROR(RequireSaved(!saved_inputs_.empty()));
    const Tensor x = saved_inputs_.Pop();
    ZE_ASSIGN_OR_RETURN(Tensor weight, weight_->data());
    // Gradients ACCUMULATE into the slot the engine hands out (under stage
    // 3 a full-size buffer, reduce-scattered after this module's backward).
    ZE_ASSIGN_OR_RETURN(Tensor grad_weight,
                        weight_->GradForAccumulation(stream));
    ZE_ASSIGN_OR_RETURN(Tensor grad_bias, bias_->GradForAccumulation(stream));
    ZE_ASSIGN_OR_RETURN(
        Tensor grad_x,
        Tensor::Empty(x.shape(), grad_logits.dtype(), grad_logits.device()));
    ZE_RETURN_IF_ERROR(nn::LinearBackward(grad_logits, x, weight, grad_x,
                                          grad_weight, grad_bias, stream));
    return grad_x;
  }
  void ClearSavedStateImpl() override { saved_inputs_.Clear(); }

 private:
  nn::Parameter* weight_;
  nn::Parameter* bias_;
  nn::SavedStack<Tensor> saved_inputs_;  // x (B, W) per call
};

// tokens (B, 8) i32 -> logits (B, 10), and the cross-entropy loss the engine
// trains. Parameter names: embed.{wte,wpe}, proj_in.{weight,bias},
// blocks.N.norm.{weight,bias}, blocks.N.mlp.{fc,proj}.{weight,bias},
// norm.{weight,bias}, head.{weight,bias}.
class DigitSumClassifier : public nn::LossModel {
 public:
  explicit DigitSumClassifier(const nn::LayerOptions& options)
      : nn::LossModel("DigitSumClassifier"), options_(options) {
    embed_ = RegisterChild("embed", std::make_unique<nn::Embedding>(
                                        kVocab, kDigits, kEmbed, options));
    proj_in_ = RegisterChild(
        "proj_in", std::make_unique<nn::Linear>(kDigits * kEmbed, kWidth,
                                                /*with_bias=*/true, options));
    blocks_ = RegisterChild("blocks", std::make_unique<nn::Sequential>());
    for (int i = 0; i < kBlocks; ++i) {
      blocks_->Append(
          std::make_unique<ResidualBlock>(kWidth, kBlocks, options));
    }
    norm_ =
        RegisterChild("norm", std::make_unique<nn::LayerNorm>(kWidth, options));
    head_ = RegisterChild(
        "head", std::make_unique<ClassifierHead>(kWidth, kClasses, options));
  }

  // inputs, targets (B, 8) i32 on the model's device; the label of sample b
  // is targets[b][0] (the targets keep the inputs' shape, so one batch
  // maker serves both; the other columns are -1 and ignored). Returns the
  // mean loss over labelled rows.
  absl::StatusOr<float> ForwardLoss(const Tensor& inputs, const Tensor& targets,
                                    const Stream& stream) override {
    if (inputs.dim() != 2 || inputs.size(1) != kDigits ||
        targets.shape() != inputs.shape() || targets.dtype() != DType::kI32) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DigitSumClassifier: inputs and targets must both be (B, ", kDigits,
          ") i32, got ", inputs.DebugString(), " and ", targets.DebugString()));
    }
    ZE_ASSIGN_OR_RETURN(labels_, FirstColumn(targets, stream));  // (B)
    ZE_ASSIGN_OR_RETURN(logits_, Forward(inputs, stream));       // (B, K)
    ZE_ASSIGN_OR_RETURN(
        Tensor losses,  // (B)
        Tensor::Empty({inputs.size(0)}, DType::kF32, logits_.device()));
    ZE_RETURN_IF_ERROR(
        nn::CrossEntropyForward(logits_, labels_, losses, stream));
    // One read back per micro-batch (it synchronises the stream).
    ZE_ASSIGN_OR_RETURN(std::vector<float> host_losses,
                        ToHostFloats(losses, stream));
    double sum = 0;
    counted_targets_ = 0;
    for (size_t b = 0; b < host_losses.size(); ++b) {
      if (host_labels_[b] < 0) continue;
      sum += host_losses[b];
      ++counted_targets_;
    }
    return counted_targets_ > 0 ? static_cast<float>(sum / counted_targets_)
                                : 0.0f;
  }

  // Backpropagates loss_scale * the last ForwardLoss's mean loss through the
  // public Module::Backward (so every module's backward hooks fire).
  absl::Status BackwardLoss(float loss_scale, const Stream& stream) override {
    if (!logits_.defined()) {
      return absl::FailedPreconditionError(
          "DigitSumClassifier::BackwardLoss without a preceding ForwardLoss");
    }
    const Tensor logits = std::move(logits_);
    logits_ = Tensor();
    const float grad_scale =
        counted_targets_ > 0 ? loss_scale / counted_targets_ : 0.0f;
    // In place: the logits are not needed once their gradient is formed.
    ZE_RETURN_IF_ERROR(
        nn::CrossEntropyBackward(logits, labels_, grad_scale, logits, stream));
    return Backward(logits, stream).status();
  }

  int64_t counted_targets() const override { return counted_targets_; }
  Device device() const override { return options_.device; }
  DType dtype() const override { return options_.dtype; }
  // Sizes the config's "auto" bucket sizes, as Hugging Face's hidden_size.
  int64_t hidden_size() const override { return kWidth; }

 protected:
  // tokens (B, 8) i32 -> logits (B, 10).
  absl::StatusOr<Tensor> ForwardImpl(const Tensor& tokens,
                                     const Stream& stream) override {
    const int64_t batch = tokens.size(0);
    ZE_ASSIGN_OR_RETURN(Tensor x, embed_->Forward(tokens, stream));  // (B,T,E)
    ZE_ASSIGN_OR_RETURN(
        x, proj_in_->Forward(x.View({batch, kDigits * kEmbed}), stream));
    ZE_ASSIGN_OR_RETURN(x, blocks_->Forward(x, stream));  // (B, W)
    ZE_ASSIGN_OR_RETURN(x, norm_->Forward(x, stream));
    return head_->Forward(x, stream);  // (B, K)
  }
  // The reverse order; the embedding returns no gradient (token ids).
  absl::StatusOr<Tensor> BackwardImpl(const Tensor& grad_logits,
                                      const Stream& stream) override {
    const int64_t batch = grad_logits.size(0);
    ZE_ASSIGN_OR_RETURN(Tensor grad, head_->Backward(grad_logits, stream));
    ZE_ASSIGN_OR_RETURN(grad, norm_->Backward(grad, stream));
    ZE_ASSIGN_OR_RETURN(grad, blocks_->Backward(grad, stream));
    ZE_ASSIGN_OR_RETURN(grad, proj_in_->Backward(grad, stream));  // (B, T*E)
    return embed_->Backward(grad.View({batch, kDigits, kEmbed}), stream);
  }
  void ClearSavedStateImpl() override {
    logits_ = Tensor();
    labels_ = Tensor();
  }

 private:
  // targets (B, T) -> targets[:, 0] (B) on the model's device, kept on the
  // host too (host_labels_) to count the labelled rows.
  absl::StatusOr<Tensor> FirstColumn(const Tensor& targets,
                                     const Stream& stream) {
    const int64_t batch = targets.size(0);
    ZE_ASSIGN_OR_RETURN(Tensor host, Tensor::Empty(targets.shape(), DType::kI32,
                                                   Device::Cpu()));
    ZE_RETURN_IF_ERROR(Copy(targets, host, stream));
    ZE_RETURN_IF_ERROR(stream.Synchronize());
    host_labels_.assign(batch, -1);
    ZE_ASSIGN_OR_RETURN(Tensor column,
                        Tensor::Empty({batch}, DType::kI32, Device::Cpu()));
    for (int64_t b = 0; b < batch; ++b) {
      host_labels_[b] = host.data_as<const int32_t>()[b * targets.size(1)];
      column.data_as<int32_t>()[b] = host_labels_[b];
    }
    if (options_.device.is_cpu()) return column;
    ZE_ASSIGN_OR_RETURN(Tensor labels,
                        Tensor::Empty({batch}, DType::kI32, options_.device));
    ZE_RETURN_IF_ERROR(Copy(column, labels, stream));
    // `column` is pageable host memory freed on return: let the copy finish.
    ZE_RETURN_IF_ERROR(stream.Synchronize());
    return labels;
  }

  nn::LayerOptions options_;
  nn::Embedding* embed_;
  nn::Linear* proj_in_;
  nn::Sequential* blocks_;
  nn::LayerNorm* norm_;
  ClassifierHead* head_;
  // Between ForwardLoss and BackwardLoss.
  Tensor logits_;  // (B, K)
  Tensor labels_;  // (B) i32
  std::vector<int32_t> host_labels_;
  int64_t counted_targets_ = 0;
};

// ------------------------------------------------------------------- data

uint64_t Mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Samples [first, first + batch) as (batch, 8) i32 tokens and targets (the
// label in column 0, -1 elsewhere), on the host.
absl::Status MakeBatch(uint64_t first, int64_t batch, Tensor* tokens,
                       Tensor* targets) {
  ZE_ASSIGN_OR_RETURN(
      *tokens, Tensor::Empty({batch, kDigits}, DType::kI32, Device::Cpu()));
  ZE_ASSIGN_OR_RETURN(
      *targets, Tensor::Empty({batch, kDigits}, DType::kI32, Device::Cpu()));
  for (int64_t b = 0; b < batch; ++b) {
    int32_t* row = tokens->data_as<int32_t>() + b * kDigits;
    int32_t* target_row = targets->data_as<int32_t>() + b * kDigits;
    int32_t sum = 0;
    for (int64_t t = 0; t < kDigits; ++t) {
      row[t] = static_cast<int32_t>(Mix((first + b) * kDigits + t) % kVocab);
      sum += row[t];
      target_row[t] = -1;
    }
    target_row[0] = sum / 8;  // 0..72 -> 0..9
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------------- main

struct Flags {
  std::string config = "examples/custom_model/zero3.json";
  int64_t steps = 200;
  std::string device = "auto";
  double min_loss_drop = 0;  // 0: no check
};

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    bool ok = eq != std::string::npos;
    if (name == "--config") {
      flags.config = value;
    } else if (name == "--device") {
      flags.device = value;
    } else if (name == "--steps") {
      ok = ok && absl::SimpleAtoi(value, &flags.steps) && flags.steps >= 5;
    } else if (name == "--min_loss_drop") {
      ok = ok && absl::SimpleAtod(value, &flags.min_loss_drop) &&
           flags.min_loss_drop >= 0 && flags.min_loss_drop < 1;
    } else {
      ok = false;
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bad flag '", arg,
          "'; usage: custom_model [--config=PATH] [--steps=N>=5] "
          "[--device=auto|cpu|cuda] [--min_loss_drop=F in [0, 1)]"));
    }
  }
  return flags;
}

absl::Status Train(const Flags& flags, int* exit_code) {
  // The communicator first: it picks this rank's device (cuda:local_rank
  // when there are GPUs), which the model is built on.
  comm::CommOptions comm_options;
  comm_options.device = flags.device;
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> created,
                      comm::CreateCommunicator(comm_options));
  std::shared_ptr<comm::Communicator> communicator = std::move(created);
  const int world = communicator->world_size();
  const int rank = communicator->rank();

  // The config decides the dtype (bf16/fp16 blocks), which the model's
  // parameters must have; Initialize checks that they agree.
  ZE_ASSIGN_OR_RETURN(config::Config config,
                      config::LoadConfigFile(flags.config, world));
  nn::LayerOptions options;
  options.device = communicator->device();
  options.dtype = config::PrecisionDType(config::GetTrainingPrecision(config));
  auto model = std::make_shared<DigitSumClassifier>(options);
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> engine,
                      engine::Initialize(model, flags.config, communicator));

  const int64_t micro = engine->config().train_micro_batch_size_per_gpu.value();
  const int64_t accumulation =
      engine->config().gradient_accumulation_steps.value();
  std::vector<double> losses;
  for (int64_t step = 0; step < flags.steps; ++step) {
    for (int64_t m = 0; m < accumulation; ++m) {
      Tensor tokens, targets;
      ZE_RETURN_IF_ERROR(
          MakeBatch(((step * accumulation + m) * world + rank) * micro, micro,
                    &tokens, &targets));
      ZE_RETURN_IF_ERROR(engine->Forward(tokens, targets).status());
      ZE_RETURN_IF_ERROR(engine->Backward());
      ZE_ASSIGN_OR_RETURN(engine::StepReport report, engine->Step());
      if (report.boundary) {
        losses.push_back(report.loss);
        if (rank == 0) {
          std::printf("step %lld loss %.9g\n", static_cast<long long>(step + 1),
                      report.loss);
        }
      }
    }
  }

  // Held-out samples (far past any training sample), the same on every
  // rank: under stage 3 EvalForward is a collective.
  Tensor tokens, targets;
  ZE_RETURN_IF_ERROR(MakeBatch(uint64_t{1} << 40, 256, &tokens, &targets));
  ZE_ASSIGN_OR_RETURN(float held_out, engine->EvalForward(tokens, targets));
  // And the classifier's own output, model(inputs) without a backward: the
  // share of held-out samples whose largest logit is the label.
  ZE_ASSIGN_OR_RETURN(Tensor logits, engine->EvalOutputs(tokens));  // (B, 10)
  ZE_ASSIGN_OR_RETURN(std::vector<float> values,
                      ToHostFloats(logits, engine->compute_stream()));
  const int64_t classes = logits.size(1);
  int64_t correct = 0;
  for (int64_t b = 0; b < logits.size(0); ++b) {
    const float* row = values.data() + b * classes;
    const int64_t predicted = std::max_element(row, row + classes) - row;
    correct += predicted == targets.data_as<int32_t>()[b * kDigits];
  }
  const double accuracy = static_cast<double>(correct) / logits.size(0);

  const size_t fifth = std::max<size_t>(1, losses.size() / 5);
  double first = 0, last = 0;
  for (size_t i = 0; i < fifth; ++i) {
    first += losses[i] / fifth;
    last += losses[losses.size() - 1 - i] / fifth;
  }
  const bool fell = last < first;
  const bool dropped_enough =
      flags.min_loss_drop <= 0 || last <= (1 - flags.min_loss_drop) * first;
  if (rank == 0) {
    std::printf(
        "custom_model: %d rank%s, ZeRO stage %d, %lld parameters, %zu steps; "
        "loss %.4f (first fifth) -> %.4f (last fifth), held-out %.4f "
        "(chance ln 10 = 2.3026), accuracy %.1f%% (chance 10%%)%s%s\n",
        world, world == 1 ? "" : "s",
        static_cast<int>(engine->config().zero_optimization.stage),
        static_cast<long long>(model->NumParameterElements()), losses.size(),
        first, last, held_out, 100 * accuracy,
        fell ? "" : "; the loss did not fall",
        dropped_enough
            ? ""
            : absl::StrFormat("; FAILED: --min_loss_drop %.0f%% not reached",
                              flags.min_loss_drop * 100)
                  .c_str());
    std::fflush(stdout);
  }
  *exit_code = dropped_enough ? 0 : 1;
  return absl::OkStatus();
}

}  // namespace
}  // namespace ze

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::printf(
          "usage: custom_model [--config=PATH (default "
          "examples/custom_model/zero3.json)] [--steps=N>=5 (200)] "
          "[--device=auto|cpu|cuda] [--min_loss_drop=F in [0, 1) (0: no "
          "check)]\nexit status: 0 finished, 1 --min_loss_drop not "
          "reached, 2 bad flag or error\n");
      return 0;
    }
  }
  absl::StatusOr<ze::Flags> flags = ze::ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "%s\n", flags.status().ToString().c_str());
    return 2;
  }
  int exit_code = 2;
  const absl::Status status = ze::Train(*flags, &exit_code);
  if (!status.ok()) {
    std::fprintf(stderr, "custom_model: %s\n", status.ToString().c_str());
    return 2;
  }
  return exit_code;
}
