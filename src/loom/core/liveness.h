// What a rank's heartbeat reports about it (Note [Heartbeats] in cli/supervise.cc).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace loom::liveness {

// This process waits on something outside it: a collective or point-to-point call (from
// issue to completion, async ones included) or a file sync. The supervisor's hang check
// does not count time spent in one: a long collective is the collective timeout's business.
void begin_wait();
void end_wait();
int64_t waits_in_flight();

// The step this rank is in (0-based; -1 before the first), for the heartbeat's report.
int64_t current_step();

// begin_wait() / end_wait() for a scope.
class Waiting {
 public:
  Waiting() { begin_wait(); }
  ~Waiting() { end_wait(); }
  Waiting(const Waiting&) = delete;
  Waiting& operator=(const Waiting&) = delete;
};

// Runs `on_expiry` on a thread of its own unless the Deadline is destroyed (met) within
// `seconds` (Note [Start deadline] in cli/train_cmd.cc). on_expiry may end the process.
class Deadline {
 public:
  Deadline(double seconds, std::function<void()> on_expiry);
  ~Deadline();
  Deadline(const Deadline&) = delete;
  Deadline& operator=(const Deadline&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool met_ = false;
  std::thread watch_;
};

// At the start of step `step` (0-based) of global rank `rank`: records the step, then Note
// [Failpoints]:
// LOOM_FAILPOINT=hang@STEP:RANK blocks the rank for good without using the CPU (a hung
// rank); busy@STEP:RANK:SECONDS keeps it computing for SECONDS, outside any collective (a
// slow rank, which the others wait for in their next collective). Unset, nothing happens.
void enter_step(int64_t step, int rank);

}  // namespace loom::liveness
