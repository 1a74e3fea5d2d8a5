#include "client/sync_replay.h"

#include <algorithm>

namespace shardtrain::client {

void SyncReplay::Acked(int shard, const PushRequest* push) {
  absl::MutexLock lock(&mu_);
  const int64_t clock = push->clock();
  if (clock > highest_clock_) {
    highest_clock_ = clock;
    for (std::vector<Noted>& noted : pending_) {
      noted.erase(std::remove_if(noted.begin(), noted.end(),
                                 [clock](const Noted& n) { return n.clock < clock; }),
                  noted.end());
    }
  } else if (clock < highest_clock_) {
    return;
  }
  std::vector<Noted>& noted = pending_[shard];
  const bool known = std::any_of(noted.begin(), noted.end(),
                                 [push](const Noted& n) { return n.push == push; });
  if (!known) noted.push_back(Noted{push, clock});
}

void SyncReplay::Pulled(int shard, const PushRequest* push) {
  absl::MutexLock lock(&mu_);
  std::vector<Noted>& noted = pending_[shard];
  noted.erase(std::remove_if(noted.begin(), noted.end(),
                             [push](const Noted& n) { return n.push == push; }),
              noted.end());
}

std::vector<PushRequest> SyncReplay::Pending(int shard) const {
  absl::MutexLock lock(&mu_);
  std::vector<PushRequest> copies;
  for (const Noted& noted : pending_[shard]) {
    copies.push_back(*noted.push);
    copies.back().set_shard_incarnation(0);
  }
  return copies;
}

}  // namespace shardtrain::client
