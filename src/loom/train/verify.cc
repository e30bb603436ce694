#include "loom/train/verify.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "loom/comm/world.h"
#include "loom/core/error.h"
#include "loom/optim/optimizer.h"

namespace loom {

VerifyRow compare_runs(const std::string& layout, const TrainSummary& ref, const TrainSummary& got,
                       const VerifyTolerance& tol) {
  VerifyRow row;
  row.layout = layout;
  row.tolerance = tol;
  if (got.losses.size() != ref.losses.size() || got.final_params.size() != ref.final_params.size()) {
    row.error = "ran " + std::to_string(got.losses.size()) + " steps and kept " +
                std::to_string(got.final_params.size()) + " parameters; the reference has " +
                std::to_string(ref.losses.size()) + " and " + std::to_string(ref.final_params.size());
    return row;
  }
  for (size_t i = 0; i < ref.losses.size(); i++)
    row.max_loss_rel = std::max(row.max_loss_rel, std::abs(double(got.losses[i]) - ref.losses[i]) /
                                                      std::max(1e-30, std::abs(double(ref.losses[i]))));
  for (size_t i = 0; i < ref.final_params.size(); i++)
    row.max_weight_abs = std::max(row.max_weight_abs, std::abs(double(got.final_params[i]) - ref.final_params[i]));
  // NaN fails both comparisons.
  row.ok = row.max_loss_rel <= tol.loss_rel && row.max_weight_abs <= tol.weight_abs;
  return row;
}

namespace {

std::string describe(const std::vector<std::string>& sets) {
  std::string s;
  for (const auto& kv : sets) {
    std::string short_kv = kv;
    for (const char* prefix : {"parallel.", "train."})
      if (kv.rfind(prefix, 0) == 0) short_kv = kv.substr(std::string(prefix).size());
    s += (s.empty() ? "" : " ") + short_kv;
  }
  return s.empty() ? "single" : s;
}

}  // namespace

double compressed_loss_rel(CompressKind k) {
  switch (k) {
    case CompressKind::kNone: return VerifyTolerance{}.loss_rel;
    case CompressKind::kBf16: return 1e-4;
    case CompressKind::kInt8: return 1e-3;
    case CompressKind::kPowerSgd: return 0.03;
    case CompressKind::kTernGrad: return 0.1;
    case CompressKind::kTopK: return 0.3;
    case CompressKind::kOneBitAdam: return 0.4;
    case CompressKind::kZeroOneAdam: return 0.4;
    case CompressKind::kTopKAdam: return 0.4;
  }
  return 0;
}

double rounding_weight_abs(const Config& c) {
  double sum = 0;
  for (int64_t k = 0; k < c.train.steps; k++) sum += lr_at(c.optim, k, c.train.steps);
  return 2 * sum;
}

VerifyTolerance tolerance_for(const Config& c) {
  if (c.parallel.reduce == GradReduce::kAdasum) return {kAdasumLossRel, INFINITY};
  // Rounded parameter gathers (int8 blocks, bf16): Note [Verify tolerances]'s flip bound.
  if (c.parallel.zeropp_qwz || c.parallel.zeropp_qgz || c.comm.param_dtype == FloatFormat::kBf16)
    return {kZeroPlusPlusLossRel, rounding_weight_abs(c)};
  const CompressKind k = c.comm.grad_dtype == FloatFormat::kBf16 ? CompressKind::kBf16 : c.parallel.compress;
  // Note [Verify tolerances]: bf16 training's own bounds; bf16 moments (Note [bf16 optimizer
  // moments]) flip a stochastic rounding wherever a layout's fp32 moment differs in its last
  // bits or its rank draws other bits (a tp slice, a pipeline part: other flat offsets), each
  // flip one bf16 step of a moment, as bf16 training's roundings flip.
  const bool bf16 = c.train.precision == Precision::kBf16 || c.optim.bf16_moments();
  const bool fp16 = c.train.precision == Precision::kFp16;
  if (k == CompressKind::kNone) {
    if (bf16 || fp16) return {kBf16TrainLossRel, std::max(kBf16TrainWeightAbs, rounding_weight_abs(c))};
    if (c.comm.p2p_dtype == FloatFormat::kBf16) return {kZeroPlusPlusLossRel, rounding_weight_abs(c)};
    return VerifyTolerance{};
  }
  // bf16's ring rounds each hop to 8 bits: a flipped update moves a weight by up to 2 lr_k.
  if (k == CompressKind::kBf16) return {compressed_loss_rel(k), rounding_weight_abs(c)};
  if (compress_in_optimizer(k) && c.parallel.zero > 0) return {kCompressedAdamZeroLossRel, INFINITY};
  return {compressed_loss_rel(k), INFINITY};
}

namespace {

// Every rank's summary of `c` run as threads in this process.
std::vector<TrainSummary> train_threads(const Config& c, const TrainOptions& o) {
  std::vector<TrainSummary> out(size_t(c.parallel.ranks()));
  comm::CommOptions copt;
  copt.timeout = std::chrono::milliseconds(int64_t(c.comm.timeout_s * 1000));
  const std::vector<std::string> errors = comm::run_threads(int(c.parallel.ranks()), copt, [&](comm::World& w) {
    out[size_t(w.global_rank())] = train(c, o, w);
  });
  for (size_t r = 0; r < errors.size(); r++)
    if (!errors[r].empty()) throw Error("rank " + std::to_string(r) + ": " + errors[r]);
  return out;
}

}  // namespace

VerifyReference verify_reference_kind(const Config& c) {
  const ScheduleKind k = c.parallel.schedule;
  if (k == ScheduleKind::k2BW && c.parallel.pp > 1) return VerifyReference::kDelayedSingle;
  return updates_per_batch(k) ? VerifyReference::kFlushingLayout : VerifyReference::kSingle;
}

std::string verify_reference(const Config& c) {
  switch (verify_reference_kind(c)) {
    case VerifyReference::kDelayedSingle: return "single process, one-step-delayed updates";
    case VerifyReference::kFlushingLayout:
      return "the layout's flushing " + std::string(schedule_name(c.parallel.schedule)) + " reference";
    case VerifyReference::kSingle: break;
  }
  return "single process";
}

std::vector<VerifyRow> verify_layouts(const Config& base, const std::vector<std::vector<std::string>>& layouts,
                                      const VerifyTolerance* tol) {
  const std::string base_toml = to_toml(base);
  std::ostringstream sink;
  TrainOptions o;
  o.json = true, o.out = &sink, o.err = &sink, o.keep_params = true;
  Config ref_cfg = base;
  ref_cfg.checkpoint.dir.clear();
  const TrainSummary single = train(ref_cfg, o);
  // Note [Verify references]: the run a layout is held to. The delayed single process depends
  // on the layout only through its synchronous warm-up steps: run once for each.
  std::map<int64_t, TrainSummary> delayed;
  auto reference = [&](const Config& c) {
    const VerifyReference kind = verify_reference_kind(c);
    if (kind == VerifyReference::kSingle) return single;
    TrainOptions ro = o;
    if (kind == VerifyReference::kDelayedSingle) {
      const int64_t warmup = c.parallel.sync_warmup_steps;
      if (auto it = delayed.find(warmup); it != delayed.end()) return it->second;
      Config r = ref_cfg;
      r.parallel.schedule = c.parallel.schedule, r.parallel.sync_warmup_steps = warmup;
      ro.two_bw_reference = true;
      return delayed[warmup] = train(r, ro);
    }
    Config r = c;
    r.parallel.schedule = ScheduleKind::k1F1B;
    ro.async_reference = schedule_name(c.parallel.schedule);
    return train_threads(r, ro)[0];
  };
  std::vector<VerifyRow> rows;
  for (const auto& sets : layouts) {
    VerifyRow row;
    row.layout = describe(sets);
    try {
      Config c = config_from_toml_string(base_toml, sets);
      c.checkpoint.dir.clear();
      LOOM_CHECK(c.train.batch == base.train.batch, "layout '", row.layout, "' changes train.batch from ",
                 base.train.batch, " to ", c.train.batch, ": compare layouts at one global batch");
      const std::vector<TrainSummary> out = train_threads(c, o);
      row = compare_runs(row.layout, reference(c), out[0], tol ? *tol : tolerance_for(c));
      row.reference = verify_reference(c);
      // Every rank must end with the same weights (replicated state stays replicated); a
      // parameter server's ranks (after the workers) keep theirs to themselves.
      for (size_t r = 1; r < size_t(c.parallel.world()) && row.ok; r++)
        if (out[r].final_params != out[0].final_params) {
          row.ok = false;
          row.error = "rank " + std::to_string(r) + " ends with different weights from rank 0";
        }
    } catch (const std::exception& e) {
      row.ok = false;
      row.error = e.what();
    }
    rows.push_back(row);
  }
  return rows;
}

std::vector<std::vector<std::string>> parse_layout_list(const std::string& text) {
  std::vector<std::vector<std::string>> out;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ';')) {
    std::vector<std::string> sets;
    std::stringstream kvs(item);
    std::string kv;
    while (std::getline(kvs, kv, ',')) {
      kv.erase(0, kv.find_first_not_of(" \t"));
      kv.erase(kv.find_last_not_of(" \t") + 1);
      if (kv.empty()) continue;
      // A bare number continues a list value: "pp_layers=3,1,3".
      if (kv.find('=') == std::string::npos && !sets.empty() && kv.find_first_not_of("0123456789") == std::string::npos) {
        sets.back() += "," + kv;
        continue;
      }
      if (kv.find('=') == std::string::npos || kv.front() == '=')
        throw ConfigError("layout item '" + kv + "' in '" + text + "': expected key=value, e.g. dp=2,zero=1");
      // Short keys are [parallel] keys, except grad_accum which lives in [train].
      if (kv.find('.') < kv.find('=')) sets.push_back(kv);
      else sets.push_back((kv.rfind("grad_accum=", 0) == 0 ? "train." : "parallel.") + kv);
    }
    if (!sets.empty()) out.push_back(sets);
  }
  if (out.empty()) throw ConfigError("no layouts in '" + text + "'; expected e.g. \"dp=2;dp=2,zero=1;dp=4\"");
  return out;
}

}  // namespace loom
