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
  phase_ = has_record_ ? Phase::kFollowing : Phase::kRecording;
}

bool FetchSchedule::OnRequest(int bucket) {
  bool diverged = false;
  if (phase_ == Phase::kFollowing &&
      (position_ >= record_.size() || record_[position_] != bucket)) {
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
  const bool adopt =
      !has_record_ || phase_ == Phase::kDiverged || observed_ != record_;
  const bool replaced = adopt && has_record_;
  if (adopt) {
    record_ = observed_;
    has_record_ = true;
  }
  phase_ = Phase::kIdle;
  return replaced;
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
  for (size_t q = position_; q < record_.size(); ++q) {
    if (record_[q] == bucket) return q;
  }
  if (next_follows_) {
    for (size_t q = 0; q < record_.size(); ++q) {
      if (record_[q] == bucket) return record_.size() + q;
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
  for (size_t q = position_; q < record_.size(); ++q) {
    const int bucket = record_[q];
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
  // The rest of this micro-step, then (wrapping once) the next one's.
  for (size_t k = 0; k < 2 * record_.size() && upcoming.size() < count; ++k) {
    const size_t q = (position_ + k) % record_.size();
    const int bucket = record_[q];
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
