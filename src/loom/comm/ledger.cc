#include "loom/comm/ledger.h"

#include "loom/core/liveness.h"

#include <cstdio>
#include <sstream>
#include <tuple>

namespace loom::comm {

std::string describe(const Descriptor& d) {
  std::ostringstream os;
  os << op_name(d.op);
  switch (d.op) {
    case OpKind::kBarrier: break;
    case OpKind::kSendRecvBatch: os << " of " << (d.batch.empty() ? d.count : d.batch.size()) << " transfers"; break;
    case OpKind::kSend: os << " " << dtype_name(d.dtype) << " x " << d.count << " to " << d.root << " tag " << d.tag; break;
    case OpKind::kRecv: os << " " << dtype_name(d.dtype) << " x " << d.count << " from " << d.root << " tag " << d.tag; break;
    default:
      os << " " << dtype_name(d.dtype) << " x " << d.count;
      if (d.op == OpKind::kAllReduce || d.op == OpKind::kReduceScatter || d.op == OpKind::kReduce)
        os << " " << reduce_name(d.reduce);
      if (d.op == OpKind::kBroadcast || d.op == OpKind::kReduce) os << " root " << d.root;
      if (d.compression != Compression::kNone) os << " as " << compression_name(d.compression);
  }
  return os.str();
}

size_t payload_bytes(const Descriptor& d, int group_size) {
  const size_t b = d.count * dtype_bytes(d.dtype);
  switch (d.op) {
    case OpKind::kReduceScatter: case OpKind::kAllGather: case OpKind::kAllToAll: return b * group_size;
    case OpKind::kSendRecvBatch: {
      size_t total = 0;
      for (const P2POp& p : d.batch) total += p.count * dtype_bytes(p.dtype);
      return total;
    }
    default: return b;
  }
}

Ledger::Ledger(size_t capacity) : capacity_(capacity), t0_(Clock::now()) {}

double Ledger::now_us() const {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0_).count();
}

double Ledger::origin_steady_us() const {
  return std::chrono::duration<double, std::micro>(t0_.time_since_epoch()).count();
}

int Ledger::add_group(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  groups_.push_back({name, 0, 0, {}});
  return static_cast<int>(groups_.size()) - 1;
}

Ledger::Issued Ledger::issue(int group, const Descriptor& d) {
  liveness::begin_wait();  // until finish(): Note [Heartbeats]
  std::lock_guard<std::mutex> lock(mu_);
  LedgerEntry e;
  e.seq = next_seq_++;
  e.group = group;
  GroupCounters& g = groups_.at(group);
  // Point-to-point calls involve two members only, so they do not advance the group's
  // collective count (members compare that count in a diagnosis).
  const bool p2p = d.op == OpKind::kSend || d.op == OpKind::kRecv || d.op == OpKind::kSendRecvBatch;
  e.group_seq = p2p ? g.issued : ++g.issued;
  e.count = d.op == OpKind::kSendRecvBatch ? d.batch.size() : d.count;
  e.op = d.op;
  e.dtype = d.dtype;
  e.reduce = d.reduce;
  e.algorithm = d.algorithm;
  e.root = d.root;
  e.tag = d.tag;
  e.issue_us = now_us();
  if (entries_.size() == capacity_) entries_.pop_front();
  entries_.push_back(e);
  g.last = e;
  last_ = e;
  has_last_ = true;
  return {e.seq, e.group_seq};
}

LedgerEntry* Ledger::find(uint64_t seq) {
  if (entries_.empty() || seq < entries_.front().seq) return nullptr;
  const size_t i = seq - entries_.front().seq;
  return i < entries_.size() ? &entries_[i] : nullptr;
}

void Ledger::start(uint64_t seq, Algorithm resolved, double estimate_us) {
  std::lock_guard<std::mutex> lock(mu_);
  if (LedgerEntry* e = find(seq)) {
    e->algorithm = resolved;
    e->estimate_us = estimate_us;
    e->start_us = now_us();
    e->state = LedgerEntry::State::kRunning;
  }
}

void Ledger::finish(uint64_t seq, bool ok) {
  liveness::end_wait();
  std::lock_guard<std::mutex> lock(mu_);
  if (LedgerEntry* e = find(seq)) {
    e->end_us = now_us();
    e->state = ok ? LedgerEntry::State::kDone : LedgerEntry::State::kFailed;
    const bool p2p = e->op == OpKind::kSend || e->op == OpKind::kRecv || e->op == OpKind::kSendRecvBatch;
    if (ok && !p2p) ++groups_.at(e->group).completed;
  }
}

std::vector<LedgerEntry> Ledger::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {entries_.begin(), entries_.end()};
}

std::vector<std::string> Ledger::group_names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& g : groups_) out.push_back(g.name);
  return out;
}

RankStatus Ledger::status(int global_rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  RankStatus s;
  s.global_rank = global_rank;
  auto text = [](const LedgerEntry& e) {
    Descriptor d;  // only the fields describe() prints
    d.op = e.op;
    d.dtype = e.dtype;
    d.reduce = e.reduce;
    std::tie(d.count, d.root, d.tag) = std::tie(e.count, e.root, e.tag);
    return describe(d);
  };
  if (has_last_) {
    const bool p2p = last_.op == OpKind::kSend || last_.op == OpKind::kRecv || last_.op == OpKind::kSendRecvBatch;
    s.last = detail::cat(text(last_), " on ", groups_[last_.group].name, p2p ? " after collective #" : " #",
                         last_.group_seq);
  } else {
    s.last = "nothing yet";
  }
  for (const auto& g : groups_) s.groups.push_back({g.name, g.issued, g.completed, g.last.seq ? text(g.last) : ""});
  const double now = now_us();
  // The oldest running call, else the newest failed one.
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    const LedgerEntry& e = *it;
    char buf[64];
    const bool p2p = e.op == OpKind::kSend || e.op == OpKind::kRecv || e.op == OpKind::kSendRecvBatch;
    const std::string what = detail::cat(op_name(e.op), p2p ? " after collective #" : " #", e.group_seq, " on ",
                                         groups_[e.group].name);
    if (e.state == LedgerEntry::State::kRunning) {
      std::snprintf(buf, sizeof buf, " for %.1f s", (now - e.start_us) * 1e-6);
      s.state = detail::cat("in ", what, buf);
    } else if (e.state == LedgerEntry::State::kFailed && s.state.empty()) {
      std::snprintf(buf, sizeof buf, " %.1f s ago", (now - e.end_us) * 1e-6);
      s.state = detail::cat("failed in ", what, buf);
    }
  }
  if (s.state.empty()) s.state = "not in a collective";
  return s;
}

}  // namespace loom::comm
