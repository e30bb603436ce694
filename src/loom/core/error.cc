#include "loom/core/error.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>

namespace loom {

namespace {
std::atomic<int> g_diag_rank{-1};
}

void set_global_rank_for_diagnostics(int global_rank) { g_diag_rank.store(global_rank); }

Error diverged(const std::string& what, double lr, long long warmup_steps, const std::string& fix_first) {
  return Error(detail::cat("training diverged: ", what, "; nothing from it is saved. ", fix_first,
                           fix_first.empty() ? "Lower" : ", or lower", " optim.lr (", lr,
                           ") or raise optim.warmup_steps (", warmup_steps, ")"));
}
int global_rank_for_diagnostics() { return g_diag_rank.load(); }

void assert_fail(const char* expr, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "loom internal error [rank %d] %s:%d: assertion `%s` failed%s%s\n",
               global_rank_for_diagnostics(), file, line, expr, msg.empty() ? "" : ": ",
               msg.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace loom
