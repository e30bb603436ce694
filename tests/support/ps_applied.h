// What the parameter servers applied, as they recorded it (Note [Asynchronous parameter
// server], TrainOptions::on_ps_apply), the checks that hold whatever the timing, and
// pushes in shuffled order.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <random>
#include <thread>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "loom/train/trainer.h"

namespace loom::testing_support {

struct Applied {
  std::mutex mu;
  std::map<int, std::vector<std::pair<int, int64_t>>> by_server;  // (worker, clock) in applying order
  int64_t most_stale = -1;
  TrainOptions options() {
    TrainOptions o;
    o.on_ps_apply = [this](int server, int worker, int64_t clock, int64_t version) {
      std::lock_guard<std::mutex> lock(mu);
      by_server[server].push_back({worker, clock});
      most_stale = std::max(most_stale, clock - version);
    };
    return o;
  }
  // Note [Exact push count]: all `servers` applied the same pushes, exactly W x steps, each
  // worker's clocks 0, 1, ... in order. Returns each worker's count of applied pushes.
  std::vector<int64_t> expect_same_pushes(int W, int servers, int64_t steps, const std::string& what = "") {
    EXPECT_EQ(int(by_server.size()), servers) << what;
    std::vector<std::pair<int, int64_t>> first = by_server[0];
    EXPECT_EQ(int64_t(first.size()), W * steps) << what;
    std::vector<int64_t> next(size_t(W), 0);
    for (const auto& [w, c] : first) EXPECT_EQ(c, next[size_t(w)]++) << what << ": worker " << w << "'s pushes out of order";
    std::sort(first.begin(), first.end());
    for (int s = 1; s < servers; ++s) {
      std::vector<std::pair<int, int64_t>> other = by_server[s];
      std::sort(other.begin(), other.end());
      EXPECT_EQ(other, first) << what << ": server " << s << " applied other pushes than server 0";
    }
    return next;
  }
};

// Final weights kept, and every push delayed by a random 0-5 ms so the pushes reach the
// servers in shuffled order.
inline TrainOptions shuffled_arrivals() {
  TrainOptions o;
  o.keep_params = true;
  o.before_ps_push = [](int64_t step) {
    thread_local std::mt19937 rng(std::hash<std::thread::id>{}(std::this_thread::get_id()) + uint64_t(step));
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 6));
  };
  return o;
}

}  // namespace loom::testing_support
