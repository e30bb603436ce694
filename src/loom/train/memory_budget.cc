#include "loom/train/memory_budget.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <numeric>
#include <sstream>
#include <vector>

#include "loom/comm/agree.h"
#include "loom/comm/group.h"
#include "loom/comm/world.h"
#include "loom/core/error.h"
#include "loom/core/hosts.h"
#include "loom/model/layout.h"
#include "loom/engine/engine.h"
#include "loom/parallel/rank_plan.h"
#include "loom/train/rank_context.h"

namespace loom {

std::string bytes_text(int64_t bytes) {
  char buf[32];
  if (bytes >= (int64_t(1) << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / double(1 << 30));
  else std::snprintf(buf, sizeof buf, "%.0f MiB", double(bytes) / double(1 << 20));
  return buf;
}

namespace {

// A rank of a layout, as its memory estimate needs it: its plan, ZeRO stage and dp group size
// (dp x cp ranks; a parameter-server worker's: the workers).
struct RankSpot {
  const RankPlan& plan;
  int zero = 0, dp_size = 1;
};

// What would shrink an estimate that does not fit: the remedy of the largest category
// first; splitting the model last.
std::string remedies(const Config& cfg, const RankSpot& rc, const MemoryEstimate& e) {
  std::vector<std::pair<int64_t, std::string>> out;  // (bytes of the category it shrinks, text)
  // Sub-groups small enough that the buffers take at most half of the state: the
  // configured size, else the largest power of two (in MiB) with buffers <= a quarter.
  OffloadConfig o = cfg.offload;
  o.optimizer = OffloadTier::kDisk;
  const int64_t state = e.moment_floats;
  const bool too_big = o.buffer_bytes(state) * 2 > e.optimizer_in_memory;
  if (too_big) {
    const double quarter_mb = double(state) * 4 / (4.0 * double(o.slots)) / double(1 << 20);
    o.sub_group_mb = std::exp2(std::max(-10.0, std::floor(std::log2(std::max(quarter_mb, 1e-6)))));
  }
  if (cfg.offload.optimizer != OffloadTier::kDisk && e.optimizer > 0)
    out.push_back({e.optimizer, "set offload.optimizer = disk with offload.dir (optimizer " + bytes_text(e.optimizer) +
                                    " -> " + bytes_text(o.buffer_bytes(state)) +
                                    " of buffers at offload.sub_group_mb = " + detail::cat(o.sub_group_mb) + ")"});
  else if (cfg.offload.optimizer == OffloadTier::kDisk && too_big)  // the buffers outweigh the state they stream
    out.push_back({e.optimizer, "lower offload.sub_group_mb to " + detail::cat(o.sub_group_mb) + " (optimizer buffers " +
                                    bytes_text(e.optimizer) + " -> " + bytes_text(o.buffer_bytes(state)) + ")"});
  if (cfg.offload.params != OffloadTier::kDisk && e.params > e.params_offloaded)
    out.push_back({e.params, "set offload.params = disk with offload.optimizer = disk (params " + bytes_text(e.params) +
                                 " -> " + bytes_text(e.params_offloaded) + ": the units in use and the one read ahead)"});
  if (cfg.offload.grads != OffloadTier::kDisk && cfg.parallel.world() == 1 && e.grads > e.params_offloaded)
    out.push_back({e.grads, "set offload.grads = disk with offload.params = disk and a whole offload.chunk_mb (grads " +
                                bytes_text(e.grads) + " -> " + bytes_text(e.params_offloaded) + ")"});
  if (rc.dp_size > 1 && rc.zero < 3)
    out.push_back({rc.zero == 0 ? e.optimizer : rc.zero == 1 ? e.grads : e.params,
                   "set parallel.zero = " + std::to_string(rc.zero + 1) + " (shards " +
                       (rc.zero == 0 ? "the optimizer state" : rc.zero == 1 ? "the gradients" : "the parameters") +
                       " over dp " + std::to_string(rc.dp_size) + ")"});
  if (e.activations > 0)
    out.push_back({e.activations, "lower the micro-batch (raise train.grad_accum, or lower train.batch / train.seq) "
                                  "or set parallel.recompute = full (activations " + bytes_text(e.activations) + ")"});
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string s;
  for (const auto& [bytes, text] : out) s += text + "; or ";
  return s + "split the model (parallel.tp / pp), or size it first with `loom simulate`";
}

}  // namespace

namespace {

// The estimate of this rank's resident state, and the refusal when it does not fit the budget
// (or, without one, the machine) on its own. The activations are the model's own carve
// (activation_floats), after a floating-point estimate has ruled out sizes whose integer
// products would overflow (need: INT64_MAX). A pure function of the config and the rank's
// plan (Note [Rank plan]): the elastic supervisor asks it of layouts no rank runs yet.
std::pair<int64_t, std::string> rank_need(const Config& cfg, const RankSpot& rc, int64_t mb, int64_t T) {
  const RankPlan& plan = rc.plan;
  const int64_t params = ParamLayout(cfg.model, {}, plan.part).param_count();
  const ModelConfig& m = cfg.model;
  // Per layer and slot at least: the residual stream, qkv, the ffn activations, the
  // attention probabilities (B, H, T, T); the logits (B, T, V) once.
  const double rough = double(mb) * double(T) *
                       (double(m.layers) * (4.0 * double(m.d_model) + double(m.ffn) + double(m.heads) * double(cfg.seq_len())) +
                        double(m.vocab)) * 4.0 * double(std::max(1, plan.act_slots));
  int64_t acts = -1;  // unknown: beyond any memory
  if (rough < double(int64_t(1) << 56))
    acts = 4 * activation_floats(m, plan.part, mb, T, plan.act_slots, plan.recompute, cfg.parallel.sp,
                                 cfg.train.precision == Precision::kBf16, plan.w_slots,
                                 key_seq_of(cfg.parallel.cp, cfg.parallel.cp_mode, cfg.seq_len()));
  std::vector<int64_t> units = plan.unit_floats;
  std::sort(units.begin(), units.end(), std::greater<>());
  units.resize(std::min<size_t>(units.size(), 3));
  // Note [Part memory estimates]: what the parts this rank's engine would be made of hold.
  EstimateInputs in{cfg, rc.zero, rc.dp_size, params, std::max<int64_t>(acts, 0),
                    std::accumulate(units.begin(), units.end(), int64_t(0)), plan.pp_rank};
  if (plan.duties.grad == rank::GradPath::kShardEveryMicro && rc.dp_size > 1)
    in.unreduced_floats = parallel::unreduced_peak_floats(plan.dp_plan, plan.layout.specs(),
                                                          m.arch == Arch::kGpt && plan.part.head && plan.part.embed);
  const MemoryEstimate e = estimate_parts(in);
  const int64_t need = acts >= 0 ? e.total() : std::numeric_limits<int64_t>::max();
  const bool budget = cfg.memory.limit_gib > 0;
  const int64_t have = budget ? int64_t(cfg.memory.limit_gib * double(int64_t(1) << 30))
                              : int64_t(::sysconf(_SC_PHYS_PAGES)) * int64_t(::sysconf(_SC_PAGESIZE));
  if (have <= 0 || need <= have) return {need, ""};
  std::ostringstream os;
  os << "model.preset '" << m.preset << "': this rank's part holds " << params << " parameters (ZeRO-" << rc.zero
     << ", dp " << rc.dp_size << "); its resident state needs params " << bytes_text(e.params) << ", grads "
     << bytes_text(e.grads) << ", optimizer " << bytes_text(e.optimizer) << ", activations at micro-batch " << mb
     << " x seq " << T << " "
     << (acts >= 0 ? bytes_text(acts) : "more than " + bytes_text(int64_t(std::min(rough, 9e18)))) << " = "
     << (acts >= 0 ? bytes_text(e.total()) : std::string("too much")) << ", but "
     << (budget ? "memory.limit_gib allows " : "this machine has ") << bytes_text(have) << "; "
     << remedies(cfg, rc, e);
  return {need, os.str()};
}

// A number of bytes from the first line of `path` ("max" or unreadable: 0).
int64_t number_in(const std::string& path) {
  std::ifstream in(path);
  long long v = 0;
  return in >> v ? int64_t(v) : 0;
}

}  // namespace

int64_t host_available_bytes() {
  int64_t avail = 0;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    long long kib = 0;
    meminfo >> kib;
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
    if (key == "MemAvailable:") avail = int64_t(kib) * 1024;
  }
  if (avail <= 0) avail = int64_t(::sysconf(_SC_AVPHYS_PAGES)) * int64_t(::sysconf(_SC_PAGESIZE));
  // cgroup v2: /proc/self/cgroup's "0::PATH"; the limit less what the group already uses.
  std::ifstream self("/proc/self/cgroup");
  for (std::string line; std::getline(self, line);)
    if (line.rfind("0::", 0) == 0) {
      const std::string dir = "/sys/fs/cgroup" + line.substr(3);
      if (const int64_t limit = number_in(dir + "/memory.max"); limit > 0)
        avail = std::min(avail, std::max<int64_t>(0, limit - number_in(dir + "/memory.current")));
    }
  return std::max<int64_t>(avail, 0);
}

std::string host_memory_problem(const std::vector<RankMemory>& ranks, const std::vector<std::string>& hosts) {
  std::vector<std::string> seen;
  for (const std::string& h : hosts)
    if (std::find(seen.begin(), seen.end(), h) == seen.end()) seen.push_back(h);
  std::ostringstream os;
  for (const std::string& h : seen) {
    double need = 0;  // in double: an unknown estimate is INT64_MAX
    int64_t avail = std::numeric_limits<int64_t>::max();
    std::string who, each;
    for (size_t r = 0; r < ranks.size() && r < hosts.size(); ++r) {
      if (hosts[r] != h) continue;
      need += double(ranks[r].need);
      if (ranks[r].available > 0) avail = std::min(avail, ranks[r].available);
      const std::string name = std::to_string(ranks[r].rank);
      who += (who.empty() ? "" : ", ") + name;
      each += std::string(each.empty() ? "" : ", ") + "rank " + name + " " +
              (ranks[r].need == std::numeric_limits<int64_t>::max() ? "too much" : bytes_text(ranks[r].need));
    }
    if (avail == std::numeric_limits<int64_t>::max() || need <= double(avail)) continue;
    os << "\n  host " << h << " runs ranks " << who << ", whose estimates add up to " << bytes_text(int64_t(std::min(need, 9e18)))
       << " (" << each << ") but it has " << bytes_text(avail) << " available";
  }
  const std::string found = os.str();
  if (found.empty()) return "";
  return "preflight: the ranks of a host need more memory than it has (Note [Host memory preflight]; each estimate "
         "counts the rank's parameters, gradients, optimizer state and activations):" + found +
         "\n  run fewer ranks on such a host (spread the job over more hosts), or shrink each rank's state: "
         "parallel.zero, offload.optimizer = disk, parallel.recompute = full, a smaller micro-batch, or split the model "
         "further (parallel.tp / pp); `loom simulate` sizes a layout first";
}

void check_fits(const Config& cfg, const RankContext& rc, int64_t mb, int64_t T,
                const std::function<int64_t()>& host_memory) {
  const auto [need, alone] = rank_need(cfg, {*rc.plan, rc.zero, rc.dp_size}, mb, T);
  comm::Group* group = everyone(rc);
  const int rank = group ? group->group_rank() : 0;
  agree_or_throw(group, rank, alone.empty() ? nullptr : std::make_exception_ptr(ConfigError(alone)));
  // Note [Host memory preflight]: every rank's (need, available), then one verdict everywhere.
  const RankMemory mine{need, host_memory ? host_memory() : host_available_bytes(), 0};
  std::vector<RankMemory> all{mine};
  std::vector<std::string> hosts{this_host()};
  if (group && group->size() > 1) {
    const int64_t packed[2] = {mine.need, mine.available};
    std::vector<int64_t> got(size_t(2 * group->size()));
    group->all_gather(std::span<const int64_t>(packed, 2), std::span<int64_t>(got));
    all.clear(), hosts.clear();
    for (int r = 0; r < group->size(); ++r) {
      const size_t g = size_t(group->global_rank_of(r));
      all.push_back({got[size_t(2 * r)], got[size_t(2 * r + 1)], int(g)});
      const std::vector<std::string>& named = group->world().hosts();
      hosts.push_back(g < named.size() ? named[g] : "?");
    }
  }
  if (const std::string problem = host_memory_problem(all, hosts); !problem.empty()) throw ConfigError(problem);
}

namespace {

// Rank `r` of cfg's layout's estimate, and its refusal on its own (rank_need).
std::pair<int64_t, std::string> layout_rank_need(const Config& cfg, int r) {
  const ParallelConfig& p = cfg.parallel;
  const int dp_size = p.servers() > 0 ? int(p.dp) : std::max<int>(1, int(p.dp_ranks()));
  return rank_need(cfg, {plan_rank(cfg, r), int(p.zero), dp_size}, cfg.micro_batch(), cfg.local_seq());
}

}  // namespace

int64_t rank_need_bytes(const Config& cfg, int global_rank) { return layout_rank_need(cfg, global_rank).first; }

std::string layout_memory_problem(const Config& cfg, const std::vector<std::string>& host_of_rank,
                                  int64_t host_available) {
  std::vector<RankMemory> ranks;
  for (int r = 0; r < int(cfg.parallel.world()); ++r) {
    const auto [need, alone] = layout_rank_need(cfg, r);
    if (!alone.empty()) return "rank " + std::to_string(r) + ": " + alone;
    ranks.push_back({need, host_available, r});
  }
  std::vector<std::string> hosts = host_of_rank;
  hosts.resize(ranks.size(), "?");
  return host_memory_problem(ranks, hosts);
}

void check_budget(const Config& cfg, const MemoryTracker& memory, comm::Group* group, int group_rank) {
  if (!(cfg.memory.limit_gib > 0)) return;
  const int64_t budget = int64_t(cfg.memory.limit_gib * double(int64_t(1) << 30));
  std::exception_ptr over;
  if (memory.peak_total() > budget) {
    std::ostringstream os;
    os << "memory.limit_gib = " << cfg.memory.limit_gib << ": this rank held " << bytes_text(memory.peak_total())
       << " at its peak, over the budget of " << bytes_text(budget) << " (peaks:";
    for (const MemoryTracker::Row& r : memory.rows()) os << " " << r.name << " " << bytes_text(r.peak_bytes);
    os << "); raise memory.limit_gib, or shrink the largest category (offload.optimizer = disk, parallel.zero, a "
          "smaller micro-batch, parallel.recompute = full)";
    over = std::make_exception_ptr(Error(os.str()));
  }
  agree_or_throw(group, group_rank, over);
}

}  // namespace loom
