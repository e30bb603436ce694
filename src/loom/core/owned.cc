// Note [Ownership by content] (owned.h).
#include "loom/core/owned.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

#include "loom/core/error.h"

namespace loom::owned {

namespace fs = std::filesystem;

namespace {

constexpr const char* kTempTag = ".loom-tmp-";
constexpr const char* kMarker = ".loom-owner";
constexpr const char* kMarkerMagic = "loom-owned-1 ";
constexpr size_t kTokenChars = 16;

bool is_token(const std::string& t) {
  return t.size() == kTokenChars &&
         std::all_of(t.begin(), t.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::string host_name() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return host;
}

// Reads at most `max_bytes` + 1 bytes of an open descriptor (`expect`: its size, if known).
std::string read_fd(int fd, size_t max_bytes, size_t expect = 0) {
  std::string out;
  out.reserve(std::min(expect, max_bytes) + 1);
  char buf[1 << 16];
  while (out.size() <= max_bytes) {
    const ssize_t n = ::read(fd, buf, std::min(sizeof buf, max_bytes + 1 - out.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, size_t(n));
  }
  return out;
}

}  // namespace

std::string new_token() {
  std::random_device rd;  // /dev/urandom on Linux
  const uint64_t v = (uint64_t(rd()) << 32) ^ uint64_t(rd());
  char buf[kTokenChars + 1];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string temp_name(const std::string& base, const std::string& token) { return base + kTempTag + token; }

std::optional<std::pair<std::string, std::string>> parse_temp_name(const std::string& name) {
  const size_t at = name.rfind(kTempTag);
  if (at == std::string::npos || at == 0) return std::nullopt;
  const std::string token = name.substr(at + std::strlen(kTempTag));
  if (!is_token(token)) return std::nullopt;
  return std::make_pair(name.substr(0, at), token);
}

Kind kind_of(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return Kind::kNone;
  if (S_ISLNK(st.st_mode)) return Kind::kSymlink;
  if (S_ISDIR(st.st_mode)) return Kind::kDir;
  if (S_ISREG(st.st_mode)) return Kind::kFile;
  return Kind::kOther;
}

const char* kind_text(Kind k) {
  switch (k) {
    case Kind::kNone: return "missing";
    case Kind::kFile: return "a regular file";
    case Kind::kDir: return "a directory";
    case Kind::kSymlink: return "a symlink";
    case Kind::kOther: return "a FIFO, socket or device";
  }
  return "?";
}

std::string read_regular(const std::string& path, size_t max_bytes, bool follow) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | (follow ? 0 : O_NOFOLLOW));
  if (fd < 0) {
    const int err = errno;
    if (err == ELOOP) throw Error("'" + path + "' is a symlink, which loom does not follow here; give the file itself");
    throw Error("cannot open '" + path + "': " + std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const bool dir = S_ISDIR(st.st_mode);
    ::close(fd);
    throw Error("cannot read '" + path + "': it is " + (dir ? "a directory" : "a FIFO, socket or device") +
                ", expected a regular file");
  }
  if (size_t(st.st_size) > max_bytes) {
    ::close(fd);
    throw Error(detail::cat("cannot read '", path, "': it is ", st.st_size, " bytes, over the ", max_bytes,
                            "-byte limit for this kind of file"));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  std::string out = read_fd(fd, max_bytes, size_t(st.st_size));
  ::close(fd);
  if (out.size() > max_bytes)  // it grew while read
    throw Error(detail::cat("cannot read '", path, "': it grew past the ", max_bytes, "-byte limit while read"));
  return out;
}

void require_regular(const std::string& path) {
  const Kind k = kind_of(path);
  if (k == Kind::kFile) return;
  if (k == Kind::kNone) throw Error("cannot read '" + path + "': " + std::strerror(ENOENT));
  throw Error("cannot read '" + path + "': it is " + kind_text(k) +
              ", where loom wrote a regular file; loom does not follow or open it");
}

TempDir::TempDir(const std::string& parent, const std::string& base) {
  token_ = new_token();
  path_ = (fs::path(parent.empty() ? "." : parent) / temp_name(base, token_)).string();
  if (::mkdir(path_.c_str(), 0755) != 0)
    throw Error("cannot create the temporary directory '" + path_ + "': " + std::strerror(errno));
  const std::string marker = path_ + "/" + kMarker;
  marker_fd_ = ::open(marker.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  const std::string text = std::string(kMarkerMagic) + token_ + " pid " + std::to_string(::getpid()) + " host " +
                           host_name() + "\n";
  if (marker_fd_ < 0 || ::flock(marker_fd_, LOCK_EX | LOCK_NB) != 0 ||
      ::write(marker_fd_, text.data(), text.size()) != ssize_t(text.size())) {
    const std::string why = std::strerror(errno);
    if (marker_fd_ >= 0) ::close(marker_fd_), ::unlink(marker.c_str());
    marker_fd_ = -1;
    ::rmdir(path_.c_str());
    throw Error("cannot write into the temporary directory '" + path_ + "': " + why);
  }
}

TempDir::~TempDir() {
  if (path_.empty()) return;
  // Made exclusively by this process: every entry is ours. The marker goes last, just before
  // the then empty directory, so a kill while removing leaves a directory still proved loom's
  // (Note [Ownership by content]).
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(path_, ec))
    if (e.path().filename() != kMarker) fs::remove_all(e.path(), ec);
  ::unlink((path_ + "/" + kMarker).c_str());
  ::rmdir(path_.c_str());
  if (marker_fd_ >= 0) ::close(marker_fd_);
}

void TempDir::drop_marker() {
  ::unlink((path_ + "/" + kMarker).c_str());
  if (marker_fd_ >= 0) ::close(marker_fd_);
  marker_fd_ = -1;
}

void TempDir::publish(const std::string& dest) {
  drop_marker();
  if (::rename(path_.c_str(), dest.c_str()) != 0)
    throw Error("cannot rename '" + path_ + "' to '" + dest + "': " + std::strerror(errno));
  path_.clear();
}

void TempDir::finish_empty() {
  drop_marker();
  if (::rmdir(path_.c_str()) != 0)
    throw Error("cannot remove the temporary directory '" + path_ + "': " + std::strerror(errno));
  path_.clear();
}

bool is_abandoned_temp(const std::string& dir, const std::string& name, bool* live) {
  if (live) *live = false;
  const auto parsed = parse_temp_name(name);
  const std::string path = (fs::path(dir) / name).string();
  if (!parsed || kind_of(path) != Kind::kDir) return false;
  const int fd = ::open((path + "/" + kMarker).c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  bool ours = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  if (ours) {
    const std::string text = read_fd(fd, 512);
    ours = text.rfind(std::string(kMarkerMagic) + parsed->second + " ", 0) == 0;
  }
  bool abandoned = false;
  if (ours) {
    abandoned = ::flock(fd, LOCK_EX | LOCK_NB) == 0;  // the maker's flock is gone: so is the maker
    if (live) *live = !abandoned;
  }
  ::close(fd);
  return abandoned;
}

std::vector<std::string> remove_abandoned(const std::string& parent, const std::string& base) {
  std::vector<std::string> removed;
  std::error_code ec;
  const std::string dir = parent.empty() ? "." : parent;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const auto parsed = parse_temp_name(name);
    if (!parsed || (!base.empty() && parsed->first != base) || !is_abandoned_temp(dir, name)) continue;
    std::error_code rm;
    fs::remove_all(e.path(), rm);
    if (!rm) removed.push_back(name);
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

std::vector<std::string> write_through_temp(const std::string& path,
                                            const std::function<void(const std::string&)>& write) {
  const fs::path out = fs::absolute(path);
  const std::string parent = out.parent_path().string(), base = out.filename().string();
  std::vector<std::string> removed = remove_abandoned(parent, base);
  TempDir made(parent, base);  // removed unless the file is moved out
  const std::string tmp = made.path() + "/" + base;
  write(tmp);
  if (::rename(tmp.c_str(), out.c_str()) != 0)
    throw Error("cannot rename '" + tmp + "' to '" + path + "': " + std::strerror(errno));
  made.finish_empty();
  return removed;
}

bool carries_mark(const std::string& path, const std::vector<std::string>& marks) {
  if (kind_of(path) != Kind::kFile) return false;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  const std::string head = read_fd(fd, 4095);
  ::close(fd);
  return std::any_of(marks.begin(), marks.end(), [&](const std::string& m) { return head.find(m) != std::string::npos; });
}

}  // namespace loom::owned
