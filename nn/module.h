// Module: a tree of named children and named Parameters, with hooks.
//
// Activations are Tensors. Forward takes the input activation and returns the
// output; Backward takes the gradient of the output and returns the gradient
// of the input (undefined when the input has no gradient, e.g. token ids).
// Backward never modifies `grad_output`.
//
// The public Forward/Backward are non-virtual (NVI). They run the module's
// hooks around the virtual ForwardImpl/BackwardImpl:
//
//   Forward:   pre-forward hooks, ForwardImpl, post-forward hooks
//   Backward:  pre-backward hooks, [checkpoint: ForwardImpl again],
//              BackwardImpl,
//              post-backward hooks
//
// Containers call their children's public Forward/Backward, so a container's
// own hooks fire around its children's (pre hooks before, post hooks after).
// A module's pre-backward hooks fire before its BackwardImpl reads any
// parameter, and for a container before any child's backward. Hooks of one
// kind run in the order they were added. This is the seam ZeRO-3 is built on:
// gather in pre-forward/pre-backward, release in post-forward/post-backward,
// reduce-scatter gradients in post-backward.
//
// Per-call state: each Forward call pushes what its backward needs (when
// saving is enabled, see NoSaveScope) and each Backward pops the most recent
// record, so a module run several times in one forward is backpropagated in
// reverse order. Backward with nothing saved is FailedPrecondition.
//
// Saved-state slots: the records live in per-slot stacks, and the slot is
// a thread-wide setting (SavedStateSlot; 0 unless set). A Forward pushes
// onto the current slot's stack and a Backward pops the current slot's most
// recent record, never another slot's. So several forwards may be in
// flight at once and be backpropagated in any order between them, as long
// as each runs in a slot of its own and its Backward runs in the same slot:
// a pipeline's 1F1B schedule runs F(m + w) before B(m) and keeps each
// in-flight micro-batch's activations in its own slot (pipeline/
// executor.h). Within one slot the order stays LIFO. Everything a module
// keeps from a forward for its backward must follow the contract: the
// module's own call records (checkpointing, below) and every leaf's
// SavedStack do; a module keeping per-call state elsewhere must key it by
// CurrentSavedStateSlot() too. The ZeRO strategies key the parameter uses
// a forward counts the same way (zero/forward_uses.h), so what a backward
// counts down is its own forward's. Activation checkpointing and the
// cpu_checkpointing offload are per slot as well: a checkpointed call's
// kept input is in its slot's record, and the offload tells a
// recomputation's saves and its prefetch order by slot
// (nn/activation_offload.h).
//
// Split backward (a pipeline's zero-bubble schedule: pipeline/schedule.h
// kBackwardInput, kBackwardWeight). Under a SplitBackwardScope, a module
// that splits (SplitsBackward: nn::Linear, whose weight-gradient product is
// a third of a layer's work) runs only the first part of its backward in
// Backward, part kInput: its input's gradient, leaving the parameter
// gradients as deferred work of the call (DeferWeightGradient: the input
// and output gradient it needs, a few tensors). Every other module runs
// its whole backward there (part kWhole): the norms', embeddings' and the
// output head's gradients are computed in the first part, as cheap (a
// loss-mode head forms its weight gradient in its forward already, its
// backward only scales it in; a plain head's product is not split yet).
// BackwardWeights, on
// the tree and in the same saved-state slot, later runs the deferred parts
// (part kWeight), in the order their first parts ran, so a parameter used
// several times accumulates in the order of a whole backward. The deferred
// work is per-call state like the saved records: kept per slot, dropped by
// ClearSavedState.
//
// Hooks and the parts. A module's pre- and post-backward hooks fire around
// each part it runs, CurrentBackwardPart() telling them which: kWhole as
// always; for a split module kInput around the first part (it reads its
// parameters, computes no parameter gradient) and kWeight around the
// second (it writes its parameter gradients, which are final for the call
// after it). So a hook that gathers parameters acts at kWhole and kInput,
// one that provides gradient buffers or reduces final gradients at kWhole
// and kWeight (the ZeRO strategies: zero/strategy.h).
//
// Activation checkpointing (set_activation_checkpointing): Forward keeps
// only its input and runs ForwardImpl with saving disabled, so no child
// keeps activations. Backward, after the module's pre-backward hooks,
// re-runs ForwardImpl with saving enabled and then runs BackwardImpl. During
// the recomputation every descendant's forward hooks fire again (so their
// parameters are gathered again); the checkpointed module's own forward
// hooks do not, because its pre-backward hooks already made its parameters
// available and a post-forward release would take them away before
// BackwardImpl. Gradients are bit-identical with and without checkpointing
// because the recomputation is the same deterministic computation.
//
// Where the kept input lives: on the device, unless an ActivationOffload
// is installed (set_activation_offload; activation_checkpointing.
// cpu_checkpointing): then it goes to host memory after the forward and
// comes back, prefetched one checkpointed call ahead, when the backward
// pops it (nn/activation_offload.h). The values are the same bytes either
// way, so gradients are bit-identical with and without the offload.
//
// Memory: activations are allocated per call from the tensor's device
// allocator (the CUDA caching allocator makes that cheap) and freed when the
// last Tensor referring to them goes away. All work of one call is queued
// on the given stream; nothing here synchronises with the host.
//
// Modules are not thread-safe and not copyable.
#ifndef ZE_NN_MODULE_H_
#define ZE_NN_MODULE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "nn/activation_offload.h"
#include "nn/init.h"
#include "nn/parameter.h"

namespace ze {
namespace nn {

enum class HookKind { kPreForward, kPostForward, kPreBackward, kPostBackward };
const char *HookKindName(HookKind kind);

class Module;

// A hook receives the module it is attached to and the stream the module's
// work is queued on. A non-OK Status aborts the Forward/Backward and is
// returned to its caller (annotated with the module's name).
using Hook = std::function<absl::Status(Module &module, const Stream &stream)>;

// Identifies one registered hook, for removal. Ids are unique process-wide.
struct HookHandle {
  int64_t id = 0;
  bool valid() const { return id != 0; }
};

// While alive, Forward calls on this thread save nothing for backward
// (inference, or the first pass of a checkpointed module). Nestable.
class NoSaveScope {
 public:
  NoSaveScope();
  ~NoSaveScope();
  NoSaveScope(const NoSaveScope &) = delete;
  NoSaveScope &operator=(const NoSaveScope &) = delete;

 private:
  bool previous_;
};
// True unless a NoSaveScope is alive on this thread.
bool SavingEnabled();

// While alive, Forward calls on this thread save into, and Backward calls
// pop from, saved-state slot `slot` (see the file comment). Nestable; the
// previous slot comes back on destruction. Any value is a slot; 0 is the
// one in use when none is set.
class SavedStateSlot {
 public:
  explicit SavedStateSlot(int64_t slot);
  ~SavedStateSlot();
  SavedStateSlot(const SavedStateSlot &) = delete;
  SavedStateSlot &operator=(const SavedStateSlot &) = delete;

 private:
  int64_t previous_;
};
// The slot Forward saves into and Backward pops from on this thread.
int64_t CurrentSavedStateSlot();

// Which part of a module's backward runs (see the file comment).
enum class BackwardPart {
  kWhole,   // input and parameter gradients
  kInput,   // split, first part: the input's gradient only
  kWeight,  // split, second part: the parameter gradients deferred
};
const char *BackwardPartName(BackwardPart part);

// While alive, Backward calls on this thread split where the module can
// (see the file comment). Nestable.
class SplitBackwardScope {
 public:
  SplitBackwardScope();
  ~SplitBackwardScope();
  SplitBackwardScope(const SplitBackwardScope &) = delete;
  SplitBackwardScope &operator=(const SplitBackwardScope &) = delete;

 private:
  bool previous_;
};
// True while a SplitBackwardScope is alive on this thread.
bool SplittingBackward();
// The part of the innermost module backward running on this thread (its
// hooks and its BackwardImpl or deferred work read it); kWhole outside any.
BackwardPart CurrentBackwardPart();

// Saved per-call records, one LIFO stack per saved-state slot: Save pushes
// onto the current slot's stack, and only when saving is enabled; empty,
// size, Top and Pop are the current slot's (Pop returns its most recent
// record, matching the reverse order of backward). Clear drops every
// slot's. Leaf modules keep their per-call state in one.
template <typename Record>
class SavedStack {
 public:
  void Save(Record record) {
    if (!SavingEnabled()) return;
    const int64_t slot = CurrentSavedStateSlot();
    std::vector<Record> *records = Find(slot);
    if (records == nullptr) {
      slots_.push_back(Slot{slot, {}});
      records = &slots_.back().records;
    }
    records->push_back(std::move(record));
  }
  bool empty() const { return size() == 0; }
  int size() const {
    const std::vector<Record> *records = Find(CurrentSavedStateSlot());
    return records == nullptr ? 0 : static_cast<int>(records->size());
  }
  // The record the next Pop returns; the current slot must not be empty.
  const Record &Top() const { return Find(CurrentSavedStateSlot())->back(); }
  // The current slot must not be empty.
  Record Pop() {
    const int64_t slot = CurrentSavedStateSlot();
    std::vector<Record> &records = *Find(slot);
    Record record = std::move(records.back());
    records.pop_back();
    if (records.empty()) {
      // Only slots holding records stay listed (slots() counts them).
      for (auto it = slots_.begin(); it != slots_.end(); ++it) {
        if (it->id == slot) {
          slots_.erase(it);
          break;
        }
      }
    }
    return record;
  }
  void Clear() { slots_.clear(); }
  // Slots holding at least one record.
  int slots() const { return static_cast<int>(slots_.size()); }
  // Calls f(record) for every record of every slot.
  template <typename F>
  void ForEach(F f) const {
    for (const Slot &slot : slots_) {
      for (const Record &record : slot.records) f(record);
    }
  }

 private:
  struct Slot {
    int64_t id;
    std::vector<Record> records;  // never empty
  };
  // A handful of slots at most (a pipeline's in-flight micro-batches): a
  // linear search beats a map.
  std::vector<Record> *Find(int64_t slot) {
    for (Slot &entry : slots_) {
      if (entry.id == slot) return &entry.records;
    }
    return nullptr;
  }
  const std::vector<Record> *Find(int64_t slot) const {
    for (const Slot &entry : slots_) {
      if (entry.id == slot) return &entry.records;
    }
    return nullptr;
  }
  std::vector<Slot> slots_;
};

class Module {
 public:
  // `type_name` is for messages ("Linear", "Block").
  explicit Module(std::string type_name);
  virtual ~Module();
  Module(const Module &) = delete;
  Module &operator=(const Module &) = delete;

  // Runs hooks and ForwardImpl. Returns the output activation, or the first
  // error (from a hook or the implementation), annotated with this module's
  // name and type.
  absl::StatusOr<Tensor> Forward(const Tensor &input, const Stream &stream);
  // Runs hooks, recomputes the forward when checkpointed, then BackwardImpl.
  // Returns the gradient of the input of the matching Forward (the most
  // recent one not yet backpropagated). FailedPrecondition when no Forward
  // was saved.
  absl::StatusOr<Tensor> Backward(const Tensor &grad_output,
                                  const Stream &stream);

  // Adds a hook of `kind`; the model need not cooperate. The handle removes
  // it. Hooks may be added or removed from inside a hook; the change takes
  // effect from the next Forward/Backward of this module.
  HookHandle AddHook(HookKind kind, Hook hook);
  // Removes the hook; false when no hook of this module has that handle.
  bool RemoveHook(HookHandle handle);
  int NumHooks(HookKind kind) const;

  // Activation checkpointing of this module (see the file comment).
  void set_activation_checkpointing(bool enabled) { checkpointing_ = enabled; }
  bool activation_checkpointing() const { return checkpointing_; }
  // Selective recompute of activation functions. A module whose forward
  // applies an elementwise function between two matrix products (GPT's
  // Mlp: GELU; the decoder's SwiGluMlp: SiLU(gate) * up) then keeps only
  // the function's inputs, which its backward needs anyway, and recomputes
  // the function's output in backward for the second product's weight
  // gradient, instead of that product keeping it alive from forward to
  // backward: per token 4C (GPT) or the FFN width (decoder) fewer saved
  // elements for one elementwise kernel per layer. Gradients are bit for
  // bit those without it where the recomputation repeats the forward's
  // arithmetic (SwiGLU always; GPT's GELU in f32, see Mlp). Set it on the
  // module itself (GptConfig / DecoderConfig recompute_activations set it
  // on every MLP); other modules ignore it. Independent of checkpointing.
  void set_recompute_activation(bool enabled) {
    recompute_activation_ = enabled;
  }
  bool recompute_activation() const { return recompute_activation_; }
  // Where this module keeps its checkpointed inputs from the next Forward
  // on (null: on the device). A call already saved stays with the offload
  // it was saved in.
  void set_activation_offload(std::shared_ptr<ActivationOffload> offload) {
    activation_offload_ = std::move(offload);
  }
  const std::shared_ptr<ActivationOffload> &activation_offload() const {
    return activation_offload_;
  }

  const std::string &type_name() const { return type_name_; }
  // Name within the parent ("attn", "3"); "" for a root.
  const std::string &local_name() const { return local_name_; }
  // Dotted path from the root ("blocks.3.attn"); "" for the root.
  std::string FullName() const;
  // Full name, or "<root Type>" for a root, for messages.
  std::string DisplayName() const;
  Module *parent() const { return parent_; }

  // Direct children in registration order.
  const std::vector<std::pair<std::string, Module *>> &children() const {
    return child_views_;
  }
  // This module and all descendants, depth-first pre-order (children in
  // registration order). Stable across calls.
  std::vector<Module *> Modules();
  // Parameters this module's own ForwardImpl/BackwardImpl read (its own and
  // shared ones such as a tied output head's weight), in registration order.
  const std::vector<Parameter *> &DirectParameters() const {
    return direct_parameters_;
  }
  // Every parameter of the subtree once (a shared parameter at its first
  // use), in the order of Modules() and then registration. Stable.
  std::vector<Parameter *> Parameters();
  // Parameter by full name ("blocks.0.ln1.weight"); NotFound otherwise.
  absl::StatusOr<Parameter *> FindParameter(const std::string &full_name);
  // Sum of numel over Parameters().
  int64_t NumParameterElements();

  // Materialises every absent parameter of the subtree from the
  // deterministic initializer (see Parameter::Materialize).
  absl::Status MaterializeParameters(uint64_t seed, const Stream &stream);
  // Zeroes every defined grad slot of the subtree (queued on `stream`).
  absl::Status ZeroGrad(const Stream &stream);

  // Drops all saved per-call state of the subtree, in every slot (e.g.
  // after an error or an abandoned forward).
  void ClearSavedState();
  // Saved forward calls not yet backpropagated, this module only, in the
  // current saved-state slot.
  int PendingBackwardCalls() const;
  // Saved-state slots holding a saved forward call of this module not yet
  // backpropagated (a pipeline rank's in-flight micro-batches).
  int SavedSlots() const { return calls_.slots(); }

  // Runs the second parts of the split Backward calls of this subtree in
  // the current saved-state slot (see the file comment), in the order
  // their first parts ran, each between the module's pre- and post-backward
  // hooks (part kWeight). Nothing to run is OK. Errors from a hook or the
  // work, annotated with the module's name; the failed call's work is gone,
  // the later ones stay.
  absl::Status BackwardWeights(const Stream &stream) {
    return BackwardWeightsOf({this}, stream);
  }
  // BackwardWeights over several subtrees together (a pipeline stage's
  // layers), in the order of the first parts across all of them.
  static absl::Status BackwardWeightsOf(const std::vector<Module *> &subtrees,
                                        const Stream &stream);
  // Second parts of split Backward calls of this subtree waiting in the
  // current saved-state slot.
  int PendingWeightGradients();

 protected:
  virtual absl::StatusOr<Tensor> ForwardImpl(const Tensor &input,
                                             const Stream &stream) = 0;
  virtual absl::StatusOr<Tensor> BackwardImpl(const Tensor &grad_output,
                                              const Stream &stream) = 0;
  // Drop everything this module's ForwardImpl saved (not its children's).
  virtual void ClearSavedStateImpl() {}
  // True for a module whose BackwardImpl, in part kInput, computes only its
  // input's gradient and hands its parameter gradients' computation to
  // DeferWeightGradient.
  virtual bool SplitsBackward() const { return false; }
  // From BackwardImpl in part kInput: `work` computes this call's parameter
  // gradients later (BackwardWeights runs it in part kWeight, on the stream
  // it is given). At most once per call; a call that defers nothing still
  // gets its kWeight hooks, with nothing to compute.
  using WeightGradientWork = std::function<absl::Status(const Stream &)>;
  void DeferWeightGradient(WeightGradientWork work) {
    deferring_ = std::move(work);
  }

  // Takes ownership of `child` under `name` (unique among this module's
  // children and parameters, no '.'); returns the raw pointer for the
  // caller's convenience. Aborts on a bad or duplicate name (a bug in the
  // model's constructor).
  template <typename M>
  M *RegisterChild(const std::string &name, std::unique_ptr<M> child) {
    M *raw = child.get();
    AdoptChild(name, std::unique_ptr<Module>(std::move(child)));
    return raw;
  }
  // Takes ownership of `child` as a child without a name of its own: its
  // subtree's modules and parameters are named as if they were this
  // module's own ("blocks.3.attn", not "<child>.blocks.3.attn"). For a
  // container of models built apart that must keep their names (a pipeline
  // rank's several stages, nn/pipeline_stage.h InterleavedStages); the
  // caller keeps the names unique. Aborts when `child` has a parent.
  template <typename M>
  M *RegisterUnnamedChild(std::unique_ptr<M> child) {
    M *raw = child.get();
    AdoptUnnamedChild(std::unique_ptr<Module>(std::move(child)));
    return raw;
  }
  // Creates a parameter owned by this module (no storage yet).
  Parameter *RegisterParameter(const std::string &name, const Shape &shape,
                               DType dtype, const Device &device,
                               const Initializer &initializer);
  // Uses a parameter owned elsewhere (weight tying). It keeps its owner's
  // name; this module lists it in DirectParameters.
  void UseSharedParameter(std::shared_ptr<Parameter> parameter);
  std::shared_ptr<Parameter> SharedParameter(const Parameter *parameter) const;

  // FailedPrecondition naming this module when `has_record` is false (a
  // leaf's BackwardImpl found no saved record).
  absl::Status RequireSaved(bool has_record) const;

 private:
  void AdoptChild(const std::string &name, std::unique_ptr<Module> child);
  void AdoptUnnamedChild(std::unique_ptr<Module> child);
  void CheckNewName(const std::string &name) const;
  absl::Status RunHooks(HookKind kind, const Stream &stream);
  absl::StatusOr<Tensor> ForwardWithHooks(const Tensor &input,
                                          const Stream &stream);

  struct HookEntry {
    HookHandle handle;
    Hook hook;
  };

  std::string type_name_;
  std::string local_name_;
  Module *parent_ = nullptr;
  std::vector<std::unique_ptr<Module>> owned_children_;
  std::vector<std::pair<std::string, Module *>> child_views_;
  std::vector<std::shared_ptr<Parameter>> parameters_;  // owned + shared
  std::vector<Parameter *> direct_parameters_;
  std::vector<HookEntry> hooks_[4];
  bool checkpointing_ = false;
  bool recompute_activation_ = false;
  std::shared_ptr<ActivationOffload> activation_offload_;
  // Per saved Forward call: whether it was checkpointed, and then its
  // input: the tensor itself, or the offload holding it and its ticket.
  struct SavedCall {
    bool checkpointed = false;
    Tensor tensor;
    std::shared_ptr<ActivationOffload> offload;
    int64_t ticket = 0;
  };
  SavedStack<SavedCall> calls_;
  // A split call's second part, waiting for BackwardWeights in its slot;
  // `sequence` orders them across the modules (first parts' order).
  struct DeferredCall {
    int64_t slot = 0;
    int64_t sequence = 0;
    WeightGradientWork work;  // may be empty: nothing to compute
  };
  std::vector<DeferredCall> deferred_;
  // Set by DeferWeightGradient during a kInput BackwardImpl.
  WeightGradientWork deferring_;
  // Runs deferred_ entry `sequence` (part kWeight, with hooks) and drops it.
  absl::Status RunDeferred(int64_t sequence, const Stream &stream);
};

// Runs children in order; Backward runs them in reverse. Children are named
// "0", "1", ... unless given names.
class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  // For subclasses that are sequences with a more specific type name.
  explicit Sequential(std::string type_name) : Module(std::move(type_name)) {}
  // Appends `child` named after its position.
  template <typename M>
  M *Append(std::unique_ptr<M> child) {
    return Append(std::to_string(children().size()), std::move(child));
  }
  template <typename M>
  M *Append(const std::string &name, std::unique_ptr<M> child) {
    return RegisterChild(name, std::move(child));
  }
  int size() const { return static_cast<int>(children().size()); }
  Module *at(int index) const { return children()[index].second; }

 protected:
  absl::StatusOr<Tensor> ForwardImpl(const Tensor &input,
                                     const Stream &stream) override;
  absl::StatusOr<Tensor> BackwardImpl(const Tensor &grad_output,
                                      const Stream &stream) override;
};

}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_MODULE_H_
