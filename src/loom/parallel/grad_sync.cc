#include "loom/parallel/grad_sync.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <cstdint>

#include "loom/comm/world.h"
#include "loom/core/error.h"

namespace loom::parallel {

std::vector<FlatRange> DataParallelPlan::owned(int dp_rank) const {
  LOOM_ASSERT(dp_rank >= 0 && dp_rank < dp);
  std::vector<FlatRange> out;
  for (const Bucket& b : buckets) out.push_back(own_piece(b, dp, dp_rank));
  return out;
}

void release_unowned(const Bucket& b, int dp, int rank, float* base) {
  const FlatRange own = own_piece(b, dp, rank);
  release_pages(base + b.offset, (own.offset - b.offset) * int64_t(sizeof(float)));
  release_pages(base + own.offset + own.count, (b.offset + b.count - own.offset - own.count) * int64_t(sizeof(float)));
}

int64_t unreduced_peak_floats(const DataParallelPlan& plan, const std::vector<ParamSpec>& specs, bool head_writes_wte) {
  std::vector<int> hooks;  // the grad-ready hook's first_final values, in call order
  std::map<int, int> first_of_block;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].layer >= 0) first_of_block.emplace(specs[i].layer, int(i));
    if (specs[i].name == "normf.w") hooks.push_back(int(i));
  }
  for (auto b = first_of_block.rbegin(); b != first_of_block.rend(); ++b) hooks.push_back(b->second);
  hooks.push_back(0);
  std::vector<int64_t> suffix(specs.size() + 1, 0);  // floats of the tensors at or after i
  for (size_t i = specs.size(); i-- > 0;) suffix[i] = suffix[i + 1] + specs[i].numel;
  const int64_t wte = head_writes_wte && !specs.empty() ? specs[0].numel : 0;  // at the first hook
  std::deque<int64_t> running;
  int64_t retired = 0, peak = 0;
  size_t next = 0;
  auto launch = [&](size_t b) {
    if (running.size() >= GradSync::kShardsInFlight) retired += running.front(), running.pop_front();
    running.push_back(plan.buckets[b].count);
  };
  if (plan.tied_first) next = 1;  // wte's bucket is all-reduced whole and stays (Note [Tied embedding reduction])
  for (const int f : hooks) {
    peak = std::max(peak, suffix[size_t(f)] + (f > 0 ? wte : 0) - retired);
    for (; next < plan.buckets.size() && plan.buckets[next].first_tensor >= f; ++next) launch(next);
  }
  return peak;
}

void gather_pieces(comm::Group& dp, const DataParallelPlan& plan, float* full, const float* packed) {
  std::vector<comm::Work> pending;
  int64_t at = 0;
  for (const Bucket& b : plan.buckets) {
    const FlatRange piece = own_piece(b, plan.dp, dp.group_rank());
    std::span<float> all(full + b.offset, size_t(b.count));
    const float* own = packed ? packed + at : full + piece.offset;
    pending.push_back(dp.all_gather(std::span<const float>(own, size_t(piece.count)), all, {.async = true}));
    at += piece.count;
  }
  for (auto& w : pending) w.wait();
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
                                    const ModelPart& part, WteBucket wte) {
  const ParamLayout base(m, {}, part);
  std::vector<TensorExtent> extents;
  for (const ParamSpec& s : base.specs()) extents.push_back({s.offset, s.numel});
  if (wte == WteBucket::kShared) return plan_from_buckets(m, dp, sharded, part, assign_buckets(extents, caps));
  LOOM_CHECK(base.specs().size() > 1 && base.specs()[0].name == "wte", "a plan with wte alone needs wte first");
  // wte alone, first or last; the rest as usual, tensor indices shifted past wte.
  std::vector<Bucket> buckets;
  for (Bucket b : assign_buckets(std::vector<TensorExtent>(extents.begin() + 1, extents.end()), caps)) {
    b.first_tensor++, b.last_tensor++;
    buckets.push_back(b);
  }
  const bool first = wte == WteBucket::kTiedFirst;
  buckets.insert(first ? buckets.begin() : buckets.end(), Bucket{0, 0, 0, 0});
  DataParallelPlan plan = plan_from_buckets(m, dp, sharded, part, std::move(buckets));
  plan.tied_first = first;
  return plan;
}

GradSync::GradSync(comm::Group& dp, const DataParallelPlan& plan, Mode mode, comm::Compression compression)
    : dp_(dp), plan_(plan), mode_(mode), compression_(compression) {
  LOOM_CHECK(plan.dp == dp.size(), "data-parallel plan for ", plan.dp, " ranks used on group ", dp.name(), " of ",
             dp.size());
}

void GradSync::set_compressors(const CompressSpec& spec, const std::vector<ParamSpec>& specs) {
  // Note [Compressed ZeRO-2/3]: the stateful compressors and Adasum reduce whole buckets in
  // every sync mode; so do 1-bit and top-k Adam (Note [Compressed Adam with ZeRO]). 0/1
  // Adam's local steps keep whole moments (ZeRO 0).
  LOOM_CHECK(spec.kind != CompressKind::kZeroOneAdam || mode_ == Mode::kAllReduce, "parallel.compress = ",
             compress_name(spec.kind), " needs the all-reduce sync (ZeRO 0)");
  spec_ = spec;
  specs_ = specs;
  compressors_.clear();
  accordion_.reset();
  if (!spec.post_backward()) return;
  for (size_t b = 0; b < plan_.buckets.size(); b++)
    compressors_.push_back(make_compressor(spec, plan_.buckets[b], specs, plan_.dp));
  if (spec.accordion) accordion_ = std::make_unique<Accordion>(spec, plan_.buckets);
}

void GradSync::set_qgz(bool on) {
  LOOM_CHECK(!on || mode_ != Mode::kAllReduce, "parallel.zeropp_qgz quantises ZeRO-2/3's reduce-scatter; this sync "
                                               "all-reduces (ZeRO 0)");
  qgz_ = on;
}

void GradSync::set_step(int64_t step) {
  step_ = step;
  sync_ = compressors_.empty() ? StepSync::kExact : spec_.sync_at(step);
  if (compressing() && accordion_) accordion_->apply(compressors_);  // the settings a resume restored too
}

// A reduce-scatter is the ring all-reduce's first half (Note [Ring codecs]).
double GradSync::ring_wire_bytes(CompressKind codec) const {
  double bytes = 0;
  for (const Bucket& b : plan_.buckets) bytes += bucket_traffic(codec, 0, 0, {}, 0, -1, b.count, plan_.dp).wire_bytes(plan_.dp);
  return mode_ == Mode::kAllReduce ? bytes : bytes / 2;
}

double GradSync::exact_wire_bytes() const { return ring_wire_bytes(CompressKind::kNone); }

double GradSync::wire_bytes() const {
  double bytes = 0;
  if (compressing()) {
    for (const auto& c : compressors_) bytes += c->wire_bytes();
    return bytes;
  }
  if (qgz_) {
    for (const Bucket& b : plan_.buckets) bytes += QgzScatter::wire_bytes(b.count, plan_.dp);
    return bytes;
  }
  if (compression_ == comm::Compression::kNone) return exact_wire_bytes();
  return ring_wire_bytes(compression_ == comm::Compression::kBF16 ? CompressKind::kBf16 : CompressKind::kInt8);
}

void GradSync::begin(float* grads) {
  LOOM_ASSERT(grads_ == nullptr && pending_.empty());
  grads_ = grads;
  next_ = 0;
  begin_us_ = dp_.world().ledger().now_us();
}

// Bucket 0 (wte) whole under ZeRO 0; under ZeRO-1 its own piece, the rows added to that piece
// only (on_embedding_rows): the update reads nothing else.
void GradSync::on_tied_head_done() {
  if (!grads_ || !plan_.tied_first || next_ > 0 || compressing()) return;
  pending_.push_back(reduce_bucket(plan_.buckets[0]));
  pending_bucket_.push_back(0);
  next_ = 1;
}

// Bucket b's reduction, started: all-reduced whole, or reduce-scattered into this rank's piece
// (summed under kShardEveryMicro, which averages at the step's end).
comm::Work GradSync::reduce_bucket(const Bucket& b) {
  const comm::CallOptions async{.async = true, .compression = compression_};
  std::span<float> all(grads_ + b.offset, size_t(b.count));
  if (mode_ == Mode::kAllReduce) return dp_.all_reduce(all, comm::ReduceOp::kAvg, async);
  const FlatRange piece = own_piece(b, plan_.dp, dp_.group_rank());
  std::span<float> own(grads_ + piece.offset, size_t(piece.count));
  const comm::ReduceOp op = mode_ == Mode::kShardEveryMicro ? comm::ReduceOp::kSum : comm::ReduceOp::kAvg;
  return dp_.reduce_scatter(std::span<const float>(all), own, op, async);  // codec: Note [Ring codecs]
}

bool GradSync::on_embedding_rows(const int32_t* tokens, const float* rows, int64_t n, int64_t C) {
  if (!grads_ || !plan_.tied_first || compressing()) return false;  // compressed: wte is a bucket like any
  LOOM_ASSERT(next_ > 0);
  const int dp = plan_.dp;
  // Ranks may hold different row counts (data.bucketing's micro-batch lengths): gather the
  // counts (sync calls also wait for the queued buckets, bucket 0's all-reduce included),
  // then every rank's rows padded to the longest.
  const int64_t mine[1] = {n};
  std::vector<int64_t> counts(static_cast<size_t>(dp));
  dp_.all_gather(std::span<const int64_t>(mine, 1), std::span<int64_t>(counts));
  const int64_t m = *std::max_element(counts.begin(), counts.end());
  std::vector<int32_t> all_tok(size_t(m * dp)), tok;
  std::vector<float> all_rows(size_t(m * C * dp)), row;
  if (n < m) {  // only a shorter rank pads (a copy of its rows); equal ranks send in place
    tok.assign(size_t(m), 0);
    row.assign(size_t(m * C), 0.0f);
    std::copy_n(tokens, n, tok.begin());
    std::copy_n(rows, n * C, row.begin());
    tokens = tok.data();
    rows = row.data();
  }
  dp_.all_gather(std::span<const int32_t>(tokens, size_t(m)), std::span<int32_t>(all_tok));
  dp_.all_gather(std::span<const float>(rows, size_t(m * C)), std::span<float>(all_rows));
  // The floats of wte this rank keeps reduced: all of it, or its piece of bucket 0 (ZeRO-1).
  const Bucket& b = plan_.buckets[0];
  const FlatRange kept = mode_ == Mode::kAllReduce ? FlatRange{b.offset, b.count} : own_piece(b, dp, dp_.group_rank());
  const int64_t lo = kept.offset - b.offset, hi = lo + kept.count;  // within wte
  float* wte = grads_ + b.offset;
  const float inv = 1.0f / float(dp);
  for (int r = 0; r < dp; r++)
    for (int64_t i = int64_t(r) * m; i < int64_t(r) * m + counts[size_t(r)]; i++) {
      const int64_t at = int64_t(all_tok[size_t(i)]) * C;
      float* g = wte + at;
      const float* d = all_rows.data() + i * C;
      for (int64_t c = std::max<int64_t>(0, lo - at); c < std::min(C, hi - at); c++) g[c] += d[c] * inv;
    }
  return true;
}

void GradSync::on_ready(int first_final) {
  if (!grads_ || compressing()) return;  // compressors run after backward, in finish()
  if (plan_.tied_first && next_ == 0) return;  // bucket 0 (wte) goes first, at head_done
  if (mode_ == Mode::kShardEveryMicro) release_done(SIZE_MAX);  // those done, waiting for none
  for (; next_ < plan_.buckets.size() && plan_.buckets[next_].first_tensor >= first_final; next_++) {
    const Bucket& b = plan_.buckets[next_];
    if (b.first_tensor == 0 && hold_first_ && !finishing_) return;
    if (mode_ == Mode::kShardEveryMicro) release_done(kShardsInFlight - 1);  // room for this one
    if (qgz_ && mode_ != Mode::kAllReduce) {
      qgz_pending_.resize(pending_.size());
      qgz_pending_.push_back(std::make_unique<QgzScatter>(dp_, std::span<float>(grads_ + b.offset, size_t(b.count))));
      pending_.push_back(qgz_pending_.back()->take_work());
    } else {
      pending_.push_back(reduce_bucket(b));
    }
    pending_bucket_.push_back(next_);
    if (tracker_) tracker_->sample();
  }
}

void GradSync::finish(bool last_micro) {
  LOOM_ASSERT(grads_ != nullptr);
  comm::Ledger& ledger = dp_.world().ledger();
  const double backward_end = ledger.now_us();
  // kShardEveryMicro reduces every micro-batch; local steps send in reduce_update, if at all
  if ((last_micro || (every_micro() && !compressing())) && !local_gradients()) wire_sent_ += wire_bytes();
  if (last_micro) steps_++;
  if (sync_ == StepSync::kCompressed && last_micro)  // Note [Compressed ZeRO-2/3]: once, at the step's end
    for (size_t b = 0; b < plan_.buckets.size(); b++) {
      const Bucket& bk = plan_.buckets[b];
      const std::span<float> g(grads_ + bk.offset, size_t(bk.count));
      compressors_[b]->reduce(dp_, g, step_);
      if (accordion_) accordion_->observe(b, g, step_, *compressors_[b]);
      if (mode_ != Mode::kAllReduce && !keep_unowned_) release_unowned(bk, plan_.dp, dp_.group_rank(), grads_);
    }
  finishing_ = true;
  on_ready(0);
  finishing_ = false;
  for (size_t i = 0; i < pending_.size(); i++) complete(i);
  if (tracker_) tracker_->sample();
  if (mode_ == Mode::kShardEveryMicro && !compressing()) {
    release_done(0);
    if (last_micro)
      for (const Bucket& b : plan_.buckets) {
        const FlatRange own = own_piece(b, plan_.dp, dp_.group_rank());
        const float inv = 1.0f / float(plan_.dp);
        for (float* g = grads_ + own.offset; g < grads_ + own.offset + own.count; g++) *g *= inv;
      }
  }
  const double done = ledger.now_us();
  windows_.push_back({begin_us_, backward_end, done});
  pending_.clear();
  pending_bucket_.clear();
  qgz_pending_.clear();
  released_ = 0;
  grads_ = nullptr;
}

void GradSync::reduce_update(float* u) {
  LOOM_ASSERT(local_gradients());
  wire_sent_ += wire_bytes();
  for (size_t b = 0; b < plan_.buckets.size(); b++) {
    const Bucket& bk = plan_.buckets[b];
    compressors_[b]->reduce(dp_, std::span<float>(u + bk.offset, size_t(bk.count)), step_);
  }
}

void GradSync::reset_compressor_state() {
  for (const auto& c : compressors_)
    for (const CompressorState& s : c->state()) std::fill(s.data->begin(), s.data->end(), 0.0f);
}

// Hands back the non-owned part of every reduced bucket, in launch order, stopping at the
// first one still running once at most `running` are (Note [Resident memory]).
void GradSync::release_done(size_t running) {
  for (; released_ < pending_.size(); released_++) {
    if (pending_.size() - released_ <= running && !pending_[released_].done()) return;
    complete(released_);
    release_unowned(plan_.buckets[pending_bucket_[released_]], plan_.dp, dp_.group_rank(), grads_);
  }
}

void GradSync::complete(size_t i) {
  pending_[i].wait();
  if (i >= qgz_pending_.size() || !qgz_pending_[i]) return;
  const Bucket& b = plan_.buckets[pending_bucket_[i]];
  const FlatRange own = own_piece(b, plan_.dp, dp_.group_rank());
  // kReduceScatter averages here; kShardEveryMicro sums and finish() divides at the end.
  const float scale = mode_ == Mode::kReduceScatter ? 1.0f / float(plan_.dp) : 1.0f;
  qgz_pending_[i]->complete(std::span<float>(grads_ + own.offset, size_t(own.count)), scale);
}

// Note [Overlap]
// How much of the gradient reduction backward hides: each bucket's collective is timed
// alone once (measure_standalone), so one step's reductions cost S seconds when nothing
// overlaps them. A step's exposed communication is the time from the moment the LAST dp
// rank finished backward until this rank's reductions completed (waiting for a slower
// peer's backward is load imbalance, not communication). hidden_fraction =
// 1 - (exposed seconds) / (steps x S), clamped to [0, 1]. (Timing the collectives inside
// the step instead would credit a reduction that merely ran slower because it shared the
// cores with backward.)
void GradSync::measure_standalone() {
  int64_t largest = 0;
  for (const Bucket& b : plan_.buckets) largest = std::max(largest, b.count);
  std::vector<float> scratch(size_t(largest), 0.0f);
  standalone_s_ = 0;
  for (size_t bi = 0; bi < plan_.buckets.size(); bi++) {
    const Bucket& b = plan_.buckets[bi];
    std::span<float> all(scratch.data(), size_t(b.count));
    const size_t piece = size_t(b.count / plan_.dp);
    // A compressor is timed as a fresh copy (its state untouched) on values it cannot
    // shortcut (zeros would make top-k's selection and PowerSGD's products trivial).
    std::unique_ptr<BucketCompressor> probe;
    if (!compressors_.empty()) {
      probe = make_compressor(spec_, b, specs_, plan_.dp);
      for (size_t i = 0; i < all.size(); i++) all[i] = float((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    }
    double t[3];
    for (double& ti : t) {
      const auto t0 = std::chrono::steady_clock::now();
      if (probe) probe->reduce(dp_, all, spec_.warmup_steps);
      else if (mode_ == Mode::kAllReduce) dp_.all_reduce(all, comm::ReduceOp::kAvg, {.compression = compression_});
      else if (qgz_) {
        QgzScatter q(dp_, all);
        q.take_work().wait();
        q.complete(all.subspan(size_t(dp_.group_rank()) * piece, piece), 1.0f);
      } else dp_.reduce_scatter(std::span<const float>(all), all.subspan(size_t(dp_.group_rank()) * piece, piece),
                              comm::ReduceOp::kSum);
      ti = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    std::sort(t, t + 3);
    standalone_s_ += t[1];
  }
}

double GradSync::hidden_fraction() {
  // Every rank's backward end per step, on the machine's steady clock.
  const double origin = dp_.world().ledger().origin_steady_us();
  std::vector<double> mine, all(windows_.size() * size_t(plan_.dp));
  for (const Window& w : windows_) mine.push_back(origin + w.backward_end_us);
  dp_.all_gather(std::span<const double>(mine), std::span<double>(all));
  exposed_s_ = 0;
  for (size_t i = 0; i < windows_.size(); i++) {
    double last_end = 0;
    for (int r = 0; r < plan_.dp; r++) last_end = std::max(last_end, all[size_t(r) * windows_.size() + i]);
    exposed_s_ += std::max(0.0, origin + windows_[i].done_us - last_end) * 1e-6;
  }
  const double alone = standalone_s_ * double(windows_.size());
  if (alone <= 0) return 1.0;
  return std::clamp(1.0 - exposed_s_ / alone, 0.0, 1.0);
}

}  // namespace loom::parallel
