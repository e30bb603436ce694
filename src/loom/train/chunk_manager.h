// Parameter offload under a memory budget: the flat parameter buffer cut into fixed-size
// chunks that a manager reads from the offload file and evicts (PatrickStar).
//
// Note [Parameter offload]
// offload.params = disk (with offload.optimizer = disk and parallel.zero = 0, any dp, tp or
// pp): the fp32 parameters live in the offload file beside the moments (StateFile's third
// array, in the flat buffer's order). The model's flat parameter buffer keeps its addresses
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
//   allowance = budget - peak non-model memory of the warm-up
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
#pragma once

#include <cstdint>
#include <vector>

#include "loom/core/memory.h"
#include "loom/model/layout.h"

namespace loom {

class StateFile;

class ChunkManager {
 public:
  enum class State { kFree, kReading, kHeld, kInUse };
  enum class Tier { kDisk, kMemory };
  struct Stats {
    int64_t chunk_floats = 0;
    int64_t acquires = 0, hits = 0;   // chunk acquisitions, and those already resident
    int64_t reads = 0, read_bytes = 0;  // chunk reads from the file
    int64_t replayed_steps = 0, replayed_read_bytes = 0;  // the steps after the warm-up, their reads
    int64_t last_step_read_bytes = 0;  // the last replayed step's reads (the steady state)
    int64_t evictions = 0;
    int64_t peak_resident_bytes = 0;  // chunk bytes resident at once
    int64_t peak_non_model_bytes = 0;  // the warm-up's measurement
    int64_t over_budget_events = 0;  // acquires whose units alone exceeded the allowance
    int trace_events = 0;
  };
  // units[u]: unit u's range of the flat buffer `params` ({0, 0}: not in this part);
  // `total` floats in the buffer; `budget_bytes` <= 0: no budget.
  ChunkManager(StateFile& file, float* params, int64_t total, std::vector<FlatRange> units, int64_t chunk_floats,
               int64_t budget_bytes, MemoryTracker* tracker);
  // A step's forward and backward begin (the first records the trace, later ones replay it).
  void begin_step();
  void acquire(int unit);
  void release(int unit);
  // Before the update: waits for the reads ahead and ends the step; resident chunks stay,
  // and refresh() gives them the update's values.
  void end_step();
  // The update's new parameters for flat [begin, begin + count) (AdamW::UpdatedFn).
  void refresh(int64_t begin, int64_t count, const float* p);
  // end_step() and every chunk's pages handed back (the file changes another way).
  void drop_all();
  // Reads every chunk into the flat buffer and keeps them (final weights at the run's end).
  void materialize();

  int chunks() const { return int(state_.size()); }
  State state(int c) const { return state_[size_t(c)]; }
  Tier tier(int c) const { return state_[size_t(c)] == State::kFree ? Tier::kDisk : Tier::kMemory; }
  const Stats& stats() const { return stats_; }
  StateFile& file() const { return file_; }

 private:
  int64_t chunk_bytes(int c) const;
  int first_chunk(int unit) const;
  int last_chunk(int unit) const;  // exclusive
  void start(int c);
  void finish_read(int c);
  void drop(int c);
  int64_t allowance() const;
  // Evicts held chunks, furthest next use first, until resident + extra <= allowance().
  void make_room(int64_t extra);
  int64_t next_use(int c) const;
  void measure_non_model();
  void record(int unit);
  void end_recording();
  void follow(int unit);
  void read_ahead();

  StateFile& file_;
  float* params_;
  std::vector<FlatRange> units_;
  std::vector<int64_t> bounds_;  // chunk c is [bounds_[c], bounds_[c + 1])
  int64_t budget_;
  MemoryTracker* tracker_;
  int params_row_ = -1;
  std::vector<State> state_;
  std::vector<int> refs_;
  std::vector<int64_t> ticket_;
  int64_t resident_ = 0;  // bytes of chunks reading, held or in use
  Stats stats_;
  // The trace: the unit of every acquire of the warm-up step, and per chunk the sorted
  // events using it.
  std::vector<int> trace_;
  std::vector<std::vector<int>> uses_;
  enum class Phase { kIdle, kRecording, kReplaying } phase_ = Phase::kIdle;
  bool recorded_ = false;
  int pos_ = 0;  // replaying: the trace event the next acquire is expected at
  int64_t step_reads_from_ = 0;
};

}  // namespace loom
