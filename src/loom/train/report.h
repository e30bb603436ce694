// Training progress output: JSON lines, a redrawn terminal bar, or plain log lines.
#pragma once

#include <array>
#include <cstdint>
#include <streambuf>
#include <string>

#include "loom/train/train_options.h"

namespace loom {

class TensorBoardWriter;

// A stream buffer that drops everything: the sink of the ranks that do not log.
class NullBuffer : public std::streambuf {
 protected:
  int overflow(int c) override { return c; }
};

class Reporter {
 public:
  Reporter(const TrainOptions& o, int64_t steps) : o_(o), steps_(steps) {}

  void info(const std::string& line);
  struct StepLine {
    int64_t step = 0;  // 0-based
    double loss = 0, lr = 0, norm = 0, tok_s = 0, elapsed = 0;
    bool log_line = false;  // plain and JSON output print only these steps (and skipped ones)
    double padding = -1;     // >= 0 (data.bucketing): the step's share of padded positions
    double loss_scale = 0;   // > 0: the loss scale the step ran at (Note [Dynamic loss scaling])
    bool skipped = false;    // gradient overflow: no update
    // A mixture: (source, share of the samples drawn so far), on log lines only.
    std::vector<std::pair<std::string, double>> mix;
  };
  void step(const StepLine& s);
  // bytes_per_token > 0 adds bits per byte: val_loss / ln 2 / bytes_per_token, comparable
  // across tokenizers (the split's mean bytes per token, so an estimate for shards).
  void val(int64_t step, double val_loss, double bytes_per_token = 0);
  void end_bar();
  // Note [TensorBoard events]: every step's and validation's figures go to `tb` too.
  void set_tensorboard(TensorBoardWriter* tb) { tb_ = tb; }

 private:
  TensorBoardWriter* tb_ = nullptr;
  void csv_row(const std::array<double, 12>& cells);
  bool csv_header_ = false;
  const TrainOptions& o_;
  int64_t steps_;
  bool bar_open_ = false;
};

}  // namespace loom
