// `loom plan`: search the layout space for a model on a cluster (Note [Plan search]).
#include <fstream>
#include <functional>
#include <sstream>
#include <iomanip>
#include <optional>
#include <iostream>
#include <nlohmann/json.hpp>

#include "loom/cli/commands.h"
#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/core/owned.h"
#include "loom/ckpt/run_dir.h"
#include "loom/plan/explain.h"
#include "loom/plan/search.h"

namespace loom::cli {

nlohmann::json layout_json(const sim::SimPlan& p);
nlohmann::json result_json(const sim::SimResult& r);

namespace {

// --compress: auto (loom's engine: every stateful compressor and ZeRO++ where dp crosses
// nodes), none, or a list tried on every dp group ("zeropp" names the ZeRO++ modes).
void set_compressors(const std::string& flag, plan::PlanRequest& req) {
  if (flag == "auto") {
    if (req.like.framework == sim::Framework::kLoom)
      req.compress = {CompressKind::kTopK, CompressKind::kTernGrad, CompressKind::kPowerSgd,
                     CompressKind::kOneBitAdam, CompressKind::kZeroOneAdam, CompressKind::kTopKAdam};
    req.zeropp = req.like.framework == sim::Framework::kLoom;
    return;
  }
  if (flag == "none") return;
  std::stringstream items(flag);
  for (std::string item; std::getline(items, item, ',');) {
    if (item == "zeropp") {
      req.zeropp = true;
      continue;
    }
    try {
      req.compress.push_back(parse_compress(item));
    } catch (const ConfigError& e) {
      throw ConfigError("--compress '" + flag + "': " + e.what() + " (or zeropp, auto, none)");
    }
  }
  req.compress_everywhere = true;
}

nlohmann::json band_json(const sim::ErrorBand& b) {
  return {{"rows", b.rows}, {"median", b.median}, {"median_abs", b.median_abs}, {"max_abs", b.max_abs}, {"basis", b.basis}};
}

// Note [Error bands]: "step time -4.2% median (|error| 6.3% median, 31.8% max) over 20 ...".
std::string band_text(const sim::ErrorBand& b) {
  if (b.rows == 0) return "expected error: unknown (" + b.basis + ")";
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << "expected error: step time " << std::showpos << 100 * b.median
     << std::noshowpos << "% median (|error| " << 100 * b.median_abs << "% median, " << 100 * b.max_abs
     << "% max) over " << b.basis;
  return os.str();
}

// --ps dense | sparse: parameter-server layouts searched too (empty: not).
void set_ps(const std::string& flag, plan::PlanRequest& req) {
  if (!flag.empty() && flag != "dense" && flag != "sparse")
    throw ConfigError("--ps '" + flag + "': expected dense or sparse (parameter-server layouts to try)");
  req.ps = !flag.empty(), req.ps_sparse = flag == "sparse";
}

// One JSON object per plan (with its error band), then the summary (with --explain's
// comparison of #1 and #2).
void print_json(const plan::PlanReport& rep, const PlanArgs& a,
                const std::function<sim::ErrorBand(const plan::PlanCandidate&)>& band,
                const std::function<std::optional<sim::GoodputReport>(const plan::PlanCandidate&)>& goodput) {
  for (const plan::PlanCandidate& c : rep.ranked) {
    nlohmann::json j = result_json(c.result);
    if (const auto g = goodput(c))
      j["goodput"] = {{"job_mtbf_s", g->job_mtbf_s}, {"daly_interval_s", g->daly_s}, {"young_interval_s", g->young_s},
                      {"save_every", g->save_every}, {"goodput", g->goodput}};
    j["layout"] = layout_json(c.plan);
    j["how"] = c.how;
    j["error_band"] = band_json(band(c));
    j["run_step_time_s"] = plan::run_step_s(c);
    if (const std::string caveat = plan::approximation_caveat(c.plan); !caveat.empty()) j["caveat"] = caveat;
    std::cout << j.dump() << "\n";
  }
  nlohmann::json s = {{"evaluated", rep.evaluated}, {"ilp_solves", rep.ilp_solves}, {"ilp_s", rep.ilp_s},
                      {"search_s", rep.total_s}, {"pruned", rep.pruned}};
  if (a.explain && rep.ranked.size() > 1) {
    const plan::Comparison c = plan::compare(rep.ranked[0], rep.ranked[1], band(rep.ranked[0]), band(rep.ranked[1]));
    nlohmann::json terms = nlohmann::json::array();
    for (const plan::TermDelta& t : c.terms) terms.push_back({{"term", t.name}, {"first_s", t.first_s}, {"second_s", t.second_s}});
    s["explain"] = {{"gap_s", c.gap_s}, {"gap_rel", c.gap_rel}, {"terms", terms}, {"validated", c.validated},
                    {"median_abs_error", c.noise}, {"reliable", c.reliable}};
  } else if (a.explain) {
    s["explain"] = "only one layout fits, nothing to compare it with";
  }
  std::cout << nlohmann::json{{"summary", s}}.dump() << std::endl;
}

// The ranked plans as text, each with its error band; --explain's comparison; what was pruned.
void print_text(const plan::PlanReport& rep, const plan::PlanRequest& req, const PlanArgs& a,
                const std::function<sim::ErrorBand(const plan::PlanCandidate&)>& band,
                const std::function<std::optional<sim::GoodputReport>(const plan::PlanCandidate&)>& goodput) {
  const double gib = double(int64_t(1) << 30);
  std::cout << "loom plan: " << req.like.cfg.model.preset << " on " << a.sim.gpus << " x " << req.cluster.device.name
            << " (" << req.cluster.name << "), global batch " << req.global_batch << " x seq " << req.like.cfg.seq_len()
            << "\n";
  int i = 0;
  for (const plan::PlanCandidate& c : rep.ranked) {
    const sim::SimResult& r = c.result;
    const sim::Breakdown& b = r.breakdown;
    std::cout << std::fixed << "#" << ++i << "  " << plan::layout_label(c.plan) << "  [" << c.how << "]\n"
              << std::setprecision(3) << "    step " << r.step_time_s << " s, MFU " << r.mfu << ", HFU " << r.hfu
              << ", " << std::setprecision(1) << r.tflops_per_gpu << " TFLOP/s/GPU; compute " << std::setprecision(3)
              << b.compute << " s, exposed comm " << b.tp_comm + b.cp_comm + b.zero_comm + b.vocab_comm + b.dp_exposed
              << " s, bubble " << b.pp_idle << " s; peak " << std::setprecision(1) << r.peak_memory_bytes / gib
              << " GiB\n";
    std::cout << "    " << band_text(band(c)) << "\n";
    if (const auto g = goodput(c)) std::cout << "    " << sim::goodput_text(*g, g->nodes) << "\n";
    if (r.warmup_steps > 0)  // Note [Synchronous warm-up]: what the ranking uses
      std::cout << "    synchronous warm-up: " << r.warmup_steps << " steps at " << r.warmup_step_time_s
                << " s; mean step over the run " << plan::run_step_s(c) << " s\n";
    if (const std::string caveat = plan::approximation_caveat(c.plan); !caveat.empty()) std::cout << "    " << caveat << "\n";
  }
  if (a.explain && rep.ranked.size() > 1)
    std::cout << plan::explain_choice(rep.ranked[0], rep.ranked[1], band(rep.ranked[0]), band(rep.ranked[1]));
  else if (a.explain)
    std::cout << "--explain: only one layout fits, nothing to compare it with\n";
  std::cout << "pruned:";
  for (const auto& [reason, n] : rep.pruned) std::cout << "\n  " << n << " " << reason << " (e.g. " << rep.example.at(reason) << ")";
  std::cout << "\n" << rep.evaluated << " layouts simulated, " << rep.ilp_solves << " ILP solves (" << std::setprecision(3)
            << rep.ilp_s << " s), search " << rep.total_s << " s\n";
}

// What `loom simulate` prices but the search does not vary: refused by name.
void refuse_unsearched(const SimArgs& a) {
  if (a.activation_offload > 0)  // Note [Activation offload]: pp 1 and no recompute, not a searched choice
    throw ConfigError("--activation-offload " + std::to_string(a.activation_offload) +
                      ": loom plan does not search activation offload; price a layout with it by `loom simulate "
                      "--activation-offload N`");
  if (a.fp8_param_gather)  // Note [fp8 weights under ZeRO-3]: ZeRO-3 only, and the search varies ZeRO
    throw ConfigError("--fp8-param-gather: loom plan does not search fp8 gathers; price a ZeRO-3 layout with them by "
                      "`loom simulate --zero 3 --fp8-param-gather`");
}

}  // namespace

int run_plan(const PlanArgs& a) {
  if (a.sim.gpus <= 0) throw ConfigError("loom plan needs --gpus N (the devices to plan for)");
  const sim::FailureModel failures = failure_model(a.sim);
  if (!a.emit.empty() && a.emit != "loom" && a.emit != "megatron")
    throw ConfigError("--emit '" + a.emit + "': expected loom or megatron");
  if (a.top < 1) throw ConfigError("--top " + std::to_string(a.top) + ": expected >= 1");
  if (a.explain && !a.emit.empty() && a.out.empty())
    throw ConfigError("--explain with --emit " + a.emit + " and no --out: the plan goes to stdout alone; add --out FILE "
                      "(the list and the explanation follow), or drop --emit");
  if (!a.out.empty())  // before the search (Note [User-named outputs])
    check_output_file(a.out, "--out", a.sim.overwrite,
                      a.emit == "loom" ? owned::marks::kPlanToml : std::vector<std::string>{});
  SimArgs base = a.sim;
  base.layout = LayoutFlags{};  // the layout is what is searched
  base.layout.micro_batch = 1;
  base.layout.dp = 1;
  base.gpus = 0;
  const SimInputs in = resolve_sim_inputs(base);  // validates the model and run keys
  refuse_unsearched(a.sim);
  plan::PlanRequest req;
  req.like = in.plan;
  std::vector<std::string> cluster_sets;
  for (const std::string& s : a.sim.sets)
    if (s.rfind("cluster.", 0) == 0) cluster_sets.push_back(s);
  req.cluster = sim::load_cluster(a.sim.cluster, cluster_sets, a.sim.gpus,
                                  a.sim.local_path.empty() ? default_local_cluster_path() : a.sim.local_path);
  sim::scale_compute_rate(req.cluster, a.sim.compute_efficiency);
  req.global_batch = a.sim.global_batch > 0 ? a.sim.global_batch : in.plan.cfg.train.batch;
  req.top = a.top;
  req.cp.clear();  // --cp N (or parallel.cp = N): context-parallel degrees 1, 2, 4, ... up to N
  for (int64_t cp = 1; cp <= std::max(a.sim.cp, in.plan.cp); cp *= 2)
    if (req.like.cfg.seq_len() % cp == 0) req.cp.push_back(cp);
  set_compressors(a.compress, req);
  set_ps(a.ps, req);
  const plan::PlanReport rep = plan::search_plans(req);
  const std::string cluster_file =
      sim::cluster_file_path(a.sim.cluster, a.sim.local_path.empty() ? default_local_cluster_path() : a.sim.local_path);
  const std::vector<sim::ValidationPoint> points = plan::validation_points(req.like.framework, cluster_file);
  // Note [Stale error bands]
  const bool stale = req.like.framework == sim::Framework::kLoom && sim::engine_points_stale(cluster_file);
  auto band = [&](const plan::PlanCandidate& c) {
    sim::ErrorBand b = sim::error_band(points, sim::layout_kind(c.plan), sim::device_family(req.cluster.device.name),
                                       plan::validation_what(req.like.framework));
    if (stale && b.rows > 0)
      b.basis += ", scored against an earlier calibration of this machine (rerun bench/sim_vs_engine on " + cluster_file + ")";
    return b;
  };
  if (rep.ranked.empty()) {
    std::string why;
    for (const auto& [reason, n] : rep.pruned) why += "\n  " + std::to_string(n) + " " + reason + " (e.g. " + rep.example.at(reason) + ")";
    throw ConfigError("no layout of " + req.like.cfg.model.preset + " fits " + std::to_string(a.sim.gpus) + " x " +
                      req.cluster.device.name + " at global batch " + std::to_string(req.global_batch) + ":" + why);
  }
  if (!a.emit.empty()) {
    const sim::SimPlan& best = rep.ranked.front().plan;
    const std::string text = a.emit == "loom" ? plan::emit_loom_toml(best) : plan::emit_megatron_args(best);
    if (a.out.empty()) {
      std::cout << text;
    } else {
      write_file_atomic(a.out, text);
      std::cerr << "wrote the best plan to " << a.out << "\n";
    }
    if (a.out.empty()) return 0;
  }
  // Note [Goodput]: each plan's expected goodput and save interval, at its predicted step time.
  auto goodput = [&](const plan::PlanCandidate& c) -> std::optional<sim::GoodputReport> {
    if (failures.node_mtbf_s <= 0) return std::nullopt;
    const int64_t per_node = std::max<int64_t>(req.cluster.devices_per_node, 1);
    return sim::goodput_report(failures, (c.result.gpus + per_node - 1) / per_node, plan::run_step_s(c));
  };
  if (a.sim.json) {
    print_json(rep, a, band, goodput);
    return 0;
  }
  print_text(rep, req, a, band, goodput);
  return 0;
}

}  // namespace loom::cli
