// ForwardUses: the uses of parameters (stages 0-2: per parameter; stage 3:
// per bucket) that training forwards counted and their backwards have not
// counted down yet, kept per saved-state slot (nn/module.h SavedStateSlot).
//
// Why: a strategy reduces a gradient once every forward use of it has been
// backpropagated (zero/stages_0_to_2.h, zero/stage3.h). The uses a backward
// counts down must be those its own forward counted, which is what the
// modules' saved records are too: so the counts are kept like the records,
// in the slot the forward ran in, and a backward reads and counts down its
// slot's. With one forward at a time (the engine's micro-steps: slot 0)
// that is the old per-bracket count. A pipeline rank running 1F1B has
// several forwards in flight, each in the slot of its (stage, micro-batch)
// (pipeline/executor.h): B(m) then counts down F(m)'s uses, whatever
// forwards ran between them.
//
// Lifetime of a slot's counts: BeginForward (the strategy's BeginForward)
// starts them at zero, forgetting an earlier forward of the same slot that
// was never backpropagated (an abandoned micro-step); Count adds the
// forward's uses; CountDown, during the slot's backward, takes them back;
// EndBackward (the strategy's EndBackward) drops them. Other slots' counts
// are untouched throughout.
//
// Not thread-safe; one per strategy.
#ifndef ZE_ZERO_FORWARD_USES_H_
#define ZE_ZERO_FORWARD_USES_H_

#include <cstdint>
#include <vector>

namespace ze {
namespace zero {

class ForwardUses {
 public:
  // Counts for indices [0, size).
  explicit ForwardUses(int size = 0) : size_(size) {}

  // The current slot's counts start at zero.
  void BeginForward();
  // One more use of `index` by the current slot's forward.
  void Count(int index);
  // One use of `index` backpropagated in the current slot: true when that
  // was its last pending one (the count went from 1 to 0); false when it
  // had none pending.
  bool CountDown(int index);
  // Uses of `index` pending in the current slot.
  int pending(int index) const;
  // The current slot's backward ended: its counts are dropped.
  void EndBackward();

  // Slots with counts (forwards not yet backpropagated, or backwards not
  // yet ended).
  int slots() const { return static_cast<int>(slots_.size()); }

 private:
  struct Slot {
    int64_t id = 0;
    std::vector<int> uses;  // per index
  };
  // The current slot's counts, created (zero) when absent.
  std::vector<int> &Current();
  const std::vector<int> *Find(int64_t slot) const;

  int size_;
  // A handful at most (a pipeline's in-flight micro-batches).
  std::vector<Slot> slots_;
};

}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_FORWARD_USES_H_
