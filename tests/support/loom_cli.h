// Runs the `loom` binary (LOOM_BINARY) as a user would, for the CLI tests.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace loom::testing_support {

struct CliResult {
  int code;
  std::string output;  // stdout and stderr together
};

// `loom ARGS` in `cwd` (empty: the test's own), its exit code and output.
inline CliResult run_loom(const std::string& args, const std::string& cwd = "") {
  const std::string cmd =
      (cwd.empty() ? "" : "cd '" + cwd + "' && ") + std::string(LOOM_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WEXITSTATUS(status), out};
}

// `args` is refused as a usage or config error (exit 2) whose message contains `names`.
inline void expect_usage_error(const std::string& args, const std::string& names) {
  const CliResult r = run_loom(args);
  EXPECT_EQ(r.code, 2) << args;
  EXPECT_NE(r.output.find(names), std::string::npos) << args << "\n" << r.output;
}

}  // namespace loom::testing_support
