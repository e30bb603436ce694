// Note [Checkpoint directory ownership] (run_dir.h).
#include "loom/ckpt/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
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

DirSurvey survey_dir(const std::string& dir) {
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
    const bool is_dir = fs::is_directory(p, ec);
    if (is_dir && is_step_name(n, 13) && fs::exists(p / "manifest.json", ec)) {
      s.steps.push_back(std::stoll(n.substr(5)));
    } else if (is_dir && is_step_name(n, 17) && ends_with(n, ".tmp")) {
      s.stale.push_back(n);
    } else if (is_dir && n.rfind("replaced-", 0) == 0) {
      s.replaced.push_back(n);
    } else if (!is_dir && n == "latest") {
      s.latest = true;
    } else if (!is_dir && n == kLockName) {
    } else if (!is_dir && (n == "latest.tmp" || (n.find(".tmp") != std::string::npos &&
                                                  std::any_of(std::begin(kWholeFiles), std::end(kWholeFiles),
                                                              [&](const char* w) { return n.rfind(w, 0) == 0; })))) {
      s.stale.push_back(n);
    } else {
      const auto* w = std::find(std::begin(kWholeFiles), std::end(kWholeFiles), n);
      if (!is_dir && w != std::end(kWholeFiles)) whole_files[w - std::begin(kWholeFiles)] = true;
      else s.foreign.push_back(n);
    }
  }
  // A whole-model checkpoint's files are loom's only when its model.safetensors says so.
  s.whole = whole_files[0] && whole_files[1] && is_loom_safetensors(fs::path(dir) / "model.safetensors");
  for (int i = 0; i < 4; ++i)
    if (whole_files[i] && !s.whole) s.foreign.push_back(kWholeFiles[i]);
  std::sort(s.foreign.begin(), s.foreign.end());
  return s;
}

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

void refuse_foreign(const DirSurvey& s, const std::string& what) {
  if (s.foreign.empty()) return;
  throw ConfigError(what + " '" + s.path + "' holds " + std::to_string(s.foreign.size()) +
                    " entr" + (s.foreign.size() == 1 ? "y" : "ies") + " loom did not write (" + list_names(s.foreign) +
                    "); loom only writes into a new or empty directory or one of its own, and never deletes what it "
                    "did not write: choose another directory (nothing there was touched)");
}

void check_new_target(const std::string& dir, const std::string& what, bool whole_ok) {
  const DirSurvey s = survey_dir(dir);
  refuse_foreign(s, what);
  if (!s.steps.empty() || s.latest || !s.replaced.empty() || (s.whole && !whole_ok))
    throw ConfigError(what + " '" + dir + "' holds checkpoints (newest " + describe_newest(s) +
                      "); write to a new directory (nothing there was touched)");
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

DirLock::DirLock(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw ConfigError("cannot create checkpoint directory '" + dir + "': " + ec.message() +
                      "; choose a writable checkpoint.dir");
  const std::string path = (fs::path(dir) / kLockName).string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw ConfigError("cannot write into checkpoint directory '" + dir + "' (creating " + kLockName +
                      "): " + std::strerror(errno) + "; choose a writable checkpoint.dir");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char holder[256] = {};
    const ssize_t n = ::pread(fd_, holder, sizeof holder - 1, 0);
    ::close(fd_);
    fd_ = -1;
    std::string who = n > 0 ? std::string(holder, size_t(n)) : std::string("unknown");
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    if (err == EWOULDBLOCK)
      throw ConfigError("checkpoint.dir '" + dir + "' is in use by another loom job (" + who +
                        "); wait for it to end, or choose another checkpoint.dir");
    throw Error("cannot lock '" + path + "': " + std::strerror(err));
  }
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string me = "pid " + std::to_string(::getpid()) + " on " + host + "\n";
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
  std::error_code ec;
  for (const std::string& n : s.stale) fs::remove_all(fs::path(s.path) / n, ec);
  return s.stale;
}

void check_output_file(const std::string& path, const std::string& what) {
  if (path.empty()) return;
  std::error_code ec;
  const fs::path p = fs::absolute(path, ec);
  if (p.string().size() + 8 >= PATH_MAX || p.filename().string().size() + 8 > NAME_MAX)
    throw ConfigError(what + " '" + path + "': the path is too long for this system; choose a shorter one");
  if (fs::is_directory(p, ec)) throw ConfigError(what + " '" + path + "' is a directory; give a file path");
  const fs::path parent = p.parent_path();
  if (!fs::is_directory(parent, ec))
    throw ConfigError(what + " '" + path + "': the directory '" + parent.string() +
                      "' does not exist; create it first or choose another path");
  // Probe by creating a sibling (never opening the target itself, which may be the user's).
  const std::string probe = p.string() + ".probe-" + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    throw ConfigError(what + " '" + path + "' cannot be written (" + std::strerror(errno) +
                      "); choose a writable directory");
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace loom
