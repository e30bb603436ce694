// Running one collective: algorithm dispatch, the debug-mode desync check, and the
// diagnosis a failed collective prints.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <sstream>

#include "loom/comm/algorithms.h"
#include "loom/comm/group.h"
#include "loom/comm/world.h"

namespace loom::comm {
namespace {

constexpr int kTagDesync = kFirstInternalTag + 100;

// The fields ranks must agree on, as fixed-size bytes for the desync exchange.
struct Fingerprint {
  uint64_t group_seq;
  uint64_t count;
  int32_t root;
  uint8_t op, dtype, reduce, algorithm;
};

Descriptor from_fingerprint(const Fingerprint& f) {
  Descriptor d;
  d.op = static_cast<OpKind>(f.op);
  d.dtype = static_cast<DType>(f.dtype);
  d.reduce = static_cast<ReduceOp>(f.reduce);
  d.algorithm = static_cast<Algorithm>(f.algorithm);
  d.count = f.count;
  d.root = f.root;
  return d;
}

bool same_call(const Fingerprint& a, const Fingerprint& b) {
  return a.group_seq == b.group_seq && a.count == b.count && a.root == b.root && a.op == b.op &&
         a.dtype == b.dtype && a.reduce == b.reduce && a.algorithm == b.algorithm;
}

bool is_p2p(OpKind op) { return op == OpKind::kSend || op == OpKind::kRecv || op == OpKind::kSendRecvBatch; }

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

}  // namespace

void Group::execute(Descriptor& d, Ledger::Issued issued, std::optional<TransferId> posted) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_.empty()) {
      if (posted) transport_->cancel(*posted);
      world_.ledger().finish(issued.seq, false);
      throw CommError(detail::cat("group ", name_, " is unusable after an earlier failure:\n", failure_));
    }
  }
  double estimate_us = 0;
  const Algorithm algorithm = choose(d, &estimate_us);
  world_.ledger().start(issued.seq, algorithm, estimate_us);
  const Clock::time_point start = Clock::now();
  // comm.timeout_s bounds the whole wait, diagnosis included: the collective gives up one
  // status grace early so that collecting the peers' status ends by the timeout.
  const Clock::time_point deadline = start + world_.options().timeout - status_grace();
  Clock::time_point next_check = start;
  auto on_wait = [this, &next_check] {
    world_.backend().serve();
    if (Clock::now() < next_check) return;
    next_check = Clock::now() + std::chrono::milliseconds(100);
    std::string dead;
    for (int g : world_.backend().dead_ranks())
      if (std::find(members_.begin(), members_.end(), g) != members_.end()) dead += (dead.empty() ? "" : ", ") + std::to_string(g);
    if (!dead.empty())
      throw CommTimeout("rank " + dead + " died: its process is gone (seen without waiting for the timeout; a rank "
                        "that failed on its own first names the cause in its own message)");
  };
  Link link(*transport_, deadline, on_wait, scratch_);
  try {
    if (world_.options().check_desync && !is_p2p(d.op)) check_desync(d, issued.group_seq, link);
    if (algorithm == Algorithm::kHierarchical) {
      Link intra(*intra_, deadline, on_wait, intra_scratch_);
      std::optional<Link> inter;
      if (inter_) inter.emplace(*inter_, deadline, on_wait, inter_scratch_);
      hierarchical_all_reduce(intra, inter ? &*inter : nullptr, d.out, d.count, d.dtype, d.reduce, size());
    } else {
      dispatch(d, algorithm, link, posted);
    }
  } catch (const CommError& e) {
    // Diagnose while the ledger still shows this call running, then record the failure.
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    std::string text = diagnosis(d, issued.group_seq, e.what(), elapsed);
    world_.ledger().finish(issued.seq, false);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (failure_.empty()) failure_ = text;
    }
    throw CommError(text);
  }
  world_.ledger().finish(issued.seq, true);
}

void Group::dispatch(Descriptor& d, Algorithm a, Link& link, std::optional<TransferId> posted) {
  if (posted) return link.wait({&*posted, 1}, "send", d.root);  // Note [Sends posted at submit]
  const size_t block = d.count * dtype_bytes(d.dtype);
  if (a == Algorithm::kNative) {
    NativeCollectives& nc = *transport_->native();
    // MPI forbids an output inside the input: an in-place reduce_scatter goes via scratch.
    const bool staged = d.op == OpKind::kReduceScatter && d.out.data() >= d.in.data() &&
                        d.out.data() < d.in.data() + d.in.size();
    const std::span<std::byte> out = staged ? link.scratch(d.out.size()) : d.out;
    TransferId id = 0;
    switch (d.op) {
      case OpKind::kAllReduce: id = nc.all_reduce(d.in, out, d.count, d.dtype, d.reduce); break;
      case OpKind::kReduceScatter: id = nc.reduce_scatter(d.in, out, d.count, d.dtype, d.reduce); break;
      case OpKind::kAllGather: id = nc.all_gather(d.in, out, d.count, d.dtype); break;
      case OpKind::kBroadcast: id = nc.broadcast(out, d.count, d.dtype, d.root); break;
      case OpKind::kAllToAll: id = nc.all_to_all(d.in, out, d.count, d.dtype); break;
      default: LOOM_ASSERT(false, "native ", op_name(d.op), " passed validation");
    }
    link.wait({&id, 1}, "native collective", -1);
    if (staged && !out.empty()) std::memcpy(d.out.data(), out.data(), out.size());
    // The native call summed; avg divides here (the library has no avg).
    if (d.reduce == ReduceOp::kAvg && (d.op == OpKind::kAllReduce || d.op == OpKind::kReduceScatter))
      divide(d.dtype, d.out.data(), d.count, size());
    return;
  }
  switch (d.op) {
    case OpKind::kAllReduce:
      if (a == Algorithm::kShm) shm_all_reduce(link, *transport_->shared(), d.out, d.count, d.dtype, d.reduce);
      else if (d.compression != Compression::kNone)
        ring_all_reduce(link, d.out, d.count, DType::kF32, d.reduce, &ring_codec(d.compression));
      else if (a == Algorithm::kRing) ring_all_reduce(link, d.out, d.count, d.dtype, d.reduce);
      else recursive_all_reduce(link, d.out, d.count, d.dtype, d.reduce);
      return;
    case OpKind::kReduceScatter:
      if (a == Algorithm::kShm) return shm_reduce_scatter(link, *transport_->shared(), d.in, d.out, d.count, d.dtype, d.reduce);
      return ring_reduce_scatter(link, d.in, d.out, d.count, d.dtype, d.reduce,
                                 d.compression != Compression::kNone ? &ring_codec(d.compression) : nullptr);
    case OpKind::kAllGather:
      if (a == Algorithm::kShm) return shm_all_gather(link, *transport_->shared(), d.in, d.out, d.count, d.dtype);
      return ring_all_gather(link, d.in, d.out, d.count, d.dtype);
    case OpKind::kBroadcast: return tree_broadcast(link, d.out, d.root);
    case OpKind::kReduce: return tree_reduce(link, d.in, d.out, d.count, d.dtype, d.reduce, d.root);
    case OpKind::kAllToAll: return pairwise_all_to_all(link, d.in, d.out, block);
    case OpKind::kSend: return link.send(d.in, d.root, d.tag);
    case OpKind::kRecv: return link.recv(d.out, d.root, d.tag);
    case OpKind::kBarrier:
      if (SharedSegment* seg = transport_->shared()) return shm_barrier(link, *seg);
      return dissemination_barrier(link);
    case OpKind::kSendRecvBatch: {
      std::vector<TransferId> ids;
      for (const P2POp& p : d.batch)
        ids.push_back(p.is_send ? link.isend(p.send, p.peer, p.tag) : link.irecv(p.recv, p.peer, p.tag));
      link.wait(ids, "point-to-point batch", -1);
      return;
    }
  }
}

// Debug mode: every member gathers every member's fingerprint of this call (a ring
// all-gather of 32-byte records) and all of them report the same table on a mismatch.
void Group::check_desync(const Descriptor& d, uint64_t group_seq, Link& link) {
  const int n = size();
  Fingerprint mine{};
  mine.group_seq = group_seq;
  mine.count = d.count;
  mine.root = d.root;
  mine.op = static_cast<uint8_t>(d.op);
  mine.dtype = static_cast<uint8_t>(d.dtype);
  mine.reduce = static_cast<uint8_t>(d.reduce);
  mine.algorithm = static_cast<uint8_t>(d.algorithm);
  std::vector<Fingerprint> all(n);
  all[group_rank_] = mine;
  for (int s = 0; s < n - 1; ++s) {
    const int send = mod(group_rank_ - s, n), recv = mod(group_rank_ - s - 1, n);
    link.exchange(std::as_bytes(std::span(&all[send], 1)), (group_rank_ + 1) % n,
                  std::as_writable_bytes(std::span(&all[recv], 1)), (group_rank_ + n - 1) % n, kTagDesync);
  }
  bool agree = true;
  for (const Fingerprint& f : all) agree = agree && same_call(f, all[0]);
  if (agree) return;
  std::ostringstream os;
  os << "loom comm: desync on group " << name_ << ": its members issued different calls:\n";
  for (int r = 0; r < n; ++r)
    os << "  rank " << members_[r] << " (group rank " << r << "): #" << all[r].group_seq << " "
       << describe(from_fingerprint(all[r])) << " (algorithm " << algorithm_name(static_cast<Algorithm>(all[r].algorithm))
       << ")\n";
  throw CommError(os.str());
}

std::chrono::milliseconds Group::status_grace() const {
  return std::min(world_.options().status_grace, world_.options().timeout / 2);
}

std::string Group::diagnosis(const Descriptor& d, uint64_t group_seq, const std::string& cause, double elapsed_s) {
  std::ostringstream os;
  if (cause.rfind("loom comm: desync", 0) == 0) {
    os << cause;
  } else {
    os << "loom comm: " << op_name(d.op) << (is_p2p(d.op) ? " after collective #" : " #") << group_seq << " ("
       << describe(d) << ") on group " << name_
       << " failed at global rank " << world_.global_rank() << " after " << seconds(elapsed_s) << ": " << cause
       << "\n";
    const auto grace = status_grace();
    const std::vector<RankStatus> all = world_.backend().collect(grace);
    os << "Members of " << name_ << (is_p2p(d.op) ? ":\n" : detail::cat(" and collective #", group_seq, ":\n"));
    for (int r = 0; r < size(); ++r) {
      const int g = members_[r];
      os << "  rank " << g << " (group rank " << r << "): ";
      const RankStatus& st = all.at(g);
      if (st.global_rank < 0) {
        if (!st.state.empty()) os << st.state << "\n";
        else os << "no answer within " << seconds(grace.count() * 1e-3) << " (dead, or busy outside loom collectives)\n";
        continue;
      }
      const GroupProgress* p = nullptr;
      for (const GroupProgress& gp : st.groups)
        if (gp.group == name_) p = &gp;
      if (p == nullptr) {
        if (!st.groups.empty()) os << "has not made this group; ";
      } else if (!is_p2p(d.op)) {
        if (p->issued >= group_seq) os << "reached it; ";
        else os << "has NOT reached it (issued " << p->issued << ", completed " << p->completed << "); ";
      }
      os << st.state << "\n";
    }
    os << "Last call issued by every rank:\n";
    for (size_t g = 0; g < all.size(); ++g)
      os << "  rank " << g << ": " << (all[g].global_rank < 0 ? std::string(all[g].state.empty() ? "no answer" : "dead") : all[g].last) << "\n";
  }
  return os.str();
}

}  // namespace loom::comm
