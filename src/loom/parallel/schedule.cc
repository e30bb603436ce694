#include "loom/parallel/schedule.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <sstream>

#include "loom/core/error.h"

namespace loom::parallel {
namespace {

// GPipe: all forwards, then all backwards (in reverse micro-batch order would also work;
// forward order keeps the gradient stream FIFO).
std::vector<PipeStep> gpipe_rank(int m) {
  std::vector<PipeStep> out;
  for (int i = 0; i < m; ++i) out.push_back({Phase::kF, i, 0});
  for (int i = 0; i < m; ++i) out.push_back({Phase::kB, i, 0});
  return out;
}

// 1F1B: rank r warms up with min(lag, m) forwards (pipeline_lag: pp - r - 1, Narayanan et
// al.'s PipeDream-Flush), then alternates one forward and one backward, then drains the
// remaining backwards.
std::vector<PipeStep> one_f_one_b_rank(int lag, int m) {
  const int warmup = std::min(lag, m);
  std::vector<PipeStep> out;
  int f = 0, b = 0;
  for (; f < warmup; ++f) out.push_back({Phase::kF, f, 0});
  for (; f < m; ++f, ++b) {
    out.push_back({Phase::kF, f, 0});
    out.push_back({Phase::kB, b, 0});
  }
  for (; b < m; ++b) out.push_back({Phase::kB, b, 0});
  return out;
}

// Zero-bubble schedules (Qi et al., "Zero Bubble (Almost) Pipeline Parallelism", ICLR 2024,
// Sec. 3, the handcrafted ZB-H1 and ZB-H2): `warmup` forwards, then per cycle one B, its W
// unless fewer than `defer` weight gradients would then be pending, and the next F; the
// deferred W's run at the end, where they fill the cool-down bubble. W's and B's keep
// micro-batch order, so every weight gradient accumulates in 1F1B's order.
//   ZB-H1: warmup = pp - r (1F1B's), defer = r: rank r holds at most pp micro-batches
//          from F to W (1F1B's peak, on rank 0); the paper's bubble is (p - 1)(T_F + T_B - T_W),
//          a third of 1F1B's at T_F = T_B = T_W (loom's W is cheaper than its B: see
//          docs/log/benchmarks.md for the measured share).
//   ZB-H2: warmup = 2 (pp - r) - 1, defer = 2 r: the extra forwards fill the warm-up
//          bubble, and the later ranks keep weight gradients for the cool-down, while the
//          last micro-batches' B travel back to rank 0; every rank holds at most 2 pp - 1
//          micro-batches from F to W (the paper's (2p - 1) M_B).
std::vector<PipeStep> zero_bubble_rank(int warmup, int defer, int m) {
  std::vector<PipeStep> out;
  int f = 0, b = 0, w = 0;
  for (; f < std::min(warmup, m); ++f) out.push_back({Phase::kF, f, 0});
  for (; b < m; ++b) {
    out.push_back({Phase::kB, b, 0});
    if (b + 1 - w > defer) out.push_back({Phase::kW, w++, 0});
    if (f < m) out.push_back({Phase::kF, f++, 0});
  }
  for (; w < m; ++w) out.push_back({Phase::kW, w, 0});
  return out;
}

// Interleaved 1F1B (Megatron): micro-batches go through the rank's vpp chunks in groups of
// pp; the k-th forward of a rank is micro-batch (k / (pp*vpp)) * pp + k % pp on chunk
// (k / pp) % vpp, backwards the same with chunks reversed. Warm-up: (pp - r - 1) * 2 +
// (vpp - 1) * pp forwards (capped at the total), then 1F1B, then drain.
std::vector<PipeStep> interleaved_rank(int r, int pp, int vpp, int m) {
  const int total = m * vpp;
  auto fwd = [&](int k) {
    return PipeStep{Phase::kF, (k / (pp * vpp)) * pp + k % pp, (k / pp) % vpp};
  };
  auto bwd = [&](int k) {
    return PipeStep{Phase::kB, (k / (pp * vpp)) * pp + k % pp, vpp - 1 - (k / pp) % vpp};
  };
  const int warmup = std::min((pp - r - 1) * 2 + (vpp - 1) * pp, total);
  std::vector<PipeStep> out;
  int f = 0, b = 0;
  for (; f < warmup; ++f) out.push_back(fwd(f));
  for (; f < total; ++f, ++b) {
    out.push_back(fwd(f));
    out.push_back(bwd(b));
  }
  for (; b < total; ++b) out.push_back(bwd(b));
  return out;
}

// Note [Pipeline streams]: the steady step of rank r: F(i), then B(i - w).
std::vector<PipeStep> stream_rank(int w, int m) {
  std::vector<PipeStep> out;
  for (int i = 0; i < m; ++i) {
    out.push_back({Phase::kF, i, 0});
    out.push_back({Phase::kB, i - w, 0});
  }
  return out;
}

}  // namespace

int steps_back(int micro, int m) { return micro >= 0 ? 0 : (-micro + m - 1) / m; }

int pipeline_lag(const Schedule& s, int rank) {
  const int plain = s.pp - rank - 1;
  return s.lag == LagRule::kDouble ? 2 * plain : s.lag == LagRule::kOneMore && plain > 0 ? plain + 1 : plain;
}

int stream_depth(const Schedule& s) { return steps_back(-pipeline_lag(s, 0), s.micro_batches); }

std::vector<PipeStep> stream_steps(const Schedule& s, int rank, int age, bool flush) {
  LOOM_ASSERT(streams(s.kind) && rank >= 0 && rank < s.pp && age >= 0);
  if (!s.stream_vocab.empty()) return s.stream_vocab[size_t(stream_variant(s, age, flush))].steps[size_t(rank)];
  const int m = s.micro_batches;
  std::vector<PipeStep> out;
  for (const PipeStep& st : s.steps[size_t(rank)])
    if (steps_back(st.micro_batch, m) <= age) out.push_back(st);
  const int w = pipeline_lag(s, rank);
  if (flush)
    for (int i = m - w; i < m; ++i)
      if (steps_back(i, m) <= age) out.push_back({Phase::kB, i, 0});
  return out;
}

int virtual_stage(ScheduleKind kind, int pp, int rank, int chunk) {
  if (kind == ScheduleKind::kZbV) return chunk == 0 ? rank : 2 * pp - 1 - rank;  // the V
  return chunk * pp + rank;
}

StageSite stage_site(ScheduleKind kind, int pp, int vpp, int v) {
  LOOM_ASSERT(v >= 0 && v < pp * vpp, "virtual stage ", v, " outside ", pp, " x ", vpp);
  const StageSite site{stage_rank(kind, pp, v), v / pp};
  LOOM_ASSERT(virtual_stage(kind, pp, site.rank, site.chunk) == v);
  return site;
}

StageSite Schedule::site(int v) const { return stage_site(kind, pp, vpp, v); }

char phase_letter(Phase p) { return p == Phase::kF ? 'F' : p == Phase::kB ? 'B' : p == Phase::kW ? 'W' : 'V'; }

namespace {
Schedule plain_schedule(ScheduleKind kind, int pp, int m, int vpp, const StageWork& work,
                        LagRule lag = LagRule::kPlain);
Schedule stream_list(const Schedule& s);
}  // namespace

Schedule make_schedule(ScheduleKind kind, int pp, int m, int vpp, bool vocab, const StageWork& work,
                       double pass_work) {
  Schedule s = plain_schedule(kind, pp, m, vpp, work);
  if (!vocab) return s;
  LOOM_CHECK(!updates_per_batch(kind), "parallel.pp_vocab with schedule ", schedule_name(kind),
             ": the vocabulary passes run in the flushing schedules (gpipe, 1f1b, interleaved, zb-h1, zb-h2, "
             "zb-v) and 2bw, not in pipedream or pipemare");
  LOOM_CHECK(pp >= 2, "parallel.pp_vocab splits the vocabulary over the pipeline's ranks and needs pp >= 2, got ", pp);
  if (kind == ScheduleKind::k1F1B || kind == ScheduleKind::k2BW) return ahead_of_passes(kind, pp, m, work, pass_work);
  if (work.empty()) {
    add_vocab_passes(s);
    return s;
  }
  // Note [ZB-V by stage work]: the passes go where a unit-time replay of the plain lists puts
  // them, so with them the list built on equal stages can end sooner than the one built on
  // the work (config B's split 1, 2, 2, 1); and a pass placed a tick early on the ranks before
  // the last (Note [Vocabulary passes ahead]) can end sooner than at its plain place. The
  // list that ends first on the work is kept, the plain one on a tie.
  std::vector<Schedule> lists{s};
  if (kind == ScheduleKind::kZbV) lists.push_back(plain_schedule(kind, pp, m, vpp, {}));
  Schedule best;
  double best_end = std::numeric_limits<double>::infinity();
  for (const Schedule& list : lists)
    for (bool early : {false, true}) {
      Schedule with = list;
      add_vocab_passes(with, early);
      if (early && !validate(with).ok) continue;
      const double end = replay_time(with, work, pass_work);
      if (end < best_end) best = std::move(with), best_end = end;
    }
  if (kind == ScheduleKind::kZbV) {  // Note [ZB-V with its passes]: placed by the list scheduler
    Schedule placed = zero_bubble_v_with_passes(pp, m, work, pass_work);
    if (!placed.steps.empty() && validate(placed).ok && replay_time(placed, work, pass_work) < best_end)
      best = std::move(placed);
  }
  return best;
}

Schedule make_lagged(ScheduleKind kind, int pp, int m, LagRule lag) {
  LOOM_ASSERT(kind == ScheduleKind::k1F1B || kind == ScheduleKind::k2BW, "lag rules are 1f1b's and 2bw's");
  return plain_schedule(kind, pp, m, 1, {}, lag);
}

double replay_time(const Schedule& s, const StageWork& work, double pass_work) {
  if (streams(s.kind)) return replay_time(stream_list(s), work, pass_work);
  const int V = s.pp * s.vpp, m = s.micro_batches;
  auto cost = [&](Phase ph, int v) {  // a backward that is not split makes its W too
    static constexpr double kUnit[3] = {4, 5, 3};
    const auto& w = work.empty() ? kUnit : work[size_t(v)].data();
    return w[int(ph)] + (ph == Phase::kB && !s.split() ? w[int(Phase::kW)] : 0);
  };
  // end[phase][v][i]: when micro-batch i's step of that phase on virtual stage v ended (-1: not yet).
  using PerStage = std::vector<std::vector<double>>;
  std::vector<PerStage> end(3, PerStage(size_t(V), std::vector<double>(size_t(m), -1)));
  std::vector<size_t> pos(size_t(s.pp), 0);
  std::vector<double> free_at(size_t(s.pp), 0);
  auto at_pass = [&](int r) {
    const std::vector<PipeStep>& list = s.steps[size_t(r)];
    return pos[size_t(r)] < list.size() && list[pos[size_t(r)]].phase == Phase::kV;
  };
  for (bool moved = true; moved;) {
    moved = false;
    bool all_at_pass = true;  // a pass: every rank leaves it together
    for (int r = 0; r < s.pp; ++r) all_at_pass = all_at_pass && at_pass(r);
    if (all_at_pass) {
      const int k = s.steps[0][pos[0]].micro_batch;  // a head's pass lasts pass_work
      const double done = *std::max_element(free_at.begin(), free_at.end()) + (s.passes[size_t(k + 1)].head >= 0 ? pass_work : 0);
      for (int r = 0; r < s.pp; ++r) free_at[size_t(r)] = done, ++pos[size_t(r)];
      moved = true;
      continue;
    }
    for (int r = 0; r < s.pp; ++r) {
      if (pos[size_t(r)] == s.steps[size_t(r)].size() || at_pass(r)) continue;
      const PipeStep& st = s.steps[size_t(r)][pos[size_t(r)]];
      const int v = s.stage(r, st.chunk), i = st.micro_batch;
      std::vector<double> deps = {free_at[size_t(r)]};
      if (st.phase == Phase::kF && v > 0) deps.push_back(end[0][size_t(v - 1)][size_t(i)]);
      if (st.phase == Phase::kB)
        deps.push_back(end[0][size_t(v)][size_t(i)]), deps.push_back(v + 1 < V ? end[1][size_t(v + 1)][size_t(i)] : 0);
      if (st.phase == Phase::kW) deps.push_back(end[1][size_t(v)][size_t(i)]);
      if (*std::min_element(deps.begin(), deps.end()) < 0) continue;
      const double t = *std::max_element(deps.begin(), deps.end()) + cost(st.phase, v);
      free_at[size_t(r)] = end[size_t(st.phase)][size_t(v)][size_t(i)] = t;
      ++pos[size_t(r)], moved = true;
    }
  }
  for (int r = 0; r < s.pp; ++r)
    if (pos[size_t(r)] < s.steps[size_t(r)].size()) return std::numeric_limits<double>::infinity();
  return *std::max_element(free_at.begin(), free_at.end());
}

namespace {

Schedule plain_schedule(ScheduleKind kind, int pp, int m, int vpp, const StageWork& work, LagRule lag) {
  LOOM_CHECK(pp >= 1, "pipeline: pp must be >= 1, got ", pp);
  LOOM_CHECK(m >= 1, "pipeline: micro-batches must be >= 1, got ", m);
  if (kind == ScheduleKind::kZbV) {
    LOOM_CHECK(vpp == 2, "schedule zb-v runs two model chunks per rank; vpp = ", vpp, ": use vpp = 2");
  } else if (kind == ScheduleKind::kInterleaved1F1B) {
    LOOM_CHECK(vpp >= 2, "schedule interleaved needs vpp >= 2, got ", vpp, "; use 1f1b for vpp = 1");
    LOOM_CHECK(m % pp == 0, "schedule interleaved needs micro-batches divisible by pp = ", pp, ", got ", m,
               "; use ", (m + pp - 1) / pp * pp, " micro-batches");
  } else {
    LOOM_CHECK(vpp == 1, "schedule ", schedule_name(kind), " runs one model chunk per rank; vpp = ", vpp,
               " needs schedule interleaved");
  }
  LOOM_CHECK(kind != ScheduleKind::k2BW || m >= pp, "schedule 2bw needs at least as many micro-batches as stages (",
             m, " < pp = ", pp, "): use ", pp, " or more");
  LOOM_CHECK(!updates_per_batch(kind) || m == 1, "schedule ", schedule_name(kind), " updates after every minibatch: ",
             "it runs one micro-batch per step, got ", m, "; use 1 (or 2bw to accumulate >= pp micro-batches)");
  Schedule s{kind, pp, vpp, m, {}};
  s.lag = lag;
  if (kind == ScheduleKind::kZbV) {
    LOOM_CHECK(work.empty() || work.size() == size_t(2 * pp), "zb-v stage work has ", work.size(),
               " stages, the schedule ", 2 * pp);
    s.steps = zero_bubble_v(pp, m, work);
    return s;
  }
  for (int r = 0; r < pp; ++r) {
    switch (kind) {
      case ScheduleKind::kGPipe: s.steps.push_back(gpipe_rank(m)); break;
      case ScheduleKind::k1F1B: s.steps.push_back(one_f_one_b_rank(pipeline_lag(s, r), m)); break;
      case ScheduleKind::kInterleaved1F1B: s.steps.push_back(interleaved_rank(r, pp, vpp, m)); break;
      case ScheduleKind::kZbH1: s.steps.push_back(zero_bubble_rank(pp - r, r, m)); break;
      case ScheduleKind::kZbH2: s.steps.push_back(zero_bubble_rank(2 * (pp - r) - 1, 2 * r, m)); break;
      case ScheduleKind::kZbV: break;  // above
      case ScheduleKind::k2BW:
      case ScheduleKind::kPipeDream:
      case ScheduleKind::kPipeMare: s.steps.push_back(stream_rank(pipeline_lag(s, r), m)); break;
    }
  }
  return s;
}

// Note [Pipeline streams]: the steps of one stream - ages 0 .. depth, then a flushing one - as
// one list of (depth + 2) m micro-batches (step k's micro-batch i is k m + i; a negative i is
// an earlier step's), which validate() replays like any flushing schedule. With vocabulary
// passes, step k's V(p) is the list's pass k (m + 2) + p, its micro-batches renumbered alike.
Schedule stream_list(const Schedule& s) {
  const int steps = std::max(stream_depth(s), 1) + 2;  // a steady step even at pp = 1
  const int m = s.micro_batches;
  Schedule out{ScheduleKind::k1F1B, s.pp, 1, steps * m, std::vector<std::vector<PipeStep>>(size_t(s.pp))};
  for (int r = 0; r < s.pp; ++r)
    for (int k = 0; k < steps; ++k)
      for (PipeStep st : stream_steps(s, r, k, k == steps - 1)) {
        st.micro_batch += k * (st.phase == Phase::kV ? m + 2 : m);
        out.steps[size_t(r)].push_back(st);
      }
  for (int k = 0; k < steps && s.vocab(); ++k)
    for (VocabPass v : stream_passes(s, k, k == steps - 1)) {
      if (v.head >= 0) v.head += k * m;
      for (int& j : v.embed) j += k * m;
      for (int& j : v.embed_grad) j += k * m;
      out.passes.push_back(std::move(v));
    }
  return out;
}

// The ranks of a deadlocked replay and the steps they wait to run.
std::string deadlock_text(const Schedule& s, const std::vector<size_t>& next, int ticks) {
  std::ostringstream os;
  os << "deadlock after " << ticks << " steps:";
  for (int r = 0; r < s.pp; ++r) {
    if (next[size_t(r)] >= s.steps[size_t(r)].size()) continue;
    const PipeStep& st = s.steps[size_t(r)][next[size_t(r)]];
    os << " rank " << r << " waits to run " << phase_letter(st.phase) << st.micro_batch << " (chunk " << st.chunk
       << ");";
  }
  if (!s.split()) os << " (schedule " << schedule_name(s.kind) << " has no W steps)";
  return os.str();
}

// The first step a finished replay never ran ("" when none): done[phase][v][mb], done_v[k + 1].
std::string missing_step(const Schedule& s, const std::vector<std::vector<std::vector<char>>>& done,
                         const std::vector<char>& done_v) {
  const int m = s.micro_batches;
  for (size_t k = 0; k < s.passes.size(); ++k)
    if (!done_v[k] && !s.passes[k].carries_nothing())  // (a stream's steps leave empty ones out)
      return detail::cat("vocabulary pass ", int(k) - 1, " never ran");
  for (int v = 0; v < s.pp * s.vpp; ++v)
    for (int mb = 0; mb < m; ++mb)
      if (!done[0][size_t(v)][size_t(mb)] || !done[1][size_t(v)][size_t(mb)] || (s.split() && !done[2][size_t(v)][size_t(mb)]))
        return detail::cat("virtual stage ", v, " never ran ",
                           !done[0][size_t(v)][size_t(mb)] ? "forward"
                           : !done[1][size_t(v)][size_t(mb)] ? "backward"
                                                             : "the weight gradient",
                           " of micro-batch ", mb);
  return "";
}

// Per micro-batch, the vocabulary pass that heads it (`head`) or looks it up; -2: none.
std::vector<int> pass_of(const Schedule& s, bool head) {
  const int m = s.micro_batches;
  std::vector<int> out(size_t(m), -2);
  for (size_t k = 0; k < s.passes.size(); ++k) {
    const VocabPass& v = s.passes[k];
    if (head && v.head >= 0 && v.head < m) out[size_t(v.head)] = int(k) - 1;
    for (int j : head ? std::vector<int>{} : v.embed)
      if (j >= 0 && j < m) out[size_t(j)] = int(k) - 1;
  }
  return out;
}

// What rank r holds after step st (per chunk: activations held, W's pending), and its peaks.
void count_held(const PipeStep& st, bool split, std::vector<int>& held, std::vector<int>& pending, int r,
                ScheduleCheck& out) {
  auto count = [](int& now, int& peak, int delta) { peak = std::max(peak, now += delta); };
  const size_t c = size_t(st.chunk);
  int& h = held[c];
  int& w = pending[c];
  if (st.phase == Phase::kF) count(h, out.chunk_peak_in_flight[r][c], 1);
  if (st.phase == Phase::kB && !split) count(h, out.chunk_peak_in_flight[r][c], -1);
  if (st.phase == Phase::kB && split) count(w, out.chunk_peak_pending_w[r][c], 1);
  if (st.phase == Phase::kW) count(h, out.chunk_peak_in_flight[r][c], -1), count(w, out.chunk_peak_pending_w[r][c], -1);
  int all_held = 0, all_pending = 0;
  for (size_t x = 0; x < held.size(); ++x) all_held += held[x], all_pending += pending[x];
  out.peak_in_flight[size_t(r)] = std::max(out.peak_in_flight[size_t(r)], all_held);
  out.peak_pending_w[size_t(r)] = std::max(out.peak_pending_w[size_t(r)], all_pending);
}

}  // namespace

// Replay in rounds: in each round every rank whose next step has its inputs runs it. A
// round where no rank can move, before all finish, is a deadlock.
ScheduleCheck validate(const Schedule& s) {
  if (streams(s.kind)) return validate(stream_list(s));
  const int pp = s.pp, vpp = s.vpp, m = s.micro_batches, stages = pp * vpp;
  const bool split = s.split();
  ScheduleCheck out;
  out.peak_in_flight.assign(pp, 0);
  out.chunk_peak_in_flight.assign(pp, std::vector<int>(size_t(vpp), 0));
  out.peak_pending_w = out.peak_in_flight;
  out.chunk_peak_pending_w = out.chunk_peak_in_flight;
  // done[phase][v][mb]: has virtual stage v run that phase of mb.
  std::vector<std::vector<std::vector<char>>> done(3, std::vector<std::vector<char>>(stages, std::vector<char>(m, 0)));
  auto& done_f = done[0];
  auto& done_b = done[1];
  std::vector<size_t> next(pp, 0);
  // Note [Vocabulary passes]: V(k) at k + 1; per micro-batch, the pass heading it and the one
  // looking it up.
  std::vector<char> done_v(s.passes.size(), 0);
  const std::vector<int> head_pass = pass_of(s, true), lookup_pass = pass_of(s, false);
  auto passed = [&](int k) { return k >= -1 && done_v[size_t(k + 1)] != 0; };
  // Per rank and chunk: micro-batches held (F run, not yet released) and W's pending.
  std::vector<std::vector<int>> held = out.chunk_peak_in_flight, pending = held;
  size_t remaining = 0;
  for (const auto& r : s.steps) remaining += r.size(), out.step_tick.emplace_back(r.size(), -1);
  // Note [Vocabulary passes]: a pass runs once every rank has reached it (a collective);
  // micro-batch i's head needs the last stage's F(i), whose B(i) needs the head.
  auto vocab_ready = [&](int k) {
    if (!s.vocab() || k < -1 || k + 1 >= int(s.passes.size()) || done_v[size_t(k + 1)]) return false;
    const VocabPass& v = s.passes[size_t(k + 1)];
    if (v.head >= 0 && !done_f[stages - 1][v.head]) return false;
    for (int j : v.embed_grad)  // the first stage's B(j) made the gradient it carries
      if (j < 0 || j >= m || !done_b[0][j]) return false;
    for (int q = 0; q < pp; ++q)
      if (next[q] >= s.steps[q].size() || s.steps[q][next[q]].phase != Phase::kV || s.steps[q][next[q]].micro_batch != k)
        return false;
    return true;
  };
  auto ready = [&](int r, const PipeStep& st) {
    const int v = s.stage(r, st.chunk), mb = st.micro_batch;
    if (st.phase == Phase::kV) return vocab_ready(mb);
    if (mb < 0 || mb >= m || st.chunk < 0 || st.chunk >= vpp || done[size_t(st.phase)][v][mb]) return false;
    switch (st.phase) {
      case Phase::kF: return v == 0 ? !s.vocab() || passed(lookup_pass[mb]) : done_f[v - 1][mb] != 0;
      case Phase::kB:
        return done_f[v][mb] && (v == stages - 1 ? !s.vocab() || passed(head_pass[mb]) : done_b[v + 1][mb]);
      case Phase::kW: return split && done_b[v][mb];
      case Phase::kV: break;
    }
    return false;
  };
  while (remaining > 0) {
    std::vector<int> movers;
    for (int r = 0; r < pp; ++r)
      if (next[r] < s.steps[r].size() && ready(r, s.steps[r][next[r]])) movers.push_back(r);
    if (movers.empty()) {
      out.problem = deadlock_text(s, next, out.ticks);
      return out;
    }
    for (int r : movers) {  // all movers' inputs were checked before this round's effects
      out.step_tick[size_t(r)][next[r]] = out.ticks;
      const PipeStep& st = s.steps[r][next[r]++];
      --remaining;
      if (st.phase == Phase::kV) {  // every rank moves past it this round
        done_v[size_t(st.micro_batch + 1)] = 1;
        continue;
      }
      done[size_t(st.phase)][s.stage(r, st.chunk)][st.micro_batch] = 1;
      count_held(st, split, held[r], pending[r], r, out);
    }
    ++out.ticks;
  }
  out.problem = missing_step(s, done, done_v);
  out.ok = out.problem.empty();
  return out;
}

}  // namespace loom::parallel
