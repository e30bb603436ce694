#include "loom/core/fileio.h"

#include "loom/core/liveness.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "loom/core/error.h"
#include "loom/core/owned.h"

namespace loom {

uint32_t crc32_of(const void* data, size_t n) {
  uLong c = crc32(0L, Z_NULL, 0);
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    const uInt chunk = uInt(std::min<size_t>(n, size_t(1) << 30));
    c = crc32(c, p, chunk);
    p += chunk, n -= chunk;
  }
  return uint32_t(c);
}

std::string read_file_bytes(const std::string& path) {
  // A FIFO or device (/dev/zero, /dev/urandom) is refused, not read: Note [Ownership by content].
  return owned::read_regular(path, SIZE_MAX - 1);
}

void fsync_dir(const std::string& dir) {
  const liveness::Waiting waiting;  // a slow disk is not a hung rank (Note [Heartbeats])
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

void require_free_space(const std::string& dir, double bytes, const std::string& what, const std::string& fix) {
  struct statvfs v {};
  if (::statvfs(dir.empty() ? "." : dir.c_str(), &v) != 0) return;
  const double free = double(v.f_bavail) * double(v.f_frsize);
  if (bytes <= free) return;
  std::ostringstream os;
  os << what << " takes " << bytes / 1e9 << " GB and '" << (dir.empty() ? "." : dir) << "' has " << free / 1e9
     << " GB free: " << fix;
  throw Error(os.str());
}

AtomicWriter::AtomicWriter(const std::string& path) : path_(path) {
  // Created exclusively under a marked name, never through a symlink (Note [Ownership by content]).
  const std::filesystem::path p(path);
  tmp_ = (p.parent_path() / owned::temp_name(p.filename().string(), owned::new_token())).string();
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error("cannot create '" + tmp_ + "': " + std::strerror(errno));
}

AtomicWriter::~AtomicWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicWriter::fail(const char* what) {
  const std::string why = std::strerror(errno);
  throw Error(std::string("cannot ") + what + " '" + tmp_ + "': " + why);
}

void AtomicWriter::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  for (size_t done = 0; done < n;) {
    const ssize_t k = ::write(fd_, p + done, n - done);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) fail("write");
    done += size_t(k);
  }
}

void AtomicWriter::write_at(uint64_t offset, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  for (size_t done = 0; done < n;) {
    const ssize_t k = ::pwrite(fd_, p + done, n - done, off_t(offset + done));
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) fail("write");
    done += size_t(k);
  }
}

void AtomicWriter::commit() {
  if (const liveness::Waiting waiting; ::fsync(fd_) != 0) fail("flush");
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("flush");
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    throw Error("cannot rename '" + tmp_ + "' to '" + path_ + "': " + why);
  }
  committed_ = true;
  fsync_dir(std::filesystem::path(path_).parent_path().string());
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  AtomicWriter w(path);
  w.write(bytes.data(), bytes.size());
  w.commit();
}

}  // namespace loom
