// Test helper: a fresh directory under the system temp dir, removed with its contents.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>

namespace loom::testing_support {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag = "loom-test") {
    path = std::filesystem::temp_directory_path() /
           (tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

}  // namespace loom::testing_support
