// Parameter-server data parallelism (Note [Parameter server]).
//
// Note [Parameter server]
// Li et al., "Scaling Distributed Machine Learning with the Parameter Server", OSDI 2014.
// parallel.ps_servers = S adds S ranks to a data-parallel job: global ranks 0 .. dp - 1 are
// workers (each trains on its share of the global batch, as dp rank r), ranks dp .. dp + S - 1
// servers (with tp or pp > 1, S per model shard: Note [Parameter server with model
// parallelism]). The flat parameter buffer is cut into keys of key_floats floats and server s holds
// a contiguous run of them (ps_partition: the runs' lengths differ by at most one key, so the
// bytes balance within one key); it keeps their fp32 weights and AdamW moments (SGD's
// momentum under optim.name = sgd) and runs the optimizer on them. Workers keep whole
// weights to compute with and no optimizer state.
//
// One step under ps.mode = sync (bulk synchronous parallel): every worker pushes its
// gradient's slice to each server and pulls the slice back updated; a server takes the
// step's pushes of all workers in worker order, whatever order they arrive in, so the sum's
// bits do not depend on timing; averages them, sums the squared norm of the mean over the
// servers (the global norm, for clipping and the log), applies AdamW and answers the pulls.
// That is dp all-reduce training up to the order of the gradient sum. Worker 0 sends the
// initial weights (every worker draws the same ones from the seed).
//
// Note [Asynchronous parameter server]
// Ho et al., "More Effective Distributed ML via a Stale Synchronous Parallel Parameter
// Server", NIPS 2013 (SSP); Dean et al., "Large Scale Distributed Deep Networks", NIPS 2012
// (asynchronous SGD). Under ps.mode = async a server applies each push as it arrives: one
// AdamW step on its range with the pushing worker's own gradient, clipped by that
// gradient's norm (the worker has the whole gradient and sends its norm), at learning rate
// lr(t) / W, t = pushes applied / W - W such updates move the weights about as far as one
// synchronous step of the mean. Its answer holds the range as it is then. A worker's clock
// c_w counts its pushes a server applied; the answer's version v = min over the workers
// still running of c_w (rounds every worker finished). The next push of that worker has
// clock c = c_w and carries v: its gradient saw every worker's first v pushes, so its
// staleness is c - v (0 under BSP). ps.mode = ssp (bound tau = ps.staleness) holds a
// worker's answer until c_w - min c <= tau, so every applied gradient has staleness <= tau;
// the slowest worker is never held, so no one waits forever. Servers record (worker, c, v)
// of every applied push.
// The run ends by pushes, not by each worker's steps: exactly W x train.steps pushes are
// applied (Note [Exact push count]), so a fast worker trains more steps than a slow one. A
// worker that hears "stop" from one server sends a "bye" to the servers that did not say it.
//
// Note [Exact push count]
// Every server must apply the same set of pushes (pushes go to all servers; only their
// arrival order differs) and the set must hold exactly B = W x train.steps of them. Server 0,
// the leader, defines it: it admits the pushes it takes while fewer than B are applied and
// refuses the rest, and sends each verdict (worker, clock, admitted) to the other servers in
// the order it decides. Another server s decides a push p of worker w itself when it can be
// sure: when s has applied B pushes already (p is refused), or when n + W - 1 < B, n being
// the pushes s took before p (p is admitted). The bound: a push that reached the leader
// before p either reached s before p, or is the newest push of some worker x != w that has
// not reached s yet (x pushes again only after s answered its last push, so at most one per
// worker); so the leader had taken at most n + W - 1 < B pushes when p reached it. Otherwise
// s parks p until the leader's verdict. The leader never waits on another server, and its
// verdict on p comes once p reaches it, so no server waits forever. A refused push is
// answered "stop" and its gradient dropped (its worker computed one step in vain).
//
// Note [PS checkpoints]
// A PS job saves the sharded format (Note [Sharded checkpoints]) with a rank file per rank: a
// server's holds its key range of the parameters and of both AdamW moments, a worker's nothing
// (its weights copy the servers', stale ones under async). The manifest lists every rank (a
// server at its shard's (pp, tp) and dp + its index: (0, r, 0) with tp = pp = 1) and the
// servers' optimizer step count. Loading
// assembles tensors from whatever pieces cover them, so a PS checkpoint resumes any layout and
// any layout's checkpoint resumes a PS job (servers load their ranges, workers whole weights).
// Sync saves every checkpoint.save_every steps; async / ssp only at the end, as step
// train.steps, and a resume from step k starts with W x k pushes done and every clock at k.
//
// Every transfer goes through point-to-point calls on a link group per worker (the worker
// and the servers; the server runs one receive per link at once, so it sees pushes in
// arrival order), so the ledger, comm.timeout_s and the diagnosis of a dead or stalled rank
// cover them as they cover collectives.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "loom/comm/group.h"
#include "loom/core/config.h"
#include "loom/model/layout.h"
#include "loom/parallel/pipeline.h"
#include "loom/rank/duties.h"
#include "loom/modes/ps/ps_sparse.h"

namespace loom::comm {
class World;
}

namespace loom::parallel {

using rank::kPsKeyFloats;  // the partition is plan data (rank/duties.h)
using rank::ps_partition;

// Note [Parameter server with model parallelism]
// With tp x pp = C > 1 the workers of one dp replica are a model-parallel group that runs
// the layout's own forward and backward (tp's collectives, the pipeline schedule, GPT's tied
// wte summed between the first and last stage); only the dp all-reduce and the update move
// to the servers. Each of the C model shards (a (pp, tp) coordinate's flat buffer) has its
// own S = parallel.ps_servers servers (rank/duties.h: ps_place), so a job has S x C servers
// and each server holds a key range of one shard: a worker pushes its shard's gradient to
// its shard's servers and pulls the weights back. Under sync every server takes the W pushes
// of its shard in worker order; the global norm is the sum over all servers of the squared
// mean with every parameter counted once (a tp-replicated tensor on tp rank 0's servers, the
// tied wte on the first stage's), so the run equals the same layout trained with dp
// all-reduce up to the order of the gradient sum. Under async / ssp a worker pushes with its
// replica's whole squared norm (summed over the replica), the leader is server 0 of shard 0
// for every shard's pushes (Note [Exact push count] counts replica pushes: all C ranks of a
// replica push each clock), and the replica's ranks agree on "stop" after each pull (a max
// over the replica), which is also a barrier: no rank pushes clock k + 1 before every server
// answered the replica's push k, so the bound of Note [Exact push count] holds per replica.
// Servers apply pushes in arrival order, so the last stage's servers' copy of the tied wte
// drifts from the first stage's under async: the last stage takes the first stage's copy
// after each pull (a broadcast over the embed group) and its servers leave it out of the
// checkpoint (ps_saved_ranges).

// Every group of a parameter-server job, made in one order on every rank (collective over
// the world): the role group (the workers, or the servers); the links (a worker's one: the
// worker and its shard's servers; a server's, one per worker of its shard in dp order); and
// a worker's training-mesh groups (null where it is alone: every server, or tp = 1 ...).
struct PsGroups {
  std::unique_ptr<comm::Group> role;
  std::vector<std::unique_ptr<comm::Group>> links;
  std::unique_ptr<comm::Group> tp, replica, embed;  // replica: the pp x tp ranks of one dp replica
  PipeLinks pipe;
};
PsGroups ps_groups(comm::World& world, const Config& cfg);

// The messages (Note [Asynchronous parameter server]): a push is a head of kTrailer floats
// and then the slice (a bye: the head alone, clock -1); an answer is the slice and then a
// tail of PsAnswer::kTrailer floats. Slices go from and to the workers' own buffers.
struct PsPush {
  enum : int { kClock, kVersion, kNormSq, kTrailer };  // clock -1: bye
};
struct PsAnswer {
  enum : int { kNormSq, kVersion, kStop, kLr, kTrailer };
};
// Note [Sparse embeddings]: a push is this header, then the row ids (push rows, pull rows,
// one pad), then the dense pieces and push rows' floats; the answer is the dense pieces, the
// pulled rows' floats (kPullRows -1: the whole table's part) and PsAnswer's trailer.
struct PsSparseHeader {
  enum : int { kClock, kVersion, kNormSq, kPushRows, kPullRows, kSize };
};

// What an answer told the worker (the first server's norm and learning rate).
struct PsReply {
  double norm = 0;  // sync: the mean gradient's global norm; else the worker's own
  double lr = 0;
  bool stop = false;
};

// A worker's side of Note [Parameter server].
class PsWorker {
 public:
  // `link`: this worker's link group (parallel::ps_groups), `ranges`: its shard's servers' key ranges.
  PsWorker(comm::Group& link, std::vector<FlatRange> ranges);
  // Worker 0: the initial weights to every server.
  void init_servers(const float* params);
  // A resumed run (Note [PS checkpoints]): the weights are every worker's first `clock` pushes.
  void start_at(int64_t clock) { std::fill(versions_.begin(), versions_.end(), float(clock)); }
  // The push / pull API (Li et al. 2014, section 3): push sends `grads`' slices with this
  // worker's clock (norm_sq: their whole squared norm, for async / ssp) and returns the
  // timestamp ts = clock; pull asks for the answers to the last push, landing in `params`,
  // and returns its ts; wait(ts) blocks until they are in. A server answers a push only after
  // applying it, so a pull sees this worker's own push ("my pull sees my own earlier push").
  // `grads` and `params` stay untouched until wait(). After a stop (a server's, or the
  // replica's: Note [Parameter server with model parallelism]) the worker says bye().
  int64_t push(const float* grads, int64_t clock, double norm_sq);
  int64_t pull(float* params);
  PsReply wait(int64_t ts);
  PsReply push_pull(const float* grads, float* params, int64_t clock, double norm_sq);
  // A bye to every server that did not answer the last push with "stop".
  void bye();
  // Tests: runs before each push (an injected delay reorders arrivals).
  std::function<void(int64_t step)> before_push;

  // Note [Sparse embeddings]: the embedding table (counted apart in the bytes), row-sparse
  // when `sparse`; then before each push_pull, the rows the step touched and the rows the
  // next step reads (pull_all: the whole table).
  void set_table(PsTable t, bool sparse) { table_ = t, sparse_ = sparse; }
  bool sparse() const { return sparse_; }
  void set_rows(int64_t step, std::vector<int32_t> push, std::vector<int32_t> pull, bool pull_all);
  // The rows step `step` reads when the last set_rows already named them as its pulls.
  const std::vector<int32_t>* rows_known_for(int64_t step) const {
    return !pull_all_ && pulls_step_ == step ? &pull_rows_ : nullptr;
  }
  // Bytes this worker sent plus received, all and the embedding table's share, per push_pull.
  double bytes_per_step() const { return calls_ ? bytes_ / double(calls_) : 0.0; }
  double table_bytes_per_step() const { return calls_ ? table_bytes_ / double(calls_) : 0.0; }

 private:
  int64_t push_sparse(const float* grads, int64_t clock, double norm_sq);

  comm::Group& link_;
  std::vector<FlatRange> ranges_;
  std::vector<float> versions_;  // per server: the version of the slice we hold
  std::vector<char> stopped_;    // per server: it answered the last push with "stop"
  // Per server, alive until wait(): the push's head, the answer's tail, the packed sparse
  // payload, and where the answer's floats land.
  std::vector<std::array<float, PsPush::kTrailer>> heads_;
  std::vector<std::array<float, PsAnswer::kTrailer>> tails_;
  std::array<float, PsSparseHeader::kSize> sparse_head_{};  // sent before push_sparse returns
  std::vector<std::vector<float>> payloads_, answers_;
  std::vector<std::vector<FlatRange>> back_;
  float* pulled_into_ = nullptr;
  std::vector<comm::Work> pending_;
  int64_t pushed_ = -1;
  PsTable table_;
  bool sparse_ = false;
  std::vector<int32_t> push_rows_, pull_rows_;
  bool pull_all_ = true;
  int64_t pulls_step_ = -1;  // the step pull_rows_ were read for
  double bytes_ = 0, table_bytes_ = 0;
  int64_t calls_ = 0;
};

// Tags of a clock's messages (each link delivers in order; the tag catches a mix-up), and of
// the initial weights.
int ps_tag(int64_t clock);
inline constexpr int kPsInitTag = 16383;  // tags are < 16384 (the comm layer's bound)

}  // namespace loom::parallel
