#include "loom/core/liveness.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace loom::liveness {

namespace {
// Diagnostic state of the process, like the rank printed by LOOM_ASSERT; not a process group.
std::atomic<int64_t> g_waits{0};
std::atomic<int64_t> g_step{-1};
}  // namespace

void begin_wait() { g_waits.fetch_add(1, std::memory_order_relaxed); }
void end_wait() { g_waits.fetch_sub(1, std::memory_order_relaxed); }
int64_t waits_in_flight() { return g_waits.load(std::memory_order_relaxed); }

int64_t current_step() { return g_step.load(std::memory_order_relaxed); }

void enter_step(int64_t step, int rank) {
  g_step.store(step, std::memory_order_relaxed);
  const char* spec = std::getenv("LOOM_FAILPOINT");
  if (!spec) return;
  char name[32] = {};
  long long at_step = -1;
  int at_rank = -1;
  double seconds = 0;
  if (std::sscanf(spec, "%31[a-z]@%lld:%d:%lf", name, &at_step, &at_rank, &seconds) < 3) return;
  if (at_step != step || at_rank != rank) return;
  if (std::strcmp(name, "hang") == 0) {
    std::fprintf(stderr, "loom: LOOM_FAILPOINT %s: rank %d blocks for good at step %lld\n", spec, rank, at_step);
    std::fflush(stderr);
    for (;;) ::pause();
  }
  if (std::strcmp(name, "busy") == 0) {
    std::fprintf(stderr, "loom: LOOM_FAILPOINT %s: rank %d computes for %g s at step %lld\n", spec, rank, seconds,
                 at_step);
    std::fflush(stderr);
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    volatile uint64_t x = 1;
    while (std::chrono::steady_clock::now() < until)
      for (int i = 0; i < 100000; ++i) x = x * 6364136223846793005ull + 1;
  }
}

Deadline::Deadline(double seconds, std::function<void()> on_expiry) {
  watch_ = std::thread([this, seconds, expire = std::move(on_expiry)] {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return met_; })) expire();
  });
}

Deadline::~Deadline() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    met_ = true;
  }
  cv_.notify_all();
  watch_.join();
}

}  // namespace loom::liveness
