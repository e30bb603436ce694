#include "loom/parallel/schedule.h"

#include <algorithm>
#include <array>
#include <cmath>
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

// 1F1B: rank r warms up with min(pp - r - 1, m) forwards, then alternates one forward and
// one backward, then drains the remaining backwards (Narayanan et al., PipeDream-Flush).
std::vector<PipeStep> one_f_one_b_rank(int r, int pp, int m) {
  const int warmup = std::min(pp - r - 1, m);
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

// ZB-V (Qi et al., ICLR 2024, Sec. 6): chunk 0 of rank r is stage r and chunk 1 stage
// 2 pp - 1 - r, so rank 0 holds both ends and each rank's two chunks together do equal
// work. Built by list scheduling on durations F = 4, B = 5, W = 3 ticks (loom's measured
// ratio on a GPT block, rounded: the input-gradient step carries the attention backward,
// the weight step only the dW GEMMs): whenever a rank is free it starts one step whose
// input is done - B before F (or, the other order, F before B), within each the later stage
// first and per chunk in micro-batch order, an F only while the rank holds fewer than 2 pp
// chunk activations (1F1B's peak: pp micro-batches of a whole stage); when neither is ready,
// the W whose B finished first. Both orders are built and the one that ends first in ticks
// is kept (B first on a tie): at pp 2 and m = 8, B first leaves 5.4% of the ticks idle and F
// first 2.5% (1F1B: 11.1%); at pp 8, B first is better. The order only has to be good;
// validate() proves it. A `forward_first` run that does not finish returns no steps.
struct ZbVList {
  std::vector<std::vector<PipeStep>> steps;
  int ticks = 0;
};

ZbVList zero_bubble_v_list(int pp, int m, bool forward_first) {
  const int V = 2 * pp, cap = 2 * pp, cost[3] = {4, 5, 3};
  auto stage = [&](int r, int c) { return virtual_stage(ScheduleKind::kZbV, pp, r, c); };
  // done[phase][stage][micro]: the tick it finishes, -1 before it starts.
  std::vector<std::vector<std::vector<int>>> done(3, std::vector<std::vector<int>>(V, std::vector<int>(m, -1)));
  std::vector<std::array<int, 3>> next0(pp, {0, 0, 0}), next1 = next0;  // per rank: next micro per phase, chunk 0 / 1
  std::vector<int> held(pp, 0), free_at(pp, 0);
  ZbVList out{std::vector<std::vector<PipeStep>>(size_t(pp)), 0};
  const Phase order[2][2] = {{Phase::kB, Phase::kF}, {Phase::kF, Phase::kB}};
  size_t left = size_t(3 * V * m);
  for (int t = 0; left > 0; t++) {
    if (t >= 100 * 3 * V * (m + 1)) {
      LOOM_ASSERT(forward_first, "zb-v list scheduling did not finish");
      return {};
    }
    for (int r = 0; r < pp; r++) {
      if (free_at[r] > t) continue;
      auto nx = [&](int c) -> std::array<int, 3>& { return c == 0 ? next0[r] : next1[r]; };
      auto ran_before = [&](int ph, int v, int i) { return done[ph][v][i] >= 0 && done[ph][v][i] <= t; };
      auto ready = [&](Phase ph, int c) {
        const int i = nx(c)[size_t(ph)], v = stage(r, c);
        if (i >= m) return false;
        if (ph == Phase::kF) return held[r] < cap && (v == 0 || ran_before(0, v - 1, i));
        if (ph == Phase::kB) return ran_before(0, v, i) && (v == V - 1 || ran_before(1, v + 1, i));
        return ran_before(1, v, i);
      };
      int pick_c = -1;
      Phase pick = Phase::kF;
      for (Phase ph : order[forward_first ? 1 : 0])
        for (int c : {1, 0})
          if (pick_c < 0 && ready(ph, c)) pick_c = c, pick = ph;
      if (pick_c < 0) {  // the W whose B ran first
        int best = -1;
        for (int c : {0, 1})
          if (ready(Phase::kW, c)) {
            const int at = done[1][stage(r, c)][nx(c)[2]];
            if (best < 0 || at < best) best = at, pick_c = c, pick = Phase::kW;
          }
      }
      if (pick_c < 0) continue;
      const int i = nx(pick_c)[size_t(pick)]++;
      free_at[r] = done[size_t(pick)][stage(r, pick_c)][i] = t + cost[int(pick)];
      out.ticks = std::max(out.ticks, free_at[r]);
      held[r] += pick == Phase::kF ? 1 : pick == Phase::kW ? -1 : 0;
      out.steps[size_t(r)].push_back({pick, i, pick_c});
      --left;
    }
  }
  return out;
}

std::vector<std::vector<PipeStep>> zero_bubble_v(int pp, int m) {
  ZbVList b = zero_bubble_v_list(pp, m, false), f = zero_bubble_v_list(pp, m, true);
  return !f.steps.empty() && f.ticks < b.ticks ? std::move(f.steps) : std::move(b.steps);
}

// Note [Pipeline streams]: the steady step of rank r: F(i), then B(i - w).
std::vector<PipeStep> stream_rank(int r, int pp, int m) {
  const int w = pp - r - 1;
  std::vector<PipeStep> out;
  for (int i = 0; i < m; ++i) {
    out.push_back({Phase::kF, i, 0});
    out.push_back({Phase::kB, i - w, 0});
  }
  return out;
}

}  // namespace

int steps_back(int micro, int m) { return micro >= 0 ? 0 : (-micro + m - 1) / m; }

int stream_depth(const Schedule& s) { return steps_back(1 - s.pp, s.micro_batches); }

std::vector<PipeStep> stream_steps(const Schedule& s, int rank, int age, bool flush) {
  LOOM_ASSERT(streams(s.kind) && rank >= 0 && rank < s.pp && age >= 0);
  if (!s.stream_vocab.empty()) return s.stream_vocab[size_t(stream_variant(s, age, flush))].steps[size_t(rank)];
  const int m = s.micro_batches;
  std::vector<PipeStep> out;
  for (const PipeStep& st : s.steps[size_t(rank)])
    if (steps_back(st.micro_batch, m) <= age) out.push_back(st);
  const int w = s.pp - rank - 1;
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
  for (int r = 0; r < pp; ++r)
    for (int c = 0; c < vpp; ++c)
      if (virtual_stage(kind, pp, r, c) == v) return {r, c};
  LOOM_ASSERT(false, "virtual stage ", v, " outside ", pp, " x ", vpp);
  return {};
}

StageSite Schedule::site(int v) const { return stage_site(kind, pp, vpp, v); }

char phase_letter(Phase p) { return p == Phase::kF ? 'F' : p == Phase::kB ? 'B' : p == Phase::kW ? 'W' : 'V'; }

namespace {
Schedule plain_schedule(ScheduleKind kind, int pp, int m, int vpp);
}  // namespace

Schedule make_schedule(ScheduleKind kind, int pp, int m, int vpp, bool vocab) {
  Schedule s = plain_schedule(kind, pp, m, vpp);
  if (!vocab) return s;
  LOOM_CHECK(!updates_per_batch(kind), "parallel.pp_vocab with schedule ", schedule_name(kind),
             ": the vocabulary passes run in the flushing schedules (gpipe, 1f1b, interleaved, zb-h1, zb-h2, "
             "zb-v) and 2bw, not in pipedream or pipemare");
  LOOM_CHECK(pp >= 2, "parallel.pp_vocab splits the vocabulary over the pipeline's ranks and needs pp >= 2, got ", pp);
  add_vocab_passes(s);
  return s;
}

namespace {

Schedule plain_schedule(ScheduleKind kind, int pp, int m, int vpp) {
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
  if (kind == ScheduleKind::kZbV) {
    s.steps = zero_bubble_v(pp, m);
    return s;
  }
  for (int r = 0; r < pp; ++r) {
    switch (kind) {
      case ScheduleKind::kGPipe: s.steps.push_back(gpipe_rank(m)); break;
      case ScheduleKind::k1F1B: s.steps.push_back(one_f_one_b_rank(r, pp, m)); break;
      case ScheduleKind::kInterleaved1F1B: s.steps.push_back(interleaved_rank(r, pp, vpp, m)); break;
      case ScheduleKind::kZbH1: s.steps.push_back(zero_bubble_rank(pp - r, r, m)); break;
      case ScheduleKind::kZbH2: s.steps.push_back(zero_bubble_rank(2 * (pp - r) - 1, 2 * r, m)); break;
      case ScheduleKind::kZbV: break;  // above
      case ScheduleKind::k2BW:
      case ScheduleKind::kPipeDream:
      case ScheduleKind::kPipeMare: s.steps.push_back(stream_rank(r, pp, m)); break;
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
    if (!done_v[k]) return detail::cat("vocabulary pass ", int(k) - 1, " never ran");
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

std::vector<int> stage_layers(int layers, int stages, const std::vector<int>& split) {
  if (split.empty()) {
    LOOM_CHECK(stages >= 1 && layers >= stages, "cannot split ", layers, " layers into ", stages,
               " pipeline stages: every stage needs a layer");
    return even_stage_split(layers, stages);
  }
  int sum = 0;
  for (size_t i = 0; i < split.size(); ++i) {
    const bool end = i == 0 || i + 1 == split.size();  // Note [Stage split]: the ends may hold no blocks
    LOOM_CHECK(split[i] >= (end ? 0 : 1), "pipeline split has stage ", i, " of ", split.size(), " with ", split[i],
               " layers");
    sum += split[i];
  }
  LOOM_CHECK(int(split.size()) == stages && sum == layers, "pipeline split of ", split.size(), " stages with ", sum,
             " layers does not match ", stages, " stages of a ", layers, "-layer model");
  return split;
}

}  // namespace loom::parallel
