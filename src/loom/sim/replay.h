// The simulator's replay of one step's schedule (Note [Simulated step] in simulator.cc):
// the plan's fixed setup, and each pipeline rank's state along the replay.
#pragma once

#include <limits>
#include <utility>
#include <vector>

#include "loom/sim/costs.h"
#include "loom/sim/simulator.h"
#include "loom/sim/unit_cost.h"

namespace loom::sim {

// Everything the per-rank phases need, fixed for one plan.
struct Setup {
  const SimPlan& plan;
  const ClusterSpec& cluster;
  int64_t tp, pp, dp, cp, vpp, V, m, seq;
  std::vector<Recompute> rk;  // per layer
  Places pl;
  LayerShape x;
  double wbytes = 4;       // bytes of one parameter / gradient as stored for compute
  double gather_bytes = 4;  // bytes of one parameter in ZeRO-3's all-gathers (comm.param_dtype)
  double scatter_bytes = 4;  // and of one gradient in ZeRO-2/3's reduce-scatters (Note [qgZ])
  double p2p_bytes = 0, p2p_s = 0;
  std::vector<ChunkCost> chunks;  // per virtual stage
  bool split = false;             // the schedule splits backward into B and W
  // Note [Vocabulary passes] (parallel.pp_vocab): what one rank's share of a micro-batch's
  // head and loss, of an embedding lookup and of its gradient cost, their collectives over
  // the pipeline included; and the parameters of a rank's vocabulary slices.
  Pass vocab_head, vocab_embed, vocab_embed_grad;
  double vocab_params = 0;
  // Note [fp8 weights under ZeRO-3] (sim/costs.cc): a block's fp8 weights, and whether each
  // gathered unit makes its fp8 copies itself (freed with it) rather than once a step.
  double fp8_block = 0;
  bool fp8_per_gather = false;
};

// sim/vocab_cost.cc: fills the vocab_* fields of a plan with parallel.pp_vocab.
void price_vocab_passes(Setup& s);

struct RankState {
  double free_at = 0, live = 0, peak_live = 0, recomputed = 0, last_bwd_window = 0;
  double first_fwd_window = 0;  // micro-batch 0's forward passes (Note [Parameter-gather overlap])
  Pass spent;
  size_t next = 0;
  std::vector<int> held, chunk_peak;  // per chunk: micro-batches in flight now, and at most
  std::vector<int> pending, pending_peak;  // per chunk: W's pending now, and at most (split backward)
  int vocab_buffers = 0;  // pp_vocab: parallel::vocab_buffers of the replayed schedule (Note [Vocabulary passes])
  int send_copies = 0;    // a stream: the input gradients in flight across a step's end (Note [Stream gradient sends])
  // Note [Vocabulary passes across a step's end]: a pass updated the vocabulary slices (not the step's end).
  bool vocab_updated = false;
  // Note [The next step's first forwards ahead]: a pass updated them aside, into a copy (memory
  // where no stash holds them).
  bool vocab_aside = false;
  // Note [2BW's update in the waits] (modes/stream/two_bw_update.cc): a stream step's waits
  // before its own backwards (micro-batches from own_from on, past the trailing ones), [from,
  // to), where a stage with a stash writes its update. Recorded only in a stream's replay
  // (replay_stream sets own_from); a flushing replay, the planner's common case, records none.
  int64_t own_from = std::numeric_limits<int64_t>::max();
  std::vector<std::pair<double, double>> backward_waits;
};

// Replays the plan's schedule (2bw: Note [Simulated 2BW]) and returns each pipeline rank's
// state at the step's end; `events` (optional) receives the trace.
std::vector<RankState> replay(const Setup& s, std::vector<SimEvent>* events);
// Note [Pipeline streams]: the passes over a stage's parameters its stream's copies around
// each update take (2bw's stash and pending gradient, pipedream's stash, pipemare's).
double stream_copies(const Setup& s, int64_t r);
// Note [2BW's update in the waits]: how much of a 2bw stage's update of `update_s` seconds runs
// in its steady step's waits before its own backwards (in time order; "U wait" events in the
// trace, pipeline rank's events at `global_rank`); the rest runs at the step's end. The
// engine starts once the gradient norm's sum is in, which this takes to be by the first wait
// (the sum starts as each rank's pending gradient completes, at its step's start).
double update_in_waits(const RankState& st, double update_s, std::vector<SimEvent>* events, int64_t global_rank);
// The optimizer's update of `params` parameters on one rank (its piece under ZeRO).
double update_s(const Setup& s, double params);

// sim/offload_cost.cc: Note [Page-cached offload]'s copies (`read` bytes out of the page cache,
// `written` into it), whether a rank's offload file stays in the page cache, and Note [Chunk
// manager]'s pricing of parameter (and gradient) chunks into rep.
double cached_copy_s(const Setup& s, double read, double written);
bool page_cached(const Setup& s, const RankReport& rep);
void price_param_offload(const Setup& s, RankReport& rep);
// Note [Activation offload]: the plan's activation offload refused where Megatron-core or the
// cluster cannot run it; one offloaded layer `b` priced into its virtual stage `ch`.
void check_activation_offload(const SimPlan& plan, const ClusterSpec& cluster);
void offload_layer(const Setup& s, ChunkCost& ch, const UnitCost& b);

}  // namespace loom::sim
