// Optimizer offload: AdamW's moments in a scratch file, streamed through a few sub-group
// buffers (ZeRO-Offload / ZeRO-Infinity's optimizer tier on a CPU engine).
//
// Note [Optimizer offload]
// With offload.optimizer = disk, m and v (S floats each, packed in AdamW::owned() order)
// live in one scratch file under offload.dir: m from byte 0, v from the next page boundary. The file is
// opened and unlinked at once, so it is never the checkpoint and vanishes with the
// process, however it ends; it is fully allocated before the first step, so a full disk is
// refused up front. The state is cut into sub-groups of G floats (offload.sub_group_mb);
// sub-group g holds state [gG, min(S, (g+1)G)). The update streams them:
//
//   read(0) read(1) ... | wait read(g), issue read(g+k) | update g | issue write(g) | ...
//
// through `slots` buffers of 2G floats (m then v): while sub-group g is updated, the reads
// of the next ones and the write of the previous ones run on an I/O thread. One thread
// serves the requests first in, first out, so a read of g always sees the last write of g.
// After the last sub-group, the first sub-groups' reads are issued for the next step, so
// they overlap its forward and backward. The update runs the same kernel on the same
// elements in the same order as the in-memory AdamW (each element's update reads only that
// element), so offloaded training equals in-memory training bit for bit.
//
// Why a thread and pread/pwrite, not io_uring: each sub-group is one large sequential
// request per moment, so there is nothing for io_uring's batching to save; the FIFO thread
// gives the read-after-write order for free, and it works where io_uring is disabled
// (containers often forbid io_uring_setup).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace loom {

// One background thread doing pread / pwrite requests in submission order.
class IoQueue {
 public:
  IoQueue();
  ~IoQueue();
  IoQueue(const IoQueue&) = delete;
  IoQueue& operator=(const IoQueue&) = delete;
  // Queues a transfer of `bytes` between `buf` and file offset `at`; returns its ticket.
  int64_t submit(int fd, bool write, void* buf, int64_t bytes, int64_t at);
  // Blocks until every request up to `ticket` is done; throws loom::Error (naming `what`)
  // when one of them failed.
  void wait(int64_t ticket, const std::string& what);
  void wait_all(const std::string& what) { wait(submitted_, what); }

 private:
  struct Request {
    int fd;
    bool write;
    void* buf;
    int64_t bytes, at, ticket;
  };
  void run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Request> queue_;
  int64_t submitted_ = 0, done_ = 0;
  std::string error_;  // the first failure, kept
  bool stop_ = false;
  std::thread thread_;
};

class MomentFile {
 public:
  // `state` floats of m and of v; sub-groups of `group` floats; `slots` buffers (>= 2).
  // Creates the scratch file under `dir` and allocates it; throws loom::Error when the
  // directory is missing, not writable or too small, naming it and the bytes needed.
  MomentFile(const std::string& dir, int rank, int64_t state, int64_t group, int slots);
  ~MomentFile();
  MomentFile(const MomentFile&) = delete;
  MomentFile& operator=(const MomentFile&) = delete;

  int64_t state() const { return state_; }
  int64_t groups() const { return (state_ + group_ - 1) / group_; }
  // Streams every sub-group in order through fn(begin, count, m, v): m and v hold state
  // [begin, begin + count); what fn leaves there is written back.
  void for_each(const std::function<void(int64_t begin, int64_t count, float* m, float* v)>& fn);
  // Waits for every transfer and forgets prefetched sub-groups (before the file is read or
  // written another way).
  void quiesce();
  // The whole m or v as a shared mapping of the file (checkpoint save and load); valid
  // until the next for_each. Its pages are page cache, not the process's own memory.
  std::span<float> map(int which);
  // The slot buffers (the resident part of the optimizer state).
  const float* slot_data(int s) const { return slots_[size_t(s)].buf.data(); }
  int64_t slot_bytes() const { return 2 * group_ * int64_t(sizeof(float)); }
  int slot_count() const { return int(slots_.size()); }
  int64_t bytes_read() const { return read_; }
  int64_t bytes_written() const { return written_; }
  const std::string& path() const { return path_; }

 private:
  struct Slot {
    std::vector<float> buf;  // m (group floats) then v
    int64_t group = -1;      // the sub-group it holds or is being read into; -1 none
    int64_t ticket = 0;      // the last transfer touching it
  };
  // Issues the read of sub-group g into slot s.
  void read_into(int s, int64_t g);
  void write_from(int s);
  Slot* slot_of(int64_t g);
  int64_t count_of(int64_t g) const;

  std::string path_;
  int fd_ = -1;
  int64_t state_, group_;
  int64_t v_at_ = 0;  // v's byte offset in the file (m's is 0)
  std::vector<Slot> slots_;
  IoQueue io_;
  int64_t read_ = 0, written_ = 0;
  void* map_[2] = {nullptr, nullptr};
};

}  // namespace loom
