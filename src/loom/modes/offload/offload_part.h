// Parameter offload's part of the engine (Note [Engine parts], Note [Parameter offload] and
// Note [Chunk manager] in modes/offload/chunk_manager.h): the parameters in the optimizer's
// file, the chunks the manager keeps resident, and the layouts' variants - the flat
// parameters (ZeRO 0), a whole-parameter file beside the sharded state (ZeRO-1/2, Note
// [Replicated-parameter offload]), the packed own pieces (ZeRO-3, Note [ZeRO-3 offload]).
#pragma once

#include <memory>
#include <vector>

#include "loom/core/config.h"
#include "loom/engine/estimate.h"
#include "loom/engine/part.h"
#include "loom/modes/offload/chunk_manager.h"
#include "loom/modes/offload/offload.h"

namespace loom {

struct Engine;
class GatherPart;

class OffloadPart final : public Part {
 public:
  // The parameters move to `file` (its third array); the flat buffer then holds only the
  // chunks the manager keeps within `budget_bytes` (<= 0: none), and with `grads` the
  // gradient buffer too (Note [Gradient chunks]). With ZeRO-3 (`gather`) the file and the
  // chunks hold the own pieces, packed in owned order. `whole` (ZeRO-1/2 only): a file of
  // the whole parameters for the chunk manager, while `file`'s third array holds the own
  // pieces. Reads the Updater's file, so it is used only while the Updater lives.
  OffloadPart(const Config& cfg, Engine& e, GatherPart* gather, StateFile& file, int64_t chunk_floats,
              int64_t budget_bytes, bool grads, std::unique_ptr<StateFile> whole);

  ChunkManager& chunks() { return *chunks_; }
  // Note [Part memory estimates]: the file's buffers in place of the state it holds, and
  // (always, for the remedies) what offloading the parameters would leave resident.
  static void estimate(const EstimateInputs& in, MemoryEstimate& e);
  // Note [Replicated-parameter offload]: ZeRO-1/2's whole parameters (null otherwise).
  StateFile* whole() { return whole_.get(); }

  void begin_step() override { chunks_->begin_step(); }
  // Zeroed by the chunk manager (Note [Gradient chunks]).
  bool zero_gradients() override { return chunks_->manages_grads(); }
  bool materialize_params() override;
  // The file the chunks read: the whole parameters' (ZeRO-1/2), else the optimizer's.
  std::span<float> param_view() override { return chunks_->file().map(chunks_->file().p_array()); }
  void after_resume(int64_t step) override;
  void trace(Trace* t) override;
  void report_memory(std::ostream& os, TrainSummary& sum) override;
  // ZeRO-3: the view holds the own pieces packed in owned order, not the flat buffer.
  void save_state(ShardState& s) const override;

 private:
  // Note [Replicated-parameter offload]: the own pieces from the whole parameters' file into
  // the optimizer file's third array (at the start, and after a resume wrote the whole file).
  void pack_from_whole();
  std::vector<FlatRange> pack_own_pieces(uint64_t seed);

  const Config& cfg_;
  Engine& e_;
  StateFile& file_;
  bool packed_;  // ZeRO-3
  std::unique_ptr<StateFile> whole_;
  // ZeRO-3: the chunks' buffer, the own pieces packed in owned order (only what the manager
  // keeps is resident).
  std::vector<float> own_pieces_;
  std::unique_ptr<ChunkManager> chunks_;
};

}  // namespace loom
