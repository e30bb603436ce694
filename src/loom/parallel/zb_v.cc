// ZB-V's lists, built by list scheduling on the stages' work (Note [ZB-V by stage work]),
// with or without the vocabulary passes (Note [ZB-V with its passes]).
#include <algorithm>
#include <array>
#include <limits>
#include <vector>

#include "loom/core/error.h"
#include "loom/parallel/schedule.h"

namespace loom::parallel {
namespace {

// ZB-V (Qi et al., ICLR 2024, Sec. 6): chunk 0 of rank r is stage r and chunk 1 stage
// 2 pp - 1 - r, so rank 0 holds both ends and each rank's two chunks together do equal
// block work. Built by list scheduling on each virtual stage's F, B and W durations (Note
// [ZB-V by stage work]; without them F = 4, B = 5, W = 3 everywhere, loom's measured ratio on
// a GPT block, rounded: the input-gradient step carries the attention backward, the weight
// step only the dW GEMMs): whenever a rank is free it starts one step whose input is done -
// B before F (or, the other order, F before B), within each the later stage first and per
// chunk in micro-batch order, an F only while the rank holds fewer than 2 pp chunk
// activations (1F1B's peak: pp micro-batches of a whole stage), or with a reserve a chunk-0
// F only while it holds fewer than 2 pp - 1 (so a fast first stage cannot fill the rank with
// forwards while the V's turn, its chunk-1 F, waits on a slower stage: that deadlocks); when
// neither is ready, the W whose B finished first. Both orders, each without and with the
// reserve, are built and the one that ends first is kept (the earlier of B first, F first, B
// first with the reserve, F first with it on a tie): at pp 2 and m = 8 with the unit
// durations, B first leaves 5.4% of the time idle and F first 2.5% (1F1B: 11.1%); at pp 8, B
// first is better. The order only has to be good; validate() proves it.
//
// Note [ZB-V with its passes]
// With the vocabulary passes (pass_work >= 0) the same scheduler places the head's passes
// V(0) .. V(m - 1) itself, as the barriers they are (Note [Vocabulary passes]): V(k) is due
// once the last stage's F(k) has ended; from then on a rank that comes free starts nothing
// and waits, and when every rank is free all run V(k) together for pass_work; the last
// stage's B(k) waits for V(k). A variant backfills: a rank that comes free while the pass is
// due starts a ready step that ends before the last rank comes free, which does not delay the
// pass (classic backfilling; of 36 cases at pp 2-4, m 4-16, it ended sooner in 30 and later in
// 6, so both are built). Placed on the work rather than at the ticks of a unit-time
// replay of the plain lists, the passes stop where the ranks meet anyway: on config B's
// default split 2, 2, 1, 1 the step's idle falls from 3.4% to 1.1% of it in make_schedule's
// units (A 5.7 -> 2.4%, M 5.6 -> 2.4%).
class ZbVList {
 public:
  std::vector<std::vector<PipeStep>> steps;  // [rank] -> its list
  double end = 0;                            // when the last step ends

  ZbVList(int pp, int m, bool forward_first, bool reserve, const StageWork& work, double pass_work, bool backfill)
      : steps(size_t(pp)), pp_(pp), m_(m), forward_first_(forward_first), reserve_(reserve), backfill_(backfill),
        work_(work), pass_work_(pass_work), next_(size_t(2 * pp), {0, 0, 0}), held_(size_t(pp), 0), free_at_(size_t(pp), 0),
        done_(3, std::vector<std::vector<double>>(size_t(2 * pp), std::vector<double>(size_t(m), -1))),
        pass_done_(size_t(m), -1) {}

  // Builds the lists; false if the order deadlocks.
  bool build() {
    size_t left = size_t(3 * 2 * pp_ * m_) + (passes() ? size_t(m_) : 0);
    // Event-driven: nothing becomes ready between two ends of steps, so t jumps to the next
    // one. A step of no work (a stage holding only the embedding) frees its rank at once, so
    // the ranks are gone over again until none starts anything at t.
    for (double t = 0; left > 0;) {
      for (bool started = true; started;) {
        started = false;
        if (run_pass(t)) started = true, --left;
        for (int r = 0; r < pp_; r++)
          if (free_at_[size_t(r)] <= t && start_one(r, t)) started = true, --left;
      }
      double next = -1;
      for (double f : free_at_)
        if (f > t && (next < 0 || f < next)) next = f;
      if (left > 0 && next < 0) return false;  // every rank free and none can start
      t = next;
    }
    return true;
  }

 private:
  bool passes() const { return pass_work_ >= 0; }
  int stage(int r, int c) const { return virtual_stage(ScheduleKind::kZbV, pp_, r, c); }
  double cost(Phase ph, int v) const {
    return work_.empty() ? std::array<double, 3>{4, 5, 3}[size_t(ph)] : work_[size_t(v)][size_t(ph)];
  }
  bool ran_before(Phase ph, int v, int i, double t) const {
    const double at = done_[size_t(ph)][size_t(v)][size_t(i)];
    return at >= 0 && at <= t;
  }
  // Note [ZB-V with its passes]: V(next_pass_) is due (its head's input is done).
  bool pass_due(double t) const { return passes() && next_pass_ < m_ && ran_before(Phase::kF, 2 * pp_ - 1, next_pass_, t); }
  // Runs the due pass on every rank at once when all are free.
  bool run_pass(double t) {
    if (!pass_due(t) || std::any_of(free_at_.begin(), free_at_.end(), [t](double f) { return f > t; })) return false;
    const int k = next_pass_++;
    pass_done_[size_t(k)] = t + pass_work_;
    for (int r = 0; r < pp_; r++) free_at_[size_t(r)] = pass_done_[size_t(k)], steps[size_t(r)].push_back({Phase::kV, k, 0});
    end = std::max(end, pass_done_[size_t(k)]);
    return true;
  }
  bool ready(int r, Phase ph, int c, double t) const {
    const int i = next_[size_t(2 * r + c)][size_t(ph)], v = stage(r, c), last = 2 * pp_ - 1;
    if (i >= m_) return false;
    const int cap = 2 * pp_ - (reserve_ && c == 0 ? 1 : 0);
    if (ph == Phase::kF) return held_[size_t(r)] < cap && (v == 0 || ran_before(Phase::kF, v - 1, i, t));
    if (ph == Phase::kB) {
      const bool head = v < last || !passes() || (pass_done_[size_t(i)] >= 0 && pass_done_[size_t(i)] <= t);
      return head && ran_before(Phase::kF, v, i, t) && (v == last || ran_before(Phase::kB, v + 1, i, t));
    }
    return ran_before(Phase::kB, v, i, t);
  }
  // Starts rank r's next step at t if one is ready: B / F in the run's order (the later chunk
  // first), else the W whose B ended first; nothing while a pass is due.
  bool start_one(int r, double t) {
    // While a pass is due: nothing, or with backfill a step that ends before the last rank comes free.
    const double room = !pass_due(t) ? std::numeric_limits<double>::infinity()
                        : backfill_  ? *std::max_element(free_at_.begin(), free_at_.end()) - t
                                     : -1;
    auto fits = [&](Phase ph, int c) { return ready(r, ph, c, t) && cost(ph, stage(r, c)) <= room; };
    const Phase order[2][2] = {{Phase::kB, Phase::kF}, {Phase::kF, Phase::kB}};
    int pick_c = -1;
    Phase pick = Phase::kF;
    for (Phase ph : order[forward_first_ ? 1 : 0])
      for (int c : {1, 0})
        if (pick_c < 0 && fits(ph, c)) pick_c = c, pick = ph;
    if (pick_c < 0) {  // the W whose B ended first
      double best = -1;
      for (int c : {0, 1})
        if (fits(Phase::kW, c)) {
          const double at = done_[1][size_t(stage(r, c))][size_t(next_[size_t(2 * r + c)][2])];
          if (best < 0 || at < best) best = at, pick_c = c, pick = Phase::kW;
        }
    }
    if (pick_c < 0) return false;
    const int i = next_[size_t(2 * r + pick_c)][size_t(pick)]++, v = stage(r, pick_c);
    free_at_[size_t(r)] = done_[size_t(pick)][size_t(v)][size_t(i)] = t + cost(pick, v);
    end = std::max(end, free_at_[size_t(r)]);
    held_[size_t(r)] += pick == Phase::kF ? 1 : pick == Phase::kW ? -1 : 0;
    steps[size_t(r)].push_back({pick, i, pick_c});
    return true;
  }

  int pp_, m_;
  bool forward_first_, reserve_, backfill_;
  const StageWork& work_;
  double pass_work_;                      // < 0: no passes
  int next_pass_ = 0;                     // the next head pass to run
  std::vector<std::array<int, 3>> next_;  // [2 rank + chunk] -> next micro-batch per phase
  std::vector<int> held_;                 // per rank: chunk activations held (F run, W not yet)
  std::vector<double> free_at_;           // per rank: when its running step ends
  std::vector<std::vector<std::vector<double>>> done_;  // [phase][stage][micro]: its end, -1 before it starts
  std::vector<double> pass_done_;         // [micro]: when its head pass ended, -1 before
};

// The lists of the variant that ends first (B first, F first, each without and with the
// reserve; with passes, each without and with backfill); empty when none finishes.
std::vector<std::vector<PipeStep>> best_list(int pp, int m, const StageWork& work, double pass_work) {
  std::vector<std::vector<PipeStep>> best;
  double best_end = -1;
  for (bool backfill : {false, true}) {
    if (backfill && pass_work < 0) break;
    for (bool reserve : {false, true})
      for (bool forward_first : {false, true}) {
        ZbVList l(pp, m, forward_first, reserve, work, pass_work, backfill);
        if (l.build() && (best_end < 0 || l.end < best_end)) best = std::move(l.steps), best_end = l.end;
      }
  }
  return best;
}

}  // namespace

std::vector<std::vector<PipeStep>> zero_bubble_v(int pp, int m, const StageWork& work) {
  std::vector<std::vector<PipeStep>> best = best_list(pp, m, work, -1);
  LOOM_ASSERT(!best.empty(), "zb-v list scheduling did not finish at pp ", pp, ", m ", m);
  return best;
}

Schedule zero_bubble_v_with_passes(int pp, int m, const StageWork& work, double pass_work) {
  LOOM_ASSERT(pass_work >= 0);
  Schedule s{ScheduleKind::kZbV, pp, 2, m, best_list(pp, m, work, pass_work)};
  if (s.steps.empty()) return s;
  for (std::vector<PipeStep>& list : s.steps) {  // V(-1) first and V(m) last, as insert_passes has them
    list.insert(list.begin(), {Phase::kV, -1, 0});
    list.push_back({Phase::kV, m, 0});
  }
  s.passes = embedding_passes(s.steps[size_t(s.site(0).rank)], m, s.site(0));
  return s;
}

}  // namespace loom::parallel
