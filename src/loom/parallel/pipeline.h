// The pipeline executor: runs any schedule (Note [Schedules as data]) on one rank with
// point-to-point activation and gradient transfers.
//
// Note [Pipeline transfers]
// Every rank sends activations to one rank (the next pipeline rank, wrapping around for
// interleaved schedules) and gradients to one rank (the previous), and receives from the
// opposite ones. Each of those four directed links is its own two-member group, so a
// send queued on one link's worker never waits behind a receive on another: sends are
// asynchronous (the validator's "a step runs once its input exists" model), receives
// block the compute thread. Messages carry tag = micro-batch x vpp + receiving chunk. A
// receiver takes messages off a link in the order its sender sent them (both follow the
// schedule, which every rank holds), keeping one that arrives before its step aside: ZB-V
// sends activations and gradients down the same links in orders the two ends need not
// share. ZB-V's turn (stages pp - 1 and pp, both on the last rank) is a local hand-over.
#pragma once

#include <array>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "loom/comm/group.h"
#include "loom/comm/mesh.h"
#include "loom/core/memory.h"
#include "loom/model/model.h"
#include "loom/parallel/schedule.h"
#include "loom/parallel/stage_part.h"

namespace loom::comm {
class World;
}

namespace loom::parallel {


struct PipeLinks {
  comm::Group *fwd_send = nullptr, *fwd_recv = nullptr, *bwd_send = nullptr, *bwd_recv = nullptr;  // null where unused
  // The link groups in creation order. Freeing a group is collective among its members
  // (MPI frees its window and communicator), so every rank frees them in the same order:
  // last created first, whatever role each plays here.
  std::vector<std::unique_ptr<comm::Group>> owned;
  PipeLinks() = default;
  PipeLinks(PipeLinks&&) = default;
  PipeLinks& operator=(PipeLinks&&) = default;
  ~PipeLinks() {
    while (!owned.empty()) owned.pop_back();
  }
};

// Collective over the world: the directed link groups of every pipeline along the mesh's
// "pp" axis (Note [Pipeline transfers]). `wrap`: the last rank also sends to the first.
PipeLinks make_pipe_links(comm::World& world, const comm::Mesh& mesh, bool wrap);

// Note [bf16 pipeline transfers]
// comm.p2p_dtype = bf16 (Megatron's pipeline_dtype under bf16): every boundary activation
// and boundary gradient is rounded to bf16 (nearest even) by its sender and widened by its
// receiver, halving the bytes on the link. The sender keeps its own fp32 values; the
// receiving stage computes with (and saves) the rounded input, so the residual stream and
// its gradient pick up one bf16 rounding (2^-8 relative) at each stage boundary that
// crosses ranks (ZB-V's turn is a local hand-over and stays fp32).
class PipelineRunner {
 public:
  // `model` holds pipeline_part(...) of this rank with at least peak-in-flight slots;
  // bf16_wire: Note [bf16 pipeline transfers].
  // tracker (optional): the bf16 wire's buffers are tracked as "buffers" when made.
  PipelineRunner(const Schedule& schedule, int pp_rank, Model& model, PipeLinks& links, int64_t B, int64_t T,
                 bool bf16_wire = false, MemoryTracker* tracker = nullptr);

  using BatchFn = std::function<void(int micro, int32_t* tokens, int32_t* targets)>;
  // One optimizer step: every step of this rank's list. Returns the sum over micro-batches
  // of the mean loss (last stage; 0 elsewhere). `before_last_backward` runs just before the
  // rank's final step that adds gradients, its last B (or W, when the schedule splits
  // backward); data parallel arms its gradient sync there.
  // Note [Pipeline streams] (2bw, pipedream, pipemare): which step of the stream this is, and
  // what the engine does around its schedule steps. weights(back, forward) binds the weights
  // the next forward or backward computes on (its micro-batch is `back` steps old; a forward
  // is always this step's); it is called before each, and with back = -1 after the last (the
  // current weights again). 2bw: batch_gradients() runs once the previous step's gradient is complete (after
  // the last trailing backward, or first), before any step that adds to this step's.
  // after_backward(back) runs after each backward (its micro-batch is `back` steps old):
  // pipedream's and pipemare's updates, 2bw's poll of its norm (Note [2BW without a barrier]).
  // before_backward(left) runs before each backward, before its input gradient's receive,
  // with `left` this step's backwards from this one on (>= 1): the time a stage waits there
  // for a slower later stage can hold other work (2bw: Note [2BW's update in the waits]).
  // A flushing schedule given a Stream (a reference) gets weights() only.
  // Note [Vocabulary passes in a stream] (2bw with pp_vocab): the passes compute on the current
  // weights; batch_gradients() then leaves the tensors the passes add to (Model::vocab_range())
  // alone, whose gradient is two steps' at once while trailing backwards' embedding gradients
  // are carried: vocab_pending(true) before a step's first pass moves their gradient so far to
  // the pending one, swap_vocab() around each trailing contribution adds it there, and
  // vocab_pending(false) after the last says that part of the pending gradient is complete.
  // vocab_update(aside) in the pass marked `update`, after its head: the vocabulary tensors'
  // update before the next step's lookups (Note [Vocabulary passes across a step's end]); `batch`
  // then gives micro-batch m + i for the next step's i. Note [The next step's first forwards
  // ahead] (parallel/schedule.h): an `aside` update goes into a copy, which lookup_aside(true /
  // false) binds around each of the next step's lookups until vocab_take(false), in the pass
  // marked `take` after its head, copies it over the tensors (vocab_take(true) before that head,
  // which reads W(t - 1)'s tensors, wherever the stream keeps them); ahead() runs before the first of the
  // next step's forwards this step runs (m + i), which compute on the next step's weights.
  struct Stream {
    int age = 0;
    bool flush = true;
    std::function<void(int back, bool forward)> weights;
    std::function<void()> batch_gradients;
    std::function<void(int back)> after_backward;
    std::function<void(int left)> before_backward;
    std::function<void(bool begin)> vocab_pending;
    std::function<void()> swap_vocab;
    std::function<void(bool aside)> vocab_update;
    std::function<void(bool before_head)> vocab_take;
    std::function<void(bool on)> lookup_aside;
    std::function<void()> ahead;
  };
  double run_step(const BatchFn& batch, float grad_scale, const std::function<void()>& before_last_backward,
                  const Stream* stream = nullptr);
  // Forward only, one batch through every stage (validation). Returns the mean loss on
  // the last stage, 0 elsewhere. Adds nothing to the gradients that are kept.
  double forward_only(const int32_t* tokens, const int32_t* targets);
  // Traces: hook(phase, micro, chunk, begin) around every schedule step, from the arrival
  // of its input (a step's blocking receive is waiting, not work) to its end.
  using StepHook = std::function<void(Phase phase, int micro, int chunk, bool begin)>;
  // The receive buffer for activations and gradients (memory reports).
  const std::vector<float>& recv_buffer() const { return recv_buf_; }
  void set_step_hook(StepHook hook) { step_hook_ = std::move(hook); }

 private:
  int virtual_stage(int chunk) const { return schedule_.stage(pp_rank_, chunk); }
  bool is_last(int chunk) const { return virtual_stage(chunk) == schedule_.pp * schedule_.vpp - 1; }
  // micro: the tag's micro-batch (wire_micro); local: the step's own index of it (negative: a
  // trailing backward's), which the vocabulary passes name.
  void forward(int micro, int local, int chunk, int slot, const int32_t* tokens, const int32_t* targets,
               float grad_scale, double* loss);
  void backward(int micro, int local, int chunk, int slot, int w_slot);
  // Note [Sends by buffer]: waits for the sends still reading the buffer that `carried` (a
  // slot's stage output, or its input gradient) is about to overwrite.
  enum Carried { kActivation = 0, kGradient = 1 };
  void wait_pending(int chunk, int slot, Carried carried);
  void wait_all_sends();
  // Note [Vocabulary passes]: pass V(k)'s embedding gradients, head and lookups, in that
  // order on every rank.
  // `last_carried`: the step's last pass to carry a trailing embedding gradient (a stream's).
  void vocab_pass(const VocabPass& p, bool last_carried, const BatchFn& batch, float grad_scale, double* loss,
                  const Stream* stream);
  void run_vocab_step(int k, const std::vector<VocabPass>& passes, bool first, bool last_carried, const BatchFn& batch,
                      float grad_scale, double* loss, const Stream* stream);
  bool holds_head() const { return model_.chunk_has_head(model_.chunks() - 1); }
  // Sends n floats from `src` to the link's peer, as bf16 through the (chunk, slot) buffer
  // on a bf16 wire; receives into recv_buf_ (widened from bf16 on a bf16 wire).
  comm::Work send(comm::Group& link, const float* src, int chunk, int slot, int tag);
  // Note [Stream gradient sends]: a stream's backward sends its input gradient from a copy.
  void send_copy(comm::Group& link, const float* src, int tag);
  void recv(comm::Group& link, int tag);
  void recv_into(comm::Group& link, int tag, float* dst);
  // The link to (sending) or from `peer_rank` for an activation or a gradient.
  comm::Group* link(int peer_rank, bool activation, bool sending) const;
  void plan_receive_order();

  const Schedule& schedule_;
  int pp_rank_;
  Model& model_;
  PipeLinks& links_;
  int64_t B_, T_;
  std::vector<float> recv_buf_;                // (B,T,C)
  std::vector<std::vector<int>> slot_of_;      // [chunk][micro] -> activation slot, -1 when free
  std::vector<std::vector<bool>> slot_busy_;   // [chunk][slot]
  std::vector<std::vector<int>> w_slot_of_;    // split backward: [chunk][micro] -> W slot, -1 when free
  std::vector<std::vector<bool>> w_busy_;      // [chunk][W slot]
  // [Carried][chunk][slot]: the last send from that slot's stage output / input gradient
  std::array<std::vector<std::vector<comm::Work>>, 2> sends_;
  bool bf16_wire_ = false;
  std::vector<comm::bf16> recv_h_;                      // bf16 wire: (B,T,C) as received
  // bf16 wire: [chunk][slot] (B,T,C) in flight, made on the slot's first send (a chunk
  // uses only the slots of its own peak).
  std::vector<std::vector<std::vector<comm::bf16>>> send_h_;
  // Note [Stream gradient sends]: (B,T,C) copies and their sends, reused once taken.
  struct SentCopy {
    std::vector<float> data;
    std::vector<comm::bf16> wire;  // bf16 wire
    comm::Work work;
  };
  std::vector<SentCopy> sent_copies_;
  MemoryTracker* tracker_ = nullptr;
  StepHook step_hook_;
  bool by_direction_ = false;  // ZB-V: links chosen by direction, not by what they carry
  std::map<comm::Group*, std::deque<int>> receive_order_;  // per incoming link: tags in send order, one step
  std::map<comm::Group*, std::deque<int>> expect_;         // what is left of it this step
  std::map<std::pair<comm::Group*, int>, std::vector<float>> early_;  // arrived before their step
  std::map<int, std::vector<float>> turn_;  // ZB-V: micro-batch -> gradient handed from chunk 1 to chunk 0
  // Vocabulary passes: vocab_buffers(schedule, rank) (B,T,C) buffers, made and tracked once;
  // micro-batch -> the one holding its embedding output (looked up, not yet forwarded; on the
  // first stage) and -> dL/d(embedding output) (backward run, not yet carried).
  std::vector<std::vector<float>> vocab_pool_;
  std::vector<int> vocab_free_;
  std::map<int, int> lookups_, embed_grads_;
  // Tokens of the micro-batches looked up whose embedding gradient is not yet carried, by
  // stream position (step x m + micro-batch; the micro-batch in a flushing schedule): a 2bw
  // trailing backward's are the step before's.
  std::map<int64_t, std::vector<int32_t>> vocab_tokens_;
  int64_t token_key(int local) const { return stream_step_ * schedule_.micro_batches + local; }
  float* hold_vocab(std::map<int, int>& held, int micro);  // a free buffer, now micro's
  void release_vocab(std::map<int, int>& held, int micro);
  // Streams: slot_of_ is indexed by micro-batch + depth m (earlier steps' below depth m, the next
  // step's forwards run ahead above m + depth m), and tags cycle through depth + 2 sets of m
  // micro-batches, step by step.
  bool streams_ = false;
  int depth_ = 0;
  int64_t stream_step_ = 0;
  int index_of(int micro) const { return micro + depth_ * schedule_.micro_batches; }
  int wire_micro(int micro) const;
  void end_stream_step(bool flush);
};

}  // namespace loom::parallel
