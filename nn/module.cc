#include "nn/module.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "core/allocator.h"
#include "core/ops.h"
#include "core/status.h"

namespace ze {
namespace nn {
namespace {

thread_local bool saving_enabled = true;
thread_local int64_t saved_state_slot = 0;
thread_local bool splitting_backward = false;
thread_local BackwardPart backward_part = BackwardPart::kWhole;
std::atomic<int64_t> next_hook_id{1};
std::atomic<int64_t> next_deferred_sequence{1};

int KindIndex(HookKind kind) { return static_cast<int>(kind); }

// The part a module's backward is in, for its hooks and implementation;
// the enclosing module's part comes back after.
class BackwardPartScope {
 public:
  explicit BackwardPartScope(BackwardPart part) : previous_(backward_part) {
    backward_part = part;
  }
  ~BackwardPartScope() { backward_part = previous_; }
  BackwardPartScope(const BackwardPartScope &) = delete;
  BackwardPartScope &operator=(const BackwardPartScope &) = delete;

 private:
  BackwardPart previous_;
};

}  // namespace

const char *BackwardPartName(BackwardPart part) {
  switch (part) {
    case BackwardPart::kWhole:
      return "whole";
    case BackwardPart::kInput:
      return "input";
    case BackwardPart::kWeight:
      return "weight";
  }
  return "unknown";
}

SplitBackwardScope::SplitBackwardScope() : previous_(splitting_backward) {
  splitting_backward = true;
}
SplitBackwardScope::~SplitBackwardScope() { splitting_backward = previous_; }
bool SplittingBackward() { return splitting_backward; }
BackwardPart CurrentBackwardPart() { return backward_part; }

const char *HookKindName(HookKind kind) {
  switch (kind) {
    case HookKind::kPreForward:
      return "pre-forward";
    case HookKind::kPostForward:
      return "post-forward";
    case HookKind::kPreBackward:
      return "pre-backward";
    case HookKind::kPostBackward:
      return "post-backward";
  }
  return "unknown";
}

NoSaveScope::NoSaveScope() : previous_(saving_enabled) {
  saving_enabled = false;
}
NoSaveScope::~NoSaveScope() { saving_enabled = previous_; }
bool SavingEnabled() { return saving_enabled; }

SavedStateSlot::SavedStateSlot(int64_t slot) : previous_(saved_state_slot) {
  saved_state_slot = slot;
}
SavedStateSlot::~SavedStateSlot() { saved_state_slot = previous_; }
int64_t CurrentSavedStateSlot() { return saved_state_slot; }

Module::Module(std::string type_name) : type_name_(std::move(type_name)) {}
Module::~Module() = default;

std::string Module::FullName() const {
  if (parent_ == nullptr) return "";
  const std::string prefix = parent_->FullName();
  if (local_name_.empty()) return prefix;  // an unnamed child
  return prefix.empty() ? local_name_ : absl::StrCat(prefix, ".", local_name_);
}

std::string Module::DisplayName() const {
  const std::string name = FullName();
  return name.empty() ? absl::StrCat("<root ", type_name_, ">")
                      : absl::StrCat(name, " (", type_name_, ")");
}

absl::Status Module::RunHooks(HookKind kind, const Stream &stream) {
  if (hooks_[KindIndex(kind)].empty()) return absl::OkStatus();
  // Iterate over a copy: a hook may add or remove hooks of this module.
  const std::vector<HookEntry> entries = hooks_[KindIndex(kind)];
  for (const HookEntry &entry : entries) {
    absl::Status status = entry.hook(*this, stream);
    if (!status.ok()) {
      return Annotate(
          status, absl::StrCat(HookKindName(kind), " hook of ", DisplayName()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> Module::ForwardWithHooks(const Tensor &input,
                                                const Stream &stream) {
  // Peak attribution's label: inside a checkpointed module's recompute its
  // children's forwards stay "recompute".
  const char *phase =
      std::strcmp(AllocationScope::CurrentPhase(), "recompute") == 0
          ? "recompute"
          : "forward";
  AllocationScope scope(&type_name_, phase);
  ZE_RETURN_IF_ERROR(RunHooks(HookKind::kPreForward, stream));
  absl::StatusOr<Tensor> output = ForwardImpl(input, stream);
  if (!output.ok()) {
    return Annotate(output.status(),
                    absl::StrCat("forward of ", DisplayName()));
  }
  ZE_RETURN_IF_ERROR(RunHooks(HookKind::kPostForward, stream));
  return output;
}

absl::StatusOr<Tensor> Module::Forward(const Tensor &input,
                                       const Stream &stream) {
  if (!SavingEnabled()) return ForwardWithHooks(input, stream);
  const bool checkpointed = checkpointing_;
  absl::StatusOr<Tensor> output;
  if (checkpointed) {
    // Keep only the input; nothing below this module saves activations.
    NoSaveScope no_save;
    output = ForwardWithHooks(input, stream);
  } else {
    output = ForwardWithHooks(input, stream);
  }
  if (!output.ok()) return output;
  SavedCall saved;
  saved.checkpointed = checkpointed;
  if (checkpointed) {
    if (activation_offload_ != nullptr) {
      absl::StatusOr<int64_t> ticket = activation_offload_->Save(input, stream);
      if (!ticket.ok()) {
        return Annotate(ticket.status(),
                        absl::StrCat("offloading the input of ", DisplayName(),
                                     " (cpu_checkpointing)"));
      }
      saved.offload = activation_offload_;
      saved.ticket = *ticket;
    } else {
      saved.tensor = input;
    }
  }
  calls_.Save(std::move(saved));
  return output;
}

absl::StatusOr<Tensor> Module::Backward(const Tensor &grad_output,
                                        const Stream &stream) {
  if (calls_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Backward of ", DisplayName(),
        " without a saved Forward in saved-state slot ",
        CurrentSavedStateSlot(),
        " (was it run under NoSaveScope, in another slot, or backpropagated "
        "already?)"));
  }
  SavedCall saved = calls_.Pop();
  const bool checkpointed = saved.checkpointed;
  const BackwardPart part = SplittingBackward() && SplitsBackward()
                                ? BackwardPart::kInput
                                : BackwardPart::kWhole;
  const BackwardPartScope part_scope(part);
  Tensor checkpoint_input;
  if (checkpointed) {
    if (saved.offload != nullptr) {
      // Before the pre-backward hooks, so that bringing the input back (and
      // prefetching the previous call's) overlaps a stage-3 gather.
      absl::StatusOr<Tensor> restored =
          saved.offload->Restore(saved.ticket, stream);
      if (!restored.ok()) {
        return Annotate(restored.status(),
                        absl::StrCat("bringing back the input of ",
                                     DisplayName(), " (cpu_checkpointing)"));
      }
      checkpoint_input = std::move(restored).value();
    } else {
      checkpoint_input = std::move(saved.tensor);
    }
  }
  AllocationScope scope(&type_name_, "backward");
  ZE_RETURN_IF_ERROR(RunHooks(HookKind::kPreBackward, stream));
  if (checkpointed) {
    // Recompute with saving enabled, so this module and its children hold
    // exactly what a non-checkpointed forward would have saved. The output
    // itself is not needed. This module's own forward hooks do not fire
    // again: its pre-backward hooks have just run (its parameters are
    // available) and a post-forward hook here would release them before
    // BackwardImpl. Children's hooks fire, since ForwardImpl calls their
    // public Forward.
    AllocationScope recompute(&type_name_, "recompute");
    absl::StatusOr<Tensor> recomputed = ForwardImpl(checkpoint_input, stream);
    if (!recomputed.ok()) {
      return Annotate(recomputed.status(),
                      absl::StrCat("recomputing the forward of ", DisplayName(),
                                   " for backward"));
    }
  }
  deferring_ = nullptr;
  absl::StatusOr<Tensor> grad_input = BackwardImpl(grad_output, stream);
  if (!grad_input.ok()) {
    deferring_ = nullptr;
    return Annotate(grad_input.status(),
                    absl::StrCat("backward of ", DisplayName()));
  }
  if (part == BackwardPart::kInput) {
    deferred_.push_back(DeferredCall{CurrentSavedStateSlot(),
                                     next_deferred_sequence.fetch_add(1),
                                     std::move(deferring_)});
    deferring_ = nullptr;
  }
  ZE_RETURN_IF_ERROR(RunHooks(HookKind::kPostBackward, stream));
  return grad_input;
}

absl::Status Module::RunDeferred(int64_t sequence, const Stream &stream) {
  auto it = deferred_.begin();
  while (it != deferred_.end() && it->sequence != sequence) ++it;
  ZE_CHECK(it != deferred_.end());
  const WeightGradientWork work = std::move(it->work);
  deferred_.erase(it);
  const BackwardPartScope part_scope(BackwardPart::kWeight);
  ZE_RETURN_IF_ERROR(RunHooks(HookKind::kPreBackward, stream));
  if (work) {
    absl::Status status = work(stream);
    if (!status.ok()) {
      return Annotate(status,
                      absl::StrCat("weight gradient of ", DisplayName()));
    }
  }
  return RunHooks(HookKind::kPostBackward, stream);
}

absl::Status Module::BackwardWeightsOf(const std::vector<Module *> &subtrees,
                                       const Stream &stream) {
  const int64_t slot = CurrentSavedStateSlot();
  std::vector<std::pair<int64_t, Module *>> pending;
  for (Module *root : subtrees) {
    for (Module *module : root->Modules()) {
      for (const DeferredCall &call : module->deferred_) {
        if (call.slot == slot) pending.emplace_back(call.sequence, module);
      }
    }
  }
  // A module shared by two subtrees would be listed twice.
  std::sort(pending.begin(), pending.end());
  pending.erase(std::unique(pending.begin(), pending.end()), pending.end());
  for (const auto &[sequence, module] : pending) {
    ZE_RETURN_IF_ERROR(module->RunDeferred(sequence, stream));
  }
  return absl::OkStatus();
}

int Module::PendingWeightGradients() {
  const int64_t slot = CurrentSavedStateSlot();
  int pending = 0;
  for (Module *module : Modules()) {
    for (const DeferredCall &call : module->deferred_) {
      if (call.slot == slot) ++pending;
    }
  }
  return pending;
}

HookHandle Module::AddHook(HookKind kind, Hook hook) {
  HookHandle handle{next_hook_id.fetch_add(1)};
  hooks_[KindIndex(kind)].push_back(HookEntry{handle, std::move(hook)});
  return handle;
}

bool Module::RemoveHook(HookHandle handle) {
  for (std::vector<HookEntry> &entries : hooks_) {
    for (auto it = entries.begin(); it != entries.end(); ++it) {
      if (it->handle.id == handle.id) {
        entries.erase(it);
        return true;
      }
    }
  }
  return false;
}

int Module::NumHooks(HookKind kind) const {
  return static_cast<int>(hooks_[KindIndex(kind)].size());
}

std::vector<Module *> Module::Modules() {
  std::vector<Module *> result;
  std::vector<Module *> stack = {this};
  while (!stack.empty()) {
    Module *module = stack.back();
    stack.pop_back();
    result.push_back(module);
    const auto &children = module->child_views_;
    for (auto it = children.rbegin(); it != children.rend(); ++it) {
      stack.push_back(it->second);
    }
  }
  return result;
}

std::vector<Parameter *> Module::Parameters() {
  std::vector<Parameter *> result;
  std::unordered_set<const Parameter *> seen;
  for (Module *module : Modules()) {
    for (Parameter *parameter : module->direct_parameters_) {
      if (seen.insert(parameter).second) result.push_back(parameter);
    }
  }
  return result;
}

absl::StatusOr<Parameter *> Module::FindParameter(
    const std::string &full_name) {
  for (Parameter *parameter : Parameters()) {
    if (parameter->name() == full_name) return parameter;
  }
  return absl::NotFoundError(absl::StrCat("no parameter named '", full_name,
                                          "' under ", DisplayName()));
}

int64_t Module::NumParameterElements() {
  int64_t total = 0;
  for (Parameter *parameter : Parameters()) total += parameter->numel();
  return total;
}

absl::Status Module::MaterializeParameters(uint64_t seed,
                                           const Stream &stream) {
  for (Parameter *parameter : Parameters()) {
    if (parameter->state() == ParameterState::kAbsent) {
      ZE_RETURN_IF_ERROR(parameter->Materialize(seed, stream));
    }
  }
  return absl::OkStatus();
}

absl::Status Module::ZeroGrad(const Stream &stream) {
  for (Parameter *parameter : Parameters()) {
    if (parameter->grad().defined()) {
      ZE_RETURN_IF_ERROR(Fill(parameter->grad(), 0.0f, stream));
    }
  }
  return absl::OkStatus();
}

void Module::ClearSavedState() {
  for (Module *module : Modules()) {
    module->calls_.ForEach([](const SavedCall &saved) {
      if (saved.offload != nullptr) saved.offload->Discard(saved.ticket);
    });
    module->calls_.Clear();
    module->deferred_.clear();
    module->deferring_ = nullptr;
    module->ClearSavedStateImpl();
  }
}

int Module::PendingBackwardCalls() const { return calls_.size(); }

void Module::CheckNewName(const std::string &name) const {
  ZE_CHECK(!name.empty());
  ZE_CHECK(name.find('.') == std::string::npos);
  for (const auto &child : child_views_) ZE_CHECK(child.first != name);
  for (const auto &parameter : parameters_) {
    ZE_CHECK(parameter->owner() != this || parameter->local_name() != name);
  }
}

void Module::AdoptChild(const std::string &name,
                        std::unique_ptr<Module> child) {
  ZE_CHECK(child != nullptr && child->parent_ == nullptr);
  CheckNewName(name);
  child->parent_ = this;
  child->local_name_ = name;
  child_views_.emplace_back(name, child.get());
  owned_children_.push_back(std::move(child));
}

void Module::AdoptUnnamedChild(std::unique_ptr<Module> child) {
  ZE_CHECK(child != nullptr && child->parent_ == nullptr);
  child->parent_ = this;
  child_views_.emplace_back("", child.get());
  owned_children_.push_back(std::move(child));
}

Parameter *Module::RegisterParameter(const std::string &name,
                                     const Shape &shape, DType dtype,
                                     const Device &device,
                                     const Initializer &initializer) {
  CheckNewName(name);
  auto parameter = std::make_shared<Parameter>(this, name, shape, dtype, device,
                                               initializer);
  direct_parameters_.push_back(parameter.get());
  parameters_.push_back(std::move(parameter));
  return direct_parameters_.back();
}

void Module::UseSharedParameter(std::shared_ptr<Parameter> parameter) {
  ZE_CHECK(parameter != nullptr);
  direct_parameters_.push_back(parameter.get());
  parameters_.push_back(std::move(parameter));
}

std::shared_ptr<Parameter> Module::SharedParameter(
    const Parameter *parameter) const {
  for (const auto &owned : parameters_) {
    if (owned.get() == parameter) return owned;
  }
  return nullptr;
}

absl::Status Module::RequireSaved(bool has_record) const {
  if (has_record) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(DisplayName(), ": no saved forward state for backward"));
}

absl::StatusOr<Tensor> Sequential::ForwardImpl(const Tensor &input,
                                               const Stream &stream) {
  Tensor activation = input;
  for (const auto &[name, child] : children()) {
    ZE_ASSIGN_OR_RETURN(activation, child->Forward(activation, stream));
  }
  return activation;
}

absl::StatusOr<Tensor> Sequential::BackwardImpl(const Tensor &grad_output,
                                                const Stream &stream) {
  Tensor grad = grad_output;
  for (auto it = children().rbegin(); it != children().rend(); ++it) {
    ZE_ASSIGN_OR_RETURN(grad, it->second->Backward(grad, stream));
  }
  return grad;
}

}  // namespace nn
}  // namespace ze
