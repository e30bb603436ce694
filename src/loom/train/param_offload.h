// Parameter offload: the model's units read from the offload file just in time.
//
// Note [Parameter offload]
// offload.params = disk (with offload.optimizer = disk and parallel.zero = 0, any dp, tp or
// pp): the fp32 parameters live in the offload file beside the moments (StateFile's third
// array, in the flat buffer's order). The model's flat parameter buffer keeps its addresses
// but holds only the units in use: the model calls acquire(unit) before it reads a unit's
// weights and release(unit) after (the hooks ZeRO-3 uses, Note [ZeRO-3]); acquire reads the
// unit's range from the file into its own place in the flat buffer and queues the read of
// the next unit in the same direction (forward: embedding, blocks, head; backward: the
// reverse), and a unit's last release hands its pages back (release_pages), so the buffer's
// resident part is the units in use and the one read ahead. A unit is read again for every
// use (each micro-batch's forward and backward, a recomputed forward): memory is what the
// mode buys, with disk traffic (the page cache serves repeats where it can).
//
// The update streams p with m and v (Note [Optimizer offload]); drop_all() before it lets
// the reads ahead finish and hands their pages back. Every unit read queues behind the
// update's writes on the file's one FIFO, so forward always sees the updated values - the
// same bits the in-memory run holds: training equals in-memory training bit for bit.
#pragma once

#include <cstdint>
#include <vector>

#include "loom/core/memory.h"
#include "loom/model/layout.h"

namespace loom {

class StateFile;

class ParamFetch {
 public:
  // units[u]: unit u's range of the flat buffer `params` ({0, 0}: not in this part).
  ParamFetch(StateFile& file, float* params, std::vector<FlatRange> units, MemoryTracker* tracker);
  void acquire(int unit);
  void release(int unit);
  // Waits for the reads ahead and hands every unit's pages back (before the update).
  void drop_all();
  // Reads every unit into the flat buffer and keeps them (final weights at the run's end).
  void materialize();
  int peak_units() const { return peak_; }
  StateFile& file() const { return file_; }

 private:
  enum class State { kOut, kReading, kIn };
  void start(int unit);
  int next_unit(int unit, int direction) const;
  void drop(int unit);

  StateFile& file_;
  float* params_;
  std::vector<FlatRange> units_;
  MemoryTracker* tracker_;
  std::vector<State> state_;
  std::vector<int> refs_;
  std::vector<int64_t> ticket_;
  int last_ = -1, in_ = 0, peak_ = 0;
};

}  // namespace loom
