#include "loom/core/elastic.h"

#include <algorithm>
#include <array>
#include <functional>
#include <optional>
#include <set>
#include <tuple>

#include "loom/core/error.h"

namespace loom {

namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = n; d >= 1; --d)
    if (n % d == 0) out.push_back(d);
  return out;
}

// dp' for `split` ranks a replica: the largest that fits the slots and divides the
// micro-batches (0: none).
int64_t fitting_dp(int64_t slots, int64_t split, int64_t micros) {
  for (int64_t dp = std::min(slots / split, micros); dp >= 1; --dp)
    if (micros % dp == 0) return dp;
  return 0;
}

// cfg with the split (tp, pp, cp), ZeRO stage and dp, what no longer divides dropped (Note
// [Elastic shapes]).
Config with_split(const Config& cfg, const ElasticShape& s) {
  Config c = cfg;
  ParallelConfig& q = c.parallel;
  if (s.pp != q.pp) q.pp_layers.clear();
  if (s.pp == 1 || c.model.layers % (s.pp * q.vpp) != 0) q.vpp = 1;
  if (s.pp == 1) q.schedule = ScheduleKind::k1F1B;
  q.sp = q.sp && s.tp > 1;
  q.tp = s.tp, q.pp = s.pp, q.cp = s.cp, q.dp = s.dp, q.zero = s.zero, q.micro_batch = s.micro_batch;
  c.train.grad_accum = s.grad_accum;
  return c;
}

}  // namespace

Config with_shape(const Config& cfg, const ElasticShape& s) { return with_split(cfg, s); }

std::vector<std::string> ElasticShape::sets() const {
  std::vector<std::string> out = {"parallel.dp=" + std::to_string(dp), "train.grad_accum=" + std::to_string(grad_accum),
                                  "parallel.micro_batch=" + std::to_string(micro_batch)};
  if (!replanned) return out;
  for (const auto& [key, v] :
       {std::pair<const char*, int64_t>{"tp", tp}, {"pp", pp}, {"cp", cp}, {"vpp", vpp}, {"zero", zero}})
    out.push_back(std::string("parallel.") + key + "=" + std::to_string(v));
  out.insert(out.end(), {"parallel.pp_layers=", "parallel.sp=" + std::string(sp ? "true" : "false"),
                         std::string("parallel.schedule=") + schedule_name(schedule)});
  return out;
}

std::string ElasticShape::split_text() const {
  return "tp " + std::to_string(tp) + " pp " + std::to_string(pp) + " cp " + std::to_string(cp) +
         (zero_raised ? " zero " + std::to_string(zero) : "");
}

ElasticShape elastic_shape(const Config& cfg, int64_t slots, const std::function<std::string(const ElasticShape&)>& refuses) {
  const ParallelConfig& p = cfg.parallel;
  ElasticShape kept;
  const int64_t micro = cfg.micro_batch();
  kept.micro_batch = micro, kept.tp = p.tp, kept.pp = p.pp, kept.cp = p.cp, kept.vpp = p.vpp, kept.zero = p.zero;
  if (p.servers() > 0)
    kept.problem = "a parameter-server job does not re-form (its servers hold the only copy of the state)";
  else if (micro <= 0 || cfg.train.batch % micro != 0)
    kept.problem = "train.batch " + std::to_string(cfg.train.batch) + " is not a multiple of the micro-batch " +
                   std::to_string(micro);
  if (!kept.problem.empty()) return kept;
  const int64_t micros = cfg.train.batch / micro;  // micro-batches of the global batch
  using Split = std::array<int64_t, 4>;  // {tp, pp, cp, zero}
  std::set<Split> tried;
  std::optional<ElasticShape> first;  // the first shape that passes the config checks
  std::string refusal;                // what `refuses` said of it
  int64_t checked = 0;
  // One tier: each split at the largest dp' its ranks fit, in the order of preference (the most
  // slots used; then the larger tp', pp', cp', the least change from a split it divides, or in
  // the last tier the smallest split first; then the lower ZeRO stage); the first `refuses`
  // accepts, if any.
  auto tier = [&](const std::vector<Split>& splits, bool smallest_first) -> std::optional<ElasticShape> {
    std::vector<ElasticShape> got;
    for (const Split& split : splits) {
      if (!tried.insert(split).second) continue;
      const auto [tp, pp, cp, zero] = split;
      ElasticShape s = kept;
      s.tp = tp, s.pp = pp, s.cp = cp, s.zero = zero;
      s.dp = fitting_dp(slots, tp * pp * cp, micros);
      if (s.dp == 0) continue;
      s.grad_accum = micros / s.dp, s.ranks = s.dp * tp * pp * cp;
      const Config c = with_split(cfg, s);
      if (!validation_errors(c).empty()) continue;
      s.zero_raised = zero != p.zero;
      s.replanned = tp != p.tp || pp != p.pp || cp != p.cp || s.zero_raised;
      s.vpp = c.parallel.vpp, s.sp = c.parallel.sp, s.schedule = c.parallel.schedule;
      got.push_back(s);
    }
    std::stable_sort(got.begin(), got.end(), [&](const ElasticShape& a, const ElasticShape& b) {
      const int64_t sa = smallest_first ? a.tp * a.pp * a.cp : 0, sb = smallest_first ? b.tp * b.pp * b.cp : 0;
      return std::tuple(-a.ranks, sa, -a.tp, -a.pp, -a.cp, a.zero) < std::tuple(-b.ranks, sb, -b.tp, -b.pp, -b.cp, b.zero);
    });
    for (const ElasticShape& s : got) {
      const std::string no = refuses ? refuses(s) : "";
      ++checked;
      if (!first) first = s, refusal = no;
      if (no.empty()) return s;
    }
    return std::nullopt;
  };
  // 1: the split kept; 2: smaller splits (tp' | tp, pp' | pp, cp' | cp); 3: those with a higher
  // ZeRO stage; 4: any split the slots hold, at any ZeRO stage from the config's.
  std::vector<Split> smaller, sharded, any;
  for (const int64_t tp : divisors(p.tp))
    for (const int64_t pp : divisors(p.pp))
      for (const int64_t cp : divisors(p.cp)) {
        smaller.push_back({tp, pp, cp, p.zero});
        for (int64_t z = p.zero + 1; z <= 3; ++z) sharded.push_back({tp, pp, cp, z});
      }
  if (auto s = tier({{p.tp, p.pp, p.cp, p.zero}}, false)) return *s;
  if (auto s = tier(smaller, false)) return *s;
  if (auto s = tier(sharded, false)) return *s;
  for (int64_t tp = 1; tp <= slots && tp <= cfg.model.heads; ++tp)  // (the checks' cheap part first)
    for (int64_t pp = 1; tp * pp <= slots && pp <= cfg.model.layers && cfg.model.heads % tp == 0; ++pp)
      for (int64_t cp = 1; tp * pp * cp <= slots && cp <= cfg.seq_len(); ++cp)
        for (int64_t z = p.zero; z <= 3 && cfg.seq_len() % cp == 0; ++z) any.push_back({tp, pp, cp, z});
  if (auto s = tier(any, true)) return *s;
  if (!first) {
    kept.problem = std::to_string(slots) + " slots hold no replica of the model's split (cp x tp x pp = " +
                   std::to_string(p.cp * p.tp * p.pp) + " ranks), and no other split passes the config checks";
    return kept;
  }
  ElasticShape none = *first;
  none.problem = "none of the " + std::to_string(checked) + " layouts the " + std::to_string(slots) +
                 " slots hold fits; the first (" + none.split_text() + ", dp " + std::to_string(none.dp) + "): " + refusal;
  return none;
}

ElasticRange parse_elastic(const std::string& spec) {
  const size_t colon = spec.find(':');
  auto number = [&](const std::string& t) {
    if (t.empty() || t.size() > 5 || !std::all_of(t.begin(), t.end(), ::isdigit) || std::stoi(t) < 1)
      throw ConfigError("--elastic " + spec + ": expected MIN:MAX hosts, positive whole numbers with MIN <= MAX (e.g. 2:4)");
    return std::stoi(t);
  };
  ElasticRange r;
  r.min_hosts = number(spec.substr(0, colon));
  r.max_hosts = colon == std::string::npos ? r.min_hosts : number(spec.substr(colon + 1));
  if (r.min_hosts > r.max_hosts)
    throw ConfigError("--elastic " + spec + ": MIN " + std::to_string(r.min_hosts) + " is above MAX " +
                      std::to_string(r.max_hosts));
  return r;
}

}  // namespace loom
