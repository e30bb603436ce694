#include "loom/train/trainer.h"

#include <omp.h>
#include <cblas.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loom/core/error.h"
#include "loom/kernels/cpu/blas_info.h"
#include "loom/model/model.h"
#include "loom/train/checkpoint.h"
#include "loom/train/data.h"
#include "loom/train/optimizer.h"

namespace loom {

namespace {

using Clock = std::chrono::steady_clock;

std::string fmt_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  const int64_t t = int64_t(s + 0.5);
  std::ostringstream os;
  if (t >= 3600) os << t / 3600 << ":" << std::setw(2) << std::setfill('0') << (t / 60) % 60;
  else os << t / 60;
  os << ":" << std::setw(2) << std::setfill('0') << t % 60;
  return os.str();
}

// Where progress goes: JSON lines, a redrawn terminal bar, or plain log lines.
class Reporter {
 public:
  Reporter(const TrainOptions& o, int64_t steps) : o_(o), steps_(steps) {}

  void info(const std::string& line) { *o_.err << line << "\n"; }

  void step(int64_t step, double loss, double lr, double norm, double tok_s, double elapsed, bool log_line) {
    const double eta = elapsed / double(step + 1) * double(steps_ - step - 1);
    if (o_.json) {
      if (!log_line) return;
      nlohmann::json j = {{"step", step + 1}, {"loss", loss}, {"lr", lr}, {"grad_norm", norm},
                          {"tokens_per_s", tok_s}, {"elapsed_s", elapsed}, {"eta_s", eta}};
      *o_.out << j.dump() << "\n" << std::flush;
    } else if (o_.progress) {
      const int width = 24, filled = int(width * (step + 1) / steps_);
      std::ostringstream os;
      os << "\r[" << std::string(filled, '#') << std::string(width - filled, '.') << "] step " << step + 1 << "/"
         << steps_ << "  loss " << std::fixed << std::setprecision(4) << loss << "  " << std::setprecision(0) << tok_s
         << " tok/s  ETA " << fmt_duration(eta) << "   ";
      *o_.err << os.str() << std::flush;
      bar_open_ = true;
    } else if (log_line) {
      std::ostringstream os;
      os << "step " << step + 1 << "/" << steps_ << "  loss " << std::fixed << std::setprecision(4) << loss
         << "  lr " << std::scientific << std::setprecision(2) << lr << "  grad_norm " << std::fixed
         << std::setprecision(3) << norm << "  " << std::setprecision(0) << tok_s << " tok/s  ETA "
         << fmt_duration(eta);
      *o_.out << os.str() << "\n" << std::flush;
    }
  }

  void val(int64_t step, double val_loss) {
    if (o_.json) {
      *o_.out << nlohmann::json{{"step", step + 1}, {"val_loss", val_loss}}.dump() << "\n" << std::flush;
      return;
    }
    std::ostringstream os;
    os << "step " << step + 1 << "/" << steps_ << "  val_loss " << std::fixed << std::setprecision(4) << val_loss;
    end_bar();
    (o_.progress ? *o_.err : *o_.out) << os.str() << "\n" << std::flush;
  }

  void end_bar() {
    if (bar_open_) *o_.err << "\n";
    bar_open_ = false;
  }

 private:
  const TrainOptions& o_;
  int64_t steps_;
  bool bar_open_ = false;
};

double evaluate(Model& model, const DataLoader& loader, int64_t batches, int64_t rows, int64_t T) {
  std::vector<int32_t> tok(size_t(rows * T)), tgt(size_t(rows * T));
  double sum = 0;
  for (int64_t i = 0; i < batches; i++) {
    loader.val_batch(i, batches, rows, tok.data(), tgt.data());
    sum += model.forward_loss(tok.data(), tgt.data(), rows, T);
  }
  return sum / double(batches);
}

}  // namespace

TrainSummary train(const Config& cfg, const TrainOptions& opt) {
  LOOM_ASSERT(opt.out && opt.err);
  if (cfg.train.threads > 0) {
    omp_set_num_threads(int(cfg.train.threads));
    openblas_set_num_threads(int(cfg.train.threads));
  }
  Reporter rep(opt, cfg.train.steps);
  if (std::string w = cpu::blas_downgrade_warning(); !w.empty()) rep.info("warning: " + w);

  const int64_t T = cfg.seq_len(), mb = cfg.micro_batch(), accum = cfg.train.grad_accum;
  const Corpus corpus = load_corpus(cfg.data.path, cfg.data.val_fraction, T);
  const DataLoader train_data(corpus.train, T, uint64_t(cfg.train.seed));
  const DataLoader val_data(corpus.val, T, uint64_t(cfg.train.seed));

  Model model(cfg.model, mb, T);
  model.init_weights(uint64_t(cfg.train.seed));
  AdamW adamw(model.layout(), cfg.optim);

  TrainSummary sum;
  sum.params = model.layout().param_count();
  sum.unigram_entropy = corpus.unigram_entropy_nats;
  {
    std::ostringstream os;
    os << "loom train: " << (cfg.model.arch == Arch::kGpt ? "gpt" : "llama") << " '" << cfg.model.preset << "' "
       << sum.params << " params (" << cfg.model.layers << " layers, d_model " << cfg.model.d_model << ", heads "
       << cfg.model.heads << "/" << cfg.model.kv_heads << ", vocab " << cfg.model.vocab << ")\n"
       << "  global batch " << cfg.train.batch << " = micro-batch " << mb << " x " << accum
       << " accumulation steps, seq " << T << ", " << cfg.train.batch * T << " tokens/step, " << cfg.train.steps
       << " steps, " << omp_get_max_threads() << " threads\n"
       << "  corpus " << (cfg.data.path.empty() ? kDefaultCorpusDir : cfg.data.path) << ": " << corpus.files.size()
       << " files, train " << corpus.train.size() << " / val " << corpus.val.size()
       << " bytes, unigram entropy " << std::fixed << std::setprecision(4) << corpus.unigram_entropy_nats << " nats";
    rep.info(os.str());
  }

  std::vector<int32_t> tok(size_t(mb * T)), tgt(size_t(mb * T));
  const auto t0 = Clock::now();
  auto last = t0;
  int64_t tokens_since = 0;
  for (int64_t step = 0; step < cfg.train.steps; step++) {
    model.zero_grads();
    double loss = 0;
    for (int64_t micro = 0; micro < accum; micro++) {
      train_data.train_batch(step, micro, accum, cfg.train.batch, tok.data(), tgt.data());
      loss += model.forward_backward(tok.data(), tgt.data(), mb, T, 1.0f / float(accum));
    }
    loss /= double(accum);
    if (!std::isfinite(loss))
      throw Error("training diverged: loss is " + std::to_string(loss) + " at step " + std::to_string(step + 1) +
                  " (optim.lr = " + std::to_string(cfg.optim.lr) + "); lower optim.lr or raise optim.warmup_steps");
    const double norm = clip_grad_norm(model.ops(), model.grads(), cfg.optim.grad_clip);
    const double lr = lr_at(cfg.optim, step, cfg.train.steps);
    adamw.step(model.ops(), model.params(), model.grads(), lr);
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
      sum.final_val_loss = evaluate(model, val_data, cfg.train.val_batches, mb, T);
      rep.val(step, sum.final_val_loss);
    }
  }
  rep.end_bar();
  const double total = std::chrono::duration<double>(Clock::now() - t0).count();
  sum.tokens_per_s = double(cfg.train.steps * cfg.train.batch * T) / total;
  if (!cfg.checkpoint.dir.empty()) {
    save_checkpoint(cfg.checkpoint.dir, cfg, model.layout(), model.params(), &adamw.m(), &adamw.v(),
                    CheckpointState{cfg.train.steps, adamw.steps_taken()});
    rep.info("saved checkpoint to " + cfg.checkpoint.dir);
  }
  return sum;
}

}  // namespace loom
