// Note [Vocabulary passes] (schedule.h): where each rank runs them, and what each carries.
#include <algorithm>
#include <string>
#include <vector>

#include "loom/core/error.h"
#include "loom/parallel/schedule.h"

namespace loom::parallel {

void add_vocab_passes(Schedule& s) {
  LOOM_ASSERT(!s.vocab(), "vocabulary passes added twice");
  const int m = s.micro_batches;
  const ScheduleCheck plain = validate(s);
  LOOM_ASSERT(plain.ok, "schedule ", schedule_name(s.kind), " does not finish: ", plain.problem);
  // head_tick[i]: the tick of the last stage's F(i) in the plain replay.
  const StageSite last = s.site(s.pp * s.vpp - 1);
  std::vector<int> head_tick(size_t(m), -1);
  const std::vector<PipeStep>& last_list = s.steps[size_t(last.rank)];
  for (size_t j = 0; j < last_list.size(); ++j)
    if (last_list[j].phase == Phase::kF && last_list[j].chunk == last.chunk)
      head_tick[size_t(last_list[j].micro_batch)] = plain.step_tick[size_t(last.rank)][j];
  // Every rank: V(-1) first, V(i) before its first step of a later tick than head_tick[i],
  // V(m) last.
  for (size_t r = 0; r < s.steps.size(); ++r) {
    std::vector<PipeStep> out{{Phase::kV, -1, 0}};
    int next_head = 0;
    for (size_t j = 0; j < s.steps[r].size(); ++j) {
      while (next_head < m && plain.step_tick[r][j] > head_tick[size_t(next_head)])
        out.push_back({Phase::kV, next_head++, 0});
      out.push_back(s.steps[r][j]);
    }
    while (next_head <= m) out.push_back({Phase::kV, next_head++, 0});
    s.steps[r] = std::move(out);
  }
  // The embedding rides with the first stage's passes: a lookup in the last one before its
  // F, a gradient in the first one after its B.
  s.passes.assign(size_t(m + 2), VocabPass{});
  for (int k = 0; k < m; ++k) s.passes[size_t(k + 1)].head = k;
  const StageSite first = s.site(0);
  int pass = -1;
  std::vector<int> grads;  // B run, gradient not yet carried
  for (const PipeStep& st : s.steps[size_t(first.rank)]) {
    if (st.phase == Phase::kV) {
      pass = st.micro_batch;
      VocabPass& v = s.passes[size_t(pass + 1)];
      v.embed_grad.insert(v.embed_grad.end(), grads.begin(), grads.end());
      grads.clear();
    } else if (st.chunk == first.chunk && st.phase == Phase::kF) {
      s.passes[size_t(pass + 1)].embed.push_back(st.micro_batch);
    } else if (st.chunk == first.chunk && st.phase == Phase::kB) {
      grads.push_back(st.micro_batch);
    }
  }
  LOOM_ASSERT(grads.empty(), "the epilogue V(", m, ") is the first stage's last step");
}

int vocab_buffers(const Schedule& s, int rank) {
  LOOM_ASSERT(s.vocab() && rank >= 0 && rank < s.pp);
  const StageSite first = s.site(0);
  if (rank != first.rank) return 1;
  int held = 0, peak = 0;
  for (const PipeStep& st : s.steps[size_t(rank)]) {
    if (st.phase == Phase::kV) {  // its gradients carried first, then its lookups made
      const VocabPass& p = s.passes[size_t(st.micro_batch + 1)];
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
  LOOM_ASSERT(held == 0, "rank ", rank, " ends its step holding ", held, " vocabulary buffers");
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
