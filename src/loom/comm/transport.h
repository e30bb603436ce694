// The backend interface: point-to-point byte transfers inside one process group, a status
// channel for diagnosis, and (optionally) the library's own collectives.
//
// Note [Transport contract]
// - Addresses are group ranks of the group the transport was made for.
// - Messages between one (sender, receiver, tag) triple arrive in the order sent.
// - isend/irecv only start a transfer; the buffer must stay valid until test() returns
//   true for its id. A receive whose message is longer or shorter than its buffer throws
//   CommError naming both sizes (it means the ranks disagree about a count).
// - test() never blocks. idle() may block for a short while (at most until `until`) when
//   the caller has nothing to do but wait.
// - Tags below kFirstInternalTag belong to users (send/recv); algorithms use the rest.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loom/core/error.h"
#include "loom/comm/types.h"

namespace loom::comm {

using Clock = std::chrono::steady_clock;

// Note [Background waits]
// An asynchronous send runs on its group's worker thread (Group::submit), which waits for
// the receiver beside the caller's compute, on the caller's core when ranks fill the
// cores. A pipeline's sends wait for the next stage to reach its receive: in ZB-H2 on two
// cores ~100 ms each, and a waiter that yields, then wakes every ~70 us (sleeps of 20 us
// plus timer slack), slowed the compute beside it by 16-59% (each step timed in traces:
// M pp 2's B 82-95 ms where 1F1B's joint backward takes 94 and B alone should take ~57).
// So while a worker runs a send or receive nobody waits on yet, the MPI transport sleeps a
// quarter of the time waited so far, 50 us to 1 ms (about 1,000 wake-ups a second at most);
// as soon as the caller blocks on the Work it raises `urgent`, which also ends a nap in
// progress, and the wait polls as before.
// The transfer itself needs no polling on the sender: the receiver moves the data, and any
// MPI call of the process (the caller's next receive) completes the request. Collectives
// keep polling (a nonblocking collective advances only inside MPI calls), unless the caller
// marks one `lazy` (CallOptions): its result is wanted much later, so a round noticed up to
// 1 ms late costs nothing (2bw's step sums, started a step before they are read). The
// shared-memory algorithms' spin waits (Link::spin_until) nap the same way.
// A nap ends early once a caller waits: Work::wait raises `urgent` under `mu` and notifies
// `cv`, which the nap waits on (a nap slept through would add up to 1 ms to every wait).
// It also ends, once, when a job is queued behind it (Group::submit sets `poked`): the
// worker runs one job at a time, so a job that starts on the worker (a receive; a send the
// transport cannot start at submit, Note [Sends posted at submit]) would otherwise start only
// when the nap before it ran out. On config A's zb-v at pp 2 (before sends were posted at
// submit) the first stage's send of a gradient queued behind the send of an activation the
// other rank had taken 0.05 ms after it was queued; the worker noticed 0.9 ms later, and the
// other rank sat idle until then. The wait naps on if its own transfer is still not done.
// A send naps the full 1 ms from its first wait: nothing but noticing its end waits on the
// sender's worker (the receiver moves the data; a caller that needs the end raises `urgent`,
// a queued job pokes). Its short first naps had cost the compute beside them: on config A's
// 2bw with the vocabulary split at pp 2, the last stage's first forward layer ran 1.06-1.16 ms
// while its gradient send to the first stage was in flight (some 12 wake-ups in the layer's
// millisecond) and 0.87 ms without one (traces; the same layer 0.89 ms single-process).
struct BackgroundWait {
  std::atomic<bool>* urgent = nullptr;        // set while a worker runs a send, receive or lazy collective
  std::atomic<bool>* poked = nullptr;         // with urgent: a job queued behind (cleared by the nap)
  std::mutex* mu = nullptr;                   // with urgent: the Work's lock and condition
  std::condition_variable* cv = nullptr;
  bool send = false;                          // with urgent: the job is a send (naps 1 ms from the start)
};
BackgroundWait& background_wait();  // this thread's
// On a worker in such a background wait: sleeps a quarter of `waited` (50 us to 1 ms; a send
// 1 ms; not past `until`, and no longer once the caller waits or a job is queued behind) and
// returns true. Elsewhere returns false at once (the caller polls).
bool background_nap(Clock::duration waited, Clock::time_point until);
// The nap's length before `until` and the wake-ups cut it: a quarter of `waited`, 50 us to 1 ms;
// a send's 1 ms.
Clock::duration background_nap_length(Clock::duration waited, bool send);

inline constexpr int kFirstInternalTag = 16384;

// A collective failed: timeout, desync or a transport error. The message is the diagnosis.
class CommError : public Error {
 public:
  explicit CommError(const std::string& what) : Error(what, Kind::kRuntime) {}
};

using TransferId = uint64_t;

// Native collectives of the library underneath (MPI). Every call is non-blocking and
// returns an id polled with Transport::test. Buffers follow Descriptor conventions.
class NativeCollectives {
 public:
  virtual ~NativeCollectives() = default;
  virtual TransferId all_reduce(std::span<const std::byte> in, std::span<std::byte> out, size_t count, DType dtype,
                                ReduceOp op) = 0;
  virtual TransferId reduce_scatter(std::span<const std::byte> in, std::span<std::byte> out, size_t count,
                                    DType dtype, ReduceOp op) = 0;
  virtual TransferId all_gather(std::span<const std::byte> in, std::span<std::byte> out, size_t count,
                                DType dtype) = 0;
  virtual TransferId broadcast(std::span<std::byte> data, size_t count, DType dtype, int root) = 0;
  virtual TransferId all_to_all(std::span<const std::byte> in, std::span<std::byte> out, size_t count,
                                DType dtype) = 0;
};

// Memory every member of a one-node group can read and write: one region per member,
// the same layout in each (Note [Shared-memory all-reduce] in algorithms.h).
class SharedSegment {
 public:
  static constexpr size_t kFlagBytes = 64;            // one cache line: the member's epoch flag
  static constexpr size_t kSlotBytes = size_t{256} << 10;  // per member per pipeline slot
  static constexpr size_t kRegionBytes = kFlagBytes + 2 * kSlotBytes;
  virtual ~SharedSegment() = default;
  virtual std::byte* region(int group_rank) = 0;
  // Member `group_rank`'s pipeline slot for round k (rounds alternate between its two slots).
  std::byte* slot(int group_rank, size_t k) { return region(group_rank) + kFlagBytes + (k % 2) * kSlotBytes; }
  uint64_t next_epoch() { return ++epoch_; }
  uint64_t next_chunk() { return chunk_++; }
  // Spins a waiting member makes before yielding its core: many when every member has a
  // core to itself, few when members outnumber cores (a spinner would hold up the peer
  // it waits for).
  int spin_limit() const { return spin_limit_; }
  void set_members(int members);

 private:
  uint64_t epoch_ = 0, chunk_ = 0;
  int spin_limit_ = 20000;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;  // group rank
  virtual TransferId isend(std::span<const std::byte> data, int peer, int tag) = 0;
  virtual TransferId irecv(std::span<std::byte> data, int peer, int tag) = 0;
  // true once the transfer is complete (and on every later call for the same id).
  virtual bool test(TransferId id) = 0;
  // Gives up a transfer that will never complete (after a timeout): afterwards the
  // transport no longer touches its buffer.
  virtual void cancel(TransferId id) = 0;
  // waited: how long the caller has been waiting for this completion.
  virtual void idle(Clock::time_point until, Clock::duration waited) = 0;
  // Optional entry: nullptr when the backend has no collectives of its own.
  virtual NativeCollectives* native() { return nullptr; }
  // Optional entry: the group's shared segment, or nullptr when the members do not share
  // a node (or the backend cannot map memory between them).
  virtual SharedSegment* shared() { return nullptr; }
  // Whether isend may be called on one thread while another tests or idles on this
  // transport (Note [Sends posted at submit]): the MPI transport takes one lock around every
  // MPI call; the thread transport keeps its bookkeeping unlocked.
  virtual bool posts_from_any_thread() const { return false; }
};

// Note [Sends posted at submit]
// An asynchronous send is started (isend) on the caller's thread when it is submitted, where
// the transport allows it; the group's worker then only waits for it. Started by the worker
// instead, the send went out when the worker got a core: on two cores, two ranks computing,
// 0.1-0.2 ms after the stage had produced it, a wait the next stage paid on every transfer of
// config A's zb-v (15 a step on the first stage, a 48 ms step). The order of a group's
// messages is the order they were submitted either way: a synchronous call waits for the
// queue to empty first, and every asynchronous send is started at its submit. The ledger
// (and a trace) still starts the send when the worker takes it up, and its timeout counts
// from there.

// What one rank reports about itself when a collective is diagnosed.
struct GroupProgress {
  std::string group;        // group name, e.g. "dp[1]{1,5,9}"
  uint64_t issued = 0;      // collectives issued on the group (the last one's sequence number)
  uint64_t completed = 0;   // collectives finished on the group
  std::string last;         // the last issued descriptor, e.g. "all_reduce f32 x 1000 sum"
};

struct RankStatus {
  int global_rank = -1;     // -1: the rank did not answer
  std::string state;        // "in all_reduce #12 on dp[0]{0,2} for 3.2 s", "not in a collective", "exited: ..."
  std::string last;         // the last call it issued, with its group and number
  std::vector<GroupProgress> groups;
};
std::string encode_status(const RankStatus& s);
RankStatus decode_status(std::string_view text);  // throws CommError on malformed text

// World-level backend: makes transports for groups and carries the status channel.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "threads", "mpi"
  virtual int world_size() const = 0;
  virtual int global_rank() const = 0;
  // Host name of every global rank (ranks on one host form a node).
  virtual std::vector<std::string> hosts() = 0;
  // Collective over the whole world: every rank calls it with the full list of groups in
  // the same order and gets a transport for the group that contains it (nullptr if none).
  virtual std::unique_ptr<Transport> make_transport(const std::vector<std::vector<int>>& groups,
                                                    const std::string& name) = 0;
  // Status channel for diagnosis. The World installs a source of its own status once;
  // serve() is called about every 10 ms while a collective waits so that peers' requests
  // are answered; collect() returns every rank's status in global-rank order, with
  // global_rank = -1 for ranks that did not answer within `grace`.
  virtual void set_status_source(std::function<RankStatus()> source) = 0;
  virtual void serve() = 0;
  virtual std::vector<RankStatus> collect(std::chrono::milliseconds grace) = 0;
  // Global ranks whose process is known to be gone (a peer on this host that exited or
  // was killed), so a collective waiting on one fails at once instead of at the timeout.
  // Ranks on other hosts are never listed: for them the timeout is the detector.
  virtual std::vector<int> dead_ranks() { return {}; }
};

}  // namespace loom::comm
