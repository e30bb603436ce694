// Runs the `loom` binary (LOOM_BINARY) as a user would, for the CLI tests.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace loom::testing_support {

struct CliResult {
  int code;
  std::string output;  // stdout and stderr together
};

// `loom ARGS` in `cwd` (empty: the test's own) with `env` ("NAME=value ...") added to the
// environment, its exit code and output.
inline CliResult run_loom(const std::string& args, const std::string& cwd = "", const std::string& env = "") {
  const std::string cmd = (cwd.empty() ? "" : "cd '" + cwd + "' && ") + (env.empty() ? "" : "env " + env + " ") +
                          std::string(LOOM_BINARY) + " " + args + " 2>&1";
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

// The tiny model of issue repro lines (2 layers, d_model 64, batch 12, no validation).
inline const std::string kTinyModel =
    " --set model.layers=2 --set model.d_model=64 --set model.heads=4 --set model.vocab=256 --set model.ctx=32"
    " --set train.batch=12 --set train.val_batches=1 --set train.val_every=0 --set train.threads=1";

// `loom train` of the tiny model for `steps` steps into `dir`, then `extra`.
inline std::string tiny_train(const std::string& dir, int steps, const std::string& extra = "") {
  return "train" + kTinyModel + " --set train.steps=" + std::to_string(steps) + " --set checkpoint.dir=" + dir + " " +
         extra;
}

// A new empty directory TempDir()/name (whatever was there is removed).
inline std::string fresh_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "/" + name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// A file's bytes ("" when it cannot be read).
inline std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// The short names the CLI test files use (`using namespace ...::cli_case;`).
namespace cli_case {
using Result = CliResult;
inline Result run(const std::string& args) { return run_loom(args); }
inline const std::string& kTiny = kTinyModel;
inline std::string train(const std::string& dir, int steps, const std::string& extra = "") {
  return tiny_train(dir, steps, extra);
}
}  // namespace cli_case

}  // namespace loom::testing_support
