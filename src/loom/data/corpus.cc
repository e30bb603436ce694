#include "loom/data/corpus.h"

#include <algorithm>
#include <filesystem>

namespace fs = std::filesystem;

namespace loom::data {

std::vector<std::string> text_files_under(const std::string& dir) {
  std::error_code ec;
  std::vector<std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec)) {
    if (!e.is_regular_file() || e.is_symlink()) continue;
    const fs::path& p = e.path();
    if (p.extension() == ".dat" && fs::exists(fs::path(p).replace_extension(), ec)) continue;  // strfile index
    files.push_back(p.string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace loom::data
