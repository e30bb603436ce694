// `loom verify`: parallel layouts against the single-process run on the same seed, data
// and global batch (design invariant 5: every parallel configuration is checked against
// the single-process run).
#pragma once

#include <string>
#include <vector>

#include "loom/core/config.h"
#include "loom/train/trainer.h"

namespace loom {

struct VerifyRow {
  std::string layout;          // e.g. "dp=2 zero=1"
  double max_loss_rel = 0;     // max over steps of |loss - ref| / |ref|
  double max_weight_abs = 0;   // max over parameters of |w - ref| after the last step
  bool ok = false;
  std::string error;           // the run failed: why
};

struct VerifyTolerance {
  double loss_rel = 1e-5;
  double weight_abs = 1e-4;
};

// Compares a run with the reference; rows differ only in layout.
VerifyRow compare_runs(const std::string& layout, const TrainSummary& ref, const TrainSummary& got,
                       const VerifyTolerance& tol = {});

// Runs `base` with each layout's overrides (e.g. {"parallel.dp=2", "parallel.zero=1"}) as
// threads in this process and compares each with the single-process run of `base`.
std::vector<VerifyRow> verify_layouts(const Config& base, const std::vector<std::vector<std::string>>& layouts,
                                      const VerifyTolerance& tol = {});

// "dp=2,zero=1;dp=4" -> {{"parallel.dp=2","parallel.zero=1"}, {"parallel.dp=4"}}. Keys may
// also be given in full ("train.grad_accum=2"). Throws ConfigError on a malformed item.
std::vector<std::vector<std::string>> parse_layout_list(const std::string& text);

}  // namespace loom
