// Parameter offload under a memory budget: the flat parameter buffer cut into fixed-size
// chunks that a manager reads from the offload file and evicts (PatrickStar).
//
// Note [Parameter offload]
// offload.params = disk (with offload.optimizer = disk; parallel.zero = 0, any dp, tp or pp):
// the fp32 parameters live in the offload file beside the moments (StateFile's third array,
// in the flat buffer's order). ZeRO-3: Note [ZeRO-3 offload]; ZeRO-1/2: Note
// [Replicated-parameter offload] (modes/offload/offload_part.cc). The model's flat parameter buffer keeps its addresses
// but holds only the chunks the manager keeps: the model calls acquire(unit) before it reads
// a unit's weights and release(unit) after (the hooks ZeRO-3 uses, Note [ZeRO-3]).
//
// The update streams p with m and v (Note [Optimizer offload]); end_step() before it lets
// the reads ahead finish, and the update copies each sub-group's new values into the chunks
// resident (refresh), so they stay valid across steps. Every chunk read queues behind the
// update's writes on the file's one FIFO, so a chunk read later sees the updated values too -
// the same bits the in-memory run holds: training equals in-memory training bit for bit.
//
// Note [Chunk manager]
// After PatrickStar (Fang et al., "Parallel Training of Pre-Trained Models via Chunk-Based
// Dynamic Memory Management", TPDS 2022, sections 4-5). The flat buffer is cut into chunks
// of offload.chunk_mb (the last one shorter); chunk c is [c S, min(N, (c+1) S)); with
// chunk_mb = 0 (the default) each unit is one chunk. A unit
// (block, embedding, head) spans the chunks its range touches. Each chunk has a state -
// free (on disk only), reading, held (resident, unused) or in use (resident, referenced by
// an acquired unit) - and its tier follows: memory unless free.
//
// Warm-up: the first step of a run keeps nothing it does not use (a chunk is dropped at
// its unit's last release, nothing is read ahead) and records the step's access trace - the
// unit of every acquire in order - and, at each acquire, the memory the rank holds besides
// parameters (the tracker's total less its params row: activations, gradients, buffers), as
// PatrickStar's tracer measures non-model memory per operator. Later steps replay the trace
// with chunks allowed
//   allowance = budget - peak non-model memory of the warm-up - 1% of the budget (slack)
// (budget: memory.limit_gib; none: 0, i.e. only what is in use and one event read ahead).
// PatrickStar's allowance varies per moment because PyTorch allocates activations as it
// goes; loom's activations are one storage carved up front, resident from its first touch
// in the warm-up on, so after the warm-up non-model memory is flat and its peak is the
// moment-wise figure too (a per-moment allowance from the warm-up would count activation
// pages not yet touched and overshoot the budget in the next step).
// Whenever resident chunks exceed the allowance, held chunks are evicted furthest next use
// first (Belady's MIN over the recorded trace; a chunk not used again this step goes first:
// its next use is in the next step) - except those of the next event. Chunks resident at the
// update stay: the update copies its values into them. Each acquire also reads ahead the chunks of the next trace event (with a
// budget, when they fit). A step whose accesses leave the trace (length bucketing's varying
// micro-batch counts) is followed by searching the unit forward in the trace; validation
// passes between steps run off the trace, evicting in no particular order.
// PatrickStar reuses a parameter chunk's memory for its gradients; gradients here stay in
// the model's own buffer, so that reuse is the budget's: an evicted chunk's bytes are what
// the allowance gives the next chunk, and the kernel recycles the pages.
//
// Chunks need not align with tensors: the flat buffer is contiguous, so a chunk may hold
// the end of one tensor and the start of the next, and any chunk size works (PatrickStar
// requires chunks at least as large as the largest tensor because it never splits one).
//
// Note [Gradient chunks]
// offload.grads = disk (one process: dp = tp = pp = 1) puts the gradients in chunks too, with
// the parameters' budget: the flat gradient buffer keeps its addresses, cut every chunk_mb
// from element 0 (a whole number of MiB, so the gradient norm's pieces, Note [Norm pieces] in
// optim/optimizer.h, never straddle a chunk). The model brackets every gradient write with
// the gradient hook (a block's backward, the head's fused loss and its norm's backward, the
// embedding's backward); a chunk it acquires is read back from the file's spill array if it
// was evicted this step, and otherwise reads as zero (the step starts with the chunks kept
// resident zeroed in place, as zero_grads does, and the others stored nowhere). Evicting a
// gradient chunk written since its last spill writes it to the spill array first; a clean one
// (zero, or its spill current, or consumed) just goes. The update takes the chunks in order
// twice - the norm pass, then the update pass, which clips each sub-group as it goes - and
// both passes are trace events, so Belady's MIN sees that the update needs the gradients
// before the next step needs the parameters; consumed chunks keep their pages for the next
// step's zeroing (no page faults where the budget holds them).
// PatrickStar's chunk reuse (a parameter chunk's memory holds its gradients once its
// backward is done) is the budget's here: both kinds of chunk draw on one allowance, and a
// parameter chunk past its last use this step is the first evicted, handing its bytes to the
// gradient chunks being written. Same values, same order: training equals in-memory training
// bit for bit.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "loom/core/memory.h"
#include "loom/model/layout.h"

namespace loom {

class StateFile;
struct Kernels;

class ChunkManager {
 public:
  enum class State { kFree, kReading, kHeld, kInUse };
  // kNone: a gradient chunk never written this step (zero, stored nowhere).
  enum class Tier { kNone, kDisk, kMemory };
  enum Kind { kParams = 0, kGrads = 1 };
  struct Stats {
    int64_t chunk_floats = 0;
    int64_t acquires = 0, hits = 0;   // chunk acquisitions, and those already resident
    int64_t reads = 0, read_bytes = 0;  // parameter chunk reads from the file
    int64_t replayed_steps = 0, replayed_read_bytes = 0;  // the steps after the warm-up, their reads
    int64_t last_step_read_bytes = 0;  // the last replayed step's reads (the steady state)
    int64_t grad_written_bytes = 0, grad_read_bytes = 0;  // gradient chunks spilled and read back
    int64_t evictions = 0;
    int64_t peak_resident_bytes = 0;  // chunk bytes resident at once
    int64_t peak_non_model_bytes = 0;  // the warm-up's measurement
    int64_t over_budget_events = 0;  // acquires whose units alone exceeded the allowance
    int trace_events = 0;
  };
  // units[u]: unit u's range of the flat buffer `params` ({0, 0}: not in this part);
  // `total` floats in the buffer; `budget_bytes` <= 0: no budget. `grads` (laid out as
  // params; nullptr: not managed) needs chunk_floats a multiple of kNormPiece and a file
  // with a spill array.
  ChunkManager(StateFile& file, float* params, int64_t total, std::vector<FlatRange> units, int64_t chunk_floats,
               int64_t budget_bytes, MemoryTracker* tracker, float* grads = nullptr);
  // A step's forward and backward begin (the first records the trace, later ones replay
  // it); managed gradients start at zero.
  void begin_step();
  void acquire(int unit) { use({kUnitParams, unit}, true); }
  void release(int unit) { use({kUnitParams, unit}, false); }
  // Note [Gradient chunks]: the model writes `unit`'s gradients between the two.
  void acquire_grads(int unit) { use({kUnitGrads, unit}, true); }
  void release_grads(int unit) { use({kUnitGrads, unit}, false); }
  bool manages_grads() const { return grads_ != nullptr; }
  // Before the update: waits for the reads ahead; resident chunks stay, and refresh()
  // gives them the update's values.
  void begin_update();
  // Managed gradients: sum of squares over `ranges`, chunk by chunk, in sum_squares' pieces
  // and order (the same double); then, per update sub-group [begin, begin + count), its
  // gradients resident (and those before it dropped).
  double grad_sum_squares(const Kernels& k, const std::vector<FlatRange>& ranges);
  void grads_for_update(int64_t begin, int64_t count);
  // The update's new parameters for flat [begin, begin + count) (AdamW::UpdatedFn).
  void refresh(int64_t begin, int64_t count, const float* p);
  // After the update (or a skipped one): the step's gradients dropped, the trace closed.
  void end_step();
  // end_step() and every chunk's pages handed back (the file changes another way).
  void drop_all();
  // Reads every parameter chunk into the flat buffer and keeps them (final weights).
  void materialize();

  int chunks(Kind k = kParams) const { return k == kParams ? grads_first_ : int(state_.size()) - grads_first_; }
  State state(int c, Kind k = kParams) const { return state_[size_t(id(k, c))]; }
  Tier tier(int c, Kind k = kParams) const;
  const Stats& stats() const { return stats_; }
  StateFile& file() const { return file_; }
  // Traces (Note [Trace schema]): hook(what, true) when the compute thread starts waiting on
  // a chunk transfer ("parameter read", "gradient read-back", "gradient spill"), false when
  // it is done.
  using SpanHook = std::function<void(const char* what, bool begin)>;
  void set_span_hook(SpanHook hook) { span_ = std::move(hook); }

 private:
  // A trace event: a unit's parameters or gradients, or one gradient chunk at the update.
  enum EventKind { kUnitParams, kUnitGrads, kUpdateGrads };
  struct Event {
    EventKind kind;
    int key;
    bool operator==(const Event&) const = default;
  };
  int id(Kind k, int c) const { return k == kParams ? c : grads_first_ + c; }
  bool is_grad(int g) const { return g >= grads_first_; }
  const std::vector<int64_t>& bounds_of(int g) const { return bounds_[is_grad(g) ? 1 : 0]; }
  int local(int g) const { return is_grad(g) ? g - grads_first_ : g; }
  float* base(int g) const { return is_grad(g) ? grads_ : params_; }
  int64_t begin_of(int g) const { return bounds_of(g)[size_t(local(g))]; }
  int64_t end_of(int g) const { return bounds_of(g)[size_t(local(g)) + 1]; }
  int64_t chunk_bytes(int g) const { return (end_of(g) - begin_of(g)) * int64_t(sizeof(float)); }
  std::pair<int, int> ids(const Event& e) const;  // [first, last)
  void use(const Event& e, bool acquire);
  bool needs_read(int g) const;
  void bring(int g);
  void finish_read(int g);
  void drop(int g, bool keep_values);
  int64_t allowance() const;
  // Evicts held chunks, furthest next use first, until resident + extra <= allowance().
  void make_room(int64_t extra);
  int64_t next_use(int g) const;
  void measure_non_model();
  void note(const Event& e);
  void end_recording();
  void read_ahead();
  void consumed(int c);

  StateFile& file_;
  float* params_;
  float* grads_;
  std::vector<FlatRange> units_;
  std::vector<int64_t> bounds_[2];  // per kind: chunk c is [bounds[c], bounds[c + 1])
  int grads_first_ = 0;             // global ids: parameter chunks, then gradient chunks
  int64_t budget_;
  MemoryTracker* tracker_;
  std::vector<State> state_;
  std::vector<int> refs_;
  std::vector<int64_t> ticket_;
  std::vector<bool> spilled_;  // gradient chunks: values in the spill array
  std::vector<bool> dirty_;    // gradient chunks: written since their last spill (else zero, or spilled)
  int64_t resident_ = 0;  // bytes of chunks reading, held or in use
  Stats stats_;
  // The trace: every event of the warm-up step in order, and per chunk the sorted events using it.
  std::vector<Event> trace_;
  std::vector<std::vector<int>> uses_;
  enum class Phase { kIdle, kRecording, kReplaying } phase_ = Phase::kIdle;
  bool recorded_ = false;
  int pos_ = 0;  // replaying: the trace event the next one is expected at
  int64_t step_reads_from_ = 0;
  int update_done_ = 0, update_next_ = 0;  // gradient chunks the update dropped / took so far
  SpanHook span_;
  void wait(int64_t ticket, const char* what);
};

}  // namespace loom
