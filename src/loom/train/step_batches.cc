// One step's micro-batches (train/step_batches.h).
#include "loom/train/step_batches.h"

#include <memory>
#include <vector>

#include "loom/engine/gradient_pass.h"
#include "loom/rank/cp_chunks.h"
#include "loom/train/rank_context.h"

namespace loom {

namespace {

// train.grad_accum micro-batches of mb x T: each adds its mean loss, its backward starting
// from S / accum (Note [Dynamic loss scaling]); the step's share is the mean over them.
class FixedBatches final : public MicroBatches {
 public:
  FixedBatches(const DataLoader& data, const Config& cfg, int64_t step, int64_t mb, int64_t T, double S)
      : data_(data), cfg_(cfg), step_(step), mb_(mb), T_(T), S_(S) {}
  int64_t count() const override { return cfg_.train.grad_accum; }
  Shape shape(int64_t) const override { return {mb_, T_, float(S_ / double(cfg_.train.grad_accum)), 1.0}; }
  void fill(int64_t m, int32_t* tokens, int32_t* targets) const override {
    data_.train_batch(step_, m, cfg_.train.grad_accum, cfg_.train.batch, tokens, targets);
  }
  double mean(double loss_sum) const override { return loss_sum / double(cfg_.train.grad_accum); }
  std::unique_ptr<MicroBatches> following() const override {
    return std::make_unique<FixedBatches>(data_, cfg_, step_ + 1, mb_, T_, S_);
  }

 private:
  const DataLoader& data_;
  const Config& cfg_;
  int64_t step_, mb_, T_;
  double S_;
};


// data.bucketing (Note [Length bucketing]): this rank's micro-batches, each at its own
// padded length. Micro-batch m returns its mean over its N positions (padding adds 0);
// scaling it by dp N / R (R: the global batch's real targets) makes the dp average of the
// summed gradients the gradient of the global batch's mean over its R real targets. The
// step's share is the sum: dp times this rank's part, as Updater averages over dp.
// Context parallelism: dp counts the dp x cp ranks and a rank's N its rows of the padded
// length (a multiple of 2 cp), which it keeps at its positions of that length.
class BucketBatches final : public MicroBatches {
 public:
  BucketBatches(const BucketLoader& data, int64_t step, const RankContext& rc, double S)
      : data_(data), plan_(data.plan(step)), dp_(rc.dp_size), cp_(rc.cp_size), cp_rank_(rc.cp_rank), rank_(*rc.plan),
        S_(S) {}
  StepTokens tokens() const { return {plan_.real_targets, plan_.positions}; }
  int64_t count() const override { return int64_t(plan_.micros.size()); }
  Shape shape(int64_t m) const override {
    const data::MicroPlan& mp = plan_.micros[size_t(m)];
    const int64_t rows = int64_t(mp.rows.size()), N = rows * (mp.seq / cp_);
    const double scale = double(dp_) * double(N) / double(plan_.real_targets);
    return {rows, mp.seq / cp_, float(scale * S_), scale};
  }
  void fill(int64_t m, int32_t* tokens, int32_t* targets) const override {
    const data::MicroPlan& mp = plan_.micros[size_t(m)];
    if (cp_ == 1) return data_.fill(mp, tokens, targets);
    const int64_t rows = int64_t(mp.rows.size()), T = mp.seq;
    std::vector<int32_t> tok(size_t(rows * T)), tgt(tok.size());
    data_.fill(mp, tok.data(), tgt.data());
    const std::vector<int32_t> pos = rank::cp_positions(T, cp_, cp_rank_, rank_.cp_split);  // this rank's alone
    const int64_t Tl = int64_t(pos.size());
    for (int64_t b = 0; b < rows; ++b)
      for (int64_t t = 0; t < Tl; ++t)
        tokens[b * Tl + t] = tok[size_t(b * T + pos[size_t(t)])], targets[b * Tl + t] = tgt[size_t(b * T + pos[size_t(t)])];
  }
  double mean(double loss_sum) const override { return loss_sum; }

 private:
  const BucketLoader& data_;
  const BucketLoader::Step plan_;
  int dp_, cp_, cp_rank_;
  const RankPlan& rank_;
  double S_;
};

}  // namespace

// One step's forward and backward through the engine's gradient pass (Note [Engine parts]);
// returns this rank's share of the loss.
double step_gradients(Engine& e, const Config& cfg, const DataLoader& train_data, const BucketLoader* buckets,
                      int64_t step, double S, bool flush, StepTokens& tokens) {
  if (buckets) {
    const BucketBatches batches(*buckets, step, e.rc, S);
    tokens = batches.tokens();
    return e.pass->run(batches, step, flush);
  }
  for (const std::unique_ptr<Part>& p : e.parts) p->before_pass(train_data, step);
  return e.pass->run(FixedBatches(train_data, cfg, step, cfg.micro_batch(), cfg.local_seq(), S), step, flush);
}

}  // namespace loom
