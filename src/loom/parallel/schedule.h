// Pipeline schedules as data (Note [Schedules as data]).
//
// Note [Schedules as data]
// A schedule is, for every pipeline rank, the ordered list of steps it executes: forward
// (F) or backward (B) of one micro-batch on one of its model chunks (virtual stages; chunk
// c of rank r is virtual stage c * pp + r, as in Megatron's interleaved 1F1B). Zero-bubble
// schedules split each backward into B, the input gradient (on the critical path), and W,
// the weight gradient (deferrable; Note [B/W split] in model/model.h); the others' B does
// both. Transfers are implied: a forward of virtual stage v > 0 needs the activation from
// v - 1, a backward of v < last needs the gradient from v + 1, a W needs its own B.
// Generators are pure functions; validate() replays the lists with blocking point-to-point
// semantics (a step runs once its input has been produced) and either proves they finish
// or names the ranks that wait on each other, and reports each rank's peak number of
// activations held (forwards whose backward, or W when split, has not run) and of
// pending weight gradients (B run, W not yet).
//
// Note [PipeDream-2BW]
// Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN Training", ICML 2021, Sec. 3.
// parallel.schedule = 2bw never flushes between steps: rank r (w = pp - r - 1 warm-up
// forwards) runs each step as m pairs F(i), B(i - w), i = 0..m-1, where a negative i - w is
// micro-batch m + i - w of the previous step (a "trailing" backward): the steady state of one
// 1F1B stream over every step's micro-batches. Its update rule (their Eq. 1) is
//   W(t+1) = W(t) - lr * grad f(W(t-1)):
// step t's batch computes (forward and backward) on W(t-1), and the gradient it yields is
// applied to W(t). Each stage holds two weight versions: W(t-1), which the step's forwards
// and its own backwards use, and W(t-2), which the previous step's trailing backwards use; a
// step ends (when the previous step's gradient is complete everywhere) with W(t) =
// AdamW(W(t-1), g(t-1)). With m >= pp a step's trailing backwards all belong to the step
// before it, so two versions suffice, as the paper proves. A flush (checkpoint, validation
// and the last step) ends its step with the cool-down backwards and applies both pending
// gradients; the next step starts the stream again as the first did (its batch computes on
// the current weights, W(-1) = W(0)), so a checkpoint is the ordinary format and a resume
// continues bit for bit. make_schedule() holds the steady step; stream_steps() the first and
// flushing variants. With pp = 1 nothing is in flight: plain training.
//
// Note [Pipeline streams]
// 2bw, pipedream and pipemare (streams(kind)) run one 1F1B stream over every step's
// micro-batches: rank r's steady step is m pairs F(i), B(i - w), w = pp - r - 1, and a
// negative i - w names micro-batch (i - w) mod m of the step steps_back(i - w) before this one.
// A stream starts at age 0 (no backward of an earlier step exists yet: those are left out
// until the stream is old enough) and ends with a flushing step, which appends the
// cool-down backwards B(m - w) .. B(m - 1) (for m < w also earlier steps'). The deepest
// backward reaches stream_depth() = ceil((pp - 1) / m) steps back: 1 for 2bw (m >= pp),
// pp - 1 for pipedream and pipemare (m = 1: each step is one minibatch).
//
// Note [Streams with data parallelism]
// With parallel.dp > 1 each stage has dp replicas, each running its own stream on its share
// of every minibatch. A replica's update waits for the replicas' mean of its gradient, one
// exact all-reduce (kAvg) of the stage's whole gradient per update: 2bw's pending gradient as
// soon as it is complete (and a flush's own at the step's end), a pipedream / pipemare
// stage's minibatch gradient right after its backward (a tied GPT first stage after adding the
// head's wte part, then sending the reduced sum on), so every replica applies the same update
// and the weight versions stay equal across replicas. No bucketed sync runs beside the
// stream: its hooks would reduce a gradient the trailing backwards are still making. The
// reduction is exposed (the simulator prices it whole, dp_exposed_s); ZeRO and the gradient
// compressors are refused with a stream at dp > 1 (the update is of whole replicas).
// Exactness: the reference is the flushing layout with the same dp (TrainOptions::
// two_bw_reference / async_reference), whose sync averages the same sums; with two replicas
// a + b is one rounding in either order, so the stream equals it bit for bit (tested).
//
// Note [Synchronous warm-up]
// parallel.sync_warmup_steps = W makes steps 1..W of a stream schedule flushing steps
// (flushes_pipeline, train/step_observers.h): each stream is one step long, so every
// minibatch's forward and backward run on the weights its update changes, i.e. synchronous
// training (pipedream and pipemare then equal 1F1B of one micro-batch per step, 2bw 1F1B of
// its m micro-batches, bit for bit; tested), and the asynchronous stream starts at step W + 1
// (the flushing schedules are synchronous throughout: for them W holds as it is). The
// updates most hurt by stale gradients are the early ones (large, fast-changing gradients
// and cold Adam moments): measured on the default job at pp 2, PipeMare after 1,000 steps
// ends 5.0% above 1F1B's validation loss from step 1 and 2.0% above it after 200
// synchronous steps (docs/log/benchmarks.md). Each warm-up step pays 1F1B's pipeline bubble:
// `loom simulate` prices one beside the steady step and `loom plan` ranks by the mean step
// over the run (plan::run_step_s).
#pragma once

#include <array>
#include <string>
#include <vector>

#include "loom/core/config.h"

namespace loom::parallel {

using ScheduleKind = loom::ScheduleKind;  // core/config.h, named by schedule_name()

// Note [Vocabulary passes]
// Yeung et al., "Balancing Pipeline Parallelism with Vocabulary Parallelism" (2024): with
// parallel.pp_vocab the LM head, the loss and the input embedding are split by vocabulary
// rows over the pp ranks of a pipeline (over pp x tp with tp), so no stage carries them
// alone. Their passes are collectives over those ranks, so every rank runs them, in one
// order: m + 2 vocabulary passes V(-1) .. V(m), one step each (Phase::kV; the step's
// micro_batch names the pass). V(i), 0 <= i < m, is micro-batch i's head and loss: the last
// stage's output broadcast, each rank's logits slice, the softmax max and sums all-reduced,
// the input gradient reduced onto the last stage. It runs where the head would: the plain
// schedule's unit-time replay gives each step a tick, and every rank runs V(i) after its
// steps of ticks up to that of the last stage's F(i) and before the rest (the last stage so
// between its F(i) and B(i)). No cycle can form: a step before V(i) depends only on steps
// of earlier ticks, which are before V(i) on their ranks too. The
// embedding rides in them (Schedule::passes): micro-batch j's lookup (each rank its rows,
// summed onto the first stage) in the last pass before the first stage's F(j), V(-1) (a
// prologue at the step's start) for the first ones; its gradient (the first stage's
// broadcast, each rank adding its rows) in the first pass after the first stage's B(j),
// V(m) (an epilogue at the end) for the last. validate() replays a pass as a barrier of all
// ranks. Memory: every rank holds the head's broadcast input and its gradient, (B, T, C)
// each, and vocab_buffers() boundary-sized buffers for the embedding's lookups and gradients
// in flight (the first stage; one elsewhere); the engine tracks them as "buffers" and the
// simulator counts them.
//
// Note [Vocabulary passes in a stream]
// 2bw runs the passes too (pipedream and pipemare, one micro-batch a step, do not): each step
// of a stream has its own V(-1) .. V(m), placed as above by the ticks of a replay of the plain
// stream (ages 0, 1 and a flush as one list, so a step's ticks include the previous step's
// trailing backwards), each pass within its own step on every rank: V(i) heads this step's
// micro-batch i, and the first stage's trailing backwards' embedding gradients (micro-batch
// i - m of the step before) ride in this step's passes, so a pass can carry gradients of two
// steps (their micro-batch indices say which). The four kinds of step (stream_variant: age 0
// or older, flushing or not) each have their lists and passes (Schedule::stream_vocab).
// Passes being collectives, they hold the ranks together as in the flushing schedules, but not
// at a steady step's ends (Note [Vocabulary passes across a step's end]): on the 8-block,
// 256k-vocabulary Llama of tests/sim/sim_vocab_test.cc at pp 2, m 8 the simulator prices 1F1B's
// bubble 5.2% and 2bw's 1.7% with the passes, both running ahead of them (Note [Vocabulary
// passes ahead]; 15.3% and 13.2% at the plain lag), and 2bw's step 2% shorter than 1F1B's (4.9%
// and 1% longer while V(-1) and V(m) held each step's ends); 38.1% and 34.6% without the passes.
// (2bw since runs the next step's first forwards ahead: 0.25%, its floor, and its step 3.1%
// shorter than 1F1B's; Note [The next step's first forwards ahead].)
// In the engine (PipelineRunner::Stream in pipeline.h, TwoBwState) the passes compute on the
// current weights, and the tensors they add to keep two steps' gradients apart while trailing
// embedding gradients are carried.
//
// Note [Vocabulary passes across a step's end]
// In a stream as above, every step's V(-1) (the first lookups) needs the vocabulary tensors
// updated at the step before's end, and every rank's V(m) comes after its last step: two
// barriers at each step boundary, after which the forwards ramp up again, the last stage idle
// (pp - 1) F (config B's 2bw at pp 2: a 4.6% bubble simulated, 6.8% measured). Neither is
// needed: the update W(t) = AdamW(W(t-1), g(t-1)) needs only the step
// before's gradient, complete once every rank has run its trailing backwards and the passes
// carried their embedding gradients, early in step t; and the lookups need only their tokens.
// So in a step that does not flush every rank updates its vocabulary tensors in V(m - 1),
// after its head (the last head of the step: nothing reads W(t-1)'s vocabulary rows after it)
// and before its lookups, which are the next step's first ones (the data of step t + 1 read a
// step early); and what V(m) carried rides at the front of the next step's V(0), among that
// step's trailing gradients and in the same order of summation. The steady steps then have
// neither V(-1) nor V(m); a stream still starts with V(-1) and a flush ends with V(m). The
// rest of each rank's update stays at the step's end, with the same clipping factor (the
// global norm, summed mid-step as before: Note [2BW without a barrier] in engine) and the same
// step count, so every parameter gets the bits it got before (AdamW is elementwise).
//
// Note [The next step's first forwards ahead]
// With the update in V(m - 1), the first stage still could not start the next step before that
// pass: its first forward needs a lookup made after the update. In one stream (Note [Pipeline
// streams]) the first stage, its lag ahead, runs that forward before the last stage's F(m - 1)
// is done, so V(m - 1) waited for it: config A's 2bw at pp 2 left each stage idle one forward a
// step, 3.8 of its 3.9% simulated bubble (the first stage before V(m - 1), the last before the
// next V(0)). So a step that does not flush runs, on each rank, the next step's forwards that a
// replay of the stream as one list runs before V(m - 1) (numbered m + i; the steps that follow
// one, age 1 and older, start without them), each on the next step's weights: a stage with a
// stash finishes writing W(t) into it and exchanges the buffers just before the first (Note
// [Early stash]; the step's end then leaves them). Their lookups move to the first stage's last
// pass before them, and the vocabulary tensors' update with them, `aside`: into a copy, which the
// next step's lookups read while V(m - 1)'s head still reads W(t - 1)'s tensors; V(m - 1)
// `take`s the copy over them after its head. Same values in the same order: the runs stay bit
// for bit what they were (TwoBw.*, PpVocab.*). Cost: two copies of each rank's vocabulary
// slices a step, and the copy's memory. Simulated bubbles at pp 2, m 8: A 3.9 -> 0.1%, M 4.0 ->
// 0.2%, B 1.8 -> 0.2%, each its floor. A stage with a stash (Note [Early stash]) updates aside
// into the stash's rows instead: the exchange makes them its parameters' and W(t - 1)'s the
// stash's, where V(m - 1)'s head then reads them (bound there around it): one copy a step (it
// copied them twice, and a third time at the exchange), and no copy's memory.
//
// F: forward. B: backward; the input gradient only when the schedule splits backward.
// W: the weight gradient of a split backward. V: a vocabulary pass (above).
enum class Phase : unsigned char { kF, kB, kW, kV };
char phase_letter(Phase p);  // 'F' | 'B' | 'W' | 'V'

struct PipeStep {
  Phase phase = Phase::kF;
  int micro_batch = 0;
  int chunk = 0;  // model chunk on this rank (0 unless interleaved)
  bool forward() const { return phase == Phase::kF; }
};

// The virtual stage (position in the model, 0 = embedding end) that chunk c of pipeline
// rank r runs: c * pp + r (Megatron's interleaving; c = 0 without chunks).
int virtual_stage(ScheduleKind kind, int pp, int rank, int chunk);

struct StageSite {
  int rank = 0, chunk = 0;
};
// The inverse of virtual_stage: the rank and chunk running virtual stage v of pp x vpp.
StageSite stage_site(ScheduleKind kind, int pp, int vpp, int v);

// What vocabulary pass V(k) carries (Note [Vocabulary passes]): micro-batch `head`'s head
// and loss (-1: none) and the embedding's lookups and gradients of the micro-batches listed
// (a stream's: j < 0 the step before's, j >= m the next step's micro-batch j - m); `update`:
// the vocabulary tensors' update comes after its head, before its lookups (Note [Vocabulary
// passes across a step's end]).
struct VocabPass {
  int head = -1;
  std::vector<int> embed, embed_grad;
  bool update = false;
  // Note [The next step's first forwards ahead]: `aside`, with `update`: the update goes into a
  // copy of the vocabulary tensors, which the next step's lookups read until `take`, a later
  // pass of the step, copies it over the tensors after its head.
  bool aside = false, take = false;
  bool carries_nothing() const { return head < 0 && embed.empty() && embed_grad.empty(); }
};

// One step's lists with its vocabulary passes (Note [Vocabulary passes in a stream]).
struct StreamStep {
  std::vector<std::vector<PipeStep>> steps;  // [pipeline rank] -> ordered steps
  std::vector<VocabPass> passes;             // passes[k + 1] is V(k)
};

// Note [ZB-V by stage work]
// ZB-V's list is built by list scheduling on each step's duration (schedule.cc). With every
// stage priced alike, the generator believes the two ends of the V - rank 0's chunks, which
// also embed and run the head - as fast as the rest, and leaves a rank's W's for the end
// where the real stages would have given it idle time before a late B: on config A (the
// tiny GPT at pp 2) a traced run idled rank 0 for 1.26 ms at the end of a 50 ms step while
// rank 1 ran four W's, two of which fitted a 0.82 ms wait before its last B
// (docs/log/benchmarks.md). Qi et al. (ICLR 2024, Sec. 3) schedule on profiled T_F, T_B,
// T_W; loom prices them from the stages' forward FLOPs a token (stage_work), so the engine,
// the simulator and the planner build the same list from the config alone: a block is F =
// 4, B = 5, W = 3 (loom's measured ratio on a GPT block, stage_work.cc), and the head adds 12 h
// to the last stage's F: the fused LM-head kernel makes the logits, the loss and their
// gradients (dX and the head's dW) in the forward step (Model::stage_forward; the simulator's
// Note [Fused loss backward] in sim/unit_cost.h prices it so), three GEMMs of
// 2 d V FLOPs a token, h = 2 d V over a block's forward FLOPs 2 (d (d + 2 kv) + d^2 + k d ffn)
// + 2 s d (k = 2 GPT, 3 Llama; causal attention over s / 2 keys on average); the embedding's
// lookup is taken as free. On config B (h = 10.3) that is 31 blocks' forward; the simulator
// prices the step at 27 and a traced run took 26-32 (docs/log/benchmarks.md). With
// parallel.pp_vocab the head and the embedding run in the vocabulary passes, on every rank
// alike: blocks only. The passes are barriers placed by a unit-time replay of the plain
// lists (Note [Vocabulary passes]), which the list built on the work does not see, so with
// them make_schedule also builds the list on equal stages, places each list's passes as there
// and a tick early on the ranks before the last (as Note [Vocabulary passes ahead] does for
// 1f1b; every flushing schedule gets both places), and keeps the one that ends first by
// replay_time, each pass lasting vocab_pass_work (the head's 12 h over the pp ranks): on
// config B's split 1, 2, 2, 1 the equal-stage one (simulated zb-v bubble 12.1% against 14.7%,
// floor 11.7%), on 2, 2, 1, 1 (the default with the vocabulary split, Note [Stage split]) the
// one on the work (2.7% against 3.9% at m 16); on config M (8 blocks, 2,048 rows) interleaved
// at pp 2 the early place (simulated bubble 5.6% against 15.9%; measured 6.4-9.3% against
// 15.7-17.9%, docs/log/benchmarks.md, session 64). zb-v also has its passes placed by its own
// list scheduler, on the work (Note [ZB-V with its passes], zb_v.cc), kept where it ends
// first: on B's 2, 2, 1, 1 at m 8, 793 units against 812 (simulated bubble 1.2% against 3.7%).
using StageWork = std::vector<std::array<double, 3>>;  // [virtual stage] -> F, B, W durations
StageWork stage_work(const Config& cfg, int pp, int vpp);
// With parallel.pp_vocab, one vocabulary pass's work on each rank in stage_work's units: the
// fused head's 12 h over the pp ranks (the embedding's share taken as free); 0 without it.
double vocab_pass_work(const Config& cfg, int pp);

// Note [Vocabulary passes ahead]
// The passes are barriers of every rank (Note [Vocabulary passes]), so between V(i) and V(i + 1)
// each rank can run only what its own earlier steps and the other ranks' steps before V(i)
// allow. In 1F1B at pp 2 the first stage runs F(i + 1) and B(i - 1) between them, and B(i - 1)
// waits for the last stage's B(i), which waits for V(i): the interval is B + B where the work is
// F + B, and on config B, whose passes are each worth four blocks, a fifth of the step idles. Run
// one forward further ahead, the first stage's F(i + 1) is done before V(i) and its B in the
// interval is one the last stage finished an interval earlier: nothing waits. How far ahead pays
// depends on the stages' and the passes' work, so make_schedule builds 1f1b's and 2bw's lists
// with the plain lag (rank r's warm-up, a stream's w: pp - r - 1), one more on every rank but the
// last, and twice the plain, each with the passes placed as Note [Vocabulary passes] places them
// or one tick earlier on the ranks before the last (V(i) before their steps of F(i)'s tick on the
// last stage), and keeps the one that ends first by replay_time (a stream's: its ages and a
// flush, stream_list). A deeper lag holds more activations on the early ranks (validate's
// peak_in_flight, which the engine allocates and the simulator prices). 2bw keeps two weight
// versions only while a step's trailing backwards are the step before's: lags up to m.
enum class LagRule : unsigned char { kPlain, kOneMore, kDouble };

struct Schedule {
  ScheduleKind kind = ScheduleKind::k1F1B;
  int pp = 1, vpp = 1, micro_batches = 1;
  std::vector<std::vector<PipeStep>> steps;  // [pipeline rank] -> ordered steps
  // Note [Vocabulary passes]: empty without parallel.pp_vocab; else passes[k + 1] is V(k) (a
  // stream: its steady step's).
  std::vector<VocabPass> passes;
  // A stream with vocabulary passes: each kind of step, by stream_variant(); else empty.
  std::vector<StreamStep> stream_vocab;
  LagRule lag = LagRule::kPlain;  // Note [Vocabulary passes ahead]
  bool vocab() const { return !passes.empty(); }
  bool split() const { return splits_backward(kind); }  // has W steps
  int stage(int rank, int chunk) const { return virtual_stage(kind, pp, rank, chunk); }
  StageSite site(int stage) const;  // the inverse of stage()
};

// Throws loom::Error naming the value and a valid choice: pp >= 1, micro_batches >= 1,
// vpp >= 2 only for interleaved (which also needs micro_batches % pp == 0), 2bw with
// micro_batches >= pp, pipedream and pipemare with micro_batches = 1.
// `vocab`: with vocabulary passes (Note [Vocabulary passes]; 2bw: Note [Vocabulary passes in a
// stream]); refused for pipedream and pipemare.
// `work`: zb-v's stage durations (Note [ZB-V by stage work]); empty: equal stages.
// `pass_work`: a vocabulary pass's (vocab_pass_work), for zb-v's choice of list with passes.
Schedule make_schedule(ScheduleKind kind, int pp, int micro_batches, int vpp = 1, bool vocab = false,
                       const StageWork& work = {}, double pass_work = 0);
// 1f1b's or 2bw's lists, without passes, at a lag rule (Note [Vocabulary passes ahead]): what
// make_schedule(kind, pp, m, 1, true, ...) runs between its passes.
Schedule make_lagged(ScheduleKind kind, int pp, int micro_batches, LagRule lag);
// make_schedule's 1f1b or 2bw with vocabulary passes: its lists at the lag rule and placement
// Note [Vocabulary passes ahead] chooses, the passes inserted.
Schedule ahead_of_passes(ScheduleKind kind, int pp, int micro_batches, const StageWork& work, double pass_work);
// Inserts the vocabulary passes into a flushing schedule's lists and fills s.passes (Note
// [Vocabulary passes]); `early`: a tick earlier on the ranks before the last (Note
// [Vocabulary passes ahead]).
void add_vocab_passes(Schedule& s, bool early = false);
// The passes V(-1) .. V(m) of a flushing list whose V steps are placed, V(k) heading
// micro-batch k. The embedding rides with the passes of `list`, the first stage's rank's: a
// lookup in the last pass before its F, a gradient in the first one after its B.
std::vector<VocabPass> embedding_passes(const std::vector<PipeStep>& list, int m, StageSite first);
// zb-v's lists on the stages' work (Note [ZB-V by stage work], parallel/zb_v.cc); with its
// vocabulary passes placed by the same scheduler (Note [ZB-V with its passes]; steps empty
// when no order finishes).
std::vector<std::vector<PipeStep>> zero_bubble_v(int pp, int m, const StageWork& work);
Schedule zero_bubble_v_with_passes(int pp, int m, const StageWork& work, double pass_work);
// How many boundary-sized (B, T, C) buffers rank `rank` holds at once for the passes' embedding
// (Note [Vocabulary passes]): the first stage a lookup per micro-batch looked up and not yet
// forwarded and an embedding gradient per backward run and not yet carried; every other rank
// one, for the lookup it sums onto the first stage. The engine makes that many; the simulator
// counts them.
int vocab_buffers(const Schedule& s, int rank);
// What the engine does not run the vocabulary passes with yet (the simulator prices it; the
// config check refuses what neither does): the refusal naming the setting and its fix, or ""
// (also without parallel.pp_vocab). The engine throws it, the planner never offers it.
std::string pp_vocab_refusal(const Config& cfg);

// Note [Pipeline streams]: rank r's list for the step `age` steps after its stream started
// (0: it starts it), flushing the stream when `flush`. steps_back(i, m): how many steps
// before the current one micro-batch index i (negative: an earlier step's) belongs to.
std::vector<PipeStep> stream_steps(const Schedule& s, int rank, int age, bool flush);
// Note [Vocabulary passes in a stream]: which kind of step that is (0: age 0, 1: older; + 2
// when it flushes) and its passes (micro-batch indices as stream_steps numbers them).
int stream_variant(const Schedule& s, int age, bool flush);
const std::vector<VocabPass>& stream_passes(const Schedule& s, int age, bool flush);
int steps_back(int micro, int m);
int stream_depth(const Schedule& s);
// How many forwards rank `rank` runs ahead of its backwards: 1F1B's warm-up and a stream's w,
// pp - rank - 1, or more by s.lag (Note [Vocabulary passes ahead]).
int pipeline_lag(const Schedule& s, int rank);

struct ScheduleCheck {
  bool ok = false;
  std::string problem;               // empty when ok: which ranks wait on what
  std::vector<int> peak_in_flight;   // per rank: most activations held at once
  std::vector<std::vector<int>> chunk_peak_in_flight;  // per rank, per chunk: the same for that chunk
  std::vector<int> peak_pending_w;   // per rank: most weight gradients pending at once (0 unless split)
  std::vector<std::vector<int>> chunk_peak_pending_w;  // per rank, per chunk: the same for that chunk
  int ticks = 0;                     // length of the replay in unit-time steps
  std::vector<std::vector<int>> step_tick;  // per rank, per step of its list: the tick it ran in
};
// Streams: replays ages 0 .. stream_depth() and a flushing step as one list.
ScheduleCheck validate(const Schedule& s);
// How long a flushing schedule's lists take when each step lasts its stage's work (empty:
// every stage F = 4, B = 5, W = 3) and a vocabulary pass is a barrier of every rank lasting
// pass_work (the head's passes V(0) .. V(m - 1); the embedding's V(-1) and V(m) none); +inf
// when they do not finish.
double replay_time(const Schedule& s, const StageWork& work = {}, double pass_work = 0);

// Layers of each virtual stage: `split` (pp x vpp entries, summing to layers; the first and
// last may be 0, Note [Stage split] in core/stage_split.cc) or, when
// empty, as even as possible with the remainder going to the middle stages (the first
// stage also embeds and the last runs the head). Throws loom::Error on a bad split.
std::vector<int> stage_layers(int layers, int stages, const std::vector<int>& split = {});

}  // namespace loom::parallel
