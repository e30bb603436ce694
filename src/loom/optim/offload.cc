#include "loom/optim/offload.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "loom/core/error.h"

namespace loom {

IoQueue::IoQueue() : thread_([this] { run(); }) {}

IoQueue::~IoQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

int64_t IoQueue::submit(int fd, bool write, void* buf, int64_t bytes, int64_t at) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push_back({fd, write, buf, bytes, at, ++submitted_});
  cv_.notify_all();
  return submitted_;
}

void IoQueue::wait(int64_t ticket, const std::string& what) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_ >= ticket; });
  if (!error_.empty()) throw Error(what + ": " + error_);
}

void IoQueue::run() {
  for (;;) {
    Request r;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping with nothing left
      r = queue_.front();
    }
    std::string failed;
    char* p = static_cast<char*>(r.buf);
    for (int64_t done = 0; done < r.bytes && failed.empty();) {
      const ssize_t n = r.write ? ::pwrite(r.fd, p + done, size_t(r.bytes - done), off_t(r.at + done))
                                : ::pread(r.fd, p + done, size_t(r.bytes - done), off_t(r.at + done));
      if (n > 0) done += n;
      else if (n < 0 && errno == EINTR) continue;
      else
        failed = std::string(r.write ? "write" : "read") + " of " + std::to_string(r.bytes) + " bytes at offset " +
                 std::to_string(r.at) + " failed: " + (n == 0 ? "end of file" : std::strerror(errno));
    }
    std::lock_guard<std::mutex> lock(mu_);
    queue_.pop_front();
    if (!failed.empty() && error_.empty()) error_ = failed;
    done_ = r.ticket;
    cv_.notify_all();
  }
}

namespace {

[[noreturn]] void refuse_dir(const std::string& dir, const std::string& why) {
  throw Error("offload.dir '" + dir + "': " + why +
              "; set offload.dir to a writable directory on a local disk with room for the optimizer state");
}

}  // namespace

MomentFile::MomentFile(const std::string& dir, int rank, int64_t state, int64_t group, int slots)
    : state_(state), group_(std::max<int64_t>(1, std::min(group, std::max<int64_t>(state, 1)))) {
  LOOM_CHECK(slots >= 2, "optimizer offload needs at least 2 sub-group buffers; got ", slots);
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) refuse_dir(dir, "no such directory");
  path_ = (fs::path(dir) / ("loom-optimizer-rank" + std::to_string(rank) + "-" + std::to_string(::getpid()) + ".bin"))
              .string();
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd_ < 0) refuse_dir(dir, std::string("cannot create a scratch file there: ") + std::strerror(errno));
  ::unlink(path_.c_str());  // scratch: gone with the process, however it ends
  v_at_ = (state_ * int64_t(sizeof(float)) + 4095) / 4096 * 4096;  // page-aligned, so v can be mapped
  const int64_t bytes = v_at_ + state_ * int64_t(sizeof(float));
  if (state_ > 0)
    if (const int rc = ::posix_fallocate(fd_, 0, off_t(bytes)); rc != 0) {
      ::close(fd_);
      fd_ = -1;
      refuse_dir(dir, "cannot allocate " + std::to_string(bytes >> 20) + " MiB for this rank's AdamW moments (" +
                          std::strerror(rc) + ")");
    }
  slots_.resize(size_t(slots));
  for (Slot& s : slots_) s.buf.assign(size_t(2 * group_), 0.0f);
}

MomentFile::~MomentFile() {
  try {
    io_.wait_all(path_);
  } catch (const Error&) {  // a destructor reports nothing; the step that used it did
  }
  for (int i = 0; i < 2; i++)
    if (map_[i]) ::munmap(map_[i], size_t(state_) * sizeof(float));
  if (fd_ >= 0) ::close(fd_);
}

int64_t MomentFile::count_of(int64_t g) const { return std::min(group_, state_ - g * group_); }

MomentFile::Slot* MomentFile::slot_of(int64_t g) {
  for (Slot& s : slots_)
    if (s.group == g) return &s;
  return nullptr;
}

void MomentFile::read_into(int s, int64_t g) {
  Slot& slot = slots_[size_t(s)];
  slot.group = g;
  const int64_t n = count_of(g), at = g * group_ * int64_t(sizeof(float)), bytes = n * int64_t(sizeof(float));
  io_.submit(fd_, false, slot.buf.data(), bytes, at);
  slot.ticket = io_.submit(fd_, false, slot.buf.data() + group_, bytes, v_at_ + at);
  read_ += 2 * bytes;
}

void MomentFile::write_from(int s) {
  Slot& slot = slots_[size_t(s)];
  const int64_t n = count_of(slot.group), at = slot.group * group_ * int64_t(sizeof(float));
  const int64_t bytes = n * int64_t(sizeof(float));
  io_.submit(fd_, true, slot.buf.data(), bytes, at);
  slot.ticket = io_.submit(fd_, true, slot.buf.data() + group_, bytes, v_at_ + at);
  written_ += 2 * bytes;
}

void MomentFile::for_each(const std::function<void(int64_t, int64_t, float*, float*)>& fn) {
  for (int i = 0; i < 2; i++)
    if (map_[i]) {  // a checkpoint mapped the file: its writes are in the page cache, which pread sees
      ::munmap(map_[i], size_t(state_) * sizeof(float));
      map_[i] = nullptr;
    }
  const int64_t n = groups();
  const int k = int(slots_.size());
  // Sub-group g always lives in slot g % k, so a slot's read of g + k queues behind its
  // write of g (the FIFO keeps the buffer until the write has taken it).
  for (int64_t g = 0; g < std::min<int64_t>(n, k); g++)
    if (!slot_of(g)) read_into(int(g % k), g);
  for (int64_t g = 0; g < n; g++) {
    const int s = int(g % k);
    Slot& slot = slots_[size_t(s)];
    LOOM_ASSERT(slot.group == g);
    io_.wait(slot.ticket, "optimizer offload file " + path_);
    fn(g * group_, count_of(g), slot.buf.data(), slot.buf.data() + group_);
    write_from(s);
    if (g + k < n) read_into(s, g + k);
  }
  // The next step's first sub-groups, read while its forward and backward run.
  for (int64_t g = 0; g < std::min<int64_t>(n, k); g++)
    if (!slot_of(g)) read_into(int(g % k), g);
}

void MomentFile::quiesce() {
  io_.wait_all("optimizer offload file " + path_);
  for (Slot& s : slots_) s.group = -1;
}

std::span<float> MomentFile::map(int which) {
  LOOM_CHECK(which == 0 || which == 1, "moment index ", which);
  quiesce();
  if (state_ == 0) return {};
  if (!map_[which]) {
    void* p = ::mmap(nullptr, size_t(state_) * sizeof(float), PROT_READ | PROT_WRITE, MAP_SHARED, fd_,
                     off_t(which == 0 ? 0 : v_at_));
    if (p == MAP_FAILED) throw Error("optimizer offload file " + path_ + ": cannot map it: " + std::strerror(errno));
    map_[which] = p;
  }
  return {static_cast<float*>(map_[which]), size_t(state_)};
}

}  // namespace loom
