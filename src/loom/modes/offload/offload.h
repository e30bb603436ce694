// Optimizer and parameter offload: AdamW's moments (and with parameter offload the fp32
// parameters) in a scratch file, streamed through a few sub-group buffers (ZeRO-Offload /
// ZeRO-Infinity's slow tier on a CPU engine).
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
// With parameter offload (Note [Parameter offload] in modes/offload/chunk_manager.h) the file holds a
// third array, the parameters, from the page boundary after v; the update streams p with m
// and v, and the model's units are read from it with fetch().
//
// With `direct` (offload.direct) the file is opened O_DIRECT: transfers bypass the page
// cache, so the moments take no memory beyond the slots even where the kernel would cache
// them, and the disk's own speed is what the step sees. Buffers, offsets and lengths are
// then multiples of 4 KiB: sub-groups are rounded up to 1,024 floats and the last one's
// transfer to the next 4 KiB (the file is allocated with that padding).
//
// Why a thread and pread/pwrite, not io_uring: each sub-group is one large sequential
// request per moment, so there is nothing for io_uring's batching to save; the FIFO thread
// gives the read-after-write order for free, and it works where io_uring is disabled
// (containers often forbid io_uring_setup).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <cstdlib>
#include <functional>
#include <memory>
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

class StateFile {
 public:
  // `state` floats of m and of v (and of p when `arrays` is 3; of p alone when it is 1: the
  // whole parameters of a ZeRO-1/2 rank, Note [Replicated-parameter offload]); sub-groups of `group`
  // floats; `slots` buffers (>= 2); `direct`: O_DIRECT (fetch() reads through the page cache
  // still: it fills arbitrary addresses). Creates the scratch file under `dir` and allocates it; throws
  // loom::Error when the directory is missing, not writable, too small or (direct) on a file
  // system without O_DIRECT, naming it and the bytes needed. `spill`: one more array of
  // `state` floats, not streamed, for gradient chunks (Note [Gradient chunks]).
  StateFile(const std::string& dir, int rank, int64_t state, int64_t group, int slots, bool direct = false,
            int arrays = 2, bool spill = false);
  ~StateFile();
  StateFile(const StateFile&) = delete;
  StateFile& operator=(const StateFile&) = delete;

  int64_t state() const { return state_; }
  int64_t groups() const { return (state_ + group_ - 1) / group_; }
  int arrays() const { return arrays_; }
  int p_array() const { return arrays_ == 1 ? 0 : 2; }  // the parameters' array (arrays 1 or 3)
  // Streams every sub-group in order through fn(begin, count, m, v, p): m, v (and p, else
  // nullptr) hold state [begin, begin + count); what fn leaves there is written back.
  using GroupFn = std::function<void(int64_t begin, int64_t count, float* m, float* v, float* p)>;
  void for_each(const GroupFn& fn);
  // Queues a read of p[at, at + count) into dst (behind every write queued so far); wait()
  // for its ticket before using dst.
  int64_t fetch(int64_t at, int64_t count, float* dst);
  void wait(int64_t ticket);
  // Queues a write (or read) of the spill array's [at, at + count) from (into) buf; wait()
  // for its ticket before reusing buf.
  int64_t spill(bool write, int64_t at, int64_t count, float* buf);
  // Waits for every transfer and forgets prefetched sub-groups (before the file is read or
  // written another way).
  void quiesce();
  // The whole m (0), v (1) or p (2) as a shared mapping of the file (initial values,
  // checkpoint save and load); valid until the next for_each. Its pages are page cache, not
  // the process's own memory.
  std::span<float> map(int which);
  // Writes [at, at + count) of mapped array `which` to the file and drops those pages from
  // the process (they stay in the page cache, clean and reclaimable): a mapping written
  // whole (the initial parameters of a model larger than memory) never holds it all.
  void flush(int which, int64_t at, int64_t count);
  // The slot buffers (the resident part of the optimizer state).
  const float* slot_data(int s) const { return slots_[size_t(s)].buf; }
  int64_t slot_bytes() const { return arrays_ * stride_ * int64_t(sizeof(float)); }
  int slot_count() const { return int(slots_.size()); }
  int64_t bytes_read() const { return read_; }
  int64_t bytes_written() const { return written_; }
  const std::string& path() const { return path_; }

 private:
  struct Slot {
    float* buf = nullptr;  // m (stride_ floats), v (and p), inside block_
    int64_t group = -1;    // the sub-group it holds or is being read into; -1 none
    int64_t ticket = 0;      // the last transfer touching it
  };
  // Issues the read of sub-group g into slot s.
  void read_into(int s, int64_t g);
  void write_from(int s);
  Slot* slot_of(int64_t g);
  int64_t count_of(int64_t g) const;
  int64_t transfer_bytes(int64_t g) const;  // count_of(g) floats, rounded up to the alignment

  std::string path_;
  int fd_ = -1;
  int fd_cached_ = -1;  // the same file without O_DIRECT (fetch, spill)
  int arrays_ = 2;
  bool spill_ = false;
  int64_t state_, group_;
  int64_t align_ = 1;   // bytes every transfer is a multiple of (4096 with O_DIRECT)
  int64_t stride_ = 0;  // floats from a slot's m to its v: group_ rounded up to the alignment
  int64_t array_bytes_ = 0;  // bytes per array in the file, page-aligned: array i starts at i array_bytes_
  std::unique_ptr<float, void (*)(void*)> block_{nullptr, &std::free};  // every slot's buffer, page-aligned
  std::vector<Slot> slots_;
  IoQueue io_;
  int64_t read_ = 0, written_ = 0;
  void* map_[3] = {nullptr, nullptr, nullptr};
  void unmap();
};

}  // namespace loom
