#include "loom/comm/group.h"

#include <algorithm>
#include <cstring>

#include "loom/comm/algorithms.h"
#include "loom/comm/cost.h"
#include "loom/comm/world.h"

namespace loom::comm {

BackgroundWait& background_wait() {
  thread_local BackgroundWait w;
  return w;
}

Clock::duration background_nap_length(Clock::duration waited, bool send) {
  const Clock::duration most = std::chrono::milliseconds(1);
  return send ? most : std::clamp<Clock::duration>(waited / 4, std::chrono::microseconds(50), most);
}

bool background_nap(Clock::duration waited, Clock::time_point until) {
  const BackgroundWait& w = background_wait();
  if (!w.urgent || *w.urgent) return false;
  const Clock::duration nap = background_nap_length(waited, w.send);
  std::unique_lock<std::mutex> lock(*w.mu);  // the worker sets urgent, poked, mu and cv together
  w.cv->wait_until(lock, std::min(until, Clock::now() + nap), [&] { return w.urgent->load() || w.poked->load(); });
  w.poked->store(false);  // a poke before the nap began ends it at once
  return true;
}

// Raises urgent under the lock a napping worker waits with, so the nap cannot miss it.
void Work::make_urgent() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->urgent = true;
  }
  state_->cv.notify_all();
}

void Work::wait() {
  if (!state_) return;
  make_urgent();
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done; });
  if (state_->error) std::rethrow_exception(state_->error);
}

bool Work::wait_for(std::chrono::milliseconds d) {
  if (!state_) return true;
  make_urgent();
  std::unique_lock<std::mutex> lock(state_->mu);
  if (!state_->cv.wait_for(lock, d, [&] { return state_->done; })) return false;
  if (state_->error) std::rethrow_exception(state_->error);
  return true;
}

bool Work::done() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done;
}

Group::Group(World& world, std::string name, std::vector<int> members, GroupTransports transports)
    : world_(world), name_(std::move(name)), members_(std::move(members)), transport_(std::move(transports.main)),
      intra_(std::move(transports.intra)), inter_(std::move(transports.inter)), nodes_(transports.nodes),
      per_node_(transports.per_node) {
  LOOM_ASSERT(transport_ != nullptr, "group ", name_, " made without a transport");
  group_rank_ = transport_->rank();
  LOOM_ASSERT(members_.at(group_rank_) == world_.global_rank(), "group ", name_, " rank mismatch");
  ledger_group_ = world_.ledger().add_group(name_);
}

Group::~Group() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

Descriptor Group::make(OpKind op, DType dtype, ReduceOp r, size_t count, std::span<const std::byte> in,
                       std::span<std::byte> out) {
  Descriptor d;
  d.op = op;
  d.dtype = dtype;
  d.reduce = r;
  d.count = count;
  d.in = in;
  d.out = out;
  return d;
}

Work Group::batch(std::vector<P2POp> ops, CallOptions o) {
  Descriptor d;
  d.op = OpKind::kSendRecvBatch;
  d.batch = std::move(ops);
  return submit(std::move(d), o);
}

Work Group::barrier(CallOptions o) { return submit(Descriptor{}, o); }

namespace {

bool overlaps(std::span<const std::byte> a, std::span<const std::byte> b) {
  if (a.empty() || b.empty()) return false;
  return a.data() < b.data() + b.size() && b.data() < a.data() + a.size();
}

}  // namespace

// Every argument problem is the caller's: loom::Error naming the call, group and values.
void Group::validate(const Descriptor& d) const {
  const int n = size();
  const size_t es = dtype_bytes(d.dtype), bytes = d.count * es;
  auto where = [&] { return detail::cat(op_name(d.op), " on group ", name_, ": "); };
  auto check_size = [&](std::span<const std::byte> s, size_t want, const char* what) {
    LOOM_CHECK(s.size() == want, where(), what, " has ", s.size() / es, " elements, expected ", want / es);
  };
  auto check_rank = [&](int r, const char* what) {
    LOOM_CHECK(r >= 0 && r < n, where(), what, " ", r, " is outside the group's ranks [0, ", n, ")");
  };
  if (d.op == OpKind::kAllReduce || d.op == OpKind::kReduceScatter || d.op == OpKind::kReduce)
    LOOM_CHECK(d.reduce != ReduceOp::kAvg || dtype_is_float(d.dtype), where(), "avg needs a floating dtype, got ",
               dtype_name(d.dtype), "; use sum and divide");
  switch (d.op) {
    case OpKind::kAllReduce:
    case OpKind::kBroadcast:
      check_size(d.out, bytes, "the buffer");
      if (d.op == OpKind::kBroadcast) check_rank(d.root, "root");
      break;
    case OpKind::kReduceScatter: {
      check_size(d.in, bytes * n, "the input");
      check_size(d.out, bytes, "the output");
      const bool own_block = d.out.data() == d.in.data() + bytes * group_rank_;
      LOOM_CHECK(own_block || !overlaps(d.in, d.out), where(), "the output overlaps the input other than as this rank's block");
      break;
    }
    case OpKind::kAllGather: {
      check_size(d.in, bytes, "the input");
      check_size(d.out, bytes * n, "the output");
      const bool own_block = d.in.data() == d.out.data() + bytes * group_rank_;
      LOOM_CHECK(own_block || !overlaps(d.in, d.out), where(), "the input overlaps the output other than as this rank's block");
      break;
    }
    case OpKind::kReduce:
      check_rank(d.root, "root");
      check_size(d.in, bytes, "the input");
      if (group_rank_ == d.root) check_size(d.out, bytes, "the root's output");
      LOOM_CHECK(group_rank_ != d.root || d.in.data() == d.out.data() || !overlaps(d.in, d.out), where(),
                 "input and output overlap partially");
      break;
    case OpKind::kAllToAll:
      LOOM_CHECK(d.in.size() == bytes * n, where(), "the input has ", d.in.size() / es,
                 " elements, which is not a multiple of the group size ", n);
      check_size(d.out, bytes * n, "the output");
      LOOM_CHECK(!overlaps(d.in, d.out), where(), "input and output must not overlap");
      break;
    case OpKind::kSend:
    case OpKind::kRecv:
      check_rank(d.root, "peer");
      LOOM_CHECK(d.root != group_rank_, where(), "peer ", d.root, " is this rank itself");
      LOOM_CHECK(d.tag >= 0 && d.tag < kFirstInternalTag, where(), "tag ", d.tag, " is outside [0, ", kFirstInternalTag, ")");
      break;
    case OpKind::kSendRecvBatch:
      for (const P2POp& p : d.batch) {
        Descriptor one = make(p.is_send ? OpKind::kSend : OpKind::kRecv, p.dtype, ReduceOp::kSum, p.count, p.send, p.recv);
        one.root = p.peer;
        one.tag = p.tag;
        validate(one);
      }
      break;
    case OpKind::kBarrier: break;
  }
  if (d.op == OpKind::kSend) check_size(d.in, bytes, "the message");
  if (d.op == OpKind::kRecv) check_size(d.out, bytes, "the buffer");
  validate_algorithm(d);
}

// The requested algorithm (and compression) must exist for this call on this group; none
// is ever silently replaced by another.
void Group::validate_algorithm(const Descriptor& d) const {
  auto where = [&] { return detail::cat(op_name(d.op), " on group ", name_, ": "); };
  const bool has_native = transport_->native() != nullptr;
  switch (d.algorithm) {
    case Algorithm::kAuto: break;
    case Algorithm::kNative:
      LOOM_CHECK(has_native, where(), "algorithm native needs a backend with its own collectives (mpi); this world runs on ",
                 world_.backend().name());
      LOOM_CHECK(d.op != OpKind::kReduce && d.op != OpKind::kSend && d.op != OpKind::kRecv &&
                     d.op != OpKind::kSendRecvBatch && d.op != OpKind::kBarrier,
                 where(), "algorithm native is not offered for this call; use auto");
      LOOM_CHECK(d.dtype != DType::kBF16, where(), "the native MPI collectives have no bf16 type; use ring or recursive");
      break;
    case Algorithm::kRing:
    case Algorithm::kRecursive:
      LOOM_CHECK(d.op == OpKind::kAllReduce || (d.algorithm == Algorithm::kRing &&
                 (d.op == OpKind::kReduceScatter || d.op == OpKind::kAllGather)),
                 where(), "algorithm ", algorithm_name(d.algorithm), " is not offered for this call; use auto");
      break;
    case Algorithm::kShm:
      LOOM_CHECK(d.op == OpKind::kAllReduce || d.op == OpKind::kReduceScatter || d.op == OpKind::kAllGather, where(),
                 "algorithm shm is offered for all_reduce, reduce_scatter and all_gather only; use auto");
      LOOM_CHECK(transport_->shared() != nullptr, where(), "algorithm shm needs every member on one node with shared "
                 "memory; this group spans nodes or the ", world_.backend().name(), " backend cannot share memory");
      break;
    case Algorithm::kHierarchical:
      LOOM_CHECK(d.op == OpKind::kAllReduce, where(), "algorithm hierarchical is offered for all_reduce only; use auto");
      LOOM_CHECK(intra_ != nullptr, where(), "algorithm hierarchical needs a group spanning several nodes; all ",
                 size(), " members are on one host (use shm)");
      break;
  }
  if (d.compression != Compression::kNone) {
    LOOM_CHECK((d.op == OpKind::kAllReduce || d.op == OpKind::kReduceScatter) && d.dtype == DType::kF32 &&
                   d.reduce != ReduceOp::kMax,
               where(), "compression ", compression_name(d.compression),
               " is offered for f32 all_reduce and reduce_scatter sum/avg only");
    LOOM_CHECK(d.algorithm == Algorithm::kAuto || d.algorithm == Algorithm::kRing, where(), "compression ",
               compression_name(d.compression), " runs on the ring; algorithm ", algorithm_name(d.algorithm),
               " cannot carry it");
  }
}

// Note [Algorithm choice]
// all_reduce with kAuto takes the cheapest algorithm by the cost model of cost.h (shm
// inside a node; hierarchical across nodes when a node holds several members; else
// recursive or ring by size and rank count). reduce_scatter and all_gather run through
// shared memory inside a node (Note [Shared-memory reduce-scatter]: one copy in and one pass
// over the slots, against the ring's size - 1 messages), else on the ring. Other ops have one
// algorithm each. Compression runs on the ring. The estimate goes into the ledger beside
// the timing.
Algorithm Group::choose(const Descriptor& d, double* estimate_us) const {
  const size_t bytes = d.count * dtype_bytes(d.dtype);
  const GroupShape shape{size(), nodes_, per_node_, transport_->shared() != nullptr};
  *estimate_us = 0;
  if ((d.op == OpKind::kReduceScatter || d.op == OpKind::kAllGather) && d.algorithm == Algorithm::kAuto &&
      d.compression == Compression::kNone && shape.shared_memory)
    return Algorithm::kShm;
  if (d.op != OpKind::kAllReduce) return d.algorithm == Algorithm::kAuto ? Algorithm::kRing : d.algorithm;
  if (d.compression != Compression::kNone) return Algorithm::kRing;
  if (d.algorithm != Algorithm::kAuto) {
    *estimate_us = all_reduce_estimate_us(d.algorithm, bytes, shape, default_cost_table());
    return d.algorithm;
  }
  return cheapest_all_reduce(bytes, shape, default_cost_table(), estimate_us);
}

Work Group::submit(Descriptor d, CallOptions o) {
  if (o.algorithm != Algorithm::kAuto) d.algorithm = o.algorithm;
  d.compression = o.compression;
  validate(d);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_.empty())
      throw CommError(detail::cat("group ", name_, " is unusable after an earlier failure:\n", failure_));
  }
  const Ledger::Issued issued = world_.ledger().issue(ledger_group_, d);
  if (!o.async) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
      busy_ = true;
    }
    struct Release {
      Group* g;
      ~Release() {
        std::lock_guard<std::mutex> lock(g->mu_);
        g->busy_ = false;
        g->cv_.notify_all();
      }
    } release{this};
    execute(d, issued);
    return Work{};
  }
  Work w;
  w.state_ = std::make_shared<Work::State>();
  std::shared_ptr<Work::State> ahead;  // a background wait this job queues behind
  std::optional<TransferId> posted;
  if (d.op == OpKind::kSend && transport_->posts_from_any_thread()) {  // Note [Sends posted at submit]
    try {
      posted = transport_->isend(d.in, d.root, d.tag);
    } catch (const CommError&) {
      // The worker starts it again and fails it with the group's diagnosis.
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back({std::move(d), issued, w.state_, o.lazy, posted});
    if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
    ahead = running_;
  }
  cv_.notify_all();
  if (ahead) {  // Note [Background waits]: end its nap, so the queue moves once it is done
    {
      std::lock_guard<std::mutex> lock(ahead->mu);
      ahead->poked = true;
    }
    ahead->cv.notify_all();
  }
  return w;
}

void Group::worker_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return (!queue_.empty() && !busy_) || (stop_ && queue_.empty()); });
    if (queue_.empty()) return;
    Job job = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    const bool background = job.lazy || job.d.op == OpKind::kSend || job.d.op == OpKind::kRecv;
    if (background) running_ = job.state;
    lock.unlock();
    std::exception_ptr error;
    background_wait() = background
                            ? BackgroundWait{&job.state->urgent, &job.state->poked, &job.state->mu, &job.state->cv,
                                             job.d.op == OpKind::kSend}
                            : BackgroundWait{};  // Note [Background waits]
    try {
      execute(job.d, job.issued, job.posted);
    } catch (...) {
      error = std::current_exception();
    }
    background_wait() = BackgroundWait{};
    {
      std::lock_guard<std::mutex> state_lock(job.state->mu);
      job.state->done = true;
      job.state->error = error;
    }
    job.state->cv.notify_all();
    lock.lock();
    busy_ = false;
    running_.reset();
    cv_.notify_all();
  }
}

}  // namespace loom::comm
