// File helpers with loom::Error messages that name the path and the OS reason.
#pragma once
#include <string>

namespace loom {

std::string read_file_bytes(const std::string& path);
// Writes to path + ".tmp", fsyncs, renames over `path`, fsyncs the directory.
void write_file_atomic(const std::string& path, const std::string& bytes);
// fsync a directory (after renames inside it).
void fsync_dir(const std::string& dir);

}  // namespace loom
