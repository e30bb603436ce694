// Which files of a directory are text to read: shared by the trainer's corpus loader and
// `loom data prepare`.
#pragma once

#include <string>
#include <vector>

namespace loom::data {

// The files under `dir` (recursively), sorted by path: regular files only, no symlinks
// (fortunes' *.u8 link to the same text) and no strfile indexes (NAME.dat beside NAME).
std::vector<std::string> text_files_under(const std::string& dir);

}  // namespace loom::data
