// `loom simulate`: one layout of one model on one cluster, predicted (Note [Simulated step]).
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <optional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loom/cli/commands.h"
#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/core/owned.h"
#include "loom/ckpt/run_dir.h"
#include "loom/core/elastic.h"
#include "loom/sim/calibrate.h"
#include "loom/sim/goodput.h"
#include "loom/sim/timeline.h"

namespace loom::cli {

std::string default_local_cluster_path(bool bf16) {
  const std::string file = bf16 ? "cluster-local-bf16.toml" : "cluster-local.toml";
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/loom/" + file;
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/loom/" + file;
  return file;
}

// What the config file, --set and the layout flags say before simulate derives the rest of
// the layout from them. Invalid as given, the final load in resolve_sim_inputs reports the
// problem with every default applied; the layout is then derived from what was given where
// it parses (so that the batch split it derives is not a second, spurious error), its
// degrees at least 1.
static Config probe_config(const SimArgs& a, const std::vector<std::string>& given) {
  try {
    return load_config(a.config_path, given);
  } catch (const ConfigError&) {  // (reported by the final load)
  }
  Config probe;
  try {
    probe = load_config_unvalidated(a.config_path, given);
  } catch (const ConfigError&) {
    if (a.global_batch > 0) probe.train.batch = a.global_batch;
  }
  probe.parallel.tp = std::max<int64_t>(1, a.layout.tp > 0 ? a.layout.tp : probe.parallel.tp);
  probe.parallel.pp = std::max<int64_t>(1, a.layout.pp > 0 ? a.layout.pp : probe.parallel.pp);
  probe.train.batch = std::max<int64_t>(1, probe.train.batch);
  probe.train.grad_accum = std::max<int64_t>(1, probe.train.grad_accum);
  return probe;
}

SimInputs resolve_sim_inputs(const SimArgs& a) {
  std::vector<std::string> cfg_sets, cluster_sets;
  if (!a.model.empty()) cfg_sets.push_back("model.preset=" + a.model);
  for (const std::string& s : a.sets) (s.rfind("cluster.", 0) == 0 ? cluster_sets : cfg_sets).push_back(s);
  if (a.cp < 1) throw ConfigError("--cp " + std::to_string(a.cp) + ": expected >= 1");
  if (a.global_batch > 0) cfg_sets.push_back("train.batch=" + std::to_string(a.global_batch));
  if (a.seq > 0) cfg_sets.push_back("train.seq=" + std::to_string(a.seq));
  // What the config file and --set already say (validation waits for the defaults below).
  std::vector<std::string> given = cfg_sets;
  LayoutFlags shape = a.layout;  // the batch split is derived below, not probed
  shape.micro_batch = shape.grad_accum = -1;
  for (const std::string& s : shape.as_sets()) given.push_back(s);
  const Config probe = probe_config(a, given);
  LayoutFlags layout = a.layout;
  const ParallelConfig& q = probe.parallel;
  const bool dp_given = a.layout.dp > 0 || (q.dp != 1 && q.dp != 0);
  if (!dp_given && a.gpus > 0) {
    // Servers take a device each: S per tp x pp shard.
    const int64_t used = q.tp * q.pp * std::max(a.cp, q.cp), workers = a.gpus - q.ps_servers * q.tp * q.pp;
    if (used <= 0 || workers <= 0 || workers % used != 0)
      throw ConfigError("--gpus " + std::to_string(a.gpus) + (q.ps_servers > 0 ? " less " + std::to_string(q.ps_servers * q.tp * q.pp) +
                        " parameter servers" : "") + " is not divisible by tp x pp x cp = " +
                        std::to_string(used) + "; set --dp or change the layout");
    layout.dp = workers / used;
  }
  // A calibrated CPU (shared device) runs loom's engine; GPU clusters Megatron-LM.
  const std::string local_path = a.local_path.empty() ? default_local_cluster_path() : a.local_path;
  const std::string fw = !a.framework.empty() ? a.framework
                         : sim::load_cluster(a.cluster, cluster_sets, 0, local_path).device.shared ? "loom" : "megatron";
  // An unstated batch split: Megatron's micro-batch 1 (then grad_accum = batch / (mb x dp));
  // loom's engine splits it as `loom train` does (micro-batch = batch / (grad_accum x dp)), so
  // the config a user trains prices the run it trains.
  if (fw != "loom" && layout.micro_batch < 0 && layout.grad_accum < 0 && q.micro_batch == 0 &&
      probe.train.grad_accum == 1)
    layout.micro_batch = 1;
  const int64_t dp = layout.dp > 0 ? layout.dp : std::max<int64_t>(1, q.dp);
  if (layout.micro_batch > 0 && layout.grad_accum < 0 && probe.train.batch % (layout.micro_batch * dp) == 0)
    layout.grad_accum = probe.train.batch / (layout.micro_batch * dp);
  for (const std::string& s : layout.as_sets()) cfg_sets.push_back(s);
  SimInputs in;
  in.plan.cfg = load_config(a.config_path, cfg_sets);
  // The simulator holds context parallelism as SimPlan::cp: a config's parallel.cp (what the
  // engine trains) moves there; --cp and parallel.cp name the same degree.
  in.plan.cp = a.cp;
  sim::take_context_parallel(in.plan);
  const int64_t gpus = a.gpus > 0 ? a.gpus : in.plan.gpus();
  in.cluster = sim::load_cluster(a.cluster, cluster_sets, gpus, local_path);
  sim::scale_compute_rate(in.cluster, a.compute_efficiency);
  in.plan.framework = sim::parse_framework(fw);
  if (!a.attention.empty() && a.attention != "unfused" && in.plan.framework == sim::Framework::kLoom)
    throw ConfigError("--attention " + a.attention + " models the GPU frameworks' kernels; loom's engine has its own "
                      "(drop --attention, or simulate with --framework megatron, fsdp or deepspeed-2021)");
  in.plan.attention = a.attention.size() == 6 && a.attention.rfind("flash", 0) == 0
                          ? sim::Attention(a.attention[5] - '0')  // flash1..3, checked by the option
                          : sim::Attention::kUnfused;
  // Issue 24: how the framework overlaps its communication is the user's to state.
  if (!a.dp_overlap.empty() && a.dp_overlap != "on" && a.dp_overlap != "off")
    throw ConfigError("--dp-overlap '" + a.dp_overlap + "': expected on or off");
  in.plan.dp_overlap = a.dp_overlap != "off";
  in.plan.blocking_p2p = a.blocking_p2p;
  if (!a.tp_overlap.empty() && a.tp_overlap != "on" && a.tp_overlap != "off")
    throw ConfigError("--tp-overlap '" + a.tp_overlap + "': expected on or off");
  in.plan.tp_overlap = a.tp_overlap == "on";
  in.plan.param_gather_overlap = a.param_gather_overlap == "on";
  in.plan.backward_prefetch_post = a.backward_prefetch == "post";
  in.plan.recompute_early_stop = a.recompute_early_stop;
  // Note [fp8 GEMMs]: --precision, else the config's train.gemm_format (what `loom train` runs).
  in.plan.gemm_format = a.precision.empty() ? in.plan.cfg.train.gemm_format : sim::parse_gemm_format(a.precision);
  in.plan.activation_offload_layers = a.activation_offload;
  in.plan.fp8_param_gather = a.fp8_param_gather;
  return in;
}

nlohmann::json layout_json(const sim::SimPlan& p) {
  const ParallelConfig& q = p.cfg.parallel;
  return {{"dp", q.dp}, {"tp", q.tp}, {"pp", q.pp}, {"vpp", q.vpp}, {"cp", p.cp}, {"sp", q.sp}, {"zero", q.zero},
          {"micro_batch", p.cfg.micro_batch()}, {"grad_accum", p.cfg.train.grad_accum}, {"global_batch", p.cfg.train.batch},
          {"seq", p.cfg.seq_len()}, {"schedule", schedule_name(q.schedule)}, {"recompute", recompute_text(q.recompute)}, {"pp_layers", pp_layers_text(q.pp_layers)},
          {"compress", compress_name(q.compress)}};
}

nlohmann::json result_json(const sim::SimResult& r) {
  const sim::Breakdown& b = r.breakdown;
  nlohmann::json ranks = nlohmann::json::array();
  for (const sim::RankReport& k : r.ranks)
    ranks.push_back({{"pp_rank", k.pp_rank}, {"global_rank", k.global_rank}, {"params_bytes", k.memory.params},
                     {"grads_bytes", k.memory.grads}, {"optimizer_bytes", k.memory.optimizer},
                     {"activations_bytes", k.memory.activations}, {"buffers_bytes", k.memory.buffers},
                     {"total_bytes", k.memory.total()}, {"step_end_s", k.step_end_s},
                     {"param_read_bytes", k.param_read_bytes}});
  return {{"step_time_s", r.step_time_s}, {"tokens_per_s", r.tokens_per_s}, {"tflops_per_gpu", r.tflops_per_gpu},
          {"mfu", r.mfu}, {"hfu", r.hfu}, {"bubble_fraction", r.bubble_fraction},
          {"bubble_floor", r.bubble_floor},
          {"peak_memory_bytes", r.peak_memory_bytes}, {"peak_rank", r.peak_rank}, {"gpus", r.gpus},
          {"breakdown", {{"compute_s", b.compute}, {"recompute_s", b.recompute}, {"tp_comm_s", b.tp_comm},
                         {"cp_comm_s", b.cp_comm}, {"zero_comm_s", b.zero_comm}, {"vocab_comm_s", b.vocab_comm},
                         {"pipeline_idle_s", b.pp_idle},
                         {"dp_exposed_s", b.dp_exposed}, {"optimizer_s", b.optimizer},
                         {"param_fetch_exposed_s", b.param_fetch}}},
          {"memory", ranks}, {"warnings", r.warnings}, {"warmup_steps", r.warmup_steps},
          {"warmup_step_time_s", r.warmup_step_time_s}};
}

void print_result(std::ostream& os, const sim::SimResult& r, double device_bytes) {
  const sim::Breakdown& b = r.breakdown;
  const double gib = double(int64_t(1) << 30);
  auto zeroed = [](double x) { return std::abs(x) < 1e-12 ? 0.0 : x; };  // a rounding's -0.0 prints as 0.0
  os << std::fixed << std::setprecision(3) << "step time " << r.step_time_s << " s   tokens/s " << std::setprecision(0)
     << r.tokens_per_s << "   TFLOP/s per GPU " << std::setprecision(1) << r.tflops_per_gpu << " (model FLOPs)\n"
     << std::setprecision(3) << "MFU " << r.mfu << " (model FLOPs)   HFU " << r.hfu
     << " (hardware FLOPs, with recompute)   pipeline bubble " << std::setprecision(1) << 100 * zeroed(r.bubble_fraction)
     << "%";
  if (r.bubble_fraction > 0) os << " (floor " << 100 * r.bubble_floor << "% from unequal stages: Note [Bubble floor])";
  os << "\n"
     << std::setprecision(3) << "slowest rank (s): compute " << b.compute << " (recompute " << b.recompute << ") | tp comm "
     << b.tp_comm << " | cp comm " << b.cp_comm << " | zero comm " << b.zero_comm << " | pipeline idle " << zeroed(b.pp_idle)
     << " | dp exposed " << b.dp_exposed << " | optimizer " << b.optimizer;
  if (b.param_fetch > 0) os << " | parameter fetch (exposed) " << b.param_fetch;
  if (b.vocab_comm > 0) os << " | vocabulary passes' comm " << b.vocab_comm;
  os << "\nmemory per pipeline rank (GiB):   params    grads optimizer activations buffers    total\n";
  for (const sim::RankReport& k : r.ranks) {
    const sim::MemoryBreakdown& m = k.memory;
    os << "  pp " << std::setw(3) << k.pp_rank << " (rank " << std::setw(5) << k.global_rank << ")       "
       << std::setprecision(2) << std::setw(8) << m.params / gib << std::setw(9) << m.grads / gib << std::setw(10)
       << m.optimizer / gib << std::setw(12) << m.activations / gib << std::setw(8) << m.buffers / gib << std::setw(9)
       << m.total() / gib << "\n";
  }
  os << "peak " << std::setprecision(2) << r.peak_memory_bytes / gib << " GiB on rank " << r.peak_rank << " of "
     << device_bytes / gib << " GiB per device";
  if (r.peak_memory_bytes > device_bytes)
    os << ": DOES NOT FIT (" << std::setprecision(3) << r.peak_memory_bytes / device_bytes
       << "x the device; `loom plan` finds a layout that fits, if any)";
  os << "\n";
  if (r.warmup_steps > 0)  // Note [Synchronous warm-up]
    os << "synchronous warm-up: the first " << r.warmup_steps << " steps flush after each, " << std::setprecision(3)
       << r.warmup_step_time_s << " s a step (the flushing 1f1b step); the steady stream above after them\n";
  if (const double io = r.ranks.empty() ? 0 : r.ranks.front().offload_io_s; io > 0)
    os << "optimizer offload: the AdamW moments stream from the offload tier in " << std::setprecision(3) << io
       << " s per step (inside the optimizer phase, overlapping its update)\n";
  for (const sim::RankReport& k : r.ranks)
    if (k.param_read_bytes > 0)
      os << "parameter offload (pp " << k.pp_rank << "): " << std::setprecision(3) << k.param_read_bytes / gib
         << " GiB read per step from the offload tier in " << k.param_read_s << " s, " << k.param_fetch_exposed_s
         << " s of it not hidden by compute\n";
  for (const sim::RankReport& k : r.ranks)
    if (k.grad_spill_bytes > 0)
      os << "gradient chunks (pp " << k.pp_rank << "): " << std::setprecision(3) << k.grad_spill_bytes / gib
         << " GiB spilled to the offload tier per step (and read back), on the step\n";
  for (const std::string& w : r.warnings) os << "warning: " << w << "\n";
}

// simulate --ops: per op of one unit, per micro-batch, and the step's sum over the layers
// this rank runs (pipeline rank 0's count of blocks, every micro-batch).
void print_ops(std::ostream& os, const SimInputs& in, const sim::SimResult& r) {
  const std::vector<sim::OpCost> ops = sim::op_costs(in.plan, in.cluster);
  const double layers = double(in.plan.cfg.model.layers) / double(in.plan.cfg.parallel.pp);
  os << "cost model per op (ms per micro-batch; step: x " << r.micro_batches << " micro-batches"
     << ", blocks x " << layers << "):\n"
     << std::fixed << std::setprecision(3);
  double fwd = 0, bwd = 0;
  for (const sim::OpCost& o : ops) {
    const double times = double(r.micro_batches) * (o.unit == "block" ? layers : 1.0);
    os << "  " << std::left << std::setw(10) << o.unit << std::setw(18) << o.name << std::right << " fwd "
       << std::setw(9) << 1e3 * o.fwd_s << "  bwd " << std::setw(9) << 1e3 * o.bwd_s << "  step " << std::setw(9)
       << 1e3 * times * (o.fwd_s + o.bwd_s) << "\n";
    fwd += times * o.fwd_s, bwd += times * o.bwd_s;
  }
  os << "  total per step: forward " << 1e3 * fwd << " ms, backward " << 1e3 * bwd << " ms (no recompute, no optimizer)\n";
  os.unsetf(std::ios::fixed);
}

sim::FailureModel failure_model(const SimArgs& a) {
  const bool any = a.node_mtbf_h > 0 || a.save_s >= 0 || a.restart_s >= 0;
  if (!any) return {};
  if (!(a.node_mtbf_h > 0 && a.save_s > 0 && a.restart_s >= 0))
    throw ConfigError("goodput (Note [Goodput]) needs --node-mtbf-h H (mean hours between one node's failures, > 0), "
                      "--save-s S (> 0, one checkpoint save) and --restart-s R (>= 0, a failure to the first step "
                      "again), all three; given " + std::to_string(a.node_mtbf_h) + ", " + std::to_string(a.save_s) +
                      ", " + std::to_string(a.restart_s));
  return {a.node_mtbf_h * 3600, a.save_s, a.restart_s};
}

namespace {

int64_t nodes_of(int64_t gpus, const sim::ClusterSpec& c) {
  return (gpus + c.devices_per_node - 1) / std::max<int64_t>(c.devices_per_node, 1);
}

// One shape of an --elastic job after a shrink, simulated on the nodes it holds (no value: its
// GPUs are not whole nodes).
std::optional<sim::SimResult> simulate_shape(const SimInputs& in, const Config& whole, const ElasticShape& shape) {
  const int64_t per_node = std::max<int64_t>(in.cluster.devices_per_node, 1);
  sim::SimPlan p = in.plan;
  p.cfg = with_shape(whole, shape);
  p.cp = shape.cp, p.cfg.parallel.cp = 1;  // the simulator takes cp as SimPlan::cp
  sim::ClusterSpec smaller = in.cluster;  // the nodes the re-formed job holds
  if (p.gpus() < per_node) smaller.nodes = 1, smaller.devices_per_node = p.gpus();
  else smaller.nodes = p.gpus() / per_node;
  if (smaller.devices() != p.gpus()) return std::nullopt;
  return sim::simulate(p, smaller);
}

// Note [Elastic shapes]: the layout an --elastic job re-forms to after losing `lost` nodes (the
// first shape whose simulated peak fits the device: the planner's memory check), simulated
// beside the whole one.
nlohmann::json shrink_report(const SimInputs& in, const sim::SimResult& r, int64_t lost, std::ostream* text) {
  const int64_t per_node = std::max<int64_t>(in.cluster.devices_per_node, 1), slots = r.gpus - lost * per_node;
  if (slots <= 0)
    throw ConfigError("--shrink-nodes " + std::to_string(lost) + ": the layout runs on " + std::to_string(r.gpus) +
                      " GPUs, " + std::to_string(nodes_of(r.gpus, in.cluster)) + " nodes of " + std::to_string(per_node));
  Config whole = in.plan.cfg;
  whole.parallel.cp = in.plan.cp;  // the model's split, as the engine holds it
  // The first shape priced whose peak fits the device (the planner's memory check; not asked when
  // the whole layout does not fit either; at most 64 shapes priced).
  const bool check = r.peak_memory_bytes <= in.cluster.device.memory_bytes;
  std::map<std::string, sim::SimResult> priced;
  auto gib = [](double bytes) { return detail::cat(std::fixed, std::setprecision(1), bytes / double(int64_t(1) << 30), " GiB"); };
  const ElasticShape shape = elastic_shape(whole, slots, [&](const ElasticShape& x) -> std::string {
    if (priced.size() >= 64) return "not priced (64 layouts were)";
    const std::optional<sim::SimResult> s = simulate_shape(in, whole, x);
    if (!s) return "its " + std::to_string(x.ranks) + " GPUs are not whole nodes of " + std::to_string(per_node);
    priced[x.split_text() + " dp " + std::to_string(x.dp)] = *s;
    if (check && s->peak_memory_bytes > in.cluster.device.memory_bytes)
      return "simulated peak " + gib(s->peak_memory_bytes) + " over the device's " +
             gib(in.cluster.device.memory_bytes);
    return "";
  });
  nlohmann::json j = {{"lost_nodes", lost}, {"slots", slots}};
  const auto at = priced.find(shape.split_text() + " dp " + std::to_string(shape.dp));
  if (!shape.problem.empty() && at == priced.end()) {
    if (text) *text << "shrink: losing " << lost << " node(s): " << shape.problem << "; the job would stop\n";
    j["problem"] = shape.problem;
    return j;
  }
  const sim::SimResult& s = at->second;
  const bool fits = s.peak_memory_bytes <= in.cluster.device.memory_bytes;
  if (text)
    *text << std::fixed << std::setprecision(3) << "shrink: losing " << lost << " node(s) (" << lost * per_node
          << " GPUs) of " << nodes_of(r.gpus, in.cluster) << ": "
          << (shape.replanned ? "re-planned to " + shape.split_text() + ", " : "") << "dp " << in.plan.cfg.parallel.dp
          << " -> " << shape.dp
          << ", grad_accum " << in.plan.cfg.train.grad_accum << " -> " << shape.grad_accum << " on " << shape.ranks
          << " GPUs (Note [Elastic shapes]): step " << r.step_time_s << " -> " << s.step_time_s << " s, tokens/s x"
          << std::setprecision(2) << s.tokens_per_s / r.tokens_per_s << ", peak " << std::setprecision(1)
          << s.peak_memory_bytes / double(int64_t(1) << 30) << " GiB" << (fits ? "" : " (no layout fits: the job would stop)")
          << "\n";
  j.update({{"dp", shape.dp}, {"grad_accum", shape.grad_accum}, {"gpus", shape.ranks}, {"step_time_s", s.step_time_s},
            {"tokens_per_s", s.tokens_per_s}, {"peak_memory_bytes", s.peak_memory_bytes}, {"fits", fits}});
  return j;
}

nlohmann::json goodput_json(const sim::GoodputReport& g) {
  return {{"job_mtbf_s", g.job_mtbf_s}, {"daly_interval_s", g.daly_s}, {"young_interval_s", g.young_s},
          {"save_every", g.save_every}, {"goodput", g.goodput}};
}

}  // namespace

int run_simulate(const SimArgs& a) {
  const sim::FailureModel failures = failure_model(a);
  const SimInputs in = resolve_sim_inputs(a);
  check_output_file(a.trace, "--trace", a.overwrite, owned::marks::kTrace);  // before any work (Note [User-named outputs])
  check_output_file(a.svg, "--svg", a.overwrite, owned::marks::kSvg);
  const bool events = !a.trace.empty() || !a.svg.empty();
  const sim::SimResult r = sim::simulate(in.plan, in.cluster, events);
  const ParallelConfig& q = in.plan.cfg.parallel;
  std::ostringstream title;
  title << (in.plan.cfg.model.notes.empty() ? in.plan.cfg.model.preset : std::string("model by shape")) << " on " << in.cluster.name << " (" << r.gpus << " GPUs): dp " << q.dp << " tp "
        << q.tp << " pp " << q.pp << " vpp " << q.vpp << " cp " << in.plan.cp << (q.sp ? " sp" : "") << " zero "
        << q.zero << ", micro-batch " << r.micro_batch << " x " << r.micro_batches << ", " << schedule_name(q.schedule)
        << ", recompute " << recompute_text(q.recompute);
  if (!a.trace.empty()) sim::write_sim_trace(a.trace, r);
  if (!a.svg.empty()) sim::write_sim_svg(a.svg, r, title.str());
  if (a.json) {
    nlohmann::json j = result_json(r);
    j["layout"] = layout_json(in.plan);
    j["model"] = in.plan.cfg.model.preset;
    j["model_notes"] = in.plan.cfg.model.notes;  // Note [Model given by shape]
    j["cluster"] = in.cluster.name;
    if (failures.node_mtbf_s > 0)
      j["goodput"] = goodput_json(sim::goodput_report(failures, nodes_of(r.gpus, in.cluster), r.step_time_s));
    if (a.shrink_nodes > 0) j["shrink"] = shrink_report(in, r, a.shrink_nodes, nullptr);
    std::cout << j.dump() << std::endl;
  } else {
    std::cout << title.str() << "\n";
    for (const std::string& n : in.plan.cfg.model.notes) std::cout << "note: " << n << "\n";
    print_result(std::cout, r, in.cluster.device.memory_bytes);
    if (a.ops) print_ops(std::cout, in, r);
    const int64_t nodes = nodes_of(r.gpus, in.cluster);
    if (failures.node_mtbf_s > 0) std::cout << sim::goodput_text(sim::goodput_report(failures, nodes, r.step_time_s), nodes) << "\n";
    if (a.shrink_nodes > 0) shrink_report(in, r, a.shrink_nodes, &std::cout);
  }
  return 0;
}

int run_calibrate(const CalibrateArgs& a) {
  const bool bf16 = parse_float_format("calibrate --precision", a.precision) == FloatFormat::kBf16;
  const std::string out = a.out.empty() ? default_local_cluster_path(bf16) : a.out;
  CalibrateOptions o;
  o.bf16 = bf16;
  o.threads = a.threads;
  o.ranks = a.ranks;
  o.offload_dir = a.offload_dir;
  o.passes = a.passes;
  o.progress = [](const std::string& line) { std::cerr << "calibrate: " << line << "\n"; };
  const sim::ClusterSpec c = calibrate_local(o);
  const std::string dir = out.substr(0, out.find_last_of('/'));
  if (dir != out && !dir.empty()) std::filesystem::create_directories(dir);
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::ofstream f(out + ".tmp");
  f << "# Measured by `loom calibrate` on " << date << " (Note [Calibration] in src/loom/sim/calibrate.cc):\n"
    << "# every number below is a measurement of loom's own kernels and collectives on this machine.\n"
    << sim::cluster_to_toml(c);
  f.close();
  if (!f) throw Error("calibrate: cannot write '" + out + ".tmp'");
  std::filesystem::rename(out + ".tmp", out);
  std::cout << "wrote " << out << " (use --cluster " << (a.out.empty() ? c.name : out) << ")\n";
  return 0;
}

}  // namespace loom::cli
