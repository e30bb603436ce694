// File helpers with loom::Error messages that name the path and the OS reason.
#pragma once
#include <string>

namespace loom {

// The bytes of a regular file (a FIFO or device is refused, never read).
std::string read_file_bytes(const std::string& path);
// Writes to a new `path.loom-tmp-<token>` (Note [Ownership by content]), fsyncs, renames
// over `path`, fsyncs the directory. The caller decides that `path` may be replaced.
void write_file_atomic(const std::string& path, const std::string& bytes);
// fsync a directory (after renames inside it).
void fsync_dir(const std::string& dir);

}  // namespace loom
