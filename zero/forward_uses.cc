#include "zero/forward_uses.h"

#include <algorithm>

#include "nn/module.h"

namespace ze {
namespace zero {

std::vector<int> &ForwardUses::Current() {
  const int64_t id = nn::CurrentSavedStateSlot();
  for (Slot &slot : slots_) {
    if (slot.id == id) return slot.uses;
  }
  slots_.push_back(Slot{id, std::vector<int>(size_, 0)});
  return slots_.back().uses;
}

const std::vector<int> *ForwardUses::Find(int64_t id) const {
  for (const Slot &slot : slots_) {
    if (slot.id == id) return &slot.uses;
  }
  return nullptr;
}

void ForwardUses::BeginForward() {
  std::vector<int> &uses = Current();
  std::fill(uses.begin(), uses.end(), 0);
}

void ForwardUses::Count(int index) { ++Current()[index]; }

bool ForwardUses::CountDown(int index) {
  std::vector<int> &uses = Current();
  if (uses[index] == 0) return false;
  return --uses[index] == 0;
}

int ForwardUses::pending(int index) const {
  const std::vector<int> *uses = Find(nn::CurrentSavedStateSlot());
  return uses == nullptr ? 0 : (*uses)[index];
}

void ForwardUses::EndBackward() {
  const int64_t id = nn::CurrentSavedStateSlot();
  slots_.erase(std::remove_if(slots_.begin(), slots_.end(),
                              [id](const Slot &slot) { return slot.id == id; }),
               slots_.end());
}

}  // namespace zero
}  // namespace ze
