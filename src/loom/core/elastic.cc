#include "loom/core/elastic.h"

#include <algorithm>

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

// cfg with the split (tp, pp, cp) and dp, what no longer divides dropped (Note [Elastic shapes]).
Config with_split(const Config& cfg, int64_t tp, int64_t pp, int64_t cp, int64_t dp, int64_t accum, int64_t micro) {
  Config c = cfg;
  ParallelConfig& q = c.parallel;
  if (pp != q.pp) q.pp_layers.clear();
  if (pp == 1 || c.model.layers % (pp * q.vpp) != 0) q.vpp = 1;
  if (pp == 1) q.schedule = ScheduleKind::k1F1B;
  q.sp = q.sp && tp > 1;
  q.tp = tp, q.pp = pp, q.cp = cp, q.dp = dp, q.micro_batch = micro;
  c.train.grad_accum = accum;
  return c;
}

}  // namespace

Config with_shape(const Config& cfg, const ElasticShape& s) {
  return with_split(cfg, s.tp, s.pp, s.cp, s.dp, s.grad_accum, s.micro_batch);
}

std::vector<std::string> ElasticShape::sets() const {
  std::vector<std::string> out = {"parallel.dp=" + std::to_string(dp), "train.grad_accum=" + std::to_string(grad_accum),
                                  "parallel.micro_batch=" + std::to_string(micro_batch)};
  if (!replanned) return out;
  for (const auto& [key, v] : {std::pair<const char*, int64_t>{"tp", tp}, {"pp", pp}, {"cp", cp}, {"vpp", vpp}})
    out.push_back(std::string("parallel.") + key + "=" + std::to_string(v));
  out.insert(out.end(), {"parallel.pp_layers=", "parallel.sp=" + std::string(sp ? "true" : "false"),
                         std::string("parallel.schedule=") + schedule_name(schedule)});
  return out;
}

std::string ElasticShape::split_text() const {
  return "tp " + std::to_string(tp) + " pp " + std::to_string(pp) + " cp " + std::to_string(cp);
}

ElasticShape elastic_shape(const Config& cfg, int64_t slots) {
  const ParallelConfig& p = cfg.parallel;
  ElasticShape s;
  const int64_t micro = cfg.micro_batch();
  s.micro_batch = micro, s.tp = p.tp, s.pp = p.pp, s.cp = p.cp, s.vpp = p.vpp;
  if (p.servers() > 0) {
    s.problem = "a parameter-server job does not re-form (its servers hold the only copy of the state)";
    return s;
  }
  if (micro <= 0 || cfg.train.batch % micro != 0) {
    s.problem = "train.batch " + std::to_string(cfg.train.batch) + " is not a multiple of the micro-batch " +
                std::to_string(micro);
    return s;
  }
  const int64_t micros = cfg.train.batch / micro;  // micro-batches of the global batch
  if (const int64_t dp = fitting_dp(slots, p.cp * p.tp * p.pp, micros); dp > 0) {
    s.dp = dp, s.grad_accum = micros / dp, s.ranks = dp * p.cp * p.tp * p.pp;
    return s;
  }
  // Re-planned: the split that fits the most slots, then keeps the most of tp, then of pp.
  for (const int64_t tp : divisors(p.tp))
    for (const int64_t pp : divisors(p.pp))
      for (const int64_t cp : divisors(p.cp)) {
        const int64_t dp = fitting_dp(slots, tp * pp * cp, micros);
        if (dp == 0 || dp * tp * pp * cp <= s.ranks) continue;
        const Config c = with_split(cfg, tp, pp, cp, dp, micros / dp, micro);
        if (!validation_errors(c).empty()) continue;
        s.dp = dp, s.grad_accum = micros / dp, s.ranks = dp * tp * pp * cp, s.replanned = true;
        s.tp = tp, s.pp = pp, s.cp = cp, s.vpp = c.parallel.vpp, s.sp = c.parallel.sp, s.schedule = c.parallel.schedule;
      }
  if (s.ranks == 0)
    s.problem = std::to_string(slots) + " slots hold no replica of the model's split (cp x tp x pp = " +
                std::to_string(p.cp * p.tp * p.pp) + " ranks), and no smaller split passes the config checks";
  return s;
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
