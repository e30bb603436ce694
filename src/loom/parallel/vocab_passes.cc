// Note [Vocabulary passes] (schedule.h): where each rank runs them, and what each carries.
#include <algorithm>
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
                                     StageSite last) {
  // head_tick[i]: the tick of the last stage's F(i).
  std::vector<int> head_tick(size_t(m), -1);
  const std::vector<PipeStep>& last_list = lists[size_t(last.rank)];
  for (size_t j = 0; j < last_list.size(); ++j)
    if (last_list[j].phase == Phase::kF && last_list[j].chunk == last.chunk && last_list[j].micro_batch >= 0)
      head_tick[size_t(last_list[j].micro_batch)] = tick[size_t(last.rank)][j];
  // Every rank: V(-1) first, V(i) before its first step of a later tick than head_tick[i],
  // V(m) last.
  for (size_t r = 0; r < lists.size(); ++r) {
    std::vector<PipeStep> out{{Phase::kV, -1, 0}};
    int next_head = 0;
    for (size_t j = 0; j < lists[r].size(); ++j) {
      while (next_head < m && tick[r][j] > head_tick[size_t(next_head)]) out.push_back({Phase::kV, next_head++, 0});
      out.push_back(lists[r][j]);
    }
    while (next_head <= m) out.push_back({Phase::kV, next_head++, 0});
    lists[r] = std::move(out);
  }
  // The embedding rides with the first stage's passes: a lookup in the last one before its
  // F, a gradient in the first one after its B.
  std::vector<VocabPass> passes(size_t(m + 2));
  for (int k = 0; k < m; ++k) passes[size_t(k + 1)].head = k;
  int pass = -1;
  std::vector<int> grads;  // B run, gradient not yet carried
  for (const PipeStep& st : lists[size_t(first.rank)]) {
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

// Note [Vocabulary passes in a stream]: each kind of step's lists with their passes, placed by
// the ticks of the plain stream's replay (ages 0 .. depth and a flush as one list; a step
// that both starts and flushes the stream, by its own replay).
void add_stream_vocab_passes(Schedule& s) {
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
    v.passes = insert_passes(l, t, m, first, last);
    v.steps = std::move(l);
  };
  fill(0, lists[0], ticks[0]);                  // age 0
  fill(1, lists[1], ticks[1]);                  // older
  fill(2, once.steps, alone.step_tick);         // age 0, flushing
  fill(3, lists[size_t(steps - 1)], ticks[size_t(steps - 1)]);  // older, flushing
  s.passes = s.stream_vocab[1].passes;
  const Schedule one{ScheduleKind::k1F1B, s.pp, 1, m, s.stream_vocab[2].steps, s.stream_vocab[2].passes};
  const ScheduleCheck with = validate(one);
  LOOM_ASSERT(with.ok, "a one-step stream with vocabulary passes does not finish: ", with.problem);
}

}  // namespace

void add_vocab_passes(Schedule& s) {
  LOOM_ASSERT(!s.vocab(), "vocabulary passes added twice");
  if (streams(s.kind)) return add_stream_vocab_passes(s);
  const ScheduleCheck plain = validate(s);
  LOOM_ASSERT(plain.ok, "schedule ", schedule_name(s.kind), " does not finish: ", plain.problem);
  s.passes = insert_passes(s.steps, plain.step_tick, s.micro_batches, s.site(0), s.site(s.pp * s.vpp - 1));
}

int stream_variant(const Schedule& s, int age, bool flush) {
  return (age >= stream_depth(s) ? 1 : 0) + (flush ? 2 : 0);
}

const std::vector<VocabPass>& stream_passes(const Schedule& s, int age, bool flush) {
  LOOM_ASSERT(!s.stream_vocab.empty());
  return s.stream_vocab[size_t(stream_variant(s, age, flush))].passes;
}

namespace {
// The most boundary buffers `list` holds at once on the first stage (Note [Vocabulary passes]).
int first_stage_buffers(const std::vector<PipeStep>& list, const std::vector<VocabPass>& passes, StageSite first) {
  int held = 0, peak = 0;
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
  LOOM_ASSERT(held == 0, "the first stage ends its step holding ", held, " vocabulary buffers");
  return peak;
}
}  // namespace

int vocab_buffers(const Schedule& s, int rank) {
  LOOM_ASSERT(s.vocab() && rank >= 0 && rank < s.pp);
  const StageSite first = s.site(0);
  if (rank != first.rank) return 1;
  int peak = 0;
  if (s.stream_vocab.empty()) peak = first_stage_buffers(s.steps[size_t(rank)], s.passes, first);
  for (const StreamStep& v : s.stream_vocab)
    peak = std::max(peak, first_stage_buffers(v.steps[size_t(rank)], v.passes, first));
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
