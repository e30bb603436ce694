// Process groups: the public collective API over typed spans.
//
// Note [Work semantics]
// Every call returns a Work. A call made with CallOptions{.async = false} (the default)
// has finished when it returns (its Work is already complete) and throws on failure.
// An async call is queued behind the group's earlier async calls and runs on the group's
// worker thread, in issue order; its buffers must stay untouched until wait() returns.
// wait() blocks until the call finished and rethrows its error; it cannot hang, because
// every collective is bounded by comm.timeout_s. wait_for(d) returns false if the call is
// still running after d (the call keeps running). A group whose collective failed is
// unusable: later calls throw the first failure's diagnosis.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/ledger.h"
#include "loom/comm/transport.h"
#include "loom/comm/types.h"

namespace loom::comm {

class World;

struct CallOptions {
  Algorithm algorithm = Algorithm::kAuto;
  bool async = false;
  Compression compression = Compression::kNone;  // f32 all_reduce / reduce_scatter only; runs the ring
  bool lazy = false;  // with async: nobody waits on it soon (Note [Background waits])
};

class Work {
 public:
  Work() = default;  // an already-complete call
  void wait();
  bool wait_for(std::chrono::milliseconds d);
  bool done() const;

 private:
  friend class Group;
  void make_urgent();
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr error;
    std::atomic<bool> urgent{false};  // Note [Background waits]: a caller waits on it
    std::atomic<bool> poked{false};   // Note [Background waits]: a job was queued behind it
  };
  std::shared_ptr<State> state_;
};

// A batch of point-to-point transfers started together and finished together.
template <typename T>
P2POp isend_op(std::span<const T> data, int peer, int tag) {
  return {true, peer, tag, dtype_of<T>, data.size(), std::as_bytes(data), {}};
}
template <typename T>
P2POp irecv_op(std::span<T> data, int peer, int tag) {
  return {false, peer, tag, dtype_of<T>, data.size(), {}, std::as_writable_bytes(data)};
}

// The transports of one group. When the members span several nodes, `intra` connects the
// members on this rank's node and `inter` the first member of every node (set on those
// "leaders" only); both are null for a group inside one node.
struct GroupTransports {
  std::unique_ptr<Transport> main, intra, inter;
  int nodes = 1;     // distinct hosts among the members
  int per_node = 1;  // most members on one host
};

class Group {
 public:
  Group(World& world, std::string name, std::vector<int> members, GroupTransports transports);
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  const std::string& name() const { return name_; }
  int size() const { return static_cast<int>(members_.size()); }
  int group_rank() const { return group_rank_; }
  int global_rank_of(int group_rank) const { return members_.at(group_rank); }
  const std::vector<int>& members() const { return members_; }
  int nodes() const { return nodes_; }
  World& world() const { return world_; }
  // This group's index in the ledger (LedgerEntry::group).
  int ledger_group() const { return ledger_group_; }
  // Which all-reduce algorithms this group can run besides ring/recursive.
  bool has_shared_memory() const { return transport_->shared() != nullptr; }
  bool has_native() const { return transport_->native() != nullptr; }

  // In place; avg divides by the group size (floating dtypes only).
  template <typename T>
  Work all_reduce(std::span<T> data, ReduceOp op = ReduceOp::kSum, CallOptions o = {}) {
    return submit(make(OpKind::kAllReduce, dtype_of<T>, op, data.size(), std::as_bytes(data),
                       std::as_writable_bytes(data)), o);
  }
  // in: size() x out.size() elements, block j reduced into rank j's out. out may alias
  // in's own block.
  template <typename T>
  Work reduce_scatter(std::span<const T> in, std::span<T> out, ReduceOp op = ReduceOp::kSum, CallOptions o = {}) {
    return submit(make(OpKind::kReduceScatter, dtype_of<T>, op, out.size(), std::as_bytes(in),
                       std::as_writable_bytes(out)), o);
  }
  // out: size() x in.size() elements; in may alias out's own block.
  template <typename T>
  Work all_gather(std::span<const T> in, std::span<T> out, CallOptions o = {}) {
    return submit(make(OpKind::kAllGather, dtype_of<T>, ReduceOp::kSum, in.size(), std::as_bytes(in),
                       std::as_writable_bytes(out)), o);
  }
  template <typename T>
  Work broadcast(std::span<T> data, int root, CallOptions o = {}) {
    Descriptor d = make(OpKind::kBroadcast, dtype_of<T>, ReduceOp::kSum, data.size(), std::as_bytes(data),
                        std::as_writable_bytes(data));
    d.root = root;
    return submit(std::move(d), o);
  }
  // out is written on the root only (it may be empty elsewhere).
  template <typename T>
  Work reduce(std::span<const T> in, std::span<T> out, int root, ReduceOp op = ReduceOp::kSum, CallOptions o = {}) {
    Descriptor d = make(OpKind::kReduce, dtype_of<T>, op, in.size(), std::as_bytes(in), std::as_writable_bytes(out));
    d.root = root;
    return submit(std::move(d), o);
  }
  // in, out: size() blocks of equal length; block j of in goes to rank j.
  template <typename T>
  Work all_to_all(std::span<const T> in, std::span<T> out, CallOptions o = {}) {
    return submit(make(OpKind::kAllToAll, dtype_of<T>, ReduceOp::kSum, size() ? in.size() / size() : 0,
                       std::as_bytes(in), std::as_writable_bytes(out)), o);
  }
  template <typename T>
  Work send(std::span<const T> data, int peer, int tag, CallOptions o = {}) {
    Descriptor d = make(OpKind::kSend, dtype_of<T>, ReduceOp::kSum, data.size(), std::as_bytes(data), {});
    d.root = peer;
    d.tag = tag;
    return submit(std::move(d), o);
  }
  template <typename T>
  Work recv(std::span<T> data, int peer, int tag, CallOptions o = {}) {
    Descriptor d = make(OpKind::kRecv, dtype_of<T>, ReduceOp::kSum, data.size(), {}, std::as_writable_bytes(data));
    d.root = peer;
    d.tag = tag;
    return submit(std::move(d), o);
  }
  Work batch(std::vector<P2POp> ops, CallOptions o = {});
  Work barrier(CallOptions o = {});

  // The one path: validate, record in the ledger, run (inline or queued), diagnose.
  Work submit(Descriptor d, CallOptions o);

 private:
  static Descriptor make(OpKind op, DType dtype, ReduceOp r, size_t count, std::span<const std::byte> in,
                         std::span<std::byte> out);
  void validate(const Descriptor& d) const;
  void validate_algorithm(const Descriptor& d) const;
  Algorithm choose(const Descriptor& d, double* estimate_us) const;
  // `posted`: a send already started at submit (Note [Sends posted at submit]).
  void execute(Descriptor& d, Ledger::Issued issued, std::optional<TransferId> posted = std::nullopt);
  void dispatch(Descriptor& d, Algorithm a, class Link& link, std::optional<TransferId> posted);
  void check_desync(const Descriptor& d, uint64_t group_seq, class Link& link);
  std::string diagnosis(const Descriptor& d, uint64_t group_seq, const std::string& cause, double elapsed_s);
  // How long a diagnosis waits for the peers' status: status_grace, at most half the timeout.
  std::chrono::milliseconds status_grace() const;
  void worker_loop();

  World& world_;
  std::string name_;
  std::vector<int> members_;
  int group_rank_ = -1;
  int ledger_group_ = 0;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Transport> intra_, inter_;
  int nodes_ = 1, per_node_ = 1;
  std::vector<std::byte> scratch_, intra_scratch_, inter_scratch_;

  struct Job {
    Descriptor d;
    Ledger::Issued issued;
    std::shared_ptr<Work::State> state;
    bool lazy = false;
    std::optional<TransferId> posted;  // Note [Sends posted at submit]
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool busy_ = false;
  std::shared_ptr<Work::State> running_;  // the worker's job, while it is a background wait
  bool stop_ = false;
  std::string failure_;  // first failure's diagnosis; non-empty = group unusable
  std::thread worker_;
};

}  // namespace loom::comm
