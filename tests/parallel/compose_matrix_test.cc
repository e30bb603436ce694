// The composition matrix (issue 52): every training mode on every parallel layout of
// ../shared/tools/compose_probe.py, on a tiny model, each accepted pair trained and held to
// its reference, each refused pair refused by the config check with its reason:
//  - a mode that a single process runs (precisions, bf16 moments, SGD, offload, recompute) is
//    in the base config, so its reference is the single-process run of that mode;
//  - a mode of the data-parallel gradient path or the schedule (codecs, compressors, Adasum,
//    ZeRO++, zero-bubble schedules, the synchronous parameter server) is in the layout, held
//    against the plain single-process run with loom verify's bound for it (tolerance_for:
//    exact layouts 1e-5 in loss and 1e-4 in weights, each approximation its measured bound,
//    Note [Verify tolerances]);
//  - 2bw, pipedream and pipemare equal their delayed-update reference (the flushing layout
//    with the same versions bound) bit for bit;
//  - the asynchronous parameter server has no exact reference: it applies exactly W x
//    train.steps pushes and ends within kAsyncPsLossRel of the single process's validation loss.
// CompositionMatrix.EachModeOnOneLayout runs in the default suite; the whole matrix is
// labelled slow (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "loom/core/error.h"
#include "loom/train/verify.h"
#include "support/temp_dir.h"
#include "support/train_threads.h"

namespace loom {
namespace {

using Sets = std::vector<std::string>;

// Async PS with two workers, final validation loss against the single-process run's:
// measured 2.4e-3 to 4.0e-3 relative over 6 runs -> 0.02.
constexpr double kAsyncPsLossRel = 0.02;

enum class Ref { kSingleWithMode, kSingle, kStream, kAsyncPs };

struct Mode {
  std::string name;
  Sets keys;
  Ref ref;
};

const std::vector<std::pair<std::string, Sets>>& layouts() {
  static const std::vector<std::pair<std::string, Sets>> l = {
      {"dp2", {"parallel.dp=2"}},
      {"dp2 z1", {"parallel.dp=2", "parallel.zero=1"}},
      {"dp2 z2", {"parallel.dp=2", "parallel.zero=2"}},
      {"dp2 z3", {"parallel.dp=2", "parallel.zero=3"}},
      {"tp2 sp", {"parallel.tp=2", "parallel.sp=true"}},
      {"pp2", {"parallel.pp=2"}},
      {"pp2 vpp2", {"parallel.pp=2", "parallel.vpp=2", "parallel.schedule=interleaved", "train.grad_accum=2"}},
      {"dp2 pp2", {"parallel.dp=2", "parallel.pp=2"}},
      {"dp2 tp2", {"parallel.dp=2", "parallel.tp=2"}},
      {"dp2 z3 pp2", {"parallel.dp=2", "parallel.zero=3", "parallel.pp=2"}},
  };
  return l;
}

std::vector<Mode> modes(const std::string& offload_dir) {
  const std::string dir = "offload.dir=" + offload_dir;
  const std::string warm = "parallel.compress_warmup_steps=2";
  return {
      {"bf16", {"train.precision=bf16"}, Ref::kSingleWithMode},
      {"fp16+scale", {"train.precision=fp16"}, Ref::kSingleWithMode},
      {"bf16 moments", {"optim.moments=bf16"}, Ref::kSingleWithMode},
      {"sgd", {"optim.name=sgd"}, Ref::kSingleWithMode},
      {"grad bf16 wire", {"comm.grad_dtype=bf16"}, Ref::kSingle},
      {"param bf16 gath", {"comm.param_dtype=bf16"}, Ref::kSingle},
      {"int8", {"parallel.compress=int8"}, Ref::kSingle},
      {"topk", {"parallel.compress=topk"}, Ref::kSingle},
      {"terngrad", {"parallel.compress=terngrad"}, Ref::kSingle},
      {"powersgd", {"parallel.compress=powersgd"}, Ref::kSingle},
      {"accordion", {"parallel.compress=powersgd", "parallel.compress_adapt=accordion", "parallel.accordion_window=2"},
       Ref::kSingle},
      {"onebit_adam", {"parallel.compress=onebit_adam", warm}, Ref::kSingle},
      {"zero_one_adam", {"parallel.compress=zero_one_adam", "parallel.zero_one_var_freeze_steps=3",
                         "parallel.zero_one_local_scaler=1", "parallel.zero_one_local_clip=2"}, Ref::kSingle},
      {"topk_adam", {"parallel.compress=topk_adam", "parallel.compress_ratio=0.01", warm}, Ref::kSingle},
      {"adasum", {"parallel.reduce=adasum"}, Ref::kSingle},
      {"zero++ qwz", {"parallel.zeropp_qwz=true"}, Ref::kSingle},
      {"zero++ qgz", {"parallel.zeropp_qgz=true"}, Ref::kSingle},
      {"zb-h1", {"parallel.schedule=zb-h1"}, Ref::kSingle},
      {"zb-v", {"parallel.schedule=zb-v"}, Ref::kSingle},
      {"2bw", {"parallel.schedule=2bw", "train.grad_accum=2"}, Ref::kStream},
      {"pipedream", {"parallel.schedule=pipedream", "optim.grad_clip=0", "train.grad_accum=1"}, Ref::kStream},
      {"pipemare", {"parallel.schedule=pipemare", "optim.grad_clip=0", "train.grad_accum=1"}, Ref::kStream},
      {"ps sync", {"parallel.ps_servers=1"}, Ref::kSingle},
      {"ps async", {"parallel.ps_servers=1", "ps.mode=async"}, Ref::kAsyncPs},
      {"offload opt", {"offload.optimizer=disk", dir}, Ref::kSingleWithMode},
      {"offload params", {"offload.params=disk", "offload.optimizer=disk", dir}, Ref::kSingleWithMode},
      {"recompute full", {"parallel.recompute=full"}, Ref::kSingleWithMode},
  };
}

// The pairs the config check refuses, each for the reason its message names.
const std::map<std::string, std::string>& expected_refusals() {
  static const std::map<std::string, std::string> r = {
      {"zero_one_adam x dp2 z1", "which ZeRO's sharded optimizer cannot"},
      {"zero_one_adam x dp2 z2", "which ZeRO's sharded optimizer cannot"},
      {"zero_one_adam x dp2 z3", "which ZeRO's sharded optimizer cannot"},
      {"zero_one_adam x dp2 z3 pp2", "which ZeRO's sharded optimizer cannot"},
      {"2bw x dp2 z3 pp2", "so nothing is sharded"},
      {"pipedream x dp2 z3 pp2", "so nothing is sharded"},
      {"pipemare x dp2 z3 pp2", "so nothing is sharded"},
  };
  return r;
}

bool in(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

const std::set<std::string> kSchedules = {"zb-h1", "zb-v", "2bw", "pipedream", "pipemare"};
const std::set<std::string> kDpOnly = {"grad bf16 wire", "param bf16 gath", "int8", "topk", "terngrad", "powersgd",
                                       "accordion", "onebit_adam", "zero_one_adam", "topk_adam", "adasum",
                                       "ps sync", "ps async"};

// The probe's cells: which (mode, layout) pairs are meaningful, and the companion keys a
// pair needs (a schedule's vpp). Returns false for a pair the probe leaves out.
bool cell(const Mode& m, const std::string& layout, Sets& extra) {
  const bool pipe = in(layout, "pp2");
  if (kSchedules.count(m.name) && !pipe) return false;
  if (kDpOnly.count(m.name) && !in(layout, "dp2")) return false;
  if (m.name == "param bf16 gath" && !in(layout, "z3")) return false;
  if (m.name.rfind("ps ", 0) == 0 && in(layout, " z")) return false;
  if (m.name.rfind("zero++", 0) == 0 && !in(layout, "z3")) return false;
  extra.clear();
  if (kSchedules.count(m.name) && in(layout, "vpp2") && m.name != "zb-v") {
    extra = {"parallel.vpp=1", "parallel.schedule=" + m.name};
    if (m.name == "pipedream" || m.name == "pipemare") extra.push_back("train.grad_accum=1");
  }
  if (m.name == "zb-v" && !in(layout, "vpp2")) extra = {"parallel.vpp=2"};
  return true;
}

Sets tiny() {
  return {"model.layers=4", "model.d_model=64", "model.heads=4", "model.ffn=128", "model.ctx=32", "train.batch=8",
          "train.steps=6", "train.val_batches=1", "train.val_every=0", "train.threads=1", "checkpoint.dir=",
          "comm.timeout_s=60", "optim.warmup_steps=2"};
}

Sets joined(Sets a, const Sets& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A stream against its delayed-update reference, bit for bit: the error, or "".
std::string check_stream(const Mode& m, const Sets& layout) {
  const Sets sets = joined(joined(tiny(), layout), m.keys);
  const Config c = load_config("", sets);
  const std::vector<TrainSummary> got = testing_support::train_keeping_params(c);
  Config ref = c;
  ref.parallel.schedule = ScheduleKind::k1F1B;
  TrainOptions o;
  o.keep_params = true;
  if (m.name == "2bw") o.two_bw_reference = true;
  else o.async_reference = m.name;
  const std::vector<TrainSummary> want = testing_support::train_as_threads(ref, o);
  for (size_t r = 0; r < got.size(); r++)
    if (got[r].losses != want[0].losses || got[r].final_params != want[0].final_params)
      return "rank " + std::to_string(r) + " differs from the delayed-update reference";
  return "";
}

// The asynchronous parameter server: a fast worker trains more steps than a slow one, so the
// run is held by what holds whatever the timing: exactly W x train.steps pushes applied, and
// the final validation loss within kAsyncPsLossRel of the single-process run's.
std::string check_async_ps(const Mode& m, const Sets& layout) {
  const Config c = load_config("", joined(joined(tiny(), layout), m.keys));
  const TrainSummary single = testing_support::train_as_threads(load_config("", tiny()))[0];
  const std::vector<TrainSummary> got = testing_support::train_as_threads(c);
  const int64_t budget = c.parallel.dp * c.train.steps;
  for (size_t r = 0; r < got.size(); r++)
    if (got[r].ps_pushes != budget)
      return "rank " + std::to_string(r) + " reports " + std::to_string(got[r].ps_pushes) + " pushes, not " +
             std::to_string(budget);
  const double rel = std::abs(got[0].final_val_loss - single.final_val_loss) / single.final_val_loss;
  std::cout << m.name << ": final validation loss " << got[0].final_val_loss << " against " << single.final_val_loss
            << " (" << rel << " relative)\n";
  if (!(rel <= kAsyncPsLossRel)) return "final validation loss " + std::to_string(rel) + " relative from the single process";
  return "";
}

// A mode's accepted layouts against its reference; a failure names the pair and the distance.
void check_mode(const Mode& m, const std::vector<std::pair<std::string, Sets>>& pairs) {
  if (pairs.empty()) return;
  if (m.ref == Ref::kStream || m.ref == Ref::kAsyncPs) {
    for (const auto& [name, layout] : pairs)
      EXPECT_EQ(m.ref == Ref::kStream ? check_stream(m, layout) : check_async_ps(m, layout), "") << m.name << " x " << name;
    return;
  }
  const bool in_base = m.ref == Ref::kSingleWithMode;
  const Config base = load_config("", in_base ? joined(tiny(), m.keys) : tiny());
  std::vector<Sets> layouts;
  for (const auto& [name, layout] : pairs) layouts.push_back(in_base ? layout : joined(layout, m.keys));
  const std::vector<VerifyRow> rows = verify_layouts(base, layouts);
  ASSERT_EQ(rows.size(), pairs.size());
  for (size_t i = 0; i < rows.size(); i++)
    EXPECT_TRUE(rows[i].ok) << m.name << " x " << pairs[i].first << ": " << rows[i].error << " loss rel "
                            << rows[i].max_loss_rel << " weights " << rows[i].max_weight_abs << " (bound "
                            << rows[i].tolerance.loss_rel << ", " << rows[i].tolerance.weight_abs << ")";
}

// Runs the matrix (every accepted pair, or each mode's last accepted layout when `one`) and
// checks the refusals; returns the accepted and total counts.
std::pair<int, int> run_matrix(bool one) {
  testing_support::TempDir dir("loom-compose");
  int accepted = 0, total = 0;
  std::set<std::string> refused;
  for (const Mode& m : modes(dir.path.string())) {
    std::vector<std::pair<std::string, Sets>> pairs;
    for (const auto& [name, layout] : layouts()) {
      Sets extra;
      if (!cell(m, name, extra)) continue;
      ++total;
      const std::string pair = m.name + " x " + name;
      const Sets layout_sets = joined(layout, extra);
      try {
        load_config("", joined(joined(tiny(), layout_sets), m.keys));
      } catch (const ConfigError& e) {
        refused.insert(pair);
        const auto want = expected_refusals().find(pair);
        EXPECT_NE(want, expected_refusals().end()) << pair << " is refused: " << e.what();
        if (want != expected_refusals().end()) EXPECT_TRUE(in(e.what(), want->second.c_str())) << pair << ": " << e.what();
        continue;
      }
      ++accepted;
      pairs.push_back({name, layout_sets});
    }
    if (one && pairs.size() > 1) pairs.erase(pairs.begin(), pairs.end() - 1);
    check_mode(m, pairs);
  }
  for (const auto& [pair, why] : expected_refusals()) EXPECT_TRUE(refused.count(pair)) << pair << " is accepted now";
  return {accepted, total};
}

TEST(CompositionMatrix, EachModeOnOneLayout) {
  const auto [accepted, total] = run_matrix(true);
  EXPECT_EQ(total, 172);
  EXPECT_EQ(accepted, total - int(expected_refusals().size()));
}

TEST(CompositionMatrix, EveryAcceptedPairMatchesItsReference) {
  const auto [accepted, total] = run_matrix(false);
  EXPECT_EQ(total, 172);
  std::cout << "composition: " << accepted << "/" << total << " pairs accepted and checked\n";
}

}  // namespace
}  // namespace loom
