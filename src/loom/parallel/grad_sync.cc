#include "loom/parallel/grad_sync.h"

#include <algorithm>

#include "loom/comm/world.h"
#include "loom/core/error.h"

namespace loom::parallel {

std::vector<FlatRange> DataParallelPlan::owned(int dp_rank) const {
  LOOM_ASSERT(dp_rank >= 0 && dp_rank < dp);
  std::vector<FlatRange> out;
  for (const Bucket& b : buckets) {
    const int64_t piece = b.count / dp;
    out.push_back({b.offset + dp_rank * piece, piece});
  }
  return out;
}

DataParallelPlan plan_from_buckets(const ModelConfig& m, int dp, bool sharded, const ModelPart& part,
                                   std::vector<Bucket> buckets) {
  LOOM_CHECK(dp >= 1, "data-parallel degree must be >= 1, got ", dp);
  DataParallelPlan plan;
  plan.dp = dp;
  plan.buckets = std::move(buckets);
  // Segments in layout order: each bucket is a run [first_tensor, last_tensor].
  std::vector<Bucket> by_layout = plan.buckets;
  std::sort(by_layout.begin(), by_layout.end(),
            [](const Bucket& a, const Bucket& b) { return a.first_tensor < b.first_tensor; });
  for (const Bucket& b : by_layout) plan.padding.segment_last.push_back(b.last_tensor);
  plan.padding.multiple = ParamLayout::kAlignFloats * (sharded ? dp : 1);
  // Re-measure every bucket in the padded layout: it spans from its first tensor to the
  // next bucket's first tensor (or the end of the buffer), padding included.
  const ParamLayout padded(m, plan.padding, part);
  const auto& specs = padded.specs();
  for (Bucket& b : plan.buckets) {
    b.offset = specs[b.first_tensor].offset;
    const int64_t end = b.last_tensor + 1 < int(specs.size()) ? specs[b.last_tensor + 1].offset : padded.total_floats();
    b.count = end - b.offset;
    LOOM_ASSERT(b.count % plan.padding.multiple == 0);
  }
  return plan;
}

DataParallelPlan plan_data_parallel(const ModelConfig& m, int dp, const BucketCaps& caps, bool sharded,
                                    const ModelPart& part) {
  const ParamLayout base(m, {}, part);
  std::vector<TensorExtent> extents;
  for (const ParamSpec& s : base.specs()) extents.push_back({s.offset, s.numel});
  return plan_from_buckets(m, dp, sharded, part, assign_buckets(extents, caps));
}

GradSync::GradSync(comm::Group& dp, const DataParallelPlan& plan, Mode mode) : dp_(dp), plan_(plan), mode_(mode) {
  LOOM_CHECK(plan.dp == dp.size(), "data-parallel plan for ", plan.dp, " ranks used on group ", dp.name(), " of ",
             dp.size());
}

void GradSync::begin(float* grads) {
  LOOM_ASSERT(grads_ == nullptr && pending_.empty());
  grads_ = grads;
  next_ = 0;
  begin_us_ = dp_.world().ledger().now_us();
}

void GradSync::on_ready(int first_final) {
  if (!grads_) return;
  if (mode_ == Mode::kShardEveryMicro) release_done(false);
  const comm::CallOptions async{.async = true};
  for (; next_ < plan_.buckets.size() && plan_.buckets[next_].first_tensor >= first_final; next_++) {
    const Bucket& b = plan_.buckets[next_];
    if (b.first_tensor == 0 && hold_first_ && !finishing_) return;
    std::span<float> all(grads_ + b.offset, size_t(b.count));
    if (mode_ == Mode::kAllReduce) {
      pending_.push_back(dp_.all_reduce(all, comm::ReduceOp::kAvg, async));
    } else {
      const size_t piece = size_t(b.count / plan_.dp);
      std::span<float> own = all.subspan(size_t(dp_.group_rank()) * piece, piece);
      const comm::ReduceOp op = mode_ == Mode::kShardEveryMicro ? comm::ReduceOp::kSum : comm::ReduceOp::kAvg;
      pending_.push_back(dp_.reduce_scatter(std::span<const float>(all), own, op, async));
    }
    pending_bucket_.push_back(next_);
    if (tracker_) tracker_->sample();
  }
}

void GradSync::finish(bool last_micro) {
  LOOM_ASSERT(grads_ != nullptr);
  comm::Ledger& ledger = dp_.world().ledger();
  const double backward_end = ledger.now_us();
  finishing_ = true;
  on_ready(0);
  finishing_ = false;
  for (comm::Work& w : pending_) w.wait();
  if (tracker_) tracker_->sample();
  if (mode_ == Mode::kShardEveryMicro) {
    release_done(true);
    if (last_micro)
      for (const Bucket& b : plan_.buckets) {
        const int64_t piece = b.count / plan_.dp, own = b.offset + dp_.group_rank() * piece;
        const float inv = 1.0f / float(plan_.dp);
        for (float* g = grads_ + own; g < grads_ + own + piece; g++) *g *= inv;
      }
  }
  const double done = ledger.now_us();
  exposed_s_ += (done - backward_end) * 1e-6;
  windows_.push_back({begin_us_, backward_end, done});
  pending_.clear();
  pending_bucket_.clear();
  released_ = 0;
  grads_ = nullptr;
}

// Hands back the non-owned part of every reduced bucket, in launch order, stopping at the
// first one still running unless wait_all (Note [Resident memory]).
void GradSync::release_done(bool wait_all) {
  for (; released_ < pending_.size(); released_++) {
    if (!wait_all && !pending_[released_].done()) return;
    pending_[released_].wait();
    const Bucket& b = plan_.buckets[pending_bucket_[released_]];
    const int64_t piece = b.count / plan_.dp, own = b.offset + dp_.group_rank() * piece;
    release_pages(grads_ + b.offset, (own - b.offset) * int64_t(sizeof(float)));
    release_pages(grads_ + own + piece, (b.offset + b.count - own - piece) * int64_t(sizeof(float)));
  }
}

// Note [Overlap]
// A bucket's collective is hidden when it runs while backward is still computing. From the
// ledger (start/end of each of this group's reductions inside a step's window) the busy
// time is the union of the intervals; the hidden part is the union clipped at the moment
// backward ended. hidden_fraction = hidden / busy over all steps; 1 when nothing ran.
double GradSync::hidden_fraction() const {
  const comm::Ledger& ledger = dp_.world().ledger();
  const int group = dp_.ledger_group();
  double busy = 0, hidden = 0;
  const std::vector<comm::LedgerEntry> entries = ledger.entries();
  for (const Window& w : windows_) {
    std::vector<std::pair<double, double>> spans;
    for (const comm::LedgerEntry& e : entries)
      if (e.group == group && (e.op == comm::OpKind::kAllReduce || e.op == comm::OpKind::kReduceScatter) &&
          e.state == comm::LedgerEntry::State::kDone && e.start_us >= w.begin_us && e.end_us <= w.done_us)
        spans.push_back({e.start_us, e.end_us});
    std::sort(spans.begin(), spans.end());
    double lo = -1, hi = -1;
    auto flush = [&] {
      if (hi <= lo) return;
      busy += hi - lo;
      hidden += std::max(0.0, std::min(hi, w.backward_end_us) - lo);
    };
    for (auto [s, e] : spans) {
      if (s > hi) flush(), lo = s, hi = e;
      else hi = std::max(hi, e);
    }
    flush();
  }
  return busy > 0 ? hidden / busy : 1.0;
}

}  // namespace loom::parallel
