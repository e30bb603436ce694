// Training progress output: JSON lines, a redrawn terminal bar, or plain log lines.
#pragma once

#include <cstdint>
#include <string>

#include "loom/train/trainer.h"

namespace loom {

class Reporter {
 public:
  Reporter(const TrainOptions& o, int64_t steps) : o_(o), steps_(steps) {}

  void info(const std::string& line);
  // padding >= 0 (data.bucketing): the step's share of padded positions, reported too.
  void step(int64_t step, double loss, double lr, double norm, double tok_s, double elapsed, bool log_line,
            double padding = -1);
  // bytes_per_token > 0 adds bits per byte: val_loss / ln 2 / bytes_per_token, comparable
  // across tokenizers (the split's mean bytes per token, so an estimate for shards).
  void val(int64_t step, double val_loss, double bytes_per_token = 0);
  void end_bar();

 private:
  const TrainOptions& o_;
  int64_t steps_;
  bool bar_open_ = false;
};

}  // namespace loom
