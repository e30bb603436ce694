#include "loom/train/trace.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loom/comm/group.h"
#include "loom/comm/ledger.h"
#include "loom/core/error.h"
#include "loom/core/fileio.h"

namespace loom {

Trace::Trace(int rank, double origin_steady_us) : rank_(rank), origin_(origin_steady_us) {}

double Trace::now_us() const {
  const double steady = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
  return steady - origin_;
}

void Trace::begin(const std::string& name, const std::string& cat, Args args) {
  open_.push_back({name, cat, now_us(), std::move(args)});
}

Spans::Scope::~Scope() {
  if (t_) t_->end();
}

Spans::Scope Spans::open(const std::string& name, const char* category, Trace::Args args) const {
  if (t_) t_->begin(name, category, std::move(args));
  return Scope(t_);
}

void Trace::end() {
  LOOM_ASSERT(!open_.empty());
  Open& o = open_.back();
  span(o.name, o.cat, o.start, now_us(), 0, std::move(o.args));
  open_.pop_back();
}

void Trace::span(const std::string& name, const std::string& cat, double t0_us, double t1_us, int tid, Args args) {
  events_.push_back({name, cat, 'X', t0_us, std::max(0.0, t1_us - t0_us), tid, std::move(args)});
}

void Trace::counter(double t_us, const std::vector<std::pair<std::string, int64_t>>& bytes) {
  events_.push_back({"memory", "memory", 'C', t_us, 0, 0, bytes});
}

void Trace::add_ledger(const comm::Ledger& ledger) {
  const std::vector<std::string> groups = ledger.group_names();
  for (const comm::LedgerEntry& e : ledger.entries()) {
    if (e.state != comm::LedgerEntry::State::kDone && e.state != comm::LedgerEntry::State::kFailed) continue;
    std::string name = std::string(comm::op_name(e.op)) + " " + std::to_string(e.count);
    if (e.group >= 0 && e.group < int(groups.size())) name += " " + groups[size_t(e.group)];
    const bool p2p = e.op == comm::OpKind::kSend || e.op == comm::OpKind::kRecv || e.op == comm::OpKind::kSendRecvBatch;
    span(name, p2p ? "transfer" : "collective", e.start_us, e.end_us, 1);
  }
}

void Trace::add_idle(double min_gap_us) {
  std::vector<std::pair<double, double>> busy;
  for (const Event& e : events_)
    if (e.ph == 'X' && e.tid == 0 && e.cat != "step") busy.push_back({e.ts, e.ts + e.dur});
  std::sort(busy.begin(), busy.end());
  double covered = busy.empty() ? 0 : busy.front().first;
  for (auto [s, e] : busy) {
    if (s - covered >= min_gap_us) span("idle", "idle", covered, s);
    covered = std::max(covered, e);
  }
}

std::string Trace::events_json(double shift_us) const {
  nlohmann::json out = nlohmann::json::array();
  out.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", rank_}, {"args", {{"name", "rank " + std::to_string(rank_)}}}});
  out.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", rank_}, {"tid", 0}, {"args", {{"name", "compute"}}}});
  out.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", rank_}, {"tid", 1}, {"args", {{"name", "communication"}}}});
  for (const Event& e : events_) {
    nlohmann::json j = {{"name", e.name}, {"cat", e.cat}, {"ph", std::string(1, e.ph)}, {"pid", rank_},
                        {"tid", e.tid}, {"ts", e.ts + shift_us}};
    if (e.ph == 'X') j["dur"] = e.dur;
    if (e.ph == 'X' && !e.values.empty()) {
      nlohmann::json args = nlohmann::json::object();
      for (const auto& [k, v] : e.values) args[k] = v;
      j["args"] = args;
    }
    if (e.ph == 'C') {
      nlohmann::json args = nlohmann::json::object();
      for (const auto& [k, v] : e.values) args[k + " MiB"] = double(v) / (1 << 20);
      j["args"] = args;
    }
    out.push_back(std::move(j));
  }
  std::string s = out.dump();
  return s.substr(1, s.size() - 2);  // the elements, to be joined with other ranks'
}

void Trace::write(const std::string& path, comm::Group* world) const {
  // Shift every rank so the earliest rank's origin is t = 0 (max of -origin = -min).
  double neg_origin[1] = {-origin_};
  if (world) world->all_reduce(std::span<double>(neg_origin), comm::ReduceOp::kMax);
  const std::string mine = events_json(origin_ + neg_origin[0]);
  std::vector<std::string> all = {mine};
  if (world && world->size() > 1) {
    int64_t len[1] = {int64_t(mine.size())};
    std::vector<int64_t> lens(size_t(world->size()));
    world->all_gather(std::span<const int64_t>(len), std::span<int64_t>(lens));
    const int64_t longest = *std::max_element(lens.begin(), lens.end());
    std::vector<uint8_t> padded(size_t(longest), ' '), gathered(size_t(longest * world->size()));
    std::copy(mine.begin(), mine.end(), padded.begin());
    world->all_gather(std::span<const uint8_t>(padded), std::span<uint8_t>(gathered));
    all.clear();
    for (int r = 0; r < world->size(); r++)
      all.emplace_back(reinterpret_cast<const char*>(gathered.data()) + r * longest, size_t(lens[size_t(r)]));
    if (world->group_rank() != 0) return;
  }
  // "otherData" marks the file loom's (Note [User-named outputs]); written through a
  // temporary name, never through whatever is at `path`.
  std::string text = "{\"displayTimeUnit\": \"ms\", \"otherData\": {\"generator\": \"loom\"}, \"traceEvents\": [";
  bool first = true;
  for (const std::string& s : all) {
    if (s.empty()) continue;
    text += (first ? "" : ",") + s;
    first = false;
  }
  text += "]}\n";
  write_file_atomic(path, text);
}

}  // namespace loom
