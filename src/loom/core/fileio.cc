#include "loom/core/fileio.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "loom/core/error.h"
#include "loom/core/owned.h"

namespace loom {

std::string read_file_bytes(const std::string& path) {
  // A FIFO or device (/dev/zero, /dev/urandom) is refused, not read: Note [Ownership by content].
  return owned::read_regular(path, SIZE_MAX - 1);
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  // Created exclusively under a marked name, never through a symlink (Note [Ownership by content]).
  const std::filesystem::path p(path);
  const std::string tmp =
      (p.parent_path() / owned::temp_name(p.filename().string(), owned::new_token())).string();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("cannot create '" + tmp + "': " + std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string why = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      throw Error("cannot write '" + tmp + "': " + why);
    }
    done += size_t(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw Error("cannot flush '" + tmp + "': " + why);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw Error("cannot rename '" + tmp + "' to '" + path + "': " + why);
  }
  fsync_dir(std::filesystem::path(path).parent_path().string());
}

}  // namespace loom
