#include "loom/modes/offload/offload.h"

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

namespace {

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

}  // namespace

StateFile::StateFile(const std::string& dir, int rank, int64_t state, int64_t group, int slots, bool direct,
                     int arrays, bool spill)
    : arrays_(arrays), spill_(spill), state_(state), group_(std::max<int64_t>(1, std::min(group, std::max<int64_t>(state, 1)))) {
  LOOM_CHECK(slots >= 2, "optimizer offload needs at least 2 sub-group buffers; got ", slots);
  LOOM_CHECK(arrays >= 1 && arrays <= 3, "an offload file holds p, m and v, or m, v and p; got ", arrays, " arrays");
  constexpr int64_t kPage = 4096;
  if (direct) align_ = kPage, group_ = round_up(group_, kPage / int64_t(sizeof(float)));
  stride_ = round_up(group_, kPage / int64_t(sizeof(float)));
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) refuse_dir(dir, "no such directory");
  path_ = (fs::path(dir) / ("loom-optimizer-rank" + std::to_string(rank) + "-" + std::to_string(::getpid()) + ".bin"))
              .string();
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | (direct ? O_DIRECT : 0), 0600);
  if (fd_ < 0 && direct && errno == EINVAL)
    refuse_dir(dir, "its file system does not support O_DIRECT (offload.direct = true); use a local disk file system "
                    "or offload.direct = false");
  if (fd_ < 0) refuse_dir(dir, std::string("cannot create a scratch file there: ") + std::strerror(errno));
  fd_cached_ = direct ? ::open(path_.c_str(), O_RDWR | O_CLOEXEC) : ::dup(fd_);
  ::unlink(path_.c_str());  // scratch: gone with the process, however it ends
  if (fd_cached_ < 0) {
    ::close(fd_);
    refuse_dir(dir, std::string("cannot open its scratch file twice: ") + std::strerror(errno));
  }
  array_bytes_ = round_up(state_ * int64_t(sizeof(float)), kPage);  // page-aligned: each array can be mapped
  // Each array padded (the last transfer may run to the page's end), the spill array after.
  const int64_t bytes = (arrays_ + (spill_ ? 1 : 0)) * array_bytes_;
  if (state_ > 0)
    if (const int rc = ::posix_fallocate(fd_, 0, off_t(bytes)); rc != 0) {
      ::close(fd_), ::close(fd_cached_);  // no destructor runs for a constructor that throws
      refuse_dir(dir, "cannot allocate " + std::to_string(bytes >> 20) + " MiB for this rank's offloaded " +
                          (arrays_ == 3   ? "parameters and AdamW moments ("
                           : arrays_ == 1 ? "parameters ("
                                          : "AdamW moments (") +
                          std::strerror(rc) + ")");
    }
  const size_t block_bytes = size_t(slots) * size_t(slot_bytes());
  block_.reset(static_cast<float*>(std::aligned_alloc(size_t(kPage), block_bytes)));
  LOOM_CHECK(block_, "optimizer offload: cannot allocate ", block_bytes, " bytes of sub-group buffers");
  std::memset(block_.get(), 0, block_bytes);  // resident from the start, as the tracker counts them
  slots_.resize(size_t(slots));
  for (int s = 0; s < slots; s++) slots_[size_t(s)].buf = block_.get() + int64_t(s) * arrays_ * stride_;
}

StateFile::~StateFile() {
  try {
    io_.wait_all(path_);
  } catch (const Error&) {  // a destructor reports nothing; the step that used it did
  }
  unmap();
  for (int fd : {fd_, fd_cached_})
    if (fd >= 0) ::close(fd);
}

void StateFile::unmap() {
  for (void*& m : map_)
    if (m) {  // a checkpoint mapped the file: its writes are in the page cache, which pread sees
      ::munmap(m, size_t(state_) * sizeof(float));
      m = nullptr;
    }
}

int64_t StateFile::count_of(int64_t g) const { return std::min(group_, state_ - g * group_); }

int64_t StateFile::transfer_bytes(int64_t g) const { return round_up(count_of(g) * int64_t(sizeof(float)), align_); }

StateFile::Slot* StateFile::slot_of(int64_t g) {
  for (Slot& s : slots_)
    if (s.group == g) return &s;
  return nullptr;
}

void StateFile::read_into(int s, int64_t g) {
  Slot& slot = slots_[size_t(s)];
  slot.group = g;
  const int64_t at = g * group_ * int64_t(sizeof(float)), bytes = transfer_bytes(g);
  for (int a = 0; a < arrays_; a++)
    slot.ticket = io_.submit(fd_, false, slot.buf + a * stride_, bytes, a * array_bytes_ + at);
  read_ += arrays_ * bytes;
}

void StateFile::write_from(int s) {
  Slot& slot = slots_[size_t(s)];
  const int64_t at = slot.group * group_ * int64_t(sizeof(float)), bytes = transfer_bytes(slot.group);
  for (int a = 0; a < arrays_; a++)
    slot.ticket = io_.submit(fd_, true, slot.buf + a * stride_, bytes, a * array_bytes_ + at);
  written_ += arrays_ * bytes;
}

void StateFile::for_each(const GroupFn& fn) {
  unmap();
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
    fn(g * group_, count_of(g), slot.buf, slot.buf + stride_, arrays_ == 3 ? slot.buf + 2 * stride_ : nullptr);
    write_from(s);
    if (g + k < n) read_into(s, g + k);
  }
  // The next step's first sub-groups, read while its forward and backward run.
  for (int64_t g = 0; g < std::min<int64_t>(n, k); g++)
    if (!slot_of(g)) read_into(int(g % k), g);
}

int64_t StateFile::fetch(int64_t at, int64_t count, float* dst) {
  LOOM_ASSERT(arrays_ != 2 && at >= 0 && at + count <= state_);
  read_ += count * int64_t(sizeof(float));
  return io_.submit(fd_cached_, false, dst, count * int64_t(sizeof(float)),
                    p_array() * array_bytes_ + at * int64_t(sizeof(float)));
}

int64_t StateFile::spill(bool write, int64_t at, int64_t count, float* buf) {
  LOOM_ASSERT(spill_ && at >= 0 && at + count <= state_);
  (write ? written_ : read_) += count * int64_t(sizeof(float));
  return io_.submit(fd_cached_, write, buf, count * int64_t(sizeof(float)),
                    arrays_ * array_bytes_ + at * int64_t(sizeof(float)));
}

void StateFile::flush(int which, int64_t at, int64_t count) {
  LOOM_ASSERT(map_[which] && at >= 0 && at + count <= state_);
  const int64_t page = 4096;
  char* const base = static_cast<char*>(map_[which]);
  const int64_t lo = at * int64_t(sizeof(float)) / page * page;
  const int64_t hi = std::min(round_up((at + count) * int64_t(sizeof(float)), page), array_bytes_);
  if (::msync(base + lo, size_t(hi - lo), MS_SYNC) != 0)
    throw Error("offload file " + path_ + ": cannot write back its mapping: " + std::strerror(errno));
  ::madvise(base + lo, size_t(hi - lo), MADV_DONTNEED);
}

void StateFile::wait(int64_t ticket) { io_.wait(ticket, "parameter offload file " + path_); }

void StateFile::quiesce() {
  io_.wait_all("optimizer offload file " + path_);
  for (Slot& s : slots_) s.group = -1;
}

std::span<float> StateFile::map(int which) {
  LOOM_CHECK(which >= 0 && which < arrays_, "offload array ", which, " of ", arrays_);
  quiesce();
  if (state_ == 0) return {};
  if (!map_[which]) {
    void* p = ::mmap(nullptr, size_t(state_) * sizeof(float), PROT_READ | PROT_WRITE, MAP_SHARED, fd_,
                     off_t(which * array_bytes_));
    if (p == MAP_FAILED) throw Error("optimizer offload file " + path_ + ": cannot map it: " + std::strerror(errno));
    map_[which] = p;
  }
  return {static_cast<float*>(map_[which]), size_t(state_)};
}

}  // namespace loom
