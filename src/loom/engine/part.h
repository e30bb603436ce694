// The engine's parts (Note [Engine parts]): what a training mode adds to a rank's engine.
//
// Note [Engine parts]
// An Engine (engine/engine.h) is a model, its memory tracker and the parts the rank's plan
// picks, in one table (make_parts, engine/parts.cc) keyed on the plan's duties and layout:
//   gradient reduction  SyncPart (dp's bucketed all-reduce / reduce-scatter with its codecs
//                       and compressors, Note [Sharded buckets]);
//   gradient pass       MicroBatchPass (one process or dp) or PipelinePass (pp > 1), each
//                       one step's forward and backward over the step's batches
//                       (engine/gradient_pass.h); a stream (2bw, pipedream, pipemare,
//                       modes/stream) rides on the pipeline pass as its executor;
//   state stores        GatherPart (ZeRO-3's sharded parameters, gathered per unit),
//                       OffloadPart (parameter offload's file and chunk manager,
//                       modes/offload), PsPart (the parameter servers, modes/ps).
// The update rule (Note [Update rules]) binds the parts it needs once, when it is made.
// Each part answers the loop's hooks below for itself - its step's start, its resume, its
// trace spans, its lines and summary fields at the run's end, its checkpoint state - so the
// step loop (train/trainer.cc) and its observers call the parts in order and name no mode.
// The order of `Engine::parts` is the order of the hooks (and of the report's words):
// stores, reduction, pipeline, stream, servers.
#pragma once

#include <cstdint>
#include <ostream>
#include <span>

namespace loom {

class Trace;
class DataLoader;
class Reporter;
struct TrainSummary;
struct ShardState;

class Part {
 public:
  virtual ~Part() = default;
  // A stream whose step goes on with the previous step's gradient (Note [PipeDream-2BW]):
  // the step neither zeroes nor starts its parts.
  virtual bool carries_gradients() const { return false; }
  // A step's forward and backward begin (Note [Chunk manager]'s step).
  virtual void begin_step() {}
  // Before a step's pass over fixed-shape batches (Note [Sparse embeddings]: the rows
  // they read).
  virtual void before_pass(const DataLoader& /*data*/, int64_t /*step*/) {}
  // Zeroes the step's gradients itself (only where it keeps them); false: the model zeroes
  // them all. The first part that does wins.
  virtual bool zero_gradients() { return false; }
  // Every unit gathered or read back, so Model::params() is the whole local part; false:
  // the part keeps no parameters elsewhere. The first part that does wins.
  virtual bool materialize_params() { return false; }
  // The parameters where the part keeps them (a mapping of its file: saving, loading, the
  // finite check; valid until the next update); empty: Model::params().
  virtual std::span<float> param_view() { return {}; }
  // The run continues at `step` from a checkpoint just loaded into the engine.
  virtual void after_resume(int64_t /*step*/) {}
  // Records the part's spans into `t` (Note [Trace schema]); nullptr stops.
  virtual void trace(Trace* /*t*/) {}
  // After every update: what the part decided (Note [Accordion]'s switches).
  virtual void after_update(Reporter& /*rep*/, TrainSummary& /*sum*/) {}
  // The run's end: its words in the memory line ("memory (rank 0, ...)") and its fields.
  virtual void report_memory(std::ostream& /*os*/, TrainSummary& /*sum*/) {}
  // The run's end, after the throughput: its own lines and fields.
  virtual void report_run(Reporter& /*rep*/, TrainSummary& /*sum*/) {}
  // A checkpoint: the part's own state in the rank's shard.
  virtual void save_state(ShardState& /*s*/) const {}
  // The run's last step is done (collective: every rank of the role calls it): figures
  // agreed at the end; `real_tokens` the run's, this rank's until then.
  virtual void end_run(Reporter& /*rep*/, TrainSummary& /*sum*/, int64_t& /*real_tokens*/) {}
};

}  // namespace loom
