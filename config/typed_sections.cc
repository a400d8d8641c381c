// The sections whose valid keys depend on their "type": optimizer and
// scheduler ({"type": ..., "params": {...}}). Their params tables per type,
// the two top-level fields, and the equality derived from the tables.
#include <set>
#include <string>
#include <vector>

#include "config/sections.h"

namespace ze {
namespace config {
namespace internal {
namespace {

const Codec<OptimizerType>& OptimizerTypeCodec() {
  static const auto* codec = new Codec<OptimizerType>(Enum<OptimizerType>(
      {{"Adam", OptimizerType::kAdam},
       {"AdamW", OptimizerType::kAdamW},
       {"SGD", OptimizerType::kSgd}},
      /*case_insensitive=*/true,
      {"Lamb", "OneBitAdam", "ZeroOneAdam", "OneBitLamb", "Adagrad", "Lion",
       "MuAdam", "MuAdamW", "MuSGD", "Adafactor"}));
  return *codec;
}

const Codec<SchedulerType>& SchedulerTypeCodec() {
  static const auto* codec = new Codec<SchedulerType>(
      Enum<SchedulerType>({{"WarmupLR", SchedulerType::kWarmupLR},
                           {"WarmupDecayLR", SchedulerType::kWarmupDecayLR},
                           {"WarmupCosineLR", SchedulerType::kWarmupCosineLR},
                           {"OneCycle", SchedulerType::kOneCycle}},
                          /*case_insensitive=*/false, {"LRRangeTest"}));
  return *codec;
}

// DeepSpeed's config parser warns about it likewise (its own optimizers
// refuse it when DeepSpeed builds them).
constexpr char kMaxGradNorm[] =
    "not an optimizer parameter; gradients are clipped by the top-level "
    "gradient_clipping";

// Adam and AdamW share keys; adam_w_mode matters for Adam only but DeepSpeed
// reads it for both.
const Schema<OptimizerParams>& AdamParamsSchema() {
  static const auto* schema = [] {
    auto* s = new Schema<OptimizerParams>();
    s->Add(Value("lr", &OptimizerParams::lr, AutoOr(Number(NonNegative())),
                 "Learning rate (the peak, when a scheduler warms up)."))
        .Add(Value("betas", &OptimizerParams::betas, AutoOr(Betas()),
                   "Decay rates of the first and second moment estimates."))
        .Add(Value("eps", &OptimizerParams::eps, AutoOr(Number(NonNegative())),
                   "Added to the denominator for numerical stability."))
        .Add(Value("weight_decay", &OptimizerParams::weight_decay,
                   AutoOr(Number(NonNegative())),
                   "Weight decay; decoupled (AdamW) unless type is Adam with "
                   "adam_w_mode false."))
        .Add(Value("torch_adam", &OptimizerParams::torch_adam, Boolean(),
                   "DeepSpeed: use torch.optim.Adam. Accepted; zero-engine has "
                   "one Adam implementation."))
        .Add(
            Value("adam_w_mode", &OptimizerParams::adam_w_mode, Boolean(),
                  "Type Adam: true applies decoupled weight decay (DeepSpeed's "
                  "default), false adds it to the gradient (L2). Must not be "
                  "false for AdamW."))
        .Add(Value("blockwise_8bit_moments",
                   &OptimizerParams::blockwise_8bit_moments, Boolean(),
                   "zero-engine extension: Adam's moments in 8 bits, in "
                   "blocks of 256 elements with one fp32 scale per block and "
                   "moment (about 2.03 bytes an element instead of 8): each "
                   "value rounded to a float with 3 (v) or 2 (|m|) "
                   "significand bits and stored as its grid index below the "
                   "block's largest (v: 255 codes over 31.75 octaves; m: a "
                   "sign and 127 codes over 31.5), the same relative "
                   "precision at every magnitude. Each step decodes, updates "
                   "in fp32 and re-encodes in one pass, on the GPU and the "
                   "CPU, rounding stochastically so that m and v are "
                   "unbiased (noise keyed by the config's seed, the step and "
                   "the element, as for bf16; bench/convergence/README.md). "
                   "An optimizer over fewer than 4096 elements (a small "
                   "bucket) keeps fp32 moments. Not with "
                   "bf16.bf16_optimizer_states, offload_optimizer nvme "
                   "(refused) nor SGD. Checkpoints hold the exact decoded "
                   "values and load into any moment format."))
        .Ignored("max_grad_norm", Number(NonNegative()),
                 std::optional<double>(0.0), kMaxGradNorm);
    return s;
  }();
  return *schema;
}

const Schema<OptimizerParams>& SgdParamsSchema() {
  static const auto* schema = [] {
    auto* s = new Schema<OptimizerParams>();
    s->Add(Value("lr", &OptimizerParams::lr, AutoOr(Number(NonNegative())),
                 "Learning rate."))
        .Add(Value("momentum", &OptimizerParams::momentum,
                   Number(UnitHalfOpen()), "Momentum factor (0 = plain SGD)."))
        .Add(Value("weight_decay", &OptimizerParams::weight_decay,
                   AutoOr(Number(NonNegative())),
                   "L2 penalty added to the gradient, as in torch.optim.SGD."))
        .Ignored("max_grad_norm", Number(NonNegative()),
                 std::optional<double>(0.0), kMaxGradNorm);
    return s;
  }();
  return *schema;
}

// The keys each scheduler type accepts, in one list so the reference and
// the parser agree.
enum SchedulerKeys : unsigned {
  kWarmup = 1u << 0,       // WarmupLR
  kWarmupDecay = 1u << 1,  // WarmupDecayLR
  kCosine = 1u << 2,       // WarmupCosineLR
  kCycle = 1u << 3,        // OneCycle
  kAll = kWarmup | kWarmupDecay | kCosine | kCycle,
};

unsigned SchedulerBit(SchedulerType type) {
  switch (type) {
    case SchedulerType::kWarmupLR:
      return kWarmup;
    case SchedulerType::kWarmupDecayLR:
      return kWarmupDecay;
    case SchedulerType::kWarmupCosineLR:
      return kCosine;
    case SchedulerType::kOneCycle:
      return kCycle;
  }
  return 0;
}

std::vector<std::pair<unsigned, Field<SchedulerParams>>> SchedulerFields() {
  using P = SchedulerParams;
  const Codec<WarmupType> warmup_type = Enum<WarmupType>(
      {{"log", WarmupType::kLog}, {"linear", WarmupType::kLinear}},
      /*case_insensitive=*/false);
  return {
      {kWarmup | kWarmupDecay,
       Value("warmup_min_lr", &P::warmup_min_lr, AutoOr(Number(NonNegative())),
             "Learning rate at the start of warmup.")},
      {kWarmup | kWarmupDecay,
       Value("warmup_max_lr", &P::warmup_max_lr, AutoOr(Number(NonNegative())),
             "Learning rate at the end of warmup.")},
      {kWarmup | kWarmupDecay | kCosine,
       Value("warmup_num_steps", &P::warmup_num_steps,
             AutoOr(Integer(AtLeast(0))), "Steps of warmup.")},
      {kWarmup | kWarmupDecay | kCosine,
       Value("warmup_type", &P::warmup_type, warmup_type,
             "Warmup curve: log or linear in the step.")},
      {kWarmupDecay | kCosine,
       Value(
           "total_num_steps", &P::total_num_steps, AutoOr(Integer(AtLeast(1))),
           "Total training steps; the decay ends here. Required.", "required")},
      {kCosine,
       Value("warmup_min_ratio", &P::warmup_min_ratio, Number(UnitClosed()),
             "Warmup starts at this fraction of the optimizer's lr.")},
      {kCosine, Value("cos_min_ratio", &P::cos_min_ratio, Number(UnitClosed()),
                      "The cosine decays to this fraction of the optimizer's "
                      "lr.")},
      {kCycle,
       Value("cycle_min_lr", &P::cycle_min_lr, Nullable(Number(NonNegative())),
             "Lower learning rate of the cycle. Required.", "required")},
      {kCycle,
       Value("cycle_max_lr", &P::cycle_max_lr, Nullable(Number(NonNegative())),
             "Upper learning rate of the cycle. Required.", "required")},
      {kCycle, Value("decay_lr_rate", &P::decay_lr_rate, Number(NonNegative()),
                     "Learning-rate decay rate after the cycle.")},
      {kCycle, Value("cycle_first_step_size", &P::cycle_first_step_size,
                     Integer(AtLeast(1)), "Steps of the rising half-cycle.")},
      {kCycle, Value("cycle_second_step_size", &P::cycle_second_step_size,
                     Integer(AtLeast(1)), "Steps of the falling half-cycle.",
                     "cycle_first_step_size")},
      {kCycle, Value("cycle_first_stair_count", &P::cycle_first_stair_count,
                     Integer(AtLeast(0)),
                     "Stairs in the rising half (0 = continuous).")},
      {kCycle, Value("cycle_second_stair_count", &P::cycle_second_stair_count,
                     Integer(AtLeast(0)), "Stairs in the falling half.",
                     "cycle_first_stair_count")},
      {kCycle,
       Value("decay_step_size", &P::decay_step_size, Integer(AtLeast(0)),
             "Steps between decays after the cycle (0 = no decay).")},
      {kCycle, Value("cycle_momentum", &P::cycle_momentum, Boolean(),
                     "Cycle momentum (beta1) inversely to the learning rate.")},
      {kCycle, Value("cycle_min_mom", &P::cycle_min_mom, Number(UnitClosed()),
                     "Lower momentum of the cycle.")},
      {kCycle, Value("cycle_max_mom", &P::cycle_max_mom, Number(UnitClosed()),
                     "Upper momentum of the cycle.")},
      {kCycle,
       Value("decay_mom_rate", &P::decay_mom_rate, Number(NonNegative()),
             "Momentum decay rate after the cycle.")},
      {kAll, Value("last_batch_iteration", &P::last_batch_iteration,
                   Integer(AtLeast(-1)),
                   "Last step already taken; -1 starts from the beginning.")},
  };
}

// Every OptimizerParams key of every optimizer type, so equality compares
// all of them whichever type the config names.
const Schema<OptimizerParams>& AllOptimizerParamsSchema() {
  static const auto* schema = [] {
    auto* all = new Schema<OptimizerParams>();
    std::set<std::string> keys;
    for (const Schema<OptimizerParams>* by_type :
         {&AdamParamsSchema(), &SgdParamsSchema()}) {
      for (const Field<OptimizerParams>& field : by_type->fields()) {
        if (keys.insert(field.key).second) all->Add(field);
      }
    }
    return all;
  }();
  return *schema;
}

// Every SchedulerParams key of every scheduler type, for equality.
const Schema<SchedulerParams>& AllSchedulerParamsSchema() {
  static const auto* schema = [] {
    auto* all = new Schema<SchedulerParams>();
    for (auto& [types, field] : SchedulerFields()) all->Add(field);
    return all;
  }();
  return *schema;
}

// "optimizer" and "scheduler": {"type": ..., "params": {...}} where the valid
// params depend on the type, so "type" is read first.
template <typename Section, typename Type, typename Params>
void ParseTypedSection(
    const Json& v, const std::string& path, const Codec<Type>& type_codec,
    const std::function<const Schema<Params>&(Type)>& schema_for,
    Problems& problems, std::optional<Section>* out) {
  if (!v.is_object()) {
    TypeMismatch(v, path, "an object", problems);
    return;
  }
  for (const auto& item : v.items()) {
    if (item.key() != "type" && item.key() != "params") {
      const std::string nearest =
          NearestCandidate(item.key(), {"type", "params"});
      problems.Add(absl::StrCat(
          "unknown key \"", item.key(), "\" at ",
          JoinJsonPath(path, item.key()),
          nearest.empty() ? "; valid keys at " + path + ": type, params"
                          : absl::StrCat("; did you mean \"", nearest, "\"?")));
    }
  }
  const std::string type_path = JoinJsonPath(path, "type");
  if (!v.contains("type")) {
    problems.Add(absl::StrCat("missing required key ", type_path, " (expected ",
                              type_codec.type, ")"));
    return;
  }
  Section section;
  if (!type_codec.read(v["type"], type_path, problems, &section.type)) return;
  if (v.contains("params")) {
    schema_for(section.type)
        .Parse(v["params"], JoinJsonPath(path, "params"), problems,
               &section.params);
  }
  *out = std::move(section);
}

}  // namespace

const Schema<OptimizerParams>& OptimizerParamsSchema(OptimizerType type) {
  return type == OptimizerType::kSgd ? SgdParamsSchema() : AdamParamsSchema();
}

const Schema<SchedulerParams>& SchedulerParamsSchema(SchedulerType type) {
  static const auto* schemas = [] {
    auto* by_type = new std::map<SchedulerType, Schema<SchedulerParams>>();
    for (SchedulerType t :
         {SchedulerType::kWarmupLR, SchedulerType::kWarmupDecayLR,
          SchedulerType::kWarmupCosineLR, SchedulerType::kOneCycle}) {
      Schema<SchedulerParams>& schema = (*by_type)[t];
      for (auto& [types, field] : SchedulerFields()) {
        if (types & SchedulerBit(t)) schema.Add(field);
      }
      // DeepSpeed: an absent second half mirrors the first.
      schema.AfterParse([](const Json& object, const std::string&, Problems&,
                           SchedulerParams* params) {
        if (!object.contains("cycle_second_step_size")) {
          params->cycle_second_step_size = params->cycle_first_step_size;
        }
        if (!object.contains("cycle_second_stair_count")) {
          params->cycle_second_stair_count = params->cycle_first_stair_count;
        }
      });
    }
    return by_type;
  }();
  return schemas->at(type);
}

Field<Config> OptimizerField() {
  using C = Config;
  Field<C> optimizer;
  optimizer.key = "optimizer";
  optimizer.type = "object";
  optimizer.parse = [](const Json& v, const std::string& path,
                       Problems& problems, C* out) {
    ParseTypedSection<OptimizerConfig, OptimizerType, OptimizerParams>(
        v, path, OptimizerTypeCodec(), OptimizerParamsSchema, problems,
        &out->optimizer);
  };
  optimizer.emit = [](const C& c) -> std::optional<Json> {
    if (!c.optimizer) return std::nullopt;
    Json json = Json::object();
    json["type"] = OptimizerTypeCodec().write(c.optimizer->type);
    json["params"] =
        OptimizerParamsSchema(c.optimizer->type).Emit(c.optimizer->params);
    return json;
  };
  // Its params depend on its type: ReferenceMarkdown() lists them in
  // tables of their own.
  optimizer.nested_rows = [](const std::string& path, const C&,
                             std::vector<ReferenceRow>* rows) {
    rows->push_back(
        {JoinJsonPath(path, "type"),
         absl::StrCat(OptimizerTypeCodec().type, " (case-insensitive)"),
         "required when `optimizer` is given",
         "The optimizer; its `params` are listed below."});
  };
  optimizer.equal = [](const C& a, const C& b) {
    return a.optimizer == b.optimizer;
  };
  optimizer.auto_paths = [](const std::string& path, const C& c,
                            std::vector<std::string>* paths) {
    if (!c.optimizer) return;
    OptimizerParamsSchema(c.optimizer->type)
        .AutoPaths(JoinJsonPath(path, "params"), c.optimizer->params, paths);
  };
  return optimizer;
}

Field<Config> SchedulerField() {
  using C = Config;
  Field<C> scheduler;
  scheduler.key = "scheduler";
  scheduler.type = "object";
  scheduler.parse = [](const Json& v, const std::string& path,
                       Problems& problems, C* out) {
    ParseTypedSection<SchedulerConfig, SchedulerType, SchedulerParams>(
        v, path, SchedulerTypeCodec(), SchedulerParamsSchema, problems,
        &out->scheduler);
  };
  scheduler.emit = [](const C& c) -> std::optional<Json> {
    if (!c.scheduler) return std::nullopt;
    Json json = Json::object();
    json["type"] = SchedulerTypeCodec().write(c.scheduler->type);
    json["params"] =
        SchedulerParamsSchema(c.scheduler->type).Emit(c.scheduler->params);
    return json;
  };
  // Its params depend on its type: ReferenceMarkdown() lists them in
  // tables of their own.
  scheduler.nested_rows = [](const std::string& path, const C&,
                             std::vector<ReferenceRow>* rows) {
    rows->push_back(
        {JoinJsonPath(path, "type"),
         absl::StrCat(SchedulerTypeCodec().type, " (case-sensitive)"),
         "required when `scheduler` is given",
         "The scheduler; its `params` are listed below."});
  };
  scheduler.equal = [](const C& a, const C& b) {
    return a.scheduler == b.scheduler;
  };
  scheduler.auto_paths = [](const std::string& path, const C& c,
                            std::vector<std::string>* paths) {
    if (!c.scheduler) return;
    SchedulerParamsSchema(c.scheduler->type)
        .AutoPaths(JoinJsonPath(path, "params"), c.scheduler->params, paths);
  };
  return scheduler;
}

}  // namespace internal

// ------------------------------------------------------------- equality

bool OptimizerParams::operator==(const OptimizerParams& other) const {
  return internal::AllOptimizerParamsSchema().Equal(*this, other);
}

bool OptimizerConfig::operator==(const OptimizerConfig& other) const {
  return type == other.type && params == other.params;
}

bool SchedulerParams::operator==(const SchedulerParams& other) const {
  return internal::AllSchedulerParamsSchema().Equal(*this, other);
}

bool SchedulerConfig::operator==(const SchedulerConfig& other) const {
  return type == other.type && params == other.params;
}

}  // namespace config
}  // namespace ze
