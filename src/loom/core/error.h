// Errors. Two kinds, never mixed:
//  - loom::Error: the user's problem (config, input data, files). Thrown by LOOM_CHECK,
//    caught at the CLI boundary, printed as one line, exit code 2 (usage/config) or 1.
//  - LOOM_ASSERT: a broken internal invariant. Prints file:line and the global rank, aborts.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace loom {

// Error::Kind decides the exit code at the CLI boundary: kConfig -> 2, kRuntime -> 1.
class Error : public std::runtime_error {
 public:
  enum class Kind { kConfig, kRuntime };
  explicit Error(const std::string& what, Kind kind = Kind::kRuntime)
      : std::runtime_error(what), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& what) : Error(what, Kind::kConfig) {}
};

// The global rank printed by LOOM_ASSERT. Set once at start-up by the launcher;
// -1 means "single process". This is diagnostic identity, not a process group.
void set_global_rank_for_diagnostics(int global_rank);
int global_rank_for_diagnostics();

[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const std::string& msg);

// Note [Diverged runs]
// Every way a CPU run can diverge stops it with one message built here: "training diverged:
// <what went non-finite or overflowed, and when>; nothing from it is saved. <the fix>", the fix
// naming the learning rate and the warm-up as set (`fix_first`, when given, is the mode's own
// first remedy). The run exits 1 (a runtime error) and no checkpoint is written from the
// diverged state (save_checked in train/step_observers.cc).
Error diverged(const std::string& what, double lr, long long warmup_steps, const std::string& fix_first = {});

namespace detail {
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace loom

// LOOM_CHECK(cond, parts...): throws loom::Error built from the streamed parts.
#define LOOM_CHECK(cond, ...)                                       \
  do {                                                              \
    if (!(cond)) throw ::loom::Error(::loom::detail::cat(__VA_ARGS__)); \
  } while (0)

// LOOM_CONFIG_CHECK(cond, parts...): as LOOM_CHECK for the user's settings (ConfigError, exit 2).
#define LOOM_CONFIG_CHECK(cond, ...)                                      \
  do {                                                                    \
    if (!(cond)) throw ::loom::ConfigError(::loom::detail::cat(__VA_ARGS__)); \
  } while (0)

// LOOM_ASSERT(cond, parts...): internal invariant; aborts with file:line and rank.
#define LOOM_ASSERT(cond, ...)                                                      \
  do {                                                                              \
    if (!(cond))                                                                    \
      ::loom::assert_fail(#cond, __FILE__, __LINE__, ::loom::detail::cat("" __VA_OPT__(,) __VA_ARGS__)); \
  } while (0)
