#include "loom/core/survivors.h"

#include <algorithm>

namespace loom {

void Survivors::gone(int r, bool local, Clock::time_point now) {
  if (!local) {
    faulty_[size_t(r)] = 1;
    remote_gone_ = now;
  } else {
    waiting_.emplace_back(r, now);
  }
}

void Survivors::judge(Clock::time_point now) {
  auto decided = [&](const std::pair<int, Clock::time_point>& w) {
    // A remote rank seen gone at or after this one (within the window): a survivor.
    if (remote_gone_ && *remote_gone_ >= w.second && *remote_gone_ - w.second <= kSurvivorWindow) return true;
    if (now - w.second <= kSurvivorWindow) return false;  // still waiting
    faulty_[size_t(w.first)] = 1;
    return true;
  };
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), decided), waiting_.end());
}

}  // namespace loom
