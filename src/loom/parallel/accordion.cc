// Note [Accordion] (accordion.h).
#include "loom/parallel/accordion.h"

#include <cmath>
#include <sstream>

#include "loom/core/error.h"

namespace loom::parallel {

Accordion::Accordion(const CompressSpec& spec, const std::vector<Bucket>& buckets) : spec_(spec) {
  LOOM_CHECK(spec.window >= 1, "parallel.accordion_window = ", spec.window, ": expected >= 1");
  for (const Bucket& b : buckets) {
    PerBucket p;
    p.sum.assign(size_t(b.count), 0.0f);
    buckets_.push_back(std::move(p));
  }
}

void Accordion::apply(const std::vector<std::unique_ptr<BucketCompressor>>& compressors) const {
  LOOM_ASSERT(compressors.size() == buckets_.size());
  for (size_t b = 0; b < buckets_.size(); b++) compressors[b]->set_heavy(heavy(b));
}

void Accordion::observe(size_t b, std::span<const float> g, int64_t step, BucketCompressor& c) {
  PerBucket& p = buckets_[b];
  LOOM_ASSERT(g.size() == p.sum.size());
  for (size_t i = 0; i < g.size(); i++) p.sum[i] += g[i];
  if (++p.meta[2] < float(spec_.window)) return;
  double sq = 0;
  for (float x : p.sum) sq += double(x) * x;
  const float norm = float(std::sqrt(sq)), prev = p.meta[0];
  // Critical: the first window, a previous norm of zero, or a relative change >= eta.
  const double change = prev > 0 ? std::fabs(double(prev) - norm) / prev : INFINITY;
  const bool heavy = prev >= 0 && change < spec_.eta;
  if (heavy != (p.meta[1] != 0.0f)) {
    std::ostringstream os;
    os << "accordion: bucket " << b << " -> " << (heavy ? "heavy" : "light") << " ("
       << (spec_.kind == CompressKind::kPowerSgd
               ? "rank " + std::to_string(heavy ? spec_.heavy_rank : spec_.rank)
               : "ratio " + std::to_string(heavy ? spec_.heavy_ratio : spec_.ratio))
       << ") after step " << step + 1 << ": window gradient norm " << prev << " -> " << norm << ", change "
       << change << (heavy ? " < " : " >= ") << "eta " << spec_.eta;
    log_.push_back(os.str());
  }
  p.meta = {norm, heavy ? 1.0f : 0.0f, 0.0f};
  std::fill(p.sum.begin(), p.sum.end(), 0.0f);
  c.set_heavy(heavy);
}

std::vector<std::string> Accordion::take_log() {
  std::vector<std::string> out;
  out.swap(log_);
  return out;
}

std::vector<CompressorState> Accordion::state(size_t b) {
  return {{"accordion sum", &buckets_[b].sum}, {"accordion meta", &buckets_[b].meta}};
}

}  // namespace loom::parallel
