// What loom may touch in a place it did not create.
//
// Note [Ownership by content]
// loom removes, replaces, prunes or follows an entry only when the entry's content proves
// that loom wrote it; a name alone never decides (issue 59: a user's `config.toml.tmpl`,
// `step-00000010.tmp/` or `latest` were deleted or overwritten because their names looked
// like loom's).
//  - Temporary directories are `<base>.loom-tmp-<token>/`, made exclusively (mkdir fails on
//    an existing name), with a marker file `.loom-owner` inside whose first line is
//    `loom-owned-1 <token> pid <pid> host <host>`. The maker holds an flock on the marker
//    for the directory's whole life; the kernel drops it when the maker dies, however it
//    dies. So a later command proves a temporary directory is an abandoned one of loom's
//    by three facts: a real directory (not a symlink) whose marker is a regular file
//    naming the same token, and whose flock it can take. Only those are removed.
//  - No instant leaves the directory unproved, so a kill anywhere (the supervisor's, a
//    lost host's) leaves what the next run can clear (issue 54; a restart refused a save's
//    directory killed between its mkdir and its marker). While the directory is made,
//    published or removed the marker lies beside it, as `<base>.loom-tmp-<token>.loom-owner`,
//    and moves by rename (the same file, so the same flock): the marker is made first,
//    whole, beside the name (written unnamed, then linked), then the directory, then the
//    marker moved in; publishing moves it out, renames the directory, then removes it;
//    removing moves it out, removes the directory, then it. A directory is proved by the
//    marker inside it or beside it; a marker beside no directory is removed alone.
//  - Temporary files are `<path>.loom-tmp-<token>`, created with O_CREAT|O_EXCL|O_NOFOLLOW
//    (never through a symlink, never over an existing file) and renamed over their target.
//  - Everything loom reads at a path a user can name is opened without blocking (a FIFO
//    or a device is refused, not read) and checked to be a regular file (`read_regular`).
// The token is 64 random bits, so a user's name collides with one only by design.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom::owned {

// 16 lower-case hex digits from the system's random source.
std::string new_token();

// "<base>.loom-tmp-<token>"; parse_temp_name inverts it (nullopt unless the name has that
// exact form with a 16-hex-digit token).
std::string temp_name(const std::string& base, const std::string& token);
std::optional<std::pair<std::string, std::string>> parse_temp_name(const std::string& name);

// What is at `path`, without following a final symlink.
enum class Kind { kNone, kFile, kDir, kSymlink, kOther };
Kind kind_of(const std::string& path);
const char* kind_text(Kind k);  // "a symlink", "a FIFO or device", ...

// The bytes of the regular file at `path` (a final symlink is followed only when
// `follow`), read without blocking on a FIFO or device: throws Error naming the path when
// it is missing, not a regular file, or longer than `max_bytes`.
std::string read_regular(const std::string& path, size_t max_bytes, bool follow = true);

// Throws Error unless `path` is a regular file itself (not a symlink, FIFO, socket, device
// or directory): for files loom wrote and reads back (checkpoint pieces), so that a FIFO
// put in their place is refused at once instead of blocking the reader.
void require_regular(const std::string& path);

// A temporary directory `<parent>/<base>.loom-tmp-<token>/` marked as loom's (above). The
// destructor removes it unless it was published.
class TempDir {
 public:
  TempDir(const std::string& parent, const std::string& base);
  // Adopts no directory: for ranks that write into one another rank made.
  TempDir() = default;
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  const std::string& token() const { return token_; }
  // Renames the directory to `dest` (which must not exist), leaving no marker in it.
  void publish(const std::string& dest);
  // Removes the marker and the directory, which must then be empty (its files were moved
  // out); throws Error when something is left.
  void finish_empty();

 private:
  void marker_out();                               // into the sibling name
  [[noreturn]] void marker_back(const std::string& what);  // after a failed step; throws
  void release();                                  // the sibling and the flock; done

  std::string path_, token_;
  int marker_fd_ = -1;
};

// "<temp dir name>" of a marker lying beside its directory ("<temp dir name>.loom-owner").
std::optional<std::string> parse_marker_name(const std::string& name);

// Is `<dir>/<name>` an abandoned temporary directory of loom's, or the marker beside one
// (marker verified, its maker gone)? `live` is set when it is loom's but its maker still
// holds it.
bool is_abandoned_temp(const std::string& dir, const std::string& name, bool* live = nullptr);

// Removes `<dir>/<name>` (and the marker beside it) when is_abandoned_temp proves it; true
// when it did.
bool remove_abandoned_entry(const std::string& dir, const std::string& name);

// Removes the abandoned temporary directories `<parent>/<base>.loom-tmp-*` (every base
// when `base` is empty); returns their names. Entries it cannot prove are left alone.
std::vector<std::string> remove_abandoned(const std::string& parent, const std::string& base);

// Writes the file `path` through `write(tmp_file)` into a marked temporary directory beside
// it (TempDir) and renames it into place, so a killed command leaves no partial file and
// the next one on `path` removes what it left (returned: their names). `write` may throw;
// then nothing is left.
std::vector<std::string> write_through_temp(const std::string& path,
                                            const std::function<void(const std::string&)>& write);

// Note [User-named outputs]
// A file loom writes at a path the user names (--out, --trace, --svg) replaces what is
// there only when that is a regular file and either --overwrite was given or its first
// 4 KiB hold the mark of loom's own output of that kind (below); a symlink, FIFO, device
// or directory is refused always (ckpt/run_dir.h: check_output_file, before any work).
// The file is written through a marked temporary name and renamed (write_file_atomic), so
// a symlink put there meanwhile is replaced, never followed.
namespace marks {
// Chrome traces (train --trace, simulate --trace): "otherData": {"generator": "loom"}, and
// the opening loom wrote before the mark existed.
inline const std::vector<std::string> kTrace = {"\"generator\": \"loom\"", "\"generator\":\"loom\"",
                                                "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [",
                                                "{\"displayTimeUnit\":\"ms\",\"traceEvents\":["};
inline const std::vector<std::string> kSvg = {"<!-- generated by loom -->"};
// A PNG's tEXt chunk "Software" (train/plot.h), within its first 4 KiB.
inline const std::vector<std::string> kPng = {std::string("Software\0generated by loom plot", 31)};
inline const std::vector<std::string> kPlanToml = {"# Written by loom plan ("};
inline const std::vector<std::string> kSafetensors = {"\"loom_config\":"};  // an export's metadata
inline const std::vector<std::string> kCalibration = {"# Measured by `loom calibrate`"};
}  // namespace marks

// True when `path` is a regular file whose first 4 KiB hold one of `marks`.
bool carries_mark(const std::string& path, const std::vector<std::string>& marks);

}  // namespace loom::owned
