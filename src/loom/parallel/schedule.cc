#include "loom/parallel/schedule.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "loom/core/error.h"

namespace loom::parallel {
namespace {

// GPipe: all forwards, then all backwards (in reverse micro-batch order would also work;
// forward order keeps the gradient stream FIFO).
std::vector<PipeStep> gpipe_rank(int m) {
  std::vector<PipeStep> out;
  for (int i = 0; i < m; ++i) out.push_back({true, i, 0});
  for (int i = 0; i < m; ++i) out.push_back({false, i, 0});
  return out;
}

// 1F1B: rank r warms up with min(pp - r - 1, m) forwards, then alternates one forward and
// one backward, then drains the remaining backwards (Narayanan et al., PipeDream-Flush).
std::vector<PipeStep> one_f_one_b_rank(int r, int pp, int m) {
  const int warmup = std::min(pp - r - 1, m);
  std::vector<PipeStep> out;
  int f = 0, b = 0;
  for (; f < warmup; ++f) out.push_back({true, f, 0});
  for (; f < m; ++f, ++b) {
    out.push_back({true, f, 0});
    out.push_back({false, b, 0});
  }
  for (; b < m; ++b) out.push_back({false, b, 0});
  return out;
}

// Interleaved 1F1B (Megatron): micro-batches go through the rank's vpp chunks in groups of
// pp; the k-th forward of a rank is micro-batch (k / (pp*vpp)) * pp + k % pp on chunk
// (k / pp) % vpp, backwards the same with chunks reversed. Warm-up: (pp - r - 1) * 2 +
// (vpp - 1) * pp forwards (capped at the total), then 1F1B, then drain.
std::vector<PipeStep> interleaved_rank(int r, int pp, int vpp, int m) {
  const int total = m * vpp;
  auto fwd = [&](int k) {
    return PipeStep{true, (k / (pp * vpp)) * pp + k % pp, (k / pp) % vpp};
  };
  auto bwd = [&](int k) {
    return PipeStep{false, (k / (pp * vpp)) * pp + k % pp, vpp - 1 - (k / pp) % vpp};
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

}  // namespace

Schedule make_schedule(ScheduleKind kind, int pp, int m, int vpp) {
  LOOM_CHECK(pp >= 1, "pipeline: pp must be >= 1, got ", pp);
  LOOM_CHECK(m >= 1, "pipeline: micro-batches must be >= 1, got ", m);
  if (kind == ScheduleKind::kInterleaved1F1B) {
    LOOM_CHECK(vpp >= 2, "schedule interleaved needs vpp >= 2, got ", vpp, "; use 1f1b for vpp = 1");
    LOOM_CHECK(m % pp == 0, "schedule interleaved needs micro-batches divisible by pp = ", pp, ", got ", m,
               "; use ", (m + pp - 1) / pp * pp, " micro-batches");
  } else {
    LOOM_CHECK(vpp == 1, "schedule ", schedule_name(kind), " runs one model chunk per rank; vpp = ", vpp,
               " needs schedule interleaved");
  }
  Schedule s{kind, pp, vpp, m, {}};
  for (int r = 0; r < pp; ++r) {
    switch (kind) {
      case ScheduleKind::kGPipe: s.steps.push_back(gpipe_rank(m)); break;
      case ScheduleKind::k1F1B: s.steps.push_back(one_f_one_b_rank(r, pp, m)); break;
      case ScheduleKind::kInterleaved1F1B: s.steps.push_back(interleaved_rank(r, pp, vpp, m)); break;
    }
  }
  return s;
}

// Replay in rounds: in each round every rank whose next step has its inputs runs it. A
// round where no rank can move, before all finish, is a deadlock.
ScheduleCheck validate(const Schedule& s) {
  const int pp = s.pp, vpp = s.vpp, m = s.micro_batches, stages = pp * vpp;
  ScheduleCheck out;
  out.peak_in_flight.assign(pp, 0);
  out.chunk_peak_in_flight.assign(pp, std::vector<int>(size_t(vpp), 0));
  // done_f[v][mb], done_b[v][mb]: has virtual stage v run forward/backward of mb.
  std::vector<std::vector<char>> done_f(stages, std::vector<char>(m, 0)), done_b = done_f;
  std::vector<size_t> next(pp, 0);
  std::vector<int> held(pp, 0);
  std::vector<std::vector<int>> chunk_held = out.chunk_peak_in_flight;
  size_t remaining = 0;
  for (const auto& r : s.steps) remaining += r.size();
  auto ready = [&](int r, const PipeStep& st) {
    const int v = st.chunk * pp + r;
    if (st.micro_batch < 0 || st.micro_batch >= m || st.chunk < 0 || st.chunk >= vpp) return false;
    if (st.forward) return !done_f[v][st.micro_batch] && (v == 0 || done_f[v - 1][st.micro_batch]);
    return done_f[v][st.micro_batch] && !done_b[v][st.micro_batch] &&
           (v == stages - 1 || done_b[v + 1][st.micro_batch]);
  };
  while (remaining > 0) {
    std::vector<int> movers;
    for (int r = 0; r < pp; ++r)
      if (next[r] < s.steps[r].size() && ready(r, s.steps[r][next[r]])) movers.push_back(r);
    if (movers.empty()) {
      std::ostringstream os;
      os << "deadlock after " << out.ticks << " steps:";
      for (int r = 0; r < pp; ++r) {
        if (next[r] >= s.steps[r].size()) continue;
        const PipeStep& st = s.steps[r][next[r]];
        os << " rank " << r << " waits to run " << (st.forward ? "F" : "B") << st.micro_batch << " (chunk " << st.chunk
           << ");";
      }
      out.problem = os.str();
      return out;
    }
    for (int r : movers) {  // all movers' inputs were checked before this round's effects
      const PipeStep& st = s.steps[r][next[r]++];
      const int v = st.chunk * pp + r;
      (st.forward ? done_f : done_b)[v][st.micro_batch] = 1;
      held[r] += st.forward ? 1 : -1;
      out.peak_in_flight[r] = std::max(out.peak_in_flight[r], held[r]);
      int& in_chunk = chunk_held[r][size_t(st.chunk)];
      in_chunk += st.forward ? 1 : -1;
      out.chunk_peak_in_flight[r][size_t(st.chunk)] = std::max(out.chunk_peak_in_flight[r][size_t(st.chunk)], in_chunk);
      --remaining;
    }
    ++out.ticks;
  }
  for (int v = 0; v < stages; ++v)
    for (int mb = 0; mb < m; ++mb)
      if (!done_f[v][mb] || !done_b[v][mb]) {
        out.problem = detail::cat("virtual stage ", v, " never ran ", done_f[v][mb] ? "backward" : "forward",
                                  " of micro-batch ", mb);
        return out;
      }
  out.ok = true;
  return out;
}

std::vector<int> stage_layers(int layers, int stages, const std::vector<int>& split) {
  LOOM_CHECK(stages >= 1 && layers >= stages, "cannot split ", layers, " layers into ", stages,
             " pipeline stages: every stage needs a layer");
  if (!split.empty()) {
    int sum = 0;
    for (int v : split) {
      LOOM_CHECK(v >= 1, "pipeline split has a stage with ", v, " layers");
      sum += v;
    }
    LOOM_CHECK(int(split.size()) == stages && sum == layers, "pipeline split of ", split.size(), " stages with ",
               sum, " layers does not match ", stages, " stages of a ", layers, "-layer model");
    return split;
  }
  std::vector<int> out(size_t(stages), layers / stages);
  // The ends also run the embedding and the head: the remainder goes to the middle stages.
  std::vector<int> order(static_cast<size_t>(stages));
  for (int i = 0; i < stages; i++) order[size_t(i)] = i;
  const double mid = (stages - 1) / 2.0;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return std::abs(a - mid) < std::abs(b - mid); });
  for (int i = 0; i < layers % stages; i++) out[size_t(order[size_t(i)])]++;
  return out;
}

}  // namespace loom::parallel
