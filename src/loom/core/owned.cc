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

namespace {

// "<temp dir name>.loom-owner": where a temporary directory's marker lies while the directory
// is being made or removed (Note [Ownership by content]).
std::string sibling_of(const std::string& temp_path) { return temp_path + kMarker; }

// The marker `path` (a regular file, not followed) names `token`; `fd_out` gets the open
// descriptor (for its flock) when it does, else -1.
bool marker_names(const std::string& path, const std::string& token, int* fd_out) {
  *fd_out = -1;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  const bool ours = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
                    read_fd(fd, 512).rfind(std::string(kMarkerMagic) + token + " ", 0) == 0;
  if (!ours) {
    ::close(fd);
    return false;
  }
  *fd_out = fd;
  return true;
}

// A marker file with its whole text and this process's flock, made to appear at `path`
// at once: written into an unnamed file (O_TMPFILE) and then linked through /proc, so no
// instant shows a marker without its text. Where the file system has no O_TMPFILE (or /proc
// is not mounted) it is created at `path` and then written (a kill between the two leaves an
// empty file, which proves nothing and is left alone). Returns the descriptor; throws Error.
int make_marker(const std::string& dir, const std::string& path, const std::string& text) {
  auto fill = [&](int fd) {
    return ::flock(fd, LOCK_EX | LOCK_NB) == 0 && ::write(fd, text.data(), text.size()) == ssize_t(text.size());
  };
  if (const int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0644); fd >= 0) {
    const std::string self = "/proc/self/fd/" + std::to_string(fd);
    if (fill(fd) && ::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, path.c_str(), AT_SYMLINK_FOLLOW) == 0) return fd;
    ::close(fd);
  }
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd >= 0 && fill(fd)) return fd;
  const std::string why = std::strerror(errno);
  if (fd >= 0) ::close(fd), ::unlink(path.c_str());
  throw Error("cannot write loom's ownership marker '" + path + "': " + why);
}

// Removes the marked directory `path` as its maker does: the marker moved out beside it
// first, the directory, then the marker (wherever it was), so a kill midway leaves it
// proved loom's. False when the directory could not be removed (the marker then stays).
bool remove_marked_dir(const std::string& path) {
  std::error_code ec;
  if (kind_of(path) == Kind::kDir) {
    ::rename((path + "/" + kMarker).c_str(), sibling_of(path).c_str());
    fs::remove_all(path, ec);
  }
  if (!ec) ::unlink(sibling_of(path).c_str());
  return !ec;
}

}  // namespace

// The marker moves between `<dir>/.loom-owner` and the sibling `<dir>.loom-owner` by rename,
// which keeps the file and so the flock; at every instant one of the two names the token
// (Note [Ownership by content]).
TempDir::TempDir(const std::string& parent, const std::string& base) {
  token_ = new_token();
  const std::string dir = parent.empty() ? "." : parent;
  path_ = (fs::path(dir) / temp_name(base, token_)).string();
  const std::string text = std::string(kMarkerMagic) + token_ + " pid " + std::to_string(::getpid()) + " host " +
                           host_name() + "\n";
  marker_fd_ = make_marker(dir, sibling_of(path_), text);  // first, so the directory is never unproved
  if (::mkdir(path_.c_str(), 0755) != 0 || ::rename(sibling_of(path_).c_str(), (path_ + "/" + kMarker).c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::rmdir(path_.c_str());
    ::unlink(sibling_of(path_).c_str());
    ::close(marker_fd_);
    marker_fd_ = -1;
    throw Error("cannot create the temporary directory '" + path_ + "': " + why);
  }
}

TempDir::~TempDir() {
  if (path_.empty()) return;
  remove_marked_dir(path_);
  if (marker_fd_ >= 0) ::close(marker_fd_);
}

void TempDir::marker_out() {
  if (::rename((path_ + "/" + kMarker).c_str(), sibling_of(path_).c_str()) != 0)
    throw Error("cannot move loom's marker out of '" + path_ + "': " + std::strerror(errno));
}

void TempDir::marker_back(const std::string& what) {
  const std::string why = std::strerror(errno);
  ::rename(sibling_of(path_).c_str(), (path_ + "/" + kMarker).c_str());
  throw Error(what + ": " + why);
}

void TempDir::release() {
  ::unlink(sibling_of(path_).c_str());
  if (marker_fd_ >= 0) ::close(marker_fd_);
  marker_fd_ = -1;
  path_.clear();
}

void TempDir::publish(const std::string& dest) {
  marker_out();
  if (::rename(path_.c_str(), dest.c_str()) != 0) marker_back("cannot rename '" + path_ + "' to '" + dest + "'");
  release();
}

void TempDir::finish_empty() {
  marker_out();
  if (::rmdir(path_.c_str()) != 0) marker_back("cannot remove the temporary directory '" + path_ + "'");
  release();
}

std::optional<std::string> parse_marker_name(const std::string& name) {
  const size_t n = std::strlen(kMarker);
  if (name.size() <= n || name.compare(name.size() - n, n, kMarker) != 0) return std::nullopt;
  const std::string dir = name.substr(0, name.size() - n);
  if (!parse_temp_name(dir)) return std::nullopt;
  return dir;
}

namespace {

// The marker that proves `<dir>/<name>` (a temporary directory or its sibling marker) loom's:
// its descriptor, or -1. A directory is proved by the marker inside it or, while it is being
// made or removed, by its sibling; the inside is looked at twice, as a live maker may be
// moving the marker in meanwhile.
int proving_marker(const std::string& dir, const std::string& name) {
  int fd = -1;
  if (const auto temp = parse_marker_name(name)) {
    marker_names((fs::path(dir) / name).string(), parse_temp_name(*temp)->second, &fd);
    return fd;
  }
  const auto parsed = parse_temp_name(name);
  const std::string path = (fs::path(dir) / name).string();
  if (!parsed || kind_of(path) != Kind::kDir) return -1;
  const std::string inside = path + "/" + kMarker;
  if (marker_names(inside, parsed->second, &fd) || marker_names(sibling_of(path), parsed->second, &fd) ||
      marker_names(inside, parsed->second, &fd))
    return fd;
  return -1;
}

}  // namespace

bool is_abandoned_temp(const std::string& dir, const std::string& name, bool* live) {
  if (live) *live = false;
  const int fd = proving_marker(dir, name);
  if (fd < 0) return false;
  const bool abandoned = ::flock(fd, LOCK_EX | LOCK_NB) == 0;  // the maker's flock is gone: so is the maker
  if (live) *live = !abandoned;
  ::close(fd);
  return abandoned;
}

bool remove_abandoned_entry(const std::string& dir, const std::string& name) {
  if (!is_abandoned_temp(dir, name)) return false;
  const auto temp = parse_marker_name(name);
  return remove_marked_dir((fs::path(dir) / (temp ? *temp : name)).string());
}

std::vector<std::string> remove_abandoned(const std::string& parent, const std::string& base) {
  std::vector<std::string> removed;
  std::error_code ec;
  const std::string dir = parent.empty() ? "." : parent;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir, ec)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());  // a directory before its sibling marker
  for (const std::string& name : names) {
    const auto temp = parse_marker_name(name);
    const auto parsed = parse_temp_name(temp ? *temp : name);
    if (!parsed || (!base.empty() && parsed->first != base)) continue;
    if (remove_abandoned_entry(dir, name)) removed.push_back(name);
  }
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
