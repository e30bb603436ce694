#include "loom/train/trainer.h"

#include <omp.h>
#include <cblas.h>

#include <chrono>
#include <cmath>
#include <iomanip>
#include <memory>
#include <sstream>
#include <streambuf>

#include "loom/comm/world.h"
#include "loom/core/error.h"
#include "loom/kernels/cpu/blas_info.h"
#include "loom/model/model.h"
#include "loom/parallel/grad_sync.h"
#include "loom/train/checkpoint.h"
#include "loom/train/data.h"
#include "loom/train/optimizer.h"
#include "loom/train/rank_context.h"
#include "loom/train/report.h"

namespace loom {

namespace {

using Clock = std::chrono::steady_clock;

// What this build runs of [parallel]: the rest is refused by name, never downgraded.
void check_supported(const Config& cfg, int world_size) {
  const ParallelConfig& p = cfg.parallel;
  std::vector<std::string> missing;
  if (p.zero == 3) missing.push_back("parallel.zero = 3 (sharded parameters)");
  if (!missing.empty()) {
    std::string msg = "not implemented yet in this build:";
    for (const auto& m : missing) msg += " " + m + ";";
    throw Error(msg + " data (parallel.dp, parallel.zero 0, 1 or 2), tensor (parallel.tp) and pipeline (parallel.pp, vpp, "
                "schedule) parallelism and parallel.recompute run today");
  }
  if (world_size != p.world())
    throw Error("the layout dp x tp x pp = " + std::to_string(p.dp) + " x " + std::to_string(p.tp) + " x " +
                std::to_string(p.pp) + " needs " + std::to_string(p.world()) + " ranks but " +
                std::to_string(world_size) + (world_size == 1 ? " process runs" : " were launched") +
                "; launch with `mpirun -np " + std::to_string(p.world()) + " loom train ...` or `loom train --nproc " +
                std::to_string(p.world()) + "`, or set parallel.dp = " + std::to_string(world_size));
}

class NullBuffer : public std::streambuf {
 protected:
  int overflow(int c) override { return c; }
};

// Mean validation loss over the global validation batch. A pipeline computes it on the
// last stage; the stats group brings it to every rank.
double evaluate(Model& model, parallel::PipelineRunner* pipe, const DataLoader& loader, int64_t batches,
                int64_t global_rows, int64_t T, const RankContext& rc) {
  const int64_t rows = loader.shard_rows(global_rows);
  std::vector<int32_t> tok(size_t(rows * T)), tgt(size_t(rows * T));
  double sum = 0;
  for (int64_t i = 0; i < batches; i++) {
    loader.val_batch(i, batches, global_rows, tok.data(), tgt.data());
    sum += pipe ? pipe->forward_only(tok.data(), tgt.data()) : model.forward_loss(tok.data(), tgt.data(), rows, T);
  }
  double v[1] = {sum / double(batches)};
  rc.stats_sum(v);
  return v[0] / (rc.dp_size * rc.tp_size);  // every dp replica's tp ranks hold one copy
}

// Gradients to updated parameters, per ZeRO stage (Note [Sharded buckets]):
//   stage 0: grads all-reduced in place; every rank clips and updates the whole buffer.
//   stage 1: grads all-reduced; each rank updates its own pieces, then all-gathers them.
//   stage 2: grads reduce-scattered (only the own pieces are reduced); as stage 1 after.
class Updater {
 public:
  Updater(const Config& cfg, Model& model, const RankContext& rc, const parallel::DataParallelPlan* plan)
      : cfg_(cfg), model_(model), rc_(rc), plan_(plan),
        adamw_(model.layout(), cfg.optim, rc.zero > 0 ? plan->owned(rc.dp_rank) : std::vector<FlatRange>{}) {
    // The global norm counts every parameter once: a GPT head stage's wte copy and, on tp
    // ranks other than 0, the replicated tensors are left out.
    norm_ranges_ = adamw_.owned();
    for (const ParamSpec& s : model.layout().specs())
      if (!rc.counts(s, cfg.model)) norm_ranges_ = subtract(norm_ranges_, {s.offset, s.numel});
  }

  // Mean loss of the global batch and the gradient norm before clipping; updates params.
  std::pair<double, double> step(double local_loss, double lr) {
    const Kernels& k = model_.ops();
    double v[2] = {local_loss, sum_squares(k, model_.grads().data(), norm_ranges_)};
    rc_.stats_sum(v);
    const double loss = v[0] / (rc_.dp_size * rc_.tp_size);  // each dp replica's tp ranks hold one copy
    const double norm = std::sqrt(rc_.zero > 0 ? v[1] : v[1] / rc_.dp_size);
    if (const double coef = clip_coef(norm, cfg_.optim.grad_clip); coef < 1.0)
      for (const FlatRange& r : adamw_.owned()) k.scale_inplace(model_.grads().data() + r.offset, r.count, float(coef));
    adamw_.step(k, model_.params(), model_.grads(), lr);
    if (rc_.zero > 0 && rc_.dp) gather(model_.params().data(), nullptr);
    return {loss, norm};
  }

  // The part's whole flat moments on every dp rank (for saving).
  void full_moments(std::vector<float>& m, std::vector<float>& v) {
    if (rc_.zero == 0 || !rc_.dp) {
      m = adamw_.m(), v = adamw_.v();
      return;
    }
    m.assign(model_.params().size(), 0.0f);
    v.assign(model_.params().size(), 0.0f);
    gather(m.data(), adamw_.m().data());
    gather(v.data(), adamw_.v().data());
  }
  const AdamW& adamw() const { return adamw_; }

 private:
  // All-gathers every bucket's pieces into `full`. packed == nullptr: the own piece
  // already sits in place in `full`; else own pieces are read from `packed` (owned order).
  void gather(float* full, const float* packed) {
    std::vector<comm::Work> pending;
    int64_t at = 0;
    for (const parallel::Bucket& b : plan_->buckets) {
      const int64_t piece = b.count / rc_.dp_size;
      std::span<float> all(full + b.offset, size_t(b.count));
      const float* own = packed ? packed + at : full + b.offset + rc_.dp_rank * piece;
      pending.push_back(rc_.dp->all_gather(std::span<const float>(own, size_t(piece)), all, {.async = true}));
      at += piece;
    }
    for (auto& w : pending) w.wait();
  }

  const Config& cfg_;
  Model& model_;
  const RankContext& rc_;
  const parallel::DataParallelPlan* plan_;
  AdamW adamw_;
  std::vector<FlatRange> norm_ranges_;
};

std::string layout_line(const Config& cfg, int64_t mb, int64_t T) {
  const ParallelConfig& p = cfg.parallel;
  std::ostringstream os;
  os << "  global batch " << cfg.train.batch << " = micro-batch " << mb << " x " << cfg.train.grad_accum
     << " micro-batches x dp " << p.dp << ", seq " << T << ", " << cfg.train.batch * T << " tokens/step, "
     << cfg.train.steps << " steps, " << omp_get_max_threads() << " threads per rank";
  if (p.world() > 1)
    os << "\n  layout pp " << p.pp << " x dp " << p.dp << " x tp " << p.tp << " = " << p.world() << " ranks, zero "
       << p.zero << ", gradient buckets <= " << p.bucket_mb << " MiB (first 1 MiB)";
  if (p.pp > 1)
    os << "\n  pipeline: schedule " << p.schedule << ", " << p.pp << " ranks x " << p.vpp << " chunks, "
       << cfg.train.grad_accum << " micro-batches per step";
  return os.str();
}

std::vector<float> unpadded_params(const Model& model) {
  std::vector<float> out;
  for (const ParamSpec& s : model.layout().specs())
    out.insert(out.end(), model.params().begin() + s.offset, model.params().begin() + s.offset + s.numel);
  return out;
}

void print_header(Reporter& rep, const Config& cfg, const Corpus& corpus, int64_t params, int64_t mb, int64_t T) {
  std::ostringstream os;
  os << "loom train: " << (cfg.model.arch == Arch::kGpt ? "gpt" : "llama") << " '" << cfg.model.preset << "' "
     << params << " params (" << cfg.model.layers << " layers, d_model " << cfg.model.d_model << ", heads "
     << cfg.model.heads << "/" << cfg.model.kv_heads << ", vocab " << cfg.model.vocab << ")\n"
     << layout_line(cfg, mb, T) << "\n"
     << "  corpus " << (cfg.data.path.empty() ? kDefaultCorpusDir : cfg.data.path) << ": " << corpus.files.size()
     << " files, train " << corpus.train.size() << " / val " << corpus.val.size() << " bytes, unigram entropy "
     << std::fixed << std::setprecision(4) << corpus.unigram_entropy_nats << " nats";
  rep.info(os.str());
}

ModelOptions model_options(const Config& cfg, const RankContext& rc, const parallel::DataParallelPlan& plan) {
  ModelOptions o;
  if (rc.dp) o.padding = plan.padding;
  o.part = rc.part;
  o.act_slots = rc.act_slots;
  o.tp_comm = rc.tp_comm.get();
  o.sp = cfg.parallel.sp;
  const std::string& r = cfg.parallel.recompute;
  o.recompute.assign(size_t(cfg.model.layers), r == "full"        ? Recompute::kFull
                                               : r == "selective" ? Recompute::kSelective
                                                                  : Recompute::kNone);
  return o;
}

// Everything one rank trains with.
struct Engine {
  Engine(const Config& cfg, RankContext& rc, int64_t mb, int64_t T)
      : plan(make_plan(cfg, rc)),
        model(cfg.model, mb, T, KernelBackend::kCpu, model_options(cfg, rc, plan)) {
    model.init_weights(uint64_t(cfg.train.seed));
    if (rc.dp) {
      sync = std::make_unique<parallel::GradSync>(
          *rc.dp, plan, rc.zero >= 2 ? parallel::GradSync::Mode::kReduceScatter : parallel::GradSync::Mode::kAllReduce);
      sync->hold_first_tensor(rc.embed != nullptr);
      model.set_grad_ready_hook([this](int first_final) { sync->on_ready(first_final); });
    }
    if (rc.schedule)
      pipe = std::make_unique<parallel::PipelineRunner>(*rc.schedule, rc.pp_rank, model, rc.links, mb, T);
  }
  static parallel::DataParallelPlan make_plan(const Config& cfg, const RankContext& rc) {
    parallel::BucketCaps caps;
    caps.cap_bytes = std::max<int64_t>(4, int64_t(cfg.parallel.bucket_mb * double(1 << 20)));
    caps.first_cap_bytes = std::min(caps.first_cap_bytes, caps.cap_bytes);
    return parallel::plan_data_parallel(cfg.model, rc.dp_size, caps, rc.zero > 0, rc.part);
  }

  parallel::DataParallelPlan plan;
  Model model;
  std::unique_ptr<parallel::GradSync> sync;
  std::unique_ptr<parallel::PipelineRunner> pipe;
};

// Forward and backward of one optimizer step; gradients reduced as the layout says.
// Returns this rank's share of the loss: the mean over its micro-batches (0 on pipeline
// stages without the head).
double compute_gradients(Engine& e, const RankContext& rc, const DataLoader& data, const Config& cfg, int64_t step,
                         int64_t mb, int64_t T) {
  const int64_t accum = cfg.train.grad_accum;
  Model& model = e.model;
  model.zero_grads();
  double loss = 0;
  auto arm = [&] {
    if (e.sync) e.sync->begin(model.grads().data());
  };
  if (e.pipe) {
    auto batch = [&](int micro, int32_t* tok, int32_t* tgt) {
      data.train_batch(step, micro, accum, cfg.train.batch, tok, tgt);
    };
    loss = e.pipe->run_step(batch, 1.0f / float(accum), arm);
  } else {
    std::vector<int32_t> tok(size_t(mb * T)), tgt(size_t(mb * T));
    for (int64_t micro = 0; micro < accum; micro++) {
      data.train_batch(step, micro, accum, cfg.train.batch, tok.data(), tgt.data());
      if (micro + 1 == accum) arm();
      loss += model.forward_backward(tok.data(), tgt.data(), mb, T, 1.0f / float(accum));
    }
  }
  if (rc.embed) {  // GPT pipeline: the tied embedding's two copies get the sum of both gradients
    const ParamSpec& w = model.layout().at("wte");
    rc.embed->all_reduce(std::span<float>(model.grads().data() + w.offset, size_t(w.numel)), comm::ReduceOp::kSum);
  }
  if (e.sync) e.sync->finish();
  return loss / double(accum);
}

void save_final(const Config& cfg, Engine& e, Updater& updater, const RankContext& rc, Reporter& rep) {
  std::vector<float> m, v;
  updater.full_moments(m, v);  // collective under ZeRO: every rank takes part
  const ParamLayout whole(cfg.model);
  std::vector<float> params = e.model.params();
  if (rc.pp_size > 1 || rc.tp_size > 1) {  // every rank's tensors into the whole layout
    params = gather_whole(cfg.model, e.model.layout(), params.data(), rc);
    m = gather_whole(cfg.model, e.model.layout(), m.data(), rc);
    v = gather_whole(cfg.model, e.model.layout(), v.data(), rc);
  }
  if (!rc.logging) return;
  save_checkpoint(cfg.checkpoint.dir, cfg, rc.pp_size > 1 || rc.tp_size > 1 ? whole : e.model.layout(), params, &m, &v,
                  CheckpointState{cfg.train.steps, updater.adamw().steps_taken()});
  rep.info("saved checkpoint to " + cfg.checkpoint.dir);
}

std::vector<float> final_params(const Config& cfg, Engine& e, const RankContext& rc) {
  if (rc.pp_size == 1 && rc.tp_size == 1) return unpadded_params(e.model);
  const ParamLayout whole(cfg.model);
  const std::vector<float> all = gather_whole(cfg.model, e.model.layout(), e.model.params().data(), rc);
  std::vector<float> out;
  for (const ParamSpec& s : whole.specs()) out.insert(out.end(), all.begin() + s.offset, all.begin() + s.offset + s.numel);
  return out;
}

TrainSummary run(const Config& cfg, const TrainOptions& given, comm::World* world) {
  LOOM_ASSERT(given.out && given.err);
  check_supported(cfg, world ? world->world_size() : 1);
  if (cfg.train.threads > 0) {
    omp_set_num_threads(int(cfg.train.threads));
    openblas_set_num_threads(int(cfg.train.threads));
  }
  RankContext rc = make_rank_context(cfg, world);
  NullBuffer null_buf;
  std::ostream null_out(&null_buf);
  TrainOptions opt = given;
  if (!rc.logging) opt.out = opt.err = &null_out, opt.progress = false;
  Reporter rep(opt, cfg.train.steps);
  if (std::string w = cpu::blas_downgrade_warning(); !w.empty()) rep.info("warning: " + w);

  const int64_t T = cfg.seq_len(), mb = cfg.micro_batch();
  const Corpus corpus = load_corpus(cfg.data.path, cfg.data.val_fraction, T);
  const DataLoader train_data(corpus.train, T, uint64_t(cfg.train.seed), rc.dp_rank, rc.dp_size);
  const DataLoader val_data(corpus.val, T, uint64_t(cfg.train.seed), rc.dp_rank, rc.dp_size);
  Engine e(cfg, rc, mb, T);
  Updater updater(cfg, e.model, rc, rc.dp ? &e.plan : nullptr);

  TrainSummary sum;
  sum.params = ParamLayout(cfg.model).param_count();
  sum.unigram_entropy = corpus.unigram_entropy_nats;
  print_header(rep, cfg, corpus, sum.params, mb, T);

  const auto t0 = Clock::now();
  auto last = t0;
  int64_t tokens_since = 0;
  for (int64_t step = 0; step < cfg.train.steps; step++) {
    const double local_loss = compute_gradients(e, rc, train_data, cfg, step, mb, T);
    const double lr = lr_at(cfg.optim, step, cfg.train.steps);
    const auto [loss, norm] = updater.step(local_loss, lr);
    if (!std::isfinite(loss))
      throw Error("training diverged: loss is " + std::to_string(loss) + " at step " + std::to_string(step + 1) +
                  " (optim.lr = " + std::to_string(cfg.optim.lr) + "); lower optim.lr or raise optim.warmup_steps");
    sum.losses.push_back(float(loss));

    tokens_since += cfg.train.batch * T;
    const auto now = Clock::now();
    const bool log_line = (step + 1) % cfg.train.log_every == 0 || step + 1 == cfg.train.steps;
    const double window = std::chrono::duration<double>(now - last).count();
    const double tok_s = window > 0 ? double(tokens_since) / window : 0.0;
    if (log_line) last = now, tokens_since = 0;
    rep.step(step, loss, lr, norm, tok_s, std::chrono::duration<double>(now - t0).count(), log_line);

    const bool last_step = step + 1 == cfg.train.steps;
    if (last_step || (cfg.train.val_every > 0 && (step + 1) % cfg.train.val_every == 0)) {
      sum.final_val_loss = evaluate(e.model, e.pipe.get(), val_data, cfg.train.val_batches, mb * rc.dp_size, T, rc);
      rep.val(step, sum.final_val_loss);
    }
  }
  rep.end_bar();
  const double total = std::chrono::duration<double>(Clock::now() - t0).count();
  sum.tokens_per_s = double(cfg.train.steps * cfg.train.batch * T) / total;
  if (e.sync) {
    sum.comm_hidden_fraction = e.sync->hidden_fraction();
    sum.comm_exposed_s = e.sync->exposed_wait_s();
    std::ostringstream os;
    os << "data parallel: " << e.plan.buckets.size() << " gradient buckets; " << std::fixed << std::setprecision(1)
       << 100.0 * sum.comm_hidden_fraction << "% of rank 0's gradient communication ran during backward, "
       << std::setprecision(3) << sum.comm_exposed_s << " s waited after backward";
    rep.info(os.str());
  }
  if (given.keep_params) sum.final_params = final_params(cfg, e, rc);
  if (!cfg.checkpoint.dir.empty()) save_final(cfg, e, updater, rc, rep);
  return sum;
}

}  // namespace

TrainSummary train(const Config& cfg, const TrainOptions& opt) { return run(cfg, opt, nullptr); }

TrainSummary train(const Config& cfg, const TrainOptions& opt, comm::World& world) { return run(cfg, opt, &world); }

}  // namespace loom
