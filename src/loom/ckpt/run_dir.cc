// Note [Checkpoint directory ownership] (run_dir.h).
#include "loom/ckpt/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/core/owned.h"
#include "loom/ckpt/compressor_state.h"
#include "loom/ckpt/shard_ckpt.h"
#include "loom/ckpt/shard_format.h"

namespace loom {

namespace fs = std::filesystem;

namespace {

constexpr const char* kLockName = "loom.lock";
constexpr const char* kWholeFiles[] = {"config.toml", "model.safetensors", "optim.safetensors", "state.json"};
// The longest name loom creates under a checkpoint directory
// ("step-NNNNNNNN.tmp/rank-RRRRR.json.tmp" and slack for pids).
constexpr size_t kLongestChild = 64;

bool is_step_name(const std::string& n, size_t len) {
  return n.size() == len && n.rfind("step-", 0) == 0 &&
         std::all_of(n.begin() + 5, n.begin() + 13, [](char c) { return c >= '0' && c <= '9'; });
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// True when `path` is a safetensors file whose metadata carries loom's checkpoint format
// tag (only the header is read, bounded).
bool is_loom_safetensors(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  uint64_t n = 0;
  if (!f.read(reinterpret_cast<char*>(&n), 8) || n == 0 || n > (64u << 20)) return false;
  std::string header(size_t(n), '\0');
  if (!f.read(header.data(), std::streamsize(n))) return false;
  const nlohmann::json j = nlohmann::json::parse(header, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("__metadata__")) return false;
  const nlohmann::json& m = j["__metadata__"];
  return m.is_object() && m.contains("format") && m["format"] == "loom-checkpoint-1";
}

std::string utc_stamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

std::string list_names(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 5; ++i) out += (i ? ", " : "") + ("'" + names[i] + "'");
  if (names.size() > 5) out += " and " + std::to_string(names.size() - 5) + " more";
  return out;
}

std::string model_text(const Config& c) {
  const ModelConfig& m = c.model;
  return detail::cat("model ", m.arch == Arch::kGpt ? "gpt" : "llama", " (preset ", m.preset, ", ", m.layers,
                     " layers, d_model ", m.d_model, ", vocab ", m.vocab, ")");
}

}  // namespace

namespace {

// `latest` as loom writes it: one step name and a newline (shard::publish).
bool is_latest_text(const std::string& t) {
  std::string n = t;
  if (!n.empty() && n.back() == '\n') n.pop_back();
  return is_step_name(n, 13);
}

// loom.lock as loom writes it: empty (between create and write), "loom-lock-1 ..." or the
// earlier "pid N on HOST" line.
bool is_lock_text(const std::string& t) {
  if (t.empty() || t.rfind("loom-lock-1 pid ", 0) == 0) return t.find('\0') == std::string::npos;
  return t.rfind("pid ", 0) == 0 && t.find(" on ") != std::string::npos && t.find('\0') == std::string::npos &&
         std::count(t.begin(), t.end(), '\n') <= 1;
}

// Reads a small file only when it is a regular one (never a FIFO, device or symlink).
std::optional<std::string> small_regular(const fs::path& p, size_t max_bytes) {
  if (owned::kind_of(p.string()) != owned::Kind::kFile) return std::nullopt;
  try {
    return owned::read_regular(p.string(), max_bytes, false);
  } catch (const Error&) {
    return std::nullopt;
  }
}

bool small_matches(const fs::path& p, size_t max_bytes, bool (*pred)(const std::string&)) {
  const std::optional<std::string> text = small_regular(p, max_bytes);
  return text && pred(*text);
}

// A complete sharded step: a real directory whose manifest.json is loom's (format tag).
bool is_loom_step(const fs::path& p) {
  if (owned::kind_of(p.string()) != owned::Kind::kDir) return false;
  const std::optional<std::string> text = small_regular(p / "manifest.json", size_t(1) << 30);
  if (!text) return false;
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  return !j.is_discarded() && j.is_object() && j.contains("format") && j["format"] == shard::kFormat;
}

// replaced-<UTC time>[-N]/ as set_aside names it.
bool is_replaced_name(const std::string& n) {
  if (n.rfind("replaced-", 0) != 0 || n.size() < 25 || n[17] != 'T' || n[24] != 'Z') return false;
  for (size_t i = 9; i < 24; ++i)
    if (i != 17 && (n[i] < '0' || n[i] > '9')) return false;
  return n.size() == 25 || (n[25] == '-' && n.size() > 26 &&
                            std::all_of(n.begin() + 26, n.end(), [](char c) { return c >= '0' && c <= '9'; }));
}

}  // namespace

namespace {
DirSurvey survey(const std::string& dir, bool nested);

// replaced-<time>/ is loom's when what it holds is: what --overwrite moved there (steps,
// `latest`, whole-model files), nothing of the user's.
bool is_loom_replaced(const fs::path& p) {
  const DirSurvey inner = survey(p.string(), true);
  return inner.foreign.empty() && (inner.holds_checkpoints() || inner.latest);
}
}  // namespace

DirSurvey survey_dir(const std::string& dir) { return survey(dir, false); }

namespace {

DirSurvey survey(const std::string& dir, bool nested) {
  DirSurvey s;
  s.path = dir;
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (ec || !fs::exists(st)) return s;
  if (!fs::is_directory(st))
    throw ConfigError("'" + dir + "' is a file, not a directory; point it at a new or empty directory (nothing there "
                      "was touched)");
  s.exists = true;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir, ec)) names.push_back(e.path().filename().string());
  if (ec) throw Error("cannot list '" + dir + "': " + ec.message());
  std::sort(names.begin(), names.end());
  bool whole_files[4] = {};
  for (const std::string& n : names) {
    const fs::path p = fs::path(dir) / n;
    const owned::Kind kind = owned::kind_of(p.string());
    const auto* w = std::find(std::begin(kWholeFiles), std::end(kWholeFiles), n);
    bool live = false;
    if (is_step_name(n, 13) && is_loom_step(p)) {
      s.steps.push_back(std::stoll(n.substr(5)));
    } else if (owned::is_abandoned_temp(dir, n, &live)) {
      s.stale.push_back(n);
    } else if (live) {
      s.busy.push_back(n);
    } else if (!nested && kind == owned::Kind::kDir && is_replaced_name(n) && is_loom_replaced(p)) {
      s.replaced.push_back(n);
    } else if (n == "latest" && small_matches(p, 64, is_latest_text)) {
      s.latest = true;
    } else if (n == kLockName && small_matches(p, 4096, is_lock_text)) {
    } else if (const auto temp = owned::parse_temp_name(n);
               temp && temp->first == "latest" && small_matches(p, 64, is_latest_text)) {
      s.stale.push_back(n);  // `latest` written in full, not yet renamed (Note [Ownership by content])
    } else if (kind == owned::Kind::kFile && w != std::end(kWholeFiles)) {
      whole_files[w - std::begin(kWholeFiles)] = true;
    } else {
      s.foreign.push_back(n);
    }
  }
  // A whole-model checkpoint's files are loom's only when its model.safetensors says so.
  s.whole = whole_files[0] && whole_files[1] && is_loom_safetensors(fs::path(dir) / "model.safetensors");
  for (int i = 0; i < 4; ++i)
    if (whole_files[i] && !s.whole) s.foreign.push_back(kWholeFiles[i]);
  std::sort(s.foreign.begin(), s.foreign.end());
  return s;
}

}  // namespace

namespace {

std::string read_text(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

// The manifest of the survey's newest complete step (there must be one); throws on damage.
shard::Manifest newest_manifest(const DirSurvey& s) {
  const fs::path step = fs::path(s.path) / shard::step_name(s.steps.back());
  return shard::parse_manifest(read_text(step / "manifest.json"), (step / "manifest.json").string());
}

}  // namespace

std::string describe_newest(const DirSurvey& s) {
  try {
    if (!s.steps.empty()) {
      const shard::Manifest m = newest_manifest(s);
      return detail::cat("step ", m.step, " (", model_text(m.config), "; layout ", layout_text(m.config.parallel), ")");
    }
    if (s.whole) {
      const Config c = config_from_toml_string(read_text(fs::path(s.path) / "config.toml"));
      int64_t step = 0;
      const nlohmann::json j = nlohmann::json::parse(read_text(fs::path(s.path) / "state.json"), nullptr, false);
      if (!j.is_discarded() && j.is_object() && j.contains("step") && j["step"].is_number_integer()) step = j["step"];
      return detail::cat("a whole-model checkpoint at step ", step, " (", model_text(c), ")");
    }
  } catch (const Error& e) {
    return detail::cat(s.steps.empty() ? "a whole-model checkpoint" : "step " + std::to_string(s.steps.back()),
                       " (unreadable: ", e.what(), ")");
  }
  return "nothing";
}

std::optional<Config> newest_config(const DirSurvey& s) {
  if (s.steps.empty()) return std::nullopt;
  try {
    return newest_manifest(s).config;
  } catch (const Error&) {
    return std::nullopt;
  }
}

namespace {

// Earlier versions of loom named their unfinished saves `*.tmp`; loom no longer removes a
// name it cannot prove is its own (Note [Ownership by content]), so it says what to do.
std::string old_temp_hint(const std::vector<std::string>& foreign) {
  for (const std::string& n : foreign)
    if (ends_with(n, ".tmp") || n.find(".tmp-") != std::string::npos)
      return ". If '" + n + "' is an unfinished save of an earlier loom version, remove it yourself";
  return "";
}

}  // namespace

void refuse_foreign(const DirSurvey& s, const std::string& what) {
  if (s.foreign.empty()) return;
  throw ConfigError(what + " '" + s.path + "' holds " + std::to_string(s.foreign.size()) +
                    " entr" + (s.foreign.size() == 1 ? "y" : "ies") + " loom did not write (" + list_names(s.foreign) +
                    "); loom only writes into a new or empty directory or one of its own, and never deletes what it "
                    "did not write: choose another directory (nothing there was touched)" + old_temp_hint(s.foreign));
}

DirSurvey check_new_target(const std::string& dir, const std::string& what, bool whole_ok) {
  DirSurvey s = survey_dir(dir);
  refuse_foreign(s, what);
  if (!s.steps.empty() || s.latest || !s.replaced.empty() || (s.whole && !whole_ok))
    throw ConfigError(what + " '" + dir + "' holds checkpoints (newest " + describe_newest(s) +
                      "); write to a new directory (nothing there was touched)");
  return s;
}

void check_run_dir(const std::string& dir, bool resuming, bool overwrite) {
  if (dir.empty()) return;
  std::error_code ec;
  const std::string abs = fs::absolute(dir, ec).lexically_normal().string();
  if (abs.size() + kLongestChild >= PATH_MAX)
    throw ConfigError(detail::cat("checkpoint.dir is ", abs.size(), " characters long; the files loom writes under it "
                                  "would pass the system's path limit (", PATH_MAX, "): choose a shorter path"));
  for (const fs::path& part : fs::path(abs))
    if (part.string().size() > NAME_MAX)
      throw ConfigError(detail::cat("checkpoint.dir has a component of ", part.string().size(),
                                    " characters (the limit is ", NAME_MAX, "): choose a shorter name"));
  const DirSurvey s = survey_dir(dir);
  refuse_foreign(s, "checkpoint.dir");
  if (resuming || overwrite || !s.holds_checkpoints()) return;
  throw ConfigError("checkpoint.dir '" + dir + "' holds checkpoints of an earlier run, newest " + describe_newest(s) +
                    ". Pass --resume auto to continue it, set checkpoint.dir to a new directory, or pass --overwrite "
                    "to move them into '" + dir + "/replaced-<time>/' and start over");
}

namespace {

// Opens dir/loom.lock for writing without following a symlink or blocking on a FIFO,
// creating it exclusively when absent; refuses anything but a regular file.
int open_lock_file(const std::string& dir, const std::string& path) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    int fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {
      fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
      if (fd < 0 && errno == EEXIST) continue;  // another job created it first: open theirs
    }
    if (fd < 0) {
      const int err = errno;
      if (err == ELOOP || err == ENXIO || err == EISDIR)
        throw ConfigError("'" + path + "' is " + owned::kind_text(owned::kind_of(path)) +
                          ", not a lock loom wrote; loom never follows or opens it: remove it or choose another "
                          "directory (nothing there was touched)");
      throw ConfigError("cannot write into checkpoint directory '" + dir + "' (creating " + kLockName +
                        "): " + std::strerror(err) + "; choose a writable checkpoint.dir");
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      throw ConfigError("'" + path + "' is " + owned::kind_text(owned::Kind::kOther) +
                        ", not a lock loom wrote: remove it or choose another directory (nothing there was touched)");
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
  }
  throw Error("cannot open '" + path + "': it keeps appearing and vanishing");
}

std::string pread_text(int fd, size_t max_bytes) {
  std::string buf(max_bytes, '\0');
  const ssize_t n = ::pread(fd, buf.data(), buf.size(), 0);
  buf.resize(n > 0 ? size_t(n) : 0);
  return buf;
}

}  // namespace

std::string lock_path(const std::string& dir) { return (fs::path(dir) / kLockName).string(); }

DirLock::DirLock(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw ConfigError("cannot create checkpoint directory '" + dir + "': " + ec.message() +
                      "; choose a writable checkpoint.dir");
  const std::string path = (fs::path(dir) / kLockName).string();
  fd_ = open_lock_file(dir, path);
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string who = pread_text(fd_, 255);
    ::close(fd_);
    fd_ = -1;
    if (who.empty()) who = "unknown";
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    if (who.rfind("loom-lock-1 ", 0) == 0) who = who.substr(12);
    if (err == EWOULDBLOCK)
      throw ConfigError("checkpoint.dir '" + dir + "' is in use by another loom job (" + who +
                        "); wait for it to end, or choose another checkpoint.dir");
    throw Error("cannot lock '" + path + "': " + std::strerror(err));
  }
  // Only a lock loom wrote is rewritten (Note [Ownership by content]).
  if (const std::string was = pread_text(fd_, 4096); !is_lock_text(was)) {
    ::close(fd_);
    fd_ = -1;
    throw ConfigError("'" + path + "' holds " + std::to_string(was.size()) + (was.size() == 4096 ? "+" : "") +
                      " bytes that are not a lock loom wrote; loom never rewrites a file it did not write: rename "
                      "it or choose another directory (nothing there was touched)");
  }
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string me = "loom-lock-1 pid " + std::to_string(::getpid()) + " on " + host + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != ssize_t(me.size())) {
    const std::string why = std::strerror(errno);
    ::close(fd_);
    fd_ = -1;
    throw Error("cannot write into '" + dir + "' (" + kLockName + "): " + why);
  }
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor drops the flock
}

std::string set_aside(const std::string& root, const std::vector<std::string>& names) {
  if (names.empty()) return "";
  const fs::path dest = fs::path(root) / ("replaced-" + utc_stamp());
  std::error_code ec;
  fs::path target = dest;
  for (int i = 1; fs::exists(target, ec); ++i) target = dest.string() + "-" + std::to_string(i);
  fs::create_directory(target, ec);
  if (ec) throw Error("cannot create '" + target.string() + "' to move earlier checkpoints into: " + ec.message());
  for (const std::string& name : names) {
    fs::rename(fs::path(root) / name, target / name, ec);
    if (ec) throw Error("cannot move '" + name + "' into '" + target.string() + "': " + ec.message());
  }
  return target.string();
}

std::string move_aside(const DirSurvey& s) {
  std::vector<std::string> names;
  for (int64_t step : s.steps) names.push_back(shard::step_name(step));
  if (s.latest) names.push_back("latest");
  std::error_code ec;
  if (s.whole)
    for (const char* f : kWholeFiles)
      if (fs::exists(fs::path(s.path) / f, ec)) names.push_back(f);
  return set_aside(s.path, names);
}

std::vector<std::string> remove_stale(const DirSurvey& s) {
  std::vector<std::string> removed;
  for (const std::string& n : s.stale) {
    const std::string p = (fs::path(s.path) / n).string();
    std::error_code ec;
    // Checked again here: the survey may be old, and only proven entries go.
    if (owned::remove_abandoned_entry(s.path, n))
      removed.push_back(n);
    else if (owned::kind_of(p) == owned::Kind::kFile && small_matches(p, 64, is_latest_text))
      if (fs::remove_all(p, ec); !ec) removed.push_back(n);
  }
  return removed;
}

bool remove_step(const std::string& root, int64_t step) {
  const fs::path dir = fs::path(root) / shard::step_name(step);
  if (!is_loom_step(dir)) return false;
  shard::Manifest m;
  try {
    m = shard::parse_manifest(read_text(dir / "manifest.json"), (dir / "manifest.json").string());
  } catch (const Error&) {
    return false;
  }
  // Only the files the manifest names, then the manifest, then the directory if empty.
  for (size_t r = 0; r < m.ranks.size(); ++r) {
    for (const std::string& f : {m.ranks[r].file, compressor_file_name(int(r))})
      if (owned::kind_of((dir / f).string()) == owned::Kind::kFile) ::unlink((dir / f).c_str());
  }
  ::unlink((dir / "manifest.json").c_str());
  return ::rmdir(dir.c_str()) == 0;
}

void check_output_file(const std::string& path, const std::string& what, bool overwrite,
                       const std::vector<std::string>& marks) {
  if (path.empty()) return;
  std::error_code ec;
  const fs::path p = fs::absolute(path, ec);
  if (p.string().size() + 32 >= PATH_MAX || p.filename().string().size() + 32 > NAME_MAX)
    throw ConfigError(what + " '" + path + "': the path is too long for this system; choose a shorter one");
  const owned::Kind kind = owned::kind_of(p.string());
  if (kind == owned::Kind::kDir) throw ConfigError(what + " '" + path + "' is a directory; give a file path");
  if (kind == owned::Kind::kSymlink || kind == owned::Kind::kOther)
    throw ConfigError(what + " '" + path + "' is " + owned::kind_text(kind) +
                      "; loom never writes through one: remove it or choose another path (nothing was touched)");
  if (kind == owned::Kind::kFile && !overwrite && !owned::carries_mark(p.string(), marks))
    throw ConfigError(what + " '" + path + "' exists and is not an earlier output of loom's of this kind: pass "
                      "--overwrite to replace it, or choose another path (nothing was touched)");
  const fs::path parent = p.parent_path();
  if (!fs::is_directory(parent, ec))
    throw ConfigError(what + " '" + path + "': the directory '" + parent.string() +
                      "' does not exist; create it first or choose another path");
  // Probe by creating a sibling (never opening the target itself, which may be the user's).
  const std::string probe = (parent / owned::temp_name(p.filename().string() + ".probe", owned::new_token())).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0)
    throw ConfigError(what + " '" + path + "' cannot be written (" + std::strerror(errno) +
                      "); choose a writable directory");
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace loom
