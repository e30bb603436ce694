// What a training run is asked for (TrainOptions) and what it reports back (TrainSummary):
// the trainer's interface types, kept apart so the reporter and the step observers need
// not include the trainer.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

namespace loom {

struct TrainOptions {
  bool json = false;      // one JSON object per line on `out`
  bool csv = false;       // comma-separated rows on `out`, a header first (the JSON lines' fields)
  bool progress = false;  // redraw a progress bar on `err` (terminals)
  std::ostream* out = nullptr;
  std::ostream* err = nullptr;
  bool keep_params = false;  // copy the final parameters (layout order, no padding) into the summary
  std::string trace_path;    // non-empty: write a Chrome trace of the run there (Note [Trace schema])
  // "auto": continue from checkpoint.dir's newest sharded checkpoint if there is one; a
  // directory: from that checkpoint (Note [Sharded checkpoints]); empty: start fresh.
  std::string resume;
  // Not resuming into a checkpoint.dir that holds an earlier run: move its checkpoints into
  // checkpoint.dir/replaced-<time>/ instead of refusing (Note [Checkpoint directory ownership]).
  bool overwrite = false;
  // Tests (fault injection): called on every rank with the step's reduced gradients (still
  // multiplied by the loss scale) just before the update.
  std::function<void(int64_t step, std::vector<float>& grads)> after_gradients;
  // Tests: train as the reference of a 2bw pipeline (one-step-delayed updates; Note
  // [PipeDream-2BW]) with flushing steps: one process, or a flushing pipeline schedule (the
  // same layout's gradient-norm grouping, so clipping agrees to the bit).
  bool two_bw_reference = false;
  // Tests: "pipedream" | "pipemare": train as the reference of that pipeline (Note [PipeDream
  // weight stashing]): the same layout with a flushing schedule, one micro-batch per step, no
  // clipping. on_weight_version: every forward and backward of a pipedream / pipemare stage
  // (or its reference) reports its minibatch and the weight version it computes on.
  std::string async_reference;
  std::function<void(int stage, int64_t batch, bool forward, int64_t version)> on_weight_version;
  // Note [Elastic growth]: under an elastic supervisor, whether it asks the job to stop at its
  // next checkpoint (to grow onto more hosts). Checked on every rank after each save, with one
  // agreement, so all stop after the same step. Unset: never asked.
  std::function<bool()> stop_requested;
  // Tests: this host's available memory in bytes, in place of what the system reports (Note
  // [Host memory preflight]).
  std::function<int64_t()> host_memory;
  // Tests: a parameter-server worker runs this before each push (injected delays).
  std::function<void(int64_t step)> before_ps_push;
  // Tests: a parameter server runs this for every push it applies (Note [Asynchronous
  // parameter server]): the worker, its clock and the version its gradient was computed from.
  std::function<void(int server, int worker, int64_t clock, int64_t version)> on_ps_apply;
};

struct TrainSummary {
  std::vector<float> losses;  // train loss per step (the global batch's mean on every rank)
  double final_val_loss = 0;
  double unigram_entropy = 0;
  // A mixture (Note [Dataset mixtures]): each source's share of the samples drawn from step
  // 0 through the run's last step, in data.shards order (empty for one source).
  std::vector<double> mix_drawn;
  double tokens_per_s = 0;      // real (target) tokens per second
  double padding_fraction = 0;  // data.bucketing: share of the positions computed that were padding
  std::vector<double> step_seconds;  // wall time of each step on this rank (validation excluded)
  // Loss scaling (Note [Dynamic loss scaling]): the scale each step ran at (empty when off)
  // and the steps (1-based) skipped for a gradient overflow.
  std::vector<double> loss_scales;
  std::vector<int64_t> skipped_steps;
  int64_t params = 0;
  // Parameter servers (Note [Asynchronous parameter server]), on every rank at the end: pushes
  // applied, the largest staleness of an applied gradient and the mean (over the servers' means,
  // the largest). This worker's pushes.
  int64_t ps_pushes = 0, ps_worker_pushes = 0;
  double ps_max_staleness = 0, ps_mean_staleness = 0;
  // This worker's bytes sent plus received per step, all and the embedding table's share
  // (Note [Sparse embeddings]: the touched and pulled rows and their ids).
  double ps_bytes_per_step = 0, ps_table_bytes_per_step = 0;
  // Data parallel only: share of gradient-communication time that ran during backward
  // (Note [Overlap] in parallel/grad_sync.h) and the seconds waited for it afterwards.
  double comm_hidden_fraction = -1;
  double comm_exposed_s = 0;
  double comm_wire_bytes = 0, comm_exact_wire_bytes = 0;  // per step from each rank (mean over the run; exact's)
  std::vector<std::string> accordion_log;  // Note [Accordion]: its switches, in order
  // ZeRO-3: unit gathers over the dp group and, under hpZ (Note [hpZ]), within the host.
  int64_t param_gathers = 0, param_gathers_on_host = 0;
  std::vector<float> final_params;  // filled when TrainOptions::keep_params (tests)
  int64_t stopped_at = 0;  // > 0: stopped after saving this step, as asked (Note [Elastic growth])
  // This rank's peak resident bytes per category (params, grads, optimizer, activations),
  // measured (Note [Resident memory]), and the ZeRO formula for its model states.
  std::vector<std::pair<std::string, int64_t>> memory_peak_bytes;
  int64_t model_state_formula_bytes = 0;
  int64_t memory_peak_total_bytes = 0;  // the most held at once (Note [Memory budget])
  // Note [Optimizer offload]: this rank's bytes read from and written to its offload file.
  int64_t offload_read_bytes = 0, offload_written_bytes = 0;
  // Note [Chunk manager]: parameter chunk reads (bytes) and evictions over the run.
  int64_t param_chunk_read_bytes = 0, param_chunk_evictions = 0;
  int64_t param_chunk_last_step_read_bytes = 0;  // the last step's (after the warm-up: the steady state)
  int64_t grad_chunk_written_bytes = 0;  // Note [Gradient chunks]: spilled to the offload file
};

}  // namespace loom
