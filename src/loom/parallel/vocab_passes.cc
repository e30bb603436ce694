// Note [Vocabulary passes] (schedule.h): where each rank runs them, and what each carries.
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "loom/core/error.h"
#include "loom/parallel/schedule.h"

namespace loom::parallel {

namespace {

using Lists = std::vector<std::vector<PipeStep>>;

// Inserts V(-1) .. V(m) into one step's lists, micro-batches 0 .. m - 1 being the ones it
// heads; tick[r][j]: the tick of lists[r][j] in a replay of the lists without passes. Returns
// the passes.
std::vector<VocabPass> insert_passes(Lists& lists, const std::vector<std::vector<int>>& tick, int m, StageSite first,
                                     StageSite last, bool early) {
  // head_tick[i]: the tick of the last stage's F(i).
  std::vector<int> head_tick(size_t(m), -1);
  const std::vector<PipeStep>& last_list = lists[size_t(last.rank)];
  for (size_t j = 0; j < last_list.size(); ++j)
    if (last_list[j].phase == Phase::kF && last_list[j].chunk == last.chunk && last_list[j].micro_batch >= 0)
      head_tick[size_t(last_list[j].micro_batch)] = tick[size_t(last.rank)][j];
  // Every rank: V(-1) first, V(i) before its first step of a later tick than head_tick[i]
  // (early: of that tick, on the ranks before the last), V(m) last.
  for (size_t r = 0; r < lists.size(); ++r) {
    std::vector<PipeStep> out{{Phase::kV, -1, 0}};
    const int later = early && int(r) != last.rank ? 0 : 1;
    int next_head = 0;
    for (size_t j = 0; j < lists[r].size(); ++j) {
      while (next_head < m && tick[r][j] >= head_tick[size_t(next_head)] + later) out.push_back({Phase::kV, next_head++, 0});
      out.push_back(lists[r][j]);
    }
    while (next_head <= m) out.push_back({Phase::kV, next_head++, 0});
    lists[r] = std::move(out);
  }
  return embedding_passes(lists[size_t(first.rank)], m, first);
}

// Note [Vocabulary passes across a step's end]: the next step's first lookups move from its
// V(-1) into this step's V(m - 1), after the vocabulary tensors' update, and the gradients this
// step's V(m) carries into the front of the next step's V(0); the passes left empty leave the
// lists. Left as they are where the kinds of step that may follow each other disagree on
// them, or where some rank's last trailing backward comes after V(m - 1).
void carry_across_steps(Schedule& s) {
  const int m = s.micro_batches;
  std::vector<StreamStep>& v = s.stream_vocab;  // by stream_variant: 0 age 0, 1 older, + 2 flushing
  const std::vector<int> lookups = v[1].passes[0].embed, tail = v[0].passes[size_t(m + 1)].embed_grad;
  if (v[3].passes[0].embed != lookups || v[1].passes[size_t(m + 1)].embed_grad != tail) return;
  for (const std::vector<PipeStep>& list : v[1].steps) {
    const auto update = std::find_if(list.begin(), list.end(), [&](const PipeStep& st) {
      return st.phase == Phase::kV && st.micro_batch == m - 1;
    });
    const bool trailing_after = std::any_of(update, list.end(), [](const PipeStep& st) {
      return st.phase != Phase::kV && st.micro_batch < 0;
    });
    if (trailing_after) return;
  }
  for (int older : {1, 3}) {
    std::vector<VocabPass>& p = v[size_t(older)].passes;
    p[0].embed.clear();
    for (auto j = tail.rbegin(); j != tail.rend(); ++j) p[1].embed_grad.insert(p[1].embed_grad.begin(), *j - m);
  }
  for (int steady : {0, 1}) {
    std::vector<VocabPass>& p = v[size_t(steady)].passes;
    p[size_t(m + 1)].embed_grad.clear();
    for (int j : lookups) p[size_t(m)].embed.push_back(j + m);
  }
  v[1].passes[size_t(m)].update = true;
  for (StreamStep& step : v)
    for (std::vector<PipeStep>& list : step.steps)
      std::erase_if(list, [&](const PipeStep& st) {
        return st.phase == Phase::kV && step.passes[size_t(st.micro_batch + 1)].carries_nothing();
      });
}

// Note [The next step's first forwards ahead]: the leading forwards of rank r's next step that a
// replay of the stream as one list runs before this step's V(m - 1) there (their ticks before
// the pass's place, as insert_passes places it): for each rank, those of the step after `k`.
std::vector<std::vector<PipeStep>> forwards_before_last_head(const std::vector<Lists>& lists,
                                                             const std::vector<std::vector<std::vector<int>>>& ticks,
                                                             int k, int m, StageSite last, bool early) {
  int head_tick = -1;  // the last stage's F(m - 1) in step k
  const std::vector<PipeStep>& last_list = lists[size_t(k)][size_t(last.rank)];
  for (size_t j = 0; j < last_list.size(); ++j)
    if (last_list[j].phase == Phase::kF && last_list[j].micro_batch == m - 1) head_tick = ticks[size_t(k)][size_t(last.rank)][j];
  std::vector<std::vector<PipeStep>> out(lists[0].size());
  for (size_t r = 0; r < out.size(); ++r) {
    const int later = early && int(r) != last.rank ? 0 : 1;
    const std::vector<PipeStep>& next = lists[size_t(k + 1)][r];
    for (size_t j = 0; j < next.size() && ticks[size_t(k + 1)][r][j] < head_tick + later; ++j) {
      if (next[j].phase != Phase::kF || next[j].micro_batch < 0) return {};  // only the next step's forwards move
      out[r].push_back(next[j]);
    }
  }
  return out;
}

bool same_steps(const std::vector<PipeStep>& a, const std::vector<PipeStep>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const PipeStep& x, const PipeStep& y) {
    return x.phase == y.phase && x.micro_batch == y.micro_batch && x.chunk == y.chunk;
  });
}

// Note [The next step's first forwards ahead]: moves them (as m + i) before each non-flushing
// step's V(m - 1), out of the front of the steps that follow one (age 1 and older), their
// lookups to the first stage's last pass before them, and (steps with a pending update) the
// vocabulary tensors' update aside into that pass and its take into V(m - 1). Left as it is
// where the two kinds of step that follow a non-flushing one would have different forwards
// moved, where no forward moves, or where the vocabulary update was not carried across the
// step's end (carry_across_steps).
void pull_next_forwards(Schedule& s, const std::vector<Lists>& lists, const std::vector<std::vector<std::vector<int>>>& ticks,
                        bool early) {
  const int m = s.micro_batches;
  const StageSite first = s.site(0), last = s.site(s.pp - 1);
  std::vector<StreamStep>& v = s.stream_vocab;
  if (!v[1].passes[size_t(m)].update) return;
  // The update moves to V(m - 2) (the first stage's pass before the moved forwards, asserted
  // below) and needs the step before's whole gradient: no trailing embedding gradient after it.
  for (size_t k = size_t(m); k < v[1].passes.size(); ++k)
    for (int j : v[1].passes[k].embed_grad)
      if (j < 0) return;
  const std::vector<std::vector<PipeStep>> pulled = forwards_before_last_head(lists, ticks, 0, m, last, early);
  const std::vector<std::vector<PipeStep>> again = forwards_before_last_head(lists, ticks, 1, m, last, early);
  if (pulled.empty() || again.empty() || pulled[size_t(first.rank)].empty()) return;
  for (size_t r = 0; r < pulled.size(); ++r)
    if (!same_steps(pulled[r], again[r])) return;
  for (int older : {1, 3})
    for (size_t r = 0; r < pulled.size(); ++r) {
      std::vector<PipeStep>& list = v[size_t(older)].steps[r];
      const std::vector<PipeStep> front(list.begin(), list.begin() + std::ptrdiff_t(pulled[r].size()));
      LOOM_ASSERT(same_steps(front, pulled[r]), "a step's first forwards moved differently on rank ", r);
      list.erase(list.begin(), list.begin() + std::ptrdiff_t(pulled[r].size()));
    }
  for (int steady : {0, 1}) {
    StreamStep& step = v[size_t(steady)];
    int aside = -2;  // the pass that now looks the moved forwards up
    for (size_t r = 0; r < pulled.size(); ++r) {
      std::vector<PipeStep>& list = step.steps[r];
      auto at = std::find_if(list.begin(), list.end(), [&](const PipeStep& st) {
        return st.phase == Phase::kV && st.micro_batch == m - 1;
      });
      LOOM_ASSERT(at != list.end(), "a non-flushing step without V(", m - 1, ") on rank ", r);
      for (PipeStep st : pulled[r]) {
        st.micro_batch += m;
        at = list.insert(at, st) + 1;
      }
      if (int(r) != first.rank) continue;
      const auto before = std::find_if(std::make_reverse_iterator(at - std::ptrdiff_t(pulled[r].size())), list.rend(),
                                       [](const PipeStep& st) { return st.phase == Phase::kV; });
      LOOM_ASSERT(before != list.rend() && before->micro_batch == m - 2, "the moved forwards on rank ", r,
                  " do not follow V(", m - 2, ")");
      aside = before->micro_batch;
    }
    std::vector<int>& late = step.passes[size_t(m)].embed;
    std::vector<int>& early_lookups = step.passes[size_t(aside + 1)].embed;
    for (const PipeStep& st : pulled[size_t(first.rank)]) {
      const auto it = std::find(late.begin(), late.end(), st.micro_batch + m);
      LOOM_ASSERT(it != late.end(), "micro-batch ", st.micro_batch, " of the next step is not looked up in V(", m - 1, ")");
      late.erase(it);
      early_lookups.push_back(st.micro_batch + m);
    }
    if (steady == 1) {
      step.passes[size_t(aside + 1)].update = step.passes[size_t(aside + 1)].aside = true;
      step.passes[size_t(m)].update = false;
      step.passes[size_t(m)].take = true;
    }
  }
}

// Note [Vocabulary passes in a stream]: each kind of step's lists with their passes, placed by
// the ticks of the plain stream's replay (ages 0 .. depth and a flush as one list; a step
// that both starts and flushes the stream, by its own replay).
void add_stream_vocab_passes(Schedule& s, bool early) {
  const int m = s.micro_batches, depth = stream_depth(s), steps = depth + 2;
  LOOM_ASSERT(s.kind == ScheduleKind::k2BW && depth == 1 && s.stream_vocab.empty());
  const StageSite first = s.site(0), last = s.site(s.pp - 1);
  const ScheduleCheck plain = validate(s);
  LOOM_ASSERT(plain.ok, "stream ", schedule_name(s.kind), " does not finish: ", plain.problem);
  // Step k of the replayed stream: its lists and their ticks (age k, flushing when k is the last).
  std::vector<Lists> lists(size_t(steps), Lists(size_t(s.pp)));
  std::vector<std::vector<std::vector<int>>> ticks(size_t(steps), std::vector<std::vector<int>>(size_t(s.pp)));
  for (int r = 0; r < s.pp; ++r) {
    size_t at = 0;
    for (int k = 0; k < steps; ++k) {
      lists[size_t(k)][size_t(r)] = stream_steps(s, r, k, k == steps - 1);
      for (size_t j = 0; j < lists[size_t(k)][size_t(r)].size(); ++j)
        ticks[size_t(k)][size_t(r)].push_back(plain.step_tick[size_t(r)][at++]);
    }
  }
  // A stream of one step: a flushing 1F1B of its m micro-batches.
  Schedule once{ScheduleKind::k1F1B, s.pp, 1, m, Lists(size_t(s.pp))};
  for (int r = 0; r < s.pp; ++r) once.steps[size_t(r)] = stream_steps(s, r, 0, true);
  const ScheduleCheck alone = validate(once);
  LOOM_ASSERT(alone.ok, alone.problem);
  s.stream_vocab.resize(4);
  auto fill = [&](int variant, Lists l, const std::vector<std::vector<int>>& t) {
    StreamStep& v = s.stream_vocab[size_t(variant)];
    v.passes = insert_passes(l, t, m, first, last, early);
    v.steps = std::move(l);
  };
  fill(0, lists[0], ticks[0]);                  // age 0
  fill(1, lists[1], ticks[1]);                  // older
  fill(2, once.steps, alone.step_tick);         // age 0, flushing
  fill(3, lists[size_t(steps - 1)], ticks[size_t(steps - 1)]);  // older, flushing
  carry_across_steps(s);
  const std::vector<StreamStep> carried = s.stream_vocab;
  pull_next_forwards(s, lists, ticks, early);
  s.passes = s.stream_vocab[1].passes;
  if (!validate(s).ok) s.stream_vocab = carried, s.passes = s.stream_vocab[1].passes;
  const Schedule one{ScheduleKind::k1F1B, s.pp, 1, m, s.stream_vocab[2].steps, s.stream_vocab[2].passes};
  const ScheduleCheck with = validate(one);
  LOOM_ASSERT(with.ok, "a one-step stream with vocabulary passes does not finish: ", with.problem);
}

// The order one step's gradient of the vocabulary tensors receives its parts in: pass by pass,
// the embedding gradients a pass carries (micro-batch j, as j + 1), then its head's (as
// -(i + 1)). own: a step's own (j >= 0); else the previous step's, carried by this one (j < 0).
std::vector<int> vocab_parts(const std::vector<VocabPass>& passes, int m, bool own) {
  std::vector<int> out;
  for (const VocabPass& p : passes) {
    for (int j : p.embed_grad)
      if ((j >= 0) == own) out.push_back(j + (own ? 0 : m) + 1);
    if (own && p.head >= 0) out.push_back(-(p.head + 1));
  }
  return out;
}

// Whether 2bw's stream sums every step's vocabulary gradient in the order its flushing
// reference (the 1F1B lists `flushing`) does: a step's own parts, then the trailing ones the
// next step carries, for every kind of step and successor (stream_variant).
bool stream_sums_like(const Schedule& stream, const Schedule& flushing) {
  const int m = stream.micro_batches;
  const std::vector<int> want = vocab_parts(flushing.passes, m, true);
  auto own = [&](int v) { return vocab_parts(stream.stream_vocab[size_t(v)].passes, m, true); };
  auto then = [&](int v, int next) {
    std::vector<int> parts = own(v), trailing = vocab_parts(stream.stream_vocab[size_t(next)].passes, m, false);
    parts.insert(parts.end(), trailing.begin(), trailing.end());
    return parts;
  };
  return own(2) == want && own(3) == want && then(0, 1) == want && then(0, 3) == want && then(1, 1) == want &&
         then(1, 3) == want;
}

}  // namespace

// Note [Vocabulary passes ahead]: the lag rule and placement whose 1F1B lists with passes end
// first by replay_time (the plain rule and placement on a tie, so the fewest activations held),
// among those with which 2bw's stream (where m >= pp lets it run) sums its vocabulary gradients
// in the 1F1B's order, applied to 1f1b or 2bw alike: a 2bw stream and its flushing reference
// (TrainOptions::two_bw_reference) then agree to the bit.
Schedule ahead_of_passes(ScheduleKind kind, int pp, int m, const StageWork& work, double pass_work) {
  Schedule best;
  double best_end = std::numeric_limits<double>::infinity();
  for (LagRule lag : {LagRule::kPlain, LagRule::kOneMore, LagRule::kDouble})
    for (bool early : {false, true}) {
      Schedule f = make_lagged(ScheduleKind::k1F1B, pp, m, lag);
      const bool plain = lag == LagRule::kPlain && !early;
      if (!plain && pipeline_lag(f, 0) > m) continue;
      add_vocab_passes(f, early);
      Schedule stream;  // 2bw's lists at the same rule, where m >= pp lets it run
      if (kind == ScheduleKind::k2BW || (!plain && m >= pp)) {
        stream = make_lagged(ScheduleKind::k2BW, pp, m, lag);
        add_vocab_passes(stream, early);
        if (!plain && !stream_sums_like(stream, f)) continue;
      }
      const double end = replay_time(f, work, pass_work);
      if (end < best_end) best = kind == ScheduleKind::k2BW ? std::move(stream) : std::move(f), best_end = end;
    }
  LOOM_ASSERT(best_end < std::numeric_limits<double>::infinity(), "1f1b with vocabulary passes at pp ", pp, ", m ", m,
              " has no list that finishes");
  return best;
}

// The embedding rides with the first stage's passes: a lookup in the last one before its F,
// a gradient in the first one after its B.
std::vector<VocabPass> embedding_passes(const std::vector<PipeStep>& list, int m, StageSite first) {
  std::vector<VocabPass> passes(size_t(m + 2));
  for (int k = 0; k < m; ++k) passes[size_t(k + 1)].head = k;
  int pass = -1;
  std::vector<int> grads;  // B run, gradient not yet carried
  for (const PipeStep& st : list) {
    if (st.phase == Phase::kV) {
      pass = st.micro_batch;
      VocabPass& v = passes[size_t(pass + 1)];
      v.embed_grad.insert(v.embed_grad.end(), grads.begin(), grads.end());
      grads.clear();
    } else if (st.chunk == first.chunk && st.phase == Phase::kF) {
      passes[size_t(pass + 1)].embed.push_back(st.micro_batch);
    } else if (st.chunk == first.chunk && st.phase == Phase::kB) {
      grads.push_back(st.micro_batch);
    }
  }
  LOOM_ASSERT(grads.empty(), "the epilogue V(", m, ") is the first stage's last step");
  return passes;
}

void add_vocab_passes(Schedule& s, bool early) {
  LOOM_ASSERT(!s.vocab(), "vocabulary passes added twice");
  if (streams(s.kind)) return add_stream_vocab_passes(s, early);
  const ScheduleCheck plain = validate(s);
  LOOM_ASSERT(plain.ok, "schedule ", schedule_name(s.kind), " does not finish: ", plain.problem);
  s.passes = insert_passes(s.steps, plain.step_tick, s.micro_batches, s.site(0), s.site(s.pp * s.vpp - 1), early);
}

int stream_variant(const Schedule& s, int age, bool flush) {
  return (age >= stream_depth(s) ? 1 : 0) + (flush ? 2 : 0);
}

const std::vector<VocabPass>& stream_passes(const Schedule& s, int age, bool flush) {
  LOOM_ASSERT(!s.stream_vocab.empty());
  return s.stream_vocab[size_t(stream_variant(s, age, flush))].passes;
}

namespace {
// The most boundary buffers `list` holds at once on the first stage (Note [Vocabulary passes]),
// counting those a stream's step takes over from the step before and leaves to the next (Note
// [Vocabulary passes across a step's end]): lookups of the next step's micro-batches (j >= m)
// and gradients of backwards carried in the next step's passes.
int first_stage_buffers(const std::vector<PipeStep>& list, const std::vector<VocabPass>& passes, StageSite first,
                        int m) {
  std::vector<int> looked, carried, forwarded, backward;
  for (const VocabPass& p : passes) {
    looked.insert(looked.end(), p.embed.begin(), p.embed.end());
    carried.insert(carried.end(), p.embed_grad.begin(), p.embed_grad.end());
  }
  for (const PipeStep& st : list)
    if (st.chunk == first.chunk && st.phase == Phase::kF) forwarded.push_back(st.micro_batch);
    else if (st.chunk == first.chunk && st.phase == Phase::kB) backward.push_back(st.micro_batch);
  auto absent = [](const std::vector<int>& of, const std::vector<int>& in) {
    return int(std::count_if(of.begin(), of.end(), [&](int j) { return std::find(in.begin(), in.end(), j) == in.end(); }));
  };
  // (the next step's lookups its first forwards here do not take: Note [The next step's first
  // forwards ahead])
  const int ahead = int(std::count_if(looked.begin(), looked.end(), [&](int j) {
    return j >= m && std::find(forwarded.begin(), forwarded.end(), j) == forwarded.end();
  }));
  int held = absent(forwarded, looked) + absent(carried, backward), peak = held;
  for (const PipeStep& st : list) {
    if (st.phase == Phase::kV) {  // its gradients carried first, then its lookups made
      const VocabPass& p = passes[size_t(st.micro_batch + 1)];
      held -= int(p.embed_grad.size());
      held += int(p.embed.size());
    } else if (st.chunk == first.chunk && st.phase == Phase::kF) {
      held -= 1;  // the lookup forwarded
      continue;
    } else if (st.chunk == first.chunk && st.phase == Phase::kB) {
      held += 1;  // the gradient kept for a later pass
    }
    peak = std::max(peak, held);
  }
  LOOM_ASSERT(held == ahead + absent(backward, carried), "the first stage ends its step holding ", held,
              " vocabulary buffers");
  return peak;
}
}  // namespace

int vocab_buffers(const Schedule& s, int rank) {
  LOOM_ASSERT(s.vocab() && rank >= 0 && rank < s.pp);
  const StageSite first = s.site(0);
  if (rank != first.rank) return 1;
  int peak = 0;
  if (s.stream_vocab.empty()) peak = first_stage_buffers(s.steps[size_t(rank)], s.passes, first, s.micro_batches);
  for (const StreamStep& v : s.stream_vocab)
    peak = std::max(peak, first_stage_buffers(v.steps[size_t(rank)], v.passes, first, s.micro_batches));
  return std::max(peak, 1);  // validation looks one micro-batch up
}

std::string pp_vocab_refusal(const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  auto refusal = [](const std::string& what, const std::string& fix) {
    return "parallel.pp_vocab with " + what + ": loom simulate prices it, but the engine does not run it yet (issue " +
           "55); " + fix + ", or set parallel.pp_vocab = false";
  };
  if (!p.pp_vocab) return "";

  if (p.ps_servers > 0) return refusal("parameter servers", "set parallel.ps_servers = 0");
  return "";
}

}  // namespace loom::parallel
