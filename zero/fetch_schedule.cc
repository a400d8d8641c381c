#include "zero/fetch_schedule.h"

#include <algorithm>
#include <utility>

namespace ze {
namespace zero {

FetchSchedule::FetchSchedule(const FetchScheduleOptions& options,
                             std::vector<int64_t> bucket_elements,
                             std::vector<bool> persistent)
    : options_(options),
      bucket_elements_(std::move(bucket_elements)),
      persistent_(std::move(persistent)) {
  persistent_.resize(bucket_elements_.size(), false);
  gathered_.assign(bucket_elements_.size(), false);
}

void FetchSchedule::BeginMicroStep() {
  position_ = 0;
  observed_.clear();
  ++micro_steps_;
  phase_ = has_record() ? Phase::kFollowing : Phase::kRecording;
}

int FetchSchedule::FindRecord(int first) const {
  for (int r = 0; r < static_cast<int>(records_.size()); ++r) {
    const std::vector<int>& requests = records_[r].requests;
    if (requests.empty() ? first < 0 : requests[0] == first) return r;
  }
  return -1;
}

bool FetchSchedule::OnRequest(int bucket) {
  bool diverged = false;
  if (phase_ == Phase::kFollowing && position_ == 0) {
    // The first request picks the path (stays on the last one if none).
    const int found = FindRecord(bucket);
    if (found >= 0) active_ = found;
  }
  const std::vector<int>& record = this->record();
  if (phase_ == Phase::kFollowing &&
      (position_ >= record.size() || record[position_] != bucket)) {
    // Every rank on the same path notices at the same request, so the
    // collectives stay in step.
    phase_ = Phase::kDiverged;
    diverged = true;
  }
  ++position_;
  observed_.push_back(bucket);
  return diverged;
}

bool FetchSchedule::EndMicroStep() {
  const bool had_record = has_record();
  const int first = observed_.empty() ? -1 : observed_[0];
  int slot = FindRecord(first);
  const bool adopt = slot < 0 || records_[slot].requests != observed_;
  if (slot < 0) {
    if (static_cast<int>(records_.size()) < kMaxRecords) {
      slot = static_cast<int>(records_.size());
      records_.emplace_back();
    } else {
      // The least recently used path makes room (the lowest index on a
      // tie, so every rank picks alike).
      slot = 0;
      for (int r = 1; r < static_cast<int>(records_.size()); ++r) {
        if (records_[r].last_used < records_[slot].last_used) slot = r;
      }
    }
  }
  records_[slot].requests = observed_;
  records_[slot].last_used = micro_steps_;
  active_ = slot;
  phase_ = Phase::kIdle;
  return adopt && had_record;
}

void FetchSchedule::OnGathered(int bucket) {
  gathered_[bucket] = true;
  live_elements_ += bucket_elements_[bucket];
  peak_live_elements_ = std::max(peak_live_elements_, live_elements_);
}

void FetchSchedule::OnFreed(int bucket) {
  gathered_[bucket] = false;
  live_elements_ -= bucket_elements_[bucket];
}

size_t FetchSchedule::NextUse(int bucket) const {
  if (phase_ != Phase::kFollowing) return Never();
  const std::vector<int>& record = this->record();
  for (size_t q = position_; q < record.size(); ++q) {
    if (record[q] == bucket) return q;
  }
  if (next_follows_) {
    // The next micro-step is assumed to take this path again.
    for (size_t q = 0; q < record.size(); ++q) {
      if (record[q] == bucket) return record.size() + q;
    }
  }
  return Never();
}

std::vector<int> FetchSchedule::PrefetchCandidates() const {
  std::vector<int> candidates;
  if (phase_ != Phase::kFollowing || options_.prefetch_bucket_elements <= 0) {
    return candidates;
  }
  int64_t budget = options_.prefetch_bucket_elements;
  int64_t live = live_elements_;
  std::vector<bool> gathered = gathered_;
  const std::vector<int>& record = this->record();
  for (size_t q = position_; q < record.size(); ++q) {
    const int bucket = record[q];
    if (gathered[bucket]) continue;
    const int64_t elements = bucket_elements_[bucket];
    if (elements > budget || live + elements > options_.max_live_elements) {
      break;
    }
    budget -= elements;
    live += elements;
    gathered[bucket] = true;
    candidates.push_back(bucket);
  }
  return candidates;
}

std::vector<int> FetchSchedule::UpcomingBuckets(
    size_t count, const std::function<bool(int)>& wanted) const {
  std::vector<int> upcoming;
  if (phase_ != Phase::kFollowing || count == 0) return upcoming;
  std::vector<bool> seen(gathered_.size(), false);
  // The rest of this micro-step, then (wrapping once) the next one's,
  // assumed to take this path again (as NextUse does).
  const std::vector<int>& record = this->record();
  for (size_t k = 0; k < 2 * record.size() && upcoming.size() < count; ++k) {
    const size_t q = (position_ + k) % record.size();
    const int bucket = record[q];
    if (seen[bucket] || gathered_[bucket]) continue;
    seen[bucket] = true;
    if (wanted(bucket)) upcoming.push_back(bucket);
  }
  return upcoming;
}

bool FetchSchedule::ShouldKeep(int bucket) const {
  if (phase_ != Phase::kFollowing || options_.max_reuse_distance <= 0) {
    return false;
  }
  if (live_elements_ > options_.max_live_elements) return false;
  const size_t next = NextUse(bucket);
  return next < Never() &&
         static_cast<int64_t>(next - position_) < options_.max_reuse_distance;
}

int FetchSchedule::EvictionVictim(
    const std::function<bool(int)>& in_use) const {
  int victim = -1;
  size_t victim_next = 0;
  for (int bucket = 0; bucket < static_cast<int>(gathered_.size()); ++bucket) {
    if (!gathered_[bucket] || persistent_[bucket] || in_use(bucket)) continue;
    const size_t next = NextUse(bucket);
    if (victim < 0 || next >= victim_next) {
      victim = bucket;
      victim_next = next;
    }
  }
  return victim;
}

}  // namespace zero
}  // namespace ze
