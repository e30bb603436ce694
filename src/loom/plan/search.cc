#include "loom/plan/search.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>
#include <sstream>

#include "loom/core/error.h"
#include "loom/sim/costs.h"
#include "loom/sim/memory_model.h"
#include "loom/plan/layer_ilp.h"
#include "loom/plan/stage_dp.h"
#include "loom/parallel/schedule.h"

namespace loom::plan {

// Note [Plan search]
// 1. Enumerate tp (divisors of the GPU count up to a node), pp (up to the layer count),
//    cp (as asked), dp = gpus / (tp pp cp), micro-batch 1, 2, 4, 8 and the config's own,
//    1F1B or interleaved with
//    vpp 2..4 (stages may be uneven) and every larger vpp that splits each stage's layers
//    evenly (interleave_degrees: published layouts use up to 12, e.g. 96 layers on pp 8),
//    sp on/off, ZeRO 0-3 and a uniform recompute policy. Layouts the engine's
//    validator refuses, or whose batch does not divide, are pruned with the reason; the
//    rest are simulated (the same replay as `loom simulate`) and those over device memory
//    are pruned as out of memory.
// 2. Refine the best few: the stage DP re-splits layers when the embedding and head make
//    the ends heavier (under pp_vocab, the other rank-balanced split); the layer ILP picks
//    each layer's recompute policy so the slowest stage is fastest within every stage's
//    memory. A refinement is kept only if the simulator (not the solver's own estimate) says
//    it is faster and fits.

std::vector<int64_t> interleave_degrees(int64_t layers, int64_t pp) {
  std::vector<int64_t> out;
  if (pp < 2) return out;
  for (int64_t v = 2; v * pp <= layers; v++)
    if (v <= 4 || (layers % pp == 0 && (layers / pp) % v == 0)) out.push_back(v);
  return out;
}

namespace {

std::vector<int64_t> divisors(int64_t n, int64_t cap) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= std::min(n, cap); ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

struct Acc {
  PlanReport& rep;
  void prune(const std::string& reason, const std::string& layout) {
    if (rep.pruned[reason]++ == 0) rep.example[reason] = layout;
  }
};

// Micro-batches tried: 1, 2, 4, 8 and the one the given config names in parallel.micro_batch
// (a tuned run's 12 or 20 is not a power of two; Note [Plan search]).
std::vector<int64_t> micro_batches(int64_t named) {
  std::vector<int64_t> out = {1, 2, 4, 8};
  if (named > 0 && std::find(out.begin(), out.end(), named) == out.end()) out.push_back(named);
  return out;
}

bool fits(const sim::SimResult& r, const sim::ClusterSpec& c) { return r.peak_memory_bytes <= c.device.memory_bytes; }

// How a candidate's dp group communicates besides exactly: a compressor (zero 0/1) or ZeRO++
// (zero 2/3).
struct SyncChoice {
  CompressKind compress = CompressKind::kNone;
  bool qwz = false, qgz = false, hpz = false;
};

// The config loom's engine would train for a plan: the simulator holds context parallelism as
// SimPlan::cp, the engine as parallel.cp (zigzag needs 2 cp chunks of the sequence, else the
// plain split).
Config engine_config(const sim::SimPlan& p) {
  Config c = p.cfg;
  c.parallel.cp = p.cp;
  if (p.cp > 1 && c.seq_len() % cp_pieces(p.cp, CpSplit::kZigZag) != 0) c.parallel.cp_split = CpSplit::kPlain;
  return c;
}

// What the config check says of a candidate; under --framework loom with cp > 1 also what it
// says of the engine's config (the cp refusals: e.g. Ulysses where cp does not divide the
// heads, or Adasum), so the planner never ranks a plan the engine refuses. GPU frameworks' cp
// plans are priced, not run by loom.
std::vector<std::string> candidate_errors(const sim::SimPlan& p) {
  std::vector<std::string> errs = validation_errors(p.cfg);
  if (errs.empty() && p.cp > 1 && p.framework == sim::Framework::kLoom) errs = validation_errors(engine_config(p));
  if (errs.empty() && p.cfg.parallel.pp_vocab)  // Note [Vocabulary passes]: searched only where the engine runs it
    if (const std::string why = engine_refusal(p); !why.empty()) errs.push_back("parallel.pp_vocab = true: " + why);
  return errs;
}

// The context-parallel modes a plan of `cp` ranks tries: under --framework loom the engine's
// allgather and ring (Note [Ring attention pricing]), and ulysses where cp divides each tp
// rank's heads and kv heads (Note [Ulysses attention]); the GPU frameworks' own scheme (ring,
// Note [Flash under context parallelism]) otherwise, as the config names it.
std::vector<CpMode> cp_modes(const sim::SimPlan& plan, int64_t cp, int64_t tp) {
  if (cp == 1 || plan.framework != sim::Framework::kLoom) return {plan.cfg.parallel.cp_mode};
  const ModelConfig& m = plan.cfg.model;
  if ((m.heads / tp) % cp == 0 && (m.kv_heads / tp) % cp == 0)
    return {CpMode::kAllGather, CpMode::kRing, CpMode::kUlysses};
  return {CpMode::kAllGather, CpMode::kRing};
}

// Exact sync, plus the requested compressors or ZeRO++ modes where they apply, over a dp
// group that crosses nodes (or anywhere, if asked): every compressor at every ZeRO stage (the
// codecs in the reduce-scatter, Note [Ring codecs]; the stateful ones and 1-bit / top-k Adam
// on whole buckets, Note [Compressed ZeRO-2/3], Note [Compressed Adam with ZeRO]) but 0/1
// Adam under ZeRO (its local steps), and ZeRO++ on reduce-scattered gradients.
std::vector<SyncChoice> sync_choices(const PlanRequest& req, const sim::SimPlan& plan, int64_t zero) {
  std::vector<SyncChoice> out = {SyncChoice{}};
  const ParallelConfig& q = plan.cfg.parallel;
  const int64_t group = q.dp * plan.cp;
  if (group < 2) return out;
  if (!req.compress_everywhere && sim::place_group(req.cluster, group, q.tp).nodes < 2) return out;
  for (CompressKind k : req.compress)
    if (k != CompressKind::kNone && (zero == 0 || k != CompressKind::kZeroOneAdam)) out.push_back({k});
  if (zero >= 2 && req.zeropp) {
    out.push_back({CompressKind::kNone, false, true, false});
    if (zero == 3)
      for (const SyncChoice c : {SyncChoice{CompressKind::kNone, false, false, true},
                                 SyncChoice{CompressKind::kNone, true, true, false},
                                 SyncChoice{CompressKind::kNone, true, true, true}})
        out.push_back(c);
  }
  return out;
}

// Stage DP on a pipelined plan: per-layer fwd + bwd time, embedding and head at the ends.
// Under parallel.pp_vocab the ends carry neither (the vocabulary passes share them over every
// rank) and what the split must balance is each rank's blocks, which a DP over stages does not
// see when a rank holds several: the rank-balanced split with the other tie (Note [Stage split])
// is tried instead, e.g. config B's zb-v at pp 2 as 1, 1, 2, 2 beside the default 2, 2, 1, 1.
bool refine_stages(const PlanRequest& req, PlanCandidate& c) {
  const ParallelConfig& par = c.plan.cfg.parallel;
  if (par.pp * par.vpp < 2) return false;
  const int64_t L = c.plan.cfg.model.layers;
  std::vector<int> split;
  if (par.pp_vocab) {
    split = rank_balanced_stage_split(int(L), int(par.pp), int(par.vpp), par.schedule, true);
    if (split == par.layer_split(L)) return false;
  } else {
    const sim::BlockCosts bc = sim::block_costs(c.plan, req.cluster);
    std::vector<double> t;
    for (const Recompute r : par.recompute_layers(L)) t.push_back(bc.time_s[int(r)]);
    // The ends may hold no block (Note [Stage split]): an embedding or a head as heavy as a stage.
    split = split_stages(t, int(par.pp * par.vpp), bc.embed_s, bc.head_s, {}, true).layers;
    if (split.empty()) return false;
  }
  PlanCandidate next = c;
  next.plan.cfg.parallel.pp_layers.assign(split.begin(), split.end());
  next.result = sim::simulate(next.plan, req.cluster);
  if (!fits(next.result, req.cluster) || next.result.step_time_s >= c.result.step_time_s) return false;
  const char* how = par.pp_vocab ? "balanced split" : "stage DP";
  next.how = c.how == "uniform" ? how : c.how + " + " + how;
  c = next;
  return true;
}

// Per-layer recompute: memory per layer = its stored bytes x the chunks its rank holds.
bool refine_recompute(const PlanRequest& req, PlanCandidate& c, PlanReport& rep) {
  const ParallelConfig& par = c.plan.cfg.parallel;
  const int64_t L = c.plan.cfg.model.layers, V = par.pp * par.vpp;
  const sim::BlockCosts bc = sim::block_costs(c.plan, req.cluster);
  const std::vector<int> per_stage = parallel::stage_layers(int(L), int(V), par.layer_split(L));
  LayerIlp p;
  p.group_budget_bytes.assign(size_t(par.pp), 0);
  p.group_base_s.assign(size_t(par.pp), 0);
  for (const sim::RankReport& r : c.result.ranks) {
    const double fixed = r.memory.total() - r.memory.activations;
    p.group_budget_bytes[size_t(r.pp_rank)] = 0.97 * req.cluster.device.memory_bytes - fixed;  // 3% headroom
  }
  // Strategies per layer: recompute none / selective / full, and under ZeRO-3 each either
  // gathered per use (shard) or kept gathered for the step (keep): index = policy + 3 keep.
  const int keeps = par.zero >= 3 && c.plan.framework != sim::Framework::kDeepSpeed2021 ? 2 : 1;
  static const char* kPolicy[3] = {"none", "selective", "full"};  // indexed by Recompute
  for (int64_t v = 0, l = 0; v < V; ++v)
    for (int i = 0; i < per_stage[size_t(v)]; ++i, ++l) {
      const int rank = int(v % par.pp);
      const double held = double(bc.in_flight[size_t(rank)]) / double(par.vpp);
      std::vector<Strategy> s;
      for (int keep = 0; keep < keeps; ++keep)
        for (int k = 0; k < 3; ++k)
          s.push_back({std::string(kPolicy[k]) + (keep ? "+keep" : ""),
                       bc.time_s[k] + (keep ? bc.zero_keep_s[k] : bc.zero_shard_s[k]),
                       bc.act_bytes[k] * held + (keep ? bc.unit_bytes : 0)});
      p.layers.push_back(s);
      p.group.push_back(rank);
    }
  const IlpSolution sol = solve_layer_ilp(p, 5);
  ++rep.ilp_solves;
  rep.ilp_s += sol.solve_s;
  if (!sol.feasible) return false;
  std::vector<Recompute> policy;
  std::vector<bool> kept;
  for (int k : sol.choice) {
    policy.push_back(Recompute(k % 3));
    kept.push_back(k >= 3);
  }
  PlanCandidate next = c;
  next.plan.cfg.parallel.recompute = policy;
  if (keeps == 2 && std::count(kept.begin(), kept.end(), true) > 0) next.plan.cfg.parallel.zero_keep = kept;
  next.result = sim::simulate(next.plan, req.cluster);
  if (!fits(next.result, req.cluster) || next.result.step_time_s >= c.result.step_time_s) return false;
  next.how = c.how == "uniform" ? "per-layer ILP" : c.how + " + per-layer ILP";
  c = next;
  return true;
}

}  // namespace

// Note [Optimizer offload], Note [Chunk manager]: `c` again with its moments on the
// cluster's offload tier, then (on loom's engine) with its parameters there too, then
// (one device) its gradients; true (and c replaced) by the first that fits device memory and
// the tier's capacity (8 bytes a parameter for the moments, 12 with the parameters, 16 with
// the gradients).
bool offloaded(const PlanRequest& req, PlanCandidate& c, PlanReport& rep) {
  if (!req.offload || !(req.cluster.offload.read_bw > 0) || c.plan.cfg.offload.optimizer == loom::OffloadTier::kDisk) return false;
  sim::SimPlan o = c.plan;
  o.cfg.offload.optimizer = loom::OffloadTier::kDisk;
  o.cfg.offload.dir = req.offload_dir;
  for (const int level : {0, 1, 2}) {
    const bool params = level >= 1;
    if (params && o.framework != sim::Framework::kLoom) return false;
    if (level == 2 && (o.cfg.parallel.world() != 1 || o.cp != 1)) return false;
    if (params) o.cfg.offload.params = loom::OffloadTier::kDisk;
    if (params && !(o.cfg.memory.limit_gib > 0))  // the chunk manager's budget: the device
      o.cfg.memory.limit_gib = 0.97 * req.cluster.device.memory_bytes / double(int64_t(1) << 30);
    if (level == 2) o.cfg.offload.grads = loom::OffloadTier::kDisk, o.cfg.offload.chunk_mb = std::max(1.0, std::floor(o.cfg.offload.chunk_mb));
    if (!parallel::pp_vocab_refusal(o.cfg).empty()) return false;  // Note [Vocabulary passes]
    PlanCandidate next{o, sim::simulate(o, req.cluster), c.how};
    ++rep.evaluated;
    double most = 0;  // parameters on the fullest pipeline rank; its state is what the tier must hold
    for (const sim::RankReport& r : next.result.ranks) most = std::max(most, r.params);
    const double shards = o.cfg.parallel.zero >= 1 ? double(o.cfg.parallel.dp * o.cp) : 1.0;
    // ZeRO-1/2 keep the whole parameters in a file of their own beside the sharded state
    // (Note [Replicated-parameter offload]).
    const bool replicated = params && (o.cfg.parallel.zero == 1 || o.cfg.parallel.zero == 2) && shards > 1;
    const double tier = (8 + 4 * level) * most / shards + (replicated ? 4 * most : 0.0);
    if (fits(next.result, req.cluster) && tier <= req.cluster.offload.capacity_bytes) {
      c = std::move(next);
      return true;
    }
  }
  return false;
}

std::string layout_label(const sim::SimPlan& p) {
  const ParallelConfig& q = p.cfg.parallel;
  std::ostringstream os;
  os << "dp " << q.dp << " tp " << q.tp << " pp " << q.pp;
  if (q.vpp > 1) os << " vpp " << q.vpp;
  if (p.cp > 1) os << " cp " << p.cp;
  if (p.cp > 1 && q.cp_mode != CpMode::kAllGather) os << " " << name_of(q.cp_mode);
  if (q.sp) os << " sp";
  if (!q.vocab_parallel && q.tp > 1) os << " vocab-replicated";
  if (q.pp_vocab) os << " pp_vocab";
  os << " zero " << q.zero << " mb " << p.cfg.micro_batch() << " x " << p.cfg.train.grad_accum << " " << schedule_name(q.schedule)
     << " recompute " << recompute_text(q.recompute);
  if (!q.pp_layers.empty()) os << " layers " << pp_layers_text(q.pp_layers);
  if (q.pp_account_embedding || q.pp_account_loss)
    os << " account" << (q.pp_account_embedding ? " embedding" : "") << (q.pp_account_loss ? " loss" : "");
  if (!q.zero_keep.empty()) os << " keep " << zero_keep_text(q.zero_keep);
  if (q.compress != CompressKind::kNone) os << " compress " << compress_name(q.compress);
  if (q.zeropp_qwz || q.zeropp_qgz || q.zeropp_hpz)
    os << " zero++" << (q.zeropp_qwz ? " qwz" : "") << (q.zeropp_qgz ? " qgz" : "") << (q.zeropp_hpz ? " hpz" : "");
  if (q.ps_servers > 0)
    os << " + " << q.ps_servers << " parameter servers" << (p.cfg.ps.sparse_embedding ? " (sparse embedding)" : "");
  if (p.cfg.offload.optimizer == loom::OffloadTier::kDisk) os << " optimizer-offload";
  if (p.cfg.offload.params == loom::OffloadTier::kDisk) os << " param-offload";
  if (p.cfg.offload.grads == loom::OffloadTier::kDisk) os << " grad-offload";
  return os.str();
}

// Two plans are one layout when their labels agree once a per-layer recompute that is the
// same everywhere is written as that one policy ("none*40" is "none").
std::string layout_key(const sim::SimPlan& p) {
  sim::SimPlan q = p;
  std::vector<Recompute>& rc = q.cfg.parallel.recompute;
  if (!rc.empty() && std::all_of(rc.begin(), rc.end(), [&](Recompute r) { return r == rc.front(); }))
    rc.erase(rc.begin() + 1, rc.end());
  return layout_label(q);
}

double run_step_s(const PlanCandidate& c) {
  const sim::SimResult& r = c.result;
  if (r.warmup_steps <= 0) return r.step_time_s;
  const double steps = double(std::max(c.plan.cfg.train.steps, r.warmup_steps)), warm = double(r.warmup_steps);
  return (warm * r.warmup_step_time_s + (steps - warm) * r.step_time_s) / steps;
}

namespace {

// The caveat of the layout's schedule or gradient path ("" when exact).
std::string layout_caveat(const sim::SimPlan& p) {
  const ParallelConfig& q = p.cfg.parallel;
  if (q.ps_servers > 0 && p.cfg.ps.sparse_embedding)  // Note [Sparse embeddings]
    return "lazy AdamW on the embedding rows (untouched rows keep their weights and moments) changes the "
           "optimisation; the rows a batch reads are priced as uniform draws (an upper bound); compare validation "
           "curves against dense parameter servers";
  if (q.schedule == ScheduleKind::k2BW && q.pp > 1)  // Note [PipeDream-2BW]
    return "one-step-delayed updates (PipeDream-2BW, W(t+1) = W(t) - lr grad f(W(t-1))) change the optimisation: "
           "the steady step is priced (no flush; checkpoint and validation steps flush), the accuracy cost is not "
           "modelled; compare validation curves against 1f1b";
  if (updates_per_batch(q.schedule) && q.pp > 1)  // Note [PipeDream weight stashing], Note [PipeMare]
    return std::string("asynchronous updates (") +
           (q.schedule == ScheduleKind::kPipeDream ? "PipeDream weight stashing" : "PipeMare, no stash") +
           ": each stage updates per minibatch on gradients pp - 1 - r updates stale) change the optimisation: the "
           "steady step is priced, the accuracy cost is not modelled; compare validation curves against 1f1b "
           "(parallel.sync_warmup_steps starts synchronously: Note [Synchronous warm-up])";
  std::ostringstream os;
  if (q.compress == CompressKind::kNone && (q.zeropp_qwz || q.zeropp_qgz)) {
    os << "ZeRO++ int8 blocks:" << (q.zeropp_qwz ? " parameter gathers (qwZ)" : "")
       << (q.zeropp_qgz ? " gradient reduce-scatters (qgZ)" : "");
    return "approximate " + os.str() + ": the time is priced, the accuracy cost is not modelled; measure it with "
           "loom verify (docs/log/benchmarks.md)";
  }
  switch (q.compress) {
    case CompressKind::kNone: return "";  // hpZ alone is exact
    case CompressKind::kTopK: os << "top-k, ratio " << q.compress_ratio << " (DGC)"; break;
    case CompressKind::kPowerSgd: os << "PowerSGD, rank " << q.compress_rank; break;
    case CompressKind::kTernGrad: os << "TernGrad, 2 bits a value"; break;
    case CompressKind::kOneBitAdam:
      os << "1-bit Adam, " << (q.zero > 0 ? "g / D" : "momentum") << " as signs after an exact warm-up";
      break;
    case CompressKind::kZeroOneAdam: os << "0/1 Adam, signs and local steps"; break;
    case CompressKind::kTopKAdam:
      os << "top-k Adam, ratio " << q.compress_ratio << " of the " << (q.zero > 0 ? "g / D" : "momentum")
         << " after an exact warm-up";
      break;
    default: os << compress_name(q.compress) << " ring all-reduce"; break;
  }
  return "approximate gradients (" + os.str() +
         "): the time is priced, the accuracy cost is not modelled; measure it with loom verify and a validation "
         "curve (docs/log/benchmarks.md)";
}

}  // namespace

std::string approximation_caveat(const sim::SimPlan& p) {
  std::string layout = layout_caveat(p);
  if (const std::string why = engine_refusal(p); !why.empty())
    layout = (layout.empty() ? "" : layout + "; ") + "simulator only: " + why;
  if (!p.cfg.optim.bf16_moments()) return layout;
  const std::string moments = "bf16 AdamW moments (optim.moments = bf16, stochastically rounded; Note [bf16 "
                              "optimizer moments]) approximate the optimiser's state: their memory is priced, the "
                              "accuracy cost is not modelled; compare validation curves against optim.moments = fp32";
  return layout.empty() ? moments : layout + "; " + moments;
}

// PlanRequest::ps: workers of tp x pp ranks (tp within a node; Note [Parameter server with
// model parallelism]) with S servers per model shard, (W + S) x tp x pp = gpus, zero 0, each
// micro-batch and recompute policy the batch allows (none unless asked).
std::vector<PlanCandidate> ps_candidates(const PlanRequest& req, Acc& acc, PlanReport& rep) {
  std::vector<PlanCandidate> kept;
  if (!req.ps) return kept;
  const int64_t gpus = req.cluster.devices(), B = req.global_batch;
  for (int64_t tp : {1, 2, 4, 8})
    for (int64_t pp : {1, 2, 4}) {
      if (tp > req.cluster.devices_per_node || gpus % (tp * pp) != 0 || (req.ps_sparse && tp * pp > 1)) continue;
      const int64_t slots = gpus / (tp * pp);  // workers + servers per shard
      for (int64_t S = 1; S < slots; S *= 2)
        for (int64_t mb : {1, 2, 4, 8})
          for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
            sim::SimPlan plan = req.like;
            ParallelConfig& q = plan.cfg.parallel;
            q.tp = tp, q.pp = pp, q.dp = slots - S, q.ps_servers = S, q.micro_batch = mb, q.zero = 0, q.recompute = {rc};
            q.sp = tp > 1, q.schedule = ScheduleKind::k1F1B, q.vpp = 1, q.compress = CompressKind::kNone;
            plan.cfg.ps.mode = PsMode::kSync, plan.cfg.ps.sparse_embedding = req.ps_sparse;
            plan.cfg.train.batch = B;
            if (B % (mb * q.dp) != 0) {
              acc.prune("indivisible: global batch not a multiple of micro-batch x dp", layout_label(plan));
              continue;
            }
            plan.cfg.train.grad_accum = B / (mb * q.dp);
            if (const std::vector<std::string> errs = validation_errors(plan.cfg); !errs.empty()) {
              acc.prune("invalid: " + errs.front().substr(0, errs.front().find(" = ")), layout_label(plan));
              continue;
            }
            PlanCandidate c{plan, sim::simulate(plan, req.cluster), "uniform"};
            ++rep.evaluated;
            if (!fits(c.result, req.cluster)) acc.prune("out of memory", layout_label(plan));
            else kept.push_back(std::move(c));
          }
    }
  return kept;
}

namespace {

// Note [Impossible models]: before the search, a model whose training state cannot fit
// anywhere the cluster has room is pruned whole, in microseconds, instead of after pricing
// every layout (issue 59: 20,000 layers of d_model 65,536 ran for minutes). The floor is
// the least any layout holds: every parameter's weight, gradient, fp32 master and two bf16
// moments (12 bytes), sharded over every GPU, plus the offload tier when the search may use
// it. Activations only add to it, so a model over the floor fits no layout. Returns the
// reason ("" when the model may fit).
std::string impossible(const PlanRequest& req) {
  const double params = sim::total_params(req.like.cfg.model);
  const double state = sim::model_state_bytes(params, 1, 0, req.cluster.device, 2).total();
  const double room = double(req.cluster.devices()) * req.cluster.device.memory_bytes +
                      (req.offload ? req.cluster.offload.capacity_bytes * double(req.cluster.nodes) : 0.0);
  constexpr double kGiB = double(int64_t(1) << 30);
  if (!(state > room)) return "";
  return detail::cat("state over the cluster's memory: ", params / 1e9, " billion parameters need at least ",
                     state / kGiB, " GiB for weights, gradients and optimizer state; the cluster has ", room / kGiB,
                     " GiB in all", req.offload ? " with its offload tier" : "");
}

// The (schedule, vpp) pairs tried at pipeline degree `pp` for `L` layers.
std::vector<std::pair<ScheduleKind, int64_t>> schedules_tried(const PlanRequest& req, int64_t L, int64_t pp) {
  std::vector<std::pair<ScheduleKind, int64_t>> scheds = {{ScheduleKind::k1F1B, 1}};
  if (pp > 1)
    for (int64_t v : interleave_degrees(L, pp)) scheds.push_back({ScheduleKind::kInterleaved1F1B, v});
  // Zero-bubble schedules: loom's engine runs them; the Megatron runs priced here do not.
  if (pp > 1 && req.like.framework == sim::Framework::kLoom) {
    for (ScheduleKind k : {ScheduleKind::kZbH1, ScheduleKind::kZbH2}) scheds.push_back({k, 1});
    if (L >= 2 * pp) scheds.push_back({ScheduleKind::kZbV, 2});
    // Asynchronous: their caveats say so; pipedream / pipemare need one micro-batch per
    // step and no clipping (validation_errors prunes the rest, saying why).
    for (ScheduleKind k : {ScheduleKind::k2BW, ScheduleKind::kPipeDream, ScheduleKind::kPipeMare})
      scheds.push_back({k, 1});
  }
  return scheds;
}

}  // namespace

PlanReport search_plans(const PlanRequest& req) {
  const auto t0 = std::chrono::steady_clock::now();
  PlanReport rep;
  Acc acc{rep};
  const int64_t gpus = req.cluster.devices(), B = req.global_batch, L = req.like.cfg.model.layers;
  LOOM_CHECK(B > 0, "--global-batch is required (sequences per optimizer step)");
  LOOM_CONFIG_CHECK(req.like.activation_offload_layers == 0 && !req.like.fp8_param_gather,
                    "the planner does not search activation offload or fp8 gathers (Note [Activation offload], Note "
                    "[fp8 weights under ZeRO-3]); price a layout with them by simulating it");
  if (const std::string why = impossible(req); !why.empty()) {
    acc.prune(why, "every layout");
    return rep;
  }
  std::vector<PlanCandidate> kept = ps_candidates(req, acc, rep);
  for (int64_t tp : divisors(gpus, req.cluster.devices_per_node))
    for (int64_t pp : divisors(gpus / tp, L))
      for (int64_t cp : req.cp) {
        if (gpus % (tp * pp * cp) != 0) continue;
        const int64_t dp = gpus / (tp * pp * cp);
        for (int64_t mb : micro_batches(req.like.cfg.parallel.micro_batch)) {
          sim::SimPlan plan = req.like;
          plan.cp = cp;
          ParallelConfig& q = plan.cfg.parallel;
          q.tp = tp, q.pp = pp, q.dp = dp, q.micro_batch = mb;
          plan.cfg.train.batch = B;
          if (B % (mb * dp) != 0) {
            acc.prune("indivisible: global batch not a multiple of micro-batch x dp", layout_label(plan));
            continue;
          }
          plan.cfg.train.grad_accum = B / (mb * dp);
          for (CpMode cp_mode : cp_modes(req.like, cp, tp))
          for (const auto& [sched, vpp] : schedules_tried(req, L, pp))
            for (bool sp : {false, true})
              for (bool vocab_parallel : {true, false})
              for (bool pp_vocab : {false, true})
              for (int64_t zero : sim::framework_zero_stages(req.like.framework))  // Note [Sharding implementations]
                for (const SyncChoice& sync : sync_choices(req, plan, zero))
                for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
                  // Same as sp off / vocab-parallel / zero 0 there:
                  if ((sp && tp == 1) || (!vocab_parallel && tp == 1) || (zero > 0 && dp * cp == 1)) continue;
                  if (pp_vocab && (pp == 1 || updates_per_batch(sched) || req.like.framework != sim::Framework::kLoom)) continue;
                  q.schedule = sched, q.vpp = vpp, q.sp = sp, q.zero = zero, q.recompute = {rc}, q.cp_mode = cp_mode;
                  q.vocab_parallel = vocab_parallel, q.pp_vocab = pp_vocab, q.compress = sync.compress;
                  q.zeropp_qwz = sync.qwz, q.zeropp_qgz = sync.qgz, q.zeropp_hpz = sync.hpz;
                  const std::vector<std::string> errs = candidate_errors(plan);
                  if (!errs.empty()) {
                    acc.prune("invalid: " + errs.front().substr(0, errs.front().find(" = ")), layout_label(plan));
                    continue;
                  }
                  PlanCandidate c{plan, sim::simulate(plan, req.cluster), "uniform"};
                  ++rep.evaluated;
                  if (!fits(c.result, req.cluster) && !offloaded(req, c, rep)) {
                    acc.prune("out of memory", layout_label(plan));
                    continue;
                  }
                  kept.push_back(std::move(c));
                }
        }
      }
  auto faster = [](const PlanCandidate& a, const PlanCandidate& b) { return run_step_s(a) < run_step_s(b); };
  std::sort(kept.begin(), kept.end(), faster);
  const size_t refine_n = req.refine ? std::min<size_t>(kept.size(), size_t(std::max<int64_t>(req.top, 3))) : 0;
  for (size_t i = 0; i < refine_n; ++i) {
    refine_stages(req, kept[i]);
    const std::vector<Recompute>& rc = kept[i].plan.cfg.parallel.recompute;
    if (std::count(rc.begin(), rc.end(), Recompute::kNone) < int64_t(rc.size()) || kept[i].plan.cfg.parallel.zero == 3)
      refine_recompute(req, kept[i], rep);
  }
  std::sort(kept.begin(), kept.end(), faster);
  std::set<std::string> seen;  // refining can turn two candidates into one layout
  for (const PlanCandidate& c : kept) {
    if (!seen.insert(layout_key(c.plan)).second) acc.prune("the same layout as a faster plan", layout_label(c.plan));
    else if (rep.ranked.size() < size_t(req.top)) rep.ranked.push_back(c);
    else acc.prune("slower than the top " + std::to_string(req.top), layout_label(c.plan));
  }
  rep.total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

std::string engine_refusal(const sim::SimPlan& p) {
  if (p.cp > 1 && p.framework != sim::Framework::kLoom)
    return detail::cat("context parallelism (cp ", p.cp, ") is priced as ", sim::framework_name(p.framework),
                       p.cfg.parallel.cp_mode == CpMode::kUlysses ? "'s Ulysses all-to-all" : "'s ring attention",
                       ", while loom's engine runs parallel.cp_mode = allgather, ring or ulysses (priced under "
                       "--framework loom)");
  if (p.gemm_format != sim::GemmFormat::kBf16)
    return detail::cat("--precision ", name_of(p.gemm_format),
                       " is priced for GPU stacks with fp8 tensor cores; loom's engine runs fp8 GEMMs on one GPU only "
                       "(train.gemm_format = fp8), not in the layouts the planner searches");
  if (p.cfg.parallel.pp_vocab && p.framework != sim::Framework::kLoom)
    return detail::cat("parallel.pp_vocab (the vocabulary split over the pipeline) is priced for loom's engine, not ",
                       sim::framework_name(p.framework), "'s (price it under --framework loom)");
  if (p.cfg.parallel.pp_vocab) return parallel::pp_vocab_refusal(engine_config(p));
  return "";
}

std::string emit_loom_toml(const sim::SimPlan& p) {
  // The planner never hands loom's engine a plan it would run otherwise than planned.
  if (const std::string why = engine_refusal(p); !why.empty())
    throw ConfigError("--emit loom: the best plan (" + layout_label(p) + ") is not one loom's engine runs as planned: " +
                      why + "; plan without it (drop --cp / --precision) to emit a config loom trains, or --emit megatron");
  const Config c = engine_config(p);
  if (const std::vector<std::string> errs = validation_errors(c); !errs.empty())
    throw ConfigError("--emit loom: the best plan (" + layout_label(p) + ") is refused by loom's engine: " + errs.front());
  std::ostringstream os;
  os << "# Written by loom plan (" << layout_label(p) << "); run with: loom train --plan FILE\n" << to_toml(c);
  return os.str();
}

std::string emit_megatron_args(const sim::SimPlan& p) {
  const Config& c = p.cfg;
  const ParallelConfig& q = c.parallel;
  const ModelConfig& m = c.model;
  std::ostringstream os;
  os << "--num-layers " << m.layers << " --hidden-size " << m.d_model << " --num-attention-heads " << m.heads
     << " --ffn-hidden-size " << m.ffn << " --seq-length " << c.seq_len() << " --max-position-embeddings " << m.ctx;
  if (m.arch == Arch::kLlama) {
    os << " --swiglu --normalization RMSNorm --position-embedding-type rope --untie-embeddings-and-output-weights"
       << " --disable-bias-linear";
    if (m.kv_heads > 0 && m.kv_heads != m.heads) os << " --group-query-attention --num-query-groups " << m.kv_heads;
  }
  os << " --micro-batch-size " << c.micro_batch() << " --global-batch-size " << c.train.batch
     << " --tensor-model-parallel-size " << q.tp << " --pipeline-model-parallel-size " << q.pp;
  if (p.cp > 1) os << " --context-parallel-size " << p.cp;
  const int64_t accounted = int64_t(q.pp_account_embedding) + int64_t(q.pp_account_loss);
  if (q.vpp > 1) os << " --num-layers-per-virtual-pipeline-stage " << (m.layers + accounted) / (q.pp * q.vpp);
  if (q.pp_account_embedding) os << " --account-for-embedding-in-pipeline-split";
  if (q.pp_account_loss) os << " --account-for-loss-in-pipeline-split";
  if (q.sp) os << " --sequence-parallel";
  if (q.zero >= 1) os << " --use-distributed-optimizer";
  const auto rk = q.recompute_layers(m.layers);
  const int64_t full = std::count(rk.begin(), rk.end(), Recompute::kFull);
  const int64_t sel = std::count(rk.begin(), rk.end(), Recompute::kSelective);
  if (full == m.layers) os << " --recompute-granularity full --recompute-method uniform --recompute-num-layers 1";
  else if (full > 0) os << " --recompute-granularity full --recompute-method block --recompute-num-layers " << full / q.pp;
  else if (sel > 0) os << " --recompute-activations";
  if (q.zero >= 2)
    os << "\n# ZeRO-" << q.zero << " has no Megatron-LM flag; the closest is --use-distributed-optimizer (ZeRO-1)";
  if (!q.pp_layers.empty())
    os << "\n# uneven stages " << pp_layers_text(q.pp_layers) << ": Megatron-LM takes --decoder-first-pipeline-num-layers / "
       << "--decoder-last-pipeline-num-layers for the ends";
  if (splits_backward(q.schedule))
    os << "\n# schedule " << schedule_name(q.schedule) << " (zero-bubble, split backward) has no Megatron-LM flag; "
       << "loom's engine runs it (--emit loom)";
  if (!q.vocab_parallel && q.tp > 1)
    os << "\n# parallel.vocab_parallel = false (embedding and head whole on every tp rank) has no Megatron-LM flag";
  if (q.pp_vocab)
    os << "\n# parallel.pp_vocab (the vocabulary split over the pipeline, Yeung et al. 2024) has no Megatron-LM flag; "
       << "loom's engine runs it (--emit loom)";
  if (!q.zero_keep.empty())
    os << "\n# parallel.zero_keep " << zero_keep_text(q.zero_keep) << " (ZeRO-3 layers kept gathered) has no Megatron-LM flag";
  if (q.compress != CompressKind::kNone)
    os << "\n# parallel.compress = " << compress_name(q.compress) << " (compressed gradients) has no Megatron-LM flag";
  if (q.ps_servers > 0)
    os << "\n# parallel.ps_servers = " << q.ps_servers << " (parameter servers) has no Megatron-LM flag";
  if (q.zeropp_qwz || q.zeropp_qgz || q.zeropp_hpz) os << "\n# ZeRO++ (parallel.zeropp_*) has no Megatron-LM flag";
  if (full > 0 && full < m.layers)
    os << "\n# per-layer recompute " << recompute_text(q.recompute) << " maps to block recompute of the first layers of each stage";
  return os.str() + "\n";
}

}  // namespace loom::plan
