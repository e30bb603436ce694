#include "loom/core/elastic.h"

#include <algorithm>

#include "loom/core/error.h"

namespace loom {

ElasticShape elastic_shape(const Config& cfg, int64_t slots) {
  const ParallelConfig& p = cfg.parallel;
  ElasticShape s;
  const int64_t split = p.cp * p.tp * p.pp, micro = cfg.micro_batch();
  s.micro_batch = micro;
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
  for (int64_t dp = std::min(slots / split, micros); dp >= 1; --dp)
    if (micros % dp == 0) {
      s.dp = dp, s.grad_accum = micros / dp, s.ranks = dp * split;
      return s;
    }
  s.problem = std::to_string(slots) + " slots hold no replica of the model's split (cp x tp x pp = " +
              std::to_string(split) + " ranks)";
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
