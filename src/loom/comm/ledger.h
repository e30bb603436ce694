// Collective descriptors and the per-rank ledger every collective is recorded in.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "loom/comm/transport.h"
#include "loom/comm/types.h"

namespace loom::comm {

// One point-to-point transfer of a batch: exactly one of send/recv is non-empty.
struct P2POp {
  bool is_send = true;
  int peer = 0;  // group rank
  int tag = 0;
  DType dtype = DType::kF32;
  size_t count = 0;
  std::span<const std::byte> send;
  std::span<std::byte> recv;
};

// Every collective call is one of these (Note [Descriptor counts]).
//
// Note [Descriptor counts]
// count is in elements of dtype:
//   all_reduce, broadcast, reduce: the buffer length;
//   reduce_scatter: the output length (input = count x group size);
//   all_gather: the input length (output = count x group size);
//   all_to_all: the block each rank sends to each rank (in = out = count x group size);
//   send/recv: the message length; barrier: 0.
struct Descriptor {
  OpKind op = OpKind::kBarrier;
  DType dtype = DType::kF32;
  ReduceOp reduce = ReduceOp::kSum;
  Algorithm algorithm = Algorithm::kAuto;
  Compression compression = Compression::kNone;
  size_t count = 0;
  int root = 0;   // broadcast/reduce: group rank of the root; send/recv: the peer
  int tag = 0;    // send/recv only
  std::span<const std::byte> in;
  std::span<std::byte> out;
  std::vector<P2POp> batch;  // kSendRecvBatch only
};

// "all_reduce f32 x 1000 sum", "send f32 x 10 to 3 tag 7".
std::string describe(const Descriptor& d);
// Bytes one rank contributes (the nccl-tests "size" of the operation).
size_t payload_bytes(const Descriptor& d, int group_size);

struct LedgerEntry {
  enum class State : uint8_t { kQueued, kRunning, kDone, kFailed };
  uint64_t seq = 0;        // per rank, over all groups
  int group = 0;           // index into Ledger::group_names()
  uint64_t group_seq = 0;  // 1-based position among this group's collectives (p2p: the last one's)
  OpKind op = OpKind::kBarrier;
  DType dtype = DType::kF32;
  ReduceOp reduce = ReduceOp::kSum;
  Algorithm algorithm = Algorithm::kAuto;  // resolved when it starts
  size_t count = 0;
  int root = 0;
  int tag = 0;
  double issue_us = 0, start_us = 0, end_us = 0;  // since the ledger was made
  double estimate_us = 0;  // the cost model's estimate for the chosen algorithm (all_reduce)
  State state = State::kQueued;
};

// Thread-safe; keeps the last `capacity` entries plus per-group counters for all time.
class Ledger {
 public:
  explicit Ledger(size_t capacity = 1 << 16);
  int add_group(const std::string& name);
  struct Issued {
    uint64_t seq = 0, group_seq = 0;
  };
  Issued issue(int group, const Descriptor& d);
  void start(uint64_t seq, Algorithm resolved, double estimate_us = 0);
  void finish(uint64_t seq, bool ok);
  std::vector<LedgerEntry> entries() const;
  std::vector<std::string> group_names() const;
  RankStatus status(int global_rank) const;
  double now_us() const;
  // The moment now_us() counts from, as steady-clock microseconds (comparable across the
  // processes of one machine: traces line ranks up with it).
  double origin_steady_us() const;

 private:
  LedgerEntry* find(uint64_t seq);
  struct GroupCounters {
    std::string name;
    uint64_t issued = 0, completed = 0;
    LedgerEntry last;  // formatted only when a status is asked for
  };
  mutable std::mutex mu_;
  size_t capacity_;
  uint64_t next_seq_ = 1;
  std::deque<LedgerEntry> entries_;
  std::vector<GroupCounters> groups_;
  LedgerEntry last_;
  bool has_last_ = false;
  Clock::time_point t0_;
};

}  // namespace loom::comm
