#include "loom/sim/replay.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include "loom/core/error.h"
#include "loom/parallel/schedule.h"

namespace loom::sim {
namespace {

std::string step_name(const parallel::PipeStep& st, int vpp) {
  char buf[32];
  const char p = parallel::phase_letter(st.phase);
  if (vpp > 1) std::snprintf(buf, sizeof buf, "%c%d.%d", p, st.micro_batch, st.chunk);
  else std::snprintf(buf, sizeof buf, "%c%d", p, st.micro_batch);
  return buf;
}

// Runs one step of rank r if its input is ready; false when it must wait.
bool try_step(const Setup& s, int64_t r, const parallel::PipeStep& st, std::vector<std::vector<double>>& fdone,
              std::vector<std::vector<double>>& bdone, RankState& rs, std::vector<SimEvent>* events) {
  using parallel::Phase;
  const int64_t v = parallel::virtual_stage(s.plan.cfg.parallel.schedule, int(s.pp), int(r), st.chunk);
  // A transfer to or from a stage on the same rank (ZB-V's turn) is a local hand-over.
  auto hop = [&](int64_t other) {
    for (int c = 0; c < int(s.vpp); ++c)
      if (parallel::virtual_stage(s.plan.cfg.parallel.schedule, int(s.pp), int(r), c) == other) return 0.0;
    return s.p2p_s;
  };
  if (st.phase == Phase::kV) return false;  // run_vocab_pass runs it, on every rank at once
  const size_t i = size_t(st.micro_batch);
  double dep = 0;
  if (st.phase == Phase::kF) {
    if (v > 0 && fdone[size_t(v - 1)][i] < 0) return false;
    dep = v > 0 ? fdone[size_t(v - 1)][i] + hop(v - 1) : 0;
  } else if (st.phase == Phase::kB) {
    if (fdone[size_t(v)][i] < 0 || (v < s.V - 1 && bdone[size_t(v + 1)][i] < 0)) return false;
    dep = v < s.V - 1 ? bdone[size_t(v + 1)][i] + hop(v + 1) : fdone[size_t(v)][i];
  } else {
    if (bdone[size_t(v)][i] < 0) return false;
    dep = bdone[size_t(v)][i];
  }
  const ChunkCost& ch = s.chunks[size_t(v)];
  const Pass pass = st.phase == Phase::kF ? ch.fwd : st.phase == Phase::kW ? ch.wgt : s.split ? minus(ch.bwd, ch.wgt) : ch.bwd;
  const bool sends = st.phase == Phase::kF ? v < s.V - 1 && hop(v + 1) > 0 : st.phase == Phase::kB && v > 0 && hop(v - 1) > 0;
  const double start = std::max(rs.free_at, dep), end = start + pass.total();
  if (st.phase == Phase::kB && int64_t(i) >= rs.own_from && start > rs.free_at)
    rs.backward_waits.emplace_back(rs.free_at, start);  // Note [2BW's update in the waits]
  const double release = end + (sends && s.plan.blocking_p2p ? s.p2p_s : 0);
  rs.spent.compute += pass.compute;
  rs.spent.tp += pass.tp;
  rs.spent.cp += pass.cp;
  rs.spent.zero += pass.zero;
  const size_t c = size_t(st.chunk);
  auto count = [](int& now, int& peak, int delta) { peak = std::max(peak, now += delta); };
  if (st.phase == Phase::kF) {
    count(rs.held[c], rs.chunk_peak[c], 1);
    rs.live += ch.act_bytes;
    rs.peak_live = std::max(rs.peak_live, rs.live);
    fdone[size_t(v)][i] = end;
  } else if (st.phase == Phase::kB) {
    rs.peak_live = std::max(rs.peak_live, rs.live + ch.transient_bytes);
    if (s.split) count(rs.pending[c], rs.pending_peak[c], 1), rs.live += ch.w_bytes;
    else count(rs.held[c], rs.chunk_peak[c], -1), rs.live -= ch.act_bytes;
    rs.recomputed += ch.recompute;
    bdone[size_t(v)][i] = end;
  } else {
    count(rs.held[c], rs.chunk_peak[c], -1);
    count(rs.pending[c], rs.pending_peak[c], -1);
    rs.live -= ch.act_bytes + ch.w_bytes;
  }
  if (st.phase != Phase::kF && int64_t(i) == s.m - 1) rs.last_bwd_window += pass.total();
  if (st.phase == Phase::kF && i == 0) rs.first_fwd_window += pass.total();
  if (events) {
    const int64_t rank = r * s.tp * s.cp * s.dp;
    events->push_back({rank, 0, step_name(st, int(s.vpp)), "pipeline", start, end});
    if (sends) events->push_back({rank, 1, "send " + step_name(st, int(s.vpp)), "transfer", end, end + s.p2p_s});
  }
  rs.free_at = release;
  return true;
}

}  // namespace

namespace {

using Lists = std::vector<std::vector<parallel::PipeStep>>;
using Done = std::vector<std::vector<double>>;

// Note [Vocabulary passes]: when every rank's next step is the same pass (and its head's
// input, the last stage's F, is done), all run it together from the latest of their free
// times; each rank's share costs the same. False when some rank has not reached it.
bool run_vocab_pass(const Setup& s, const Lists& lists, const std::vector<parallel::VocabPass>& passes,
                    const Done& fdone, std::vector<RankState>& ranks, std::vector<SimEvent>* events) {
  int k = -2;
  for (size_t r = 0; r < lists.size(); ++r) {
    if (ranks[r].next >= lists[r].size()) return false;
    const parallel::PipeStep& st = lists[r][ranks[r].next];
    if (st.phase != parallel::Phase::kV || (k != -2 && st.micro_batch != k)) return false;
    k = st.micro_batch;
  }
  const parallel::VocabPass& v = passes[size_t(k + 1)];
  double start = 0;
  if (v.head >= 0 && (start = fdone[size_t(s.V - 1)][size_t(v.head)]) < 0) return false;
  Pass cost;
  if (v.head >= 0) add_to(cost, s.vocab_head);
  add_to(cost, s.vocab_embed, double(v.embed.size()));
  add_to(cost, s.vocab_embed_grad, double(v.embed_grad.size()));
  if (v.update) cost.compute += update_s(s, s.vocab_params);
  // Note [The next step's first forwards ahead]: the update aside copies the vocabulary slices
  // first, and the take copies them back (each a read and a write of the slices).
  const double copy_s = memory_time_s(s.cluster.device, 2 * s.wbytes * s.vocab_params);
  if (v.aside || v.take) cost.compute += copy_s;
  for (const RankState& rs : ranks) start = std::max(start, rs.free_at);
  for (size_t r = 0; r < ranks.size(); ++r) {
    RankState& rs = ranks[r];
    add_to(rs.spent, cost);
    rs.vocab_updated = rs.vocab_updated || v.update;
    rs.vocab_aside = rs.vocab_aside || v.aside;
    rs.free_at = start + cost.total();
    ++rs.next;
    if (events)  // a pipeline step, as the engine's trace has it (loom compare counts it as busy)
      events->push_back({int64_t(r) * s.tp * s.cp * s.dp, 0, "V" + std::to_string(k), "pipeline", start, rs.free_at});
  }
  return true;
}

// Every rank runs its list (from rs.next = 0) as far as inputs allow, until all are done.
void run_lists(const Setup& s, const Lists& lists, Done& fdone, Done& bdone, std::vector<RankState>& ranks,
               std::vector<SimEvent>* events, const std::vector<parallel::VocabPass>& passes = {}) {
  size_t remaining = 0;
  for (size_t r = 0; r < lists.size(); ++r) remaining += lists[r].size(), ranks[r].next = 0;
  while (remaining > 0) {
    bool moved = false;
    if (!passes.empty() && run_vocab_pass(s, lists, passes, fdone, ranks, events)) remaining -= lists.size(), moved = true;
    for (int64_t r = 0; r < s.pp; ++r) {
      RankState& rs = ranks[size_t(r)];
      const auto& steps = lists[size_t(r)];
      while (rs.next < steps.size() && try_step(s, r, steps[rs.next], fdone, bdone, rs, events)) {
        ++rs.next;
        --remaining;
        moved = true;
      }
    }
    LOOM_ASSERT(moved, "simulated schedule ", schedule_name(s.plan.cfg.parallel.schedule),
                " deadlocked; parallel::validate accepts it");
  }
}

// Note [Simulated 2BW]
// The streams (2bw, pipedream, pipemare: Note [Pipeline streams] in parallel/schedule.h) run
// across steps with no barrier between them (Note [2BW without a barrier] in
// engine/engine.cc: the sums a step's end needs were started earlier). The replay runs a
// stream - ages 0 .. 2 depth, then a flushing step - each rank's lists as the engine runs them
// (micro-batch k m + i is step k's i), and reports a steady step (age 2 depth): each rank's
// time from the end of its previous step's list to the end of the steady one, its busy
// time and its trace from that start (a stage with a stash writes its update in that step's
// waits before its own backwards, Note [2BW's update in the waits]; the simulator places the
// rest at the step's end); the memory peaks are the whole stream's (1F1B's). On
// even stages only the transfers' latency is left of 1F1B's bubble. A flushing step
// (checkpoint, validation, the last) costs about a 1F1B step.
// The step the replay reports: past the ages where backwards are still missing (depth), and
// as many again for the start's timing to wash out (with one micro-batch a step the ranks'
// offsets are a whole step).
int steady_stream_age(const parallel::Schedule& sched) { return 2 * parallel::stream_depth(sched); }

std::vector<RankState> replay_stream(const Setup& s, const parallel::Schedule& sched, Done& fdone, Done& bdone,
                                     std::vector<RankState> ranks, std::vector<SimEvent>* events) {
  std::vector<SimEvent> steady;
  std::vector<RankState> out, before;
  const int steady_age = steady_stream_age(sched);
  for (int k = 0; k < steady_age + 2; ++k) {
    Lists lists(size_t(s.pp));
    const bool flush = k == steady_age + 1;
    for (int r = 0; r < int(s.pp); ++r)
      for (parallel::PipeStep st : parallel::stream_steps(sched, r, k, flush)) {
        if (st.phase != parallel::Phase::kV) st.micro_batch += k * int(s.m);  // a pass keeps its index
        lists[size_t(r)].push_back(st);
      }
    std::vector<parallel::VocabPass> passes;  // Note [Vocabulary passes in a stream]: this step's
    if (sched.vocab())
      for (parallel::VocabPass v : parallel::stream_passes(sched, k, flush)) {
        if (v.head >= 0) v.head += k * int(s.m);
        passes.push_back(std::move(v));
      }
    if (k == steady_age) before = ranks;
    for (RankState& rs : ranks) rs.own_from = k * s.m, rs.backward_waits.clear();
    run_lists(s, lists, fdone, bdone, ranks, k == steady_age && events ? &steady : nullptr, passes);
    if (k == steady_age) out = ranks;
  }
  for (size_t r = 0; r < out.size(); ++r) {
    out[r].free_at -= before[r].free_at;
    out[r].spent = minus(out[r].spent, before[r].spent);
    out[r].recomputed -= before[r].recomputed;
    out[r].peak_live = ranks[r].peak_live, out[r].chunk_peak = ranks[r].chunk_peak;  // the stream's peaks
    for (auto& [from, to] : out[r].backward_waits) from -= before[r].free_at, to -= before[r].free_at;
  }
  const int64_t stride = s.tp * s.cp * s.dp;  // SimEvent::rank is pipeline rank x stride
  if (events)
    for (SimEvent e : steady) {
      const double start = before[size_t(e.rank / stride)].free_at;
      e.t0_s -= start, e.t1_s -= start;
      events->push_back(e);
    }
  return out;
}

}  // namespace

// Note [Pipeline streams]: the copies around each update. 2bw: stash <- W where the stage
// holds one (2; Note [Early stash]: not the last), pending <- g, g <- 0 (3); pipedream: a stash
// <- W where the stage holds any (2); pipemare: the corrected weights, the copy before the
// update and the velocity's pass (3 + 2 + 4).
double stream_copies(const Setup& s, int64_t r) {
  const ScheduleKind kind = s.plan.cfg.parallel.schedule;
  const int64_t tau = s.pp - 1 - r;
  return s.pp <= 1                                    ? 0
         : kind == ScheduleKind::k2BW                 ? 1 + 2 * stream_param_copies(kind, int(s.pp), int(r))
         : kind == ScheduleKind::kPipeDream && tau > 0 ? 2
         : kind == ScheduleKind::kPipeMare && tau > 0  ? 9
                                                       : 0;
}

double update_in_waits(const RankState& st, double update_s, std::vector<SimEvent>* events, int64_t global_rank) {
  double left = update_s;
  for (const auto& [from, to] : st.backward_waits) {
    const double d = std::min(left, to - from);
    if (d <= 0) break;
    if (events) events->push_back({global_rank, 0, "U wait", "update", from, from + d});
    left -= d;
  }
  return update_s - left;
}

double update_s(const Setup& s, double params) {
  const DeviceSpec& dev = s.cluster.device;
  const ParallelConfig& par = s.plan.cfg.parallel;
  // Adam reads w, g, m, v and writes w, m, v (SGD: w, g, m and w, m; Note [SGD with
  // momentum]); mixed precision also the fp16 copy and the fp16 -> fp32 gradient.
  const double update_bytes_per_param = s.plan.cfg.optim.update_bytes() + (dev.mixed_precision ? 4.0 : 0.0);
  const double bytes = params / (par.zero >= 1 ? double(s.dp * s.cp) : 1.0) * update_bytes_per_param;
  return dev.optimizer_efficiency.points.empty()
             ? memory_time_s(dev, bytes)
             : bytes / (dev.memory_bw * dev.optimizer_efficiency.at(bytes)) + dev.kernel_overhead_s;
}

std::vector<RankState> replay(const Setup& s, std::vector<SimEvent>* events) {
  const ParallelConfig& par = s.plan.cfg.parallel;
  const parallel::Schedule sched = parallel::make_schedule(par.schedule, int(s.pp), int(s.m), int(s.vpp), par.pp_vocab,
                                                           parallel::stage_work(s.plan.cfg, int(s.pp), int(s.vpp)),
                                                           parallel::vocab_pass_work(s.plan.cfg, int(s.pp)));
  const bool stream = streams(par.schedule) && s.pp > 1;
  const int64_t steps = stream ? steady_stream_age(sched) + 2 : 1;
  Done fdone(static_cast<size_t>(s.V), std::vector<double>(static_cast<size_t>(steps * s.m), -1.0));
  Done bdone = fdone;
  std::vector<RankState> ranks(static_cast<size_t>(s.pp));
  for (RankState& rs : ranks)
    rs.held.assign(size_t(s.vpp), 0), rs.chunk_peak = rs.pending = rs.pending_peak = rs.held;
  if (sched.vocab())
    for (int r = 0; r < int(s.pp); ++r) ranks[size_t(r)].vocab_buffers = parallel::vocab_buffers(sched, r);
  if (stream)  // the previous rank takes the rest of a step's gradients in its next step
    for (int r = 1; r < int(s.pp); ++r)
      ranks[size_t(r)].send_copies = parallel::pipeline_lag(sched, r - 1) - parallel::pipeline_lag(sched, r);
  if (stream) return replay_stream(s, sched, fdone, bdone, std::move(ranks), events);
  run_lists(s, sched.steps, fdone, bdone, ranks, events, sched.passes);
  return ranks;
}

}  // namespace loom::sim
