// File helpers with loom::Error messages that name the path and the OS reason.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace loom {

// CRC-32 (zlib's) of n bytes, any n (zlib takes 32-bit lengths: fed in pieces).
uint32_t crc32_of(const void* data, size_t n);

// The bytes of a regular file (a FIFO or device is refused, never read).
std::string read_file_bytes(const std::string& path);
// Writes to a new `path.loom-tmp-<token>` (Note [Ownership by content]), fsyncs, renames
// over `path`, fsyncs the directory. The caller decides that `path` may be replaced.
void write_file_atomic(const std::string& path, const std::string& bytes);
// A file written in pieces and published as write_file_atomic does: into a new marked
// temporary, fsynced, renamed over `path` by commit(); destroyed uncommitted, the temporary
// is removed. write_at patches bytes already written (a header's counts and CRCs).
class AtomicWriter {
 public:
  explicit AtomicWriter(const std::string& path);
  ~AtomicWriter();
  AtomicWriter(const AtomicWriter&) = delete;
  AtomicWriter& operator=(const AtomicWriter&) = delete;
  void write(const void* data, size_t n);
  void write_at(uint64_t offset, const void* data, size_t n);
  void commit();

 private:
  [[noreturn]] void fail(const char* what);
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

// fsync a directory (after renames inside it).
void fsync_dir(const std::string& dir);

// Throws loom::Error before a byte is written when `bytes` more do not fit in the free space
// of the file system holding `dir`: "<what> takes X GB and '<dir>' has Y GB free: <fix>".
// Does nothing when the free space cannot be read.
void require_free_space(const std::string& dir, double bytes, const std::string& what, const std::string& fix);

}  // namespace loom
