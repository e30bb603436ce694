// Published large-model runs (tests/reference/published_runs.csv) as simulator plans, and
// the simulator's prediction of each one's published figure.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "loom/sim/simulator.h"

namespace loom::sim {

struct PublishedRun {
  std::map<std::string, std::string> fields;  // column -> text, as in the CSV
  std::string id() const;                     // row_id
  std::string label() const;                  // "GPT 175B tp8 pp8 dp1 ..."
  // The GPU's family, the gpu_type before its first '-' or ' ': "A100" for "A100-80GB",
  // "H100" for "H100 (80GB; SXM assumed, ...)"; the family loom plan's error bands group by.
  std::string gpu_family() const;
};

// RFC 4180 CSV with a header row. Throws loom::Error naming the file and line.
std::vector<PublishedRun> read_published_runs(const std::string& path);
std::vector<PublishedRun> parse_published_runs(const std::string& text, const std::string& origin);

// The row's configuration as a plan on its cluster preset (dgx-a100 for A100 rows).
// Missing vocabulary: 51,200 (the Megatron papers' padded GPT-2 vocabulary; a Nemotron's:
// 256,000, its tokenizer's). Rows whose
// notes give an interleave factor (or calculon's assumed 3 for 175B/530B in Korthikanti
// et al., which the paper's activation Figure 1 reproduces exactly) run interleaved.
struct PublishedCase {
  SimPlan plan;
  ClusterSpec cluster;
  // "tflops_per_gpu" (Megatron's count), "iteration_time_s" or "tokens_per_sec_per_gpu"
  // (Note [Published metrics]).
  std::string metric;
  double published = 0;
  std::string assumed;      // what the row left unstated and was inferred (Note [Unstated recompute])
};
// The compiled-in cluster preset of a gpu_type column ("" when none).
std::string gpu_preset(const std::string& gpu);
PublishedCase published_case(const PublishedRun& row);
// Note [Unstated recompute] (published_recompute.cc): sets c's recompute to the least that fits
// the device (by the block where `blocks`, offloading activations first where `offload`) and
// says what it took; "" when none is needed.
std::string fit_unstated_recompute(PublishedCase& c, bool blocks, bool offload);

struct PublishedCheck {
  std::string id, label, metric;
  double published = 0, predicted = 0;
  double error() const { return (predicted - published) / published; }  // in the row's metric
  // In step time whatever the metric (predicted / measured - 1; negative: predicted too fast):
  // a rate's (TFLOP/s, tokens/s) is published / predicted - 1.
  double step_time_error() const { return metric == "iteration_time_s" ? error() : published / predicted - 1; }
  SimResult result;
  SimPlan plan;  // the row as simulated
  std::string assumed;  // PublishedCase::assumed
};
PublishedCheck check_published(const PublishedRun& row);

// Megatron's per-iteration FLOP count of Narayanan et al. (2021), eq. (3): with the
// recompute forward 96 B s l h^2 (1 + s/(6h) + V/(16 l h)); without it (model FLOPs, the
// count MFU and llm-foundry's "model TFLOP/s" use) 72 B s l h^2 (1 + s/(6h) + V/(12 l h)).
double megatron_flops_per_iteration(double B, double s, double l, double h, double V, bool recompute_forward = true);

}  // namespace loom::sim
