#include "loom/parallel/pipeline.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "loom/comm/world.h"
#include "loom/core/error.h"

namespace loom::parallel {

PipeLinks make_pipe_links(comm::World& world, const comm::Mesh& mesh, bool wrap) {
  const int pp = mesh.axis_size("pp");
  PipeLinks links;
  if (pp == 1) return links;
  const std::vector<std::vector<int>> pipes = mesh.groups({"pp"});
  const int me = world.global_rank();
  for (int dir = 0; dir < 2; dir++) {
    // Directed stage pairs (from, to): activations r -> r+1, gradients r+1 -> r; plus the
    // wrap-around pair for interleaved schedules.
    std::vector<std::pair<int, int>> pairs;
    for (int r = 0; r + 1 < pp; r++) pairs.push_back(dir == 0 ? std::pair{r, r + 1} : std::pair{r + 1, r});
    if (wrap) pairs.push_back(dir == 0 ? std::pair{pp - 1, 0} : std::pair{0, pp - 1});
    // Rounds of stage-disjoint pairs (greedy); one world-collective group call per round.
    std::vector<std::vector<std::pair<int, int>>> rounds;
    for (auto pr : pairs) {
      auto fits = [&](const std::vector<std::pair<int, int>>& rd) {
        for (auto q : rd)
          if (q.first == pr.first || q.first == pr.second || q.second == pr.first || q.second == pr.second)
            return false;
        return true;
      };
      auto it = std::find_if(rounds.begin(), rounds.end(), fits);
      if (it == rounds.end()) rounds.emplace_back(1, pr);
      else it->push_back(pr);
    }
    for (const auto& rd : rounds) {
      std::vector<std::vector<int>> partition;
      std::vector<int> used(size_t(world.world_size()), 0);
      bool sender = false, receiver = false;
      for (const auto& pipe : pipes)
        for (auto [from, to] : rd) {
          const int a = pipe[size_t(from)], b = pipe[size_t(to)];
          partition.push_back({std::min(a, b), std::max(a, b)});
          used[size_t(a)] = used[size_t(b)] = 1;
          sender = sender || a == me;
          receiver = receiver || b == me;
        }
      for (int r = 0; r < world.world_size(); r++)
        if (!used[size_t(r)]) partition.push_back({r});
      std::unique_ptr<comm::Group> g = world.group(partition, dir == 0 ? "pp_act" : "pp_grad");
      if (g->size() != 2) continue;  // a singleton: free now (collective over itself only)
      if (sender) (dir == 0 ? links.fwd_send : links.bwd_send) = g.get();
      else if (receiver) (dir == 0 ? links.fwd_recv : links.bwd_recv) = g.get();
      links.owned.push_back(std::move(g));
    }
  }
  return links;
}

PipelineRunner::PipelineRunner(const Schedule& schedule, int pp_rank, Model& model, PipeLinks& links, int64_t B,
                               int64_t T, bool bf16_wire, MemoryTracker* tracker)
    : schedule_(schedule), pp_rank_(pp_rank), model_(model), links_(links), B_(B), T_(T), bf16_wire_(bf16_wire),
      tracker_(tracker) {
  LOOM_CHECK(model.chunks() == schedule.vpp, "pipeline rank ", pp_rank, " model holds ", model.chunks(),
             " chunks but the schedule runs vpp = ", schedule.vpp);
  recv_buf_.resize(size_t(model.boundary_floats(B, T)));
  const ScheduleCheck check = validate(schedule);
  LOOM_CHECK(check.ok, "pipeline schedule does not finish: ", check.problem);
  const int slots = check.peak_in_flight[size_t(pp_rank)];
  streams_ = streams(schedule.kind);
  depth_ = streams_ ? stream_depth(schedule) : 0;
  const int ahead = streams_ ? 1 : 0;  // Note [The next step's first forwards ahead]
  slot_of_.assign(size_t(schedule.vpp), std::vector<int>(size_t(schedule.micro_batches * (1 + depth_ + ahead)), -1));
  slot_busy_.assign(size_t(schedule.vpp), std::vector<bool>(size_t(slots), false));
  w_slot_of_ = slot_of_;
  w_busy_.assign(size_t(schedule.vpp), std::vector<bool>(size_t(check.peak_pending_w[size_t(pp_rank)]), false));
  for (auto& per_kind : sends_) per_kind.assign(size_t(schedule.vpp), std::vector<comm::Work>(size_t(slots)));
  if (bf16_wire_) {
    recv_h_.resize(recv_buf_.size());
    if (tracker_)
      tracker_->track(tracker_->category("buffers"), recv_h_.data(), int64_t(recv_h_.size() * sizeof(comm::bf16)));
    send_h_.assign(size_t(schedule.vpp), std::vector<std::vector<comm::bf16>>(size_t(slots)));
  }
  by_direction_ = schedule.kind == ScheduleKind::kZbV;
  if (schedule.vocab()) {
    vocab_pool_.assign(size_t(vocab_buffers(schedule, pp_rank)), std::vector<float>(recv_buf_.size()));
    for (size_t i = 0; i < vocab_pool_.size(); ++i) {
      vocab_free_.push_back(int(i));
      if (tracker_)
        tracker_->track(tracker_->category("buffers"), vocab_pool_[i].data(), int64_t(recv_buf_.size() * sizeof(float)));
    }
  }
  // A stream's links carry it across steps, received in the order sent: no per-step plan.
  if (!streams_) plan_receive_order();
}

// Note [Pipeline streams]: a micro-batch's tag on the wire - its step's set of m, the sets
// cycling over depth + 2 steps - so a message sent in one step and received in a later one
// keeps its tag; micro-batch m + i is the next step's i (Note [The next step's first forwards
// ahead]), tagged as the receiver's next step takes it.
int PipelineRunner::wire_micro(int micro) const {
  if (!streams_) return micro;
  const int m = schedule_.micro_batches, sets = depth_ + 2;
  const int back = micro >= m ? -(micro / m) : steps_back(micro, m);
  const int set = int(((stream_step_ - back) % sets + sets) % sets);
  return set * m + (micro + back * m);
}

void PipelineRunner::end_stream_step(bool flush) {
  const int m = schedule_.micro_batches;
  for (std::vector<int>& of : slot_of_) {
    for (int i = 0; i < m; ++i)
      LOOM_ASSERT(of[size_t(i)] < 0, "pipeline rank ", pp_rank_, " kept micro-batch ", i - depth_ * m, " past its step");
    std::copy(of.begin() + m, of.end(), of.begin());
    std::fill(of.end() - m, of.end(), -1);
    for (int i = 0; flush && i < int(of.size()); ++i)
      LOOM_ASSERT(of[size_t(i)] < 0, "pipeline rank ", pp_rank_, " flushed with micro-batch ", i, " in flight");
  }
  // Note [Vocabulary passes across a step's end]: the next step's lookups (made as m + i) and
  // this step's gradients not yet carried (i, carried as i - m) under the next step's numbers.
  for (std::map<int, int>* held : {&lookups_, &embed_grads_}) {
    std::map<int, int> renamed;
    for (const auto& [micro, buffer] : *held) renamed[micro - m] = buffer;
    *held = std::move(renamed);
  }
  ++stream_step_;
}

// For every link into this rank, the tags its sender sends in one step, in its order.
void PipelineRunner::plan_receive_order() {
  const Schedule& s = schedule_;
  const int last = s.pp * s.vpp - 1;
  for (int from = 0; from < s.pp; ++from) {
    if (from == pp_rank_) continue;
    for (const PipeStep& st : s.steps[size_t(from)]) {
      const int v = s.stage(from, st.chunk);
      const bool fwd = st.phase == Phase::kF;
      if (st.phase == Phase::kW || st.phase == Phase::kV || (fwd && v == last) || (!fwd && v == 0)) continue;
      const StageSite to = s.site(fwd ? v + 1 : v - 1);
      if (to.rank == pp_rank_) receive_order_[link(from, fwd, false)].push_back(st.micro_batch * s.vpp + to.chunk);
    }
  }
}

namespace {
// The other member of a two-member link group.
int peer(const comm::Group& link) { return 1 - link.group_rank(); }
}  // namespace

float* PipelineRunner::hold_vocab(std::map<int, int>& held, int micro) {
  LOOM_ASSERT(!vocab_free_.empty() && !held.count(micro), "pipeline rank ", pp_rank_, " has no vocabulary buffer for ",
              "micro-batch ", micro, " (", vocab_pool_.size(), " made)");
  const int i = vocab_free_.back();
  vocab_free_.pop_back();
  held[micro] = i;
  return vocab_pool_[size_t(i)].data();
}

void PipelineRunner::release_vocab(std::map<int, int>& held, int micro) {
  auto it = held.find(micro);
  LOOM_ASSERT(it != held.end(), "pipeline rank ", pp_rank_, " holds no vocabulary buffer for micro-batch ", micro);
  vocab_free_.push_back(it->second);
  held.erase(it);
}

// Note [Sends by buffer]
// A send reads its source until the receiver has taken it, so the source's next writer waits
// for it: a slot's forward rewrites its stage output (what F sent), its backward its input
// gradient (what B sent) - two buffers, so a forward does not wait for the gradient its slot's
// backward sent, nor a backward for an activation. On the last stage of 1F1B on two ranks
// waiting for both held every forward until the previous stage had taken the backward's
// gradient, 0.1-0.3 ms a micro-batch of config A's 6 ms (a traced 2bw step). The bf16 wire
// converts both into one buffer per slot (send_h_), so there a writer waits for both.
void PipelineRunner::wait_pending(int chunk, int slot, Carried carried) {
  sends_[carried][size_t(chunk)][size_t(slot)].wait();
  if (bf16_wire_) sends_[1 - carried][size_t(chunk)][size_t(slot)].wait();
}

void PipelineRunner::wait_all_sends() {
  for (auto& per_kind : sends_)
    for (auto& per_chunk : per_kind)
      for (auto& w : per_chunk) w.wait();
  for (SentCopy& c : sent_copies_) c.work.wait();
}

// Note [Stream gradient sends]
// In a stream a backward's input gradient may be taken only in the next step, by the previous
// stage's trailing backward, and a step ends at a collective of every rank (2bw's update waits
// for the gradient norm's all-reduce; the vocabulary passes' V(-1)). With the stages further
// apart than one micro-batch (Note [Vocabulary passes ahead]) a stage sends two or more such
// gradients in a step, and had its slot's next backward waited for the first (Note [Sends by
// buffer]) it would wait across that collective for a receiver that is waiting in it. So a
// stream sends each gradient from a copy, one (B,T,C) buffer per send in flight, reused once
// taken: a memory copy of a boundary a backward, and the copies the job's peak keeps.
void PipelineRunner::send_copy(comm::Group& link, const float* src, int tag) {
  const size_t n = recv_buf_.size();
  SentCopy* c = nullptr;
  for (SentCopy& s : sent_copies_)
    if (s.work.done()) c = &s;
  if (!c) {
    c = &sent_copies_.emplace_back();
    c->data.resize(bf16_wire_ ? 0 : n), c->wire.resize(bf16_wire_ ? n : 0);
    if (tracker_)
      tracker_->track(tracker_->category("buffers"), bf16_wire_ ? static_cast<const void*>(c->wire.data()) : c->data.data(),
                      int64_t(n * (bf16_wire_ ? sizeof(comm::bf16) : sizeof(float))));
  }
  if (bf16_wire_) {
    for (size_t i = 0; i < n; i++) c->wire[i] = comm::float_to_bf16(src[i]);
    c->work = link.send(std::span<const comm::bf16>(c->wire), peer(link), tag, {.async = true});
  } else {
    std::copy(src, src + n, c->data.begin());
    c->work = link.send(std::span<const float>(c->data), peer(link), tag, {.async = true});
  }
}

comm::Work PipelineRunner::send(comm::Group& link, const float* src, int chunk, int slot, int tag) {
  const size_t n = recv_buf_.size();
  if (!bf16_wire_) return link.send(std::span<const float>(src, n), peer(link), tag, {.async = true});
  std::vector<comm::bf16>& h = send_h_[size_t(chunk)][size_t(slot)];  // free: wait_pending ran
  if (h.empty()) {
    h.resize(n);
    if (tracker_) tracker_->track(tracker_->category("buffers"), h.data(), int64_t(n * sizeof(comm::bf16)));
  }
  for (size_t i = 0; i < n; i++) h[i] = comm::float_to_bf16(src[i]);
  return link.send(std::span<const comm::bf16>(h), peer(link), tag, {.async = true});
}

void PipelineRunner::recv_into(comm::Group& link, int tag, float* dst) {
  if (!bf16_wire_) return (void)link.recv(std::span<float>(dst, recv_buf_.size()), peer(link), tag);
  link.recv(std::span<comm::bf16>(recv_h_), peer(link), tag);
  for (size_t i = 0; i < recv_buf_.size(); i++) dst[i] = comm::bf16_to_float(recv_h_[i]);
}

// Note [Pipeline transfers]: messages are taken off a link in the order its sender sent
// them; one that arrives before its step is kept aside until the step asks for it.
void PipelineRunner::recv(comm::Group& link, int tag) {
  auto it = expect_.find(&link);
  if (it == expect_.end()) return recv_into(link, tag, recv_buf_.data());  // forward_only, or no schedule order
  if (auto e = early_.find({&link, tag}); e != early_.end()) {  // taken off the link before
    std::copy(e->second.begin(), e->second.end(), recv_buf_.begin());
    early_.erase(e);
    return;
  }
  std::deque<int>& order = it->second;
  while (!order.empty() && order.front() != tag) {
    std::vector<float>& early = early_[{&link, order.front()}];
    early.resize(recv_buf_.size());
    recv_into(link, order.front(), early.data());
    order.pop_front();
  }
  LOOM_ASSERT(!order.empty(), "pipeline rank ", pp_rank_, " expects no message tagged ", tag, " on this link");
  order.pop_front();
  recv_into(link, tag, recv_buf_.data());
}

comm::Group* PipelineRunner::link(int peer_rank, bool activation, bool sending) const {
  // Interleaved and one-chunk schedules: activations flow up the pipeline (wrapping around)
  // and gradients down, each on its own links. ZB-V's chunk 1 runs the other way: a message
  // takes the link of its direction, whatever it carries.
  const bool up = by_direction_ ? (sending ? peer_rank == pp_rank_ + 1 : peer_rank == pp_rank_ - 1) : activation;
  comm::Group* g = sending ? (up ? links_.fwd_send : links_.bwd_send) : (up ? links_.fwd_recv : links_.bwd_recv);
  LOOM_ASSERT(g, "pipeline rank ", pp_rank_, " has no link ", sending ? "to" : "from", " rank ", peer_rank);
  return g;
}

void PipelineRunner::forward(int micro, int local, int chunk, int slot, const int32_t* tokens,
                             const int32_t* targets, float grad_scale, double* loss) {
  const int v = virtual_stage(chunk), vpp = schedule_.vpp;
  const float* x_in = nullptr;
  const bool looked_up = v == 0 && schedule_.vocab();
  if (looked_up) {  // in an earlier vocabulary pass
    LOOM_ASSERT(lookups_.count(local), "pipeline rank ", pp_rank_, " forwards micro-batch ", local, " unlooked-up");
    x_in = vocab_pool_[size_t(lookups_.at(local))].data();
  } else if (v > 0) {
    const StageSite from = schedule_.site(v - 1);
    if (from.rank == pp_rank_) {  // ZB-V's turn: the other chunk's output, still held
      x_in = model_.stage_output(from.chunk, slot_of_[size_t(from.chunk)][size_t(micro)]);
    } else {
      recv(*link(from.rank, true, false), micro * vpp + chunk);  // tagged by the receiving chunk
      x_in = recv_buf_.data();
    }
  }
  wait_pending(chunk, slot, kActivation);  // the slot's output may still be on its way out
  if (step_hook_) step_hook_(Phase::kF, micro, chunk, true);  // the step's span starts once its input is here
  const float l = model_.stage_forward(chunk, slot, tokens, x_in, targets, B_, T_, grad_scale);
  if (looked_up) release_vocab(lookups_, local);
  if (is_last(chunk)) {
    *loss += l;
    return;
  }
  const StageSite to = schedule_.site(v + 1);
  if (to.rank == pp_rank_) return;
  sends_[kActivation][size_t(chunk)][size_t(slot)] =
      send(*link(to.rank, true, true), model_.stage_output(chunk, slot), chunk, slot, micro * vpp + to.chunk);
}

// w_slot >= 0: B of a split backward (Note [B/W split] in model/model.h).
void PipelineRunner::backward(int micro, int local, int chunk, int slot, int w_slot) {
  const int v = virtual_stage(chunk), vpp = schedule_.vpp;
  const float* dy = nullptr;
  if (!is_last(chunk)) {
    const StageSite from = schedule_.site(v + 1);
    if (from.rank == pp_rank_) {
      dy = turn_.at(micro).data();
    } else {
      recv(*link(from.rank, false, false), micro * vpp + chunk);
      dy = recv_buf_.data();
    }
  }
  wait_pending(chunk, slot, kGradient);
  if (step_hook_) step_hook_(Phase::kB, micro, chunk, true);
  if (w_slot >= 0) model_.stage_backward_input(chunk, slot, w_slot, dy, B_, T_);
  else model_.stage_backward(chunk, slot, dy, B_, T_);
  turn_.erase(micro);  // (only ZB-V's turn had one)
  if (v == 0 && schedule_.vocab()) {  // carried by a later vocabulary pass
    const float* grad = model_.stage_input_grad(chunk, slot);
    std::copy(grad, grad + recv_buf_.size(), hold_vocab(embed_grads_, local));
  }
  if (v == 0) return;
  const StageSite to = schedule_.site(v - 1);
  const float* grad = model_.stage_input_grad(chunk, slot);
  if (to.rank == pp_rank_) {  // ZB-V's turn: kept until the other chunk's B of this micro-batch
    turn_[micro].assign(grad, grad + recv_buf_.size());
    return;
  }
  if (streams_) return send_copy(*link(to.rank, false, true), grad, micro * vpp + to.chunk);
  sends_[kGradient][size_t(chunk)][size_t(slot)] =
      send(*link(to.rank, false, true), grad, chunk, slot, micro * vpp + to.chunk);
}

void PipelineRunner::vocab_pass(const VocabPass& p, bool last_carried, const BatchFn& batch, float grad_scale,
                                double* loss, const Stream* stream) {
  std::vector<int32_t> tok(size_t(B_ * T_)), tgt(tok.size());
  for (int j : p.embed_grad) {
    auto looked = vocab_tokens_.find(token_key(j));
    const bool held = embed_grads_.count(j) > 0;
    LOOM_ASSERT(looked != vocab_tokens_.end() && model_.chunk_has_embed(0) == held, "pipeline rank ", pp_rank_,
                ": micro-batch ", j, "'s embedding gradient or its tokens are not where they should be");
    // Note [Vocabulary passes in a stream]: a trailing backward's is the step before's gradient.
    const bool before = j < 0 && stream && stream->swap_vocab;
    if (before) stream->swap_vocab();
    model_.vocab_embed_grad(held ? vocab_pool_[size_t(embed_grads_.at(j))].data() : nullptr, looked->second.data(), B_,
                            T_);
    if (before) stream->swap_vocab();
    if (held) release_vocab(embed_grads_, j);
    vocab_tokens_.erase(looked);
  }
  if (last_carried && stream->vocab_pending) stream->vocab_pending(false);
  const bool take = p.take && stream && stream->vocab_take;
  if (p.head >= 0) {
    if (take) stream->vocab_take(true);  // the head reads W(t - 1)'s rows
    batch(p.head, tok.data(), tgt.data());
    const int last_chunk = model_.chunks() - 1;
    const int slot = holds_head() ? slot_of_[size_t(last_chunk)][size_t(index_of(p.head))] : -1;
    LOOM_ASSERT(!holds_head() || slot >= 0, "pipeline rank ", pp_rank_, " runs micro-batch ", p.head,
                "'s head before its forward");
    const float l = model_.vocab_head(slot, tgt.data(), B_, T_, grad_scale, true);
    if (holds_head()) *loss += l;
  }
  // Note [Vocabulary passes across a step's end]: W(t)'s rows before the next step's lookups,
  // aside while a later head still reads W(t - 1)'s (Note [The next step's first forwards ahead]).
  if (p.update && stream && stream->vocab_update) stream->vocab_update(p.aside);
  if (take) stream->vocab_take(false);
  for (int j : p.embed) {
    batch(j, tok.data(), tgt.data());
    const bool next = j >= schedule_.micro_batches && stream && stream->lookup_aside;
    if (next) stream->lookup_aside(true);
    model_.vocab_lookup(hold_vocab(lookups_, j), tok.data(), B_, T_);
    if (next) stream->lookup_aside(false);
    vocab_tokens_[token_key(j)] = tok;  // for its gradient's pass
    if (!model_.chunk_has_embed(0)) release_vocab(lookups_, j);  // only the first stage forwards it
  }
}

// Note [Vocabulary passes]: V(k), a collective of the vocabulary group. A stream's passes
// compute on the current weights; `first`: the step's first pass; `last_carried`: the last to
// carry a trailing backward's embedding gradient, or the first when none does (Note
// [Vocabulary passes in a stream]).
void PipelineRunner::run_vocab_step(int k, const std::vector<VocabPass>& passes, bool first, bool last_carried,
                                    const BatchFn& batch, float grad_scale, double* loss, const Stream* stream) {
  if (stream && stream->weights) stream->weights(0, true);
  if (stream && first && stream->vocab_pending) stream->vocab_pending(true);
  if (step_hook_) {  // the span starts once every rank is here (waiting for the others is idle)
    model_.vocab_meet();
    step_hook_(Phase::kV, k, 0, true);
  }
  vocab_pass(passes[size_t(k + 1)], stream && last_carried, batch, grad_scale, loss, stream);
  if (step_hook_) step_hook_(Phase::kV, k, 0, false);
}

namespace {
// The lowest free slot of `busy`, marked busy (the validator's peak bounds the slots in use).
int take_slot(std::vector<bool>& busy) {
  const int slot = int(std::find(busy.begin(), busy.end(), false) - busy.begin());
  LOOM_ASSERT(slot < int(busy.size()));
  busy[size_t(slot)] = true;
  return slot;
}

// The index of the last of `steps` that `holds` is true of (-1: none).
template <class Pred>
int last_where(const std::vector<PipeStep>& steps, Pred holds) {
  for (int i = int(steps.size()) - 1; i >= 0; --i)
    if (holds(steps[size_t(i)])) return i;
  return -1;
}

// Note [Vocabulary passes in a stream]: the last of a step's passes that carries a trailing
// backward's embedding gradient (-1: V(-1)), or `first`, the step's first pass, when none does.
int last_carrying_pass(const std::vector<VocabPass>& passes, int first, bool stream) {
  int last = first;
  for (size_t k = 0; stream && k < passes.size(); ++k)
    for (int j : passes[k].embed_grad)
      if (j < 0) last = int(k) - 1;
  return last;
}
}  // namespace

double PipelineRunner::run_step(const BatchFn& batch, float grad_scale, const std::function<void()>& before_last_backward,
                                const Stream* stream) {
  LOOM_ASSERT(!streams_ || stream != nullptr);
  const std::vector<PipeStep> steps = streams_ ? stream_steps(schedule_, pp_rank_, stream->age, stream->flush)
                                               : schedule_.steps[size_t(pp_rank_)];
  const bool split = schedule_.split();
  const Phase grads_phase = split ? Phase::kW : Phase::kB;  // the step that adds weight gradients
  const int last_grads = last_where(steps, [&](const PipeStep& st) { return st.phase == grads_phase; });
  int backwards = int(std::count_if(steps.begin(), steps.end(), [](const PipeStep& st) { return st.phase == Phase::kB; }));
  const size_t n = size_t(B_ * T_);
  std::vector<int32_t> tok(n), tgt(n);
  double loss = 0;
  expect_ = receive_order_;
  // Streams: the weights bound, and (2bw) the step before which the previous step's gradient
  // is complete (after its last trailing backward; the last stage's forwards add the head's
  // gradients, so nothing of this step's batch may run before it).
  const int m = schedule_.micro_batches;
  const int carried_done =
      streams_ ? last_where(steps, [](const PipeStep& st) { return st.phase != Phase::kV && st.micro_batch < 0; }) + 1 : 0;
  // Note [Vocabulary passes in a stream]: this step's passes, and the last carrying a trailing
  // backward's embedding gradient (-1, V(-1), when none does).
  const std::vector<VocabPass>& passes =
      streams_ && schedule_.vocab() ? stream_passes(schedule_, stream->age, stream->flush) : schedule_.passes;
  const auto first_pass = std::find_if(steps.begin(), steps.end(), [](const PipeStep& st) { return st.phase == Phase::kV; });
  const int carried_vocab = first_pass == steps.end() ? -2 : last_carrying_pass(passes, first_pass->micro_batch, streams_);
  bool ahead = false;  // Note [The next step's first forwards ahead]
  for (int i = 0; i < int(steps.size()); i++) {
    const PipeStep& s = steps[size_t(i)];
    if (streams_ && i == carried_done && stream->batch_gradients) stream->batch_gradients();
    if (streams_ && s.phase == Phase::kF && s.micro_batch >= m && !std::exchange(ahead, true) && stream->ahead)
      stream->ahead();
    if (s.phase == Phase::kV) {
      run_vocab_step(s.micro_batch, passes, steps.begin() + i == first_pass, s.micro_batch == carried_vocab, batch,
                     grad_scale, &loss, streams_ ? stream : nullptr);
      continue;
    }
    if (step_hook_ && s.phase == Phase::kW) step_hook_(s.phase, s.micro_batch, s.chunk, true);  // F, B: after their receive
    if (i == last_grads && before_last_backward) before_last_backward();
    if (stream && stream->weights && s.phase != Phase::kW)  // Note [Pipeline streams]
      stream->weights(steps_back(s.micro_batch, m), s.phase == Phase::kF);
    int& slot = slot_of_[size_t(s.chunk)][size_t(index_of(s.micro_batch))];
    int& w_slot = w_slot_of_[size_t(s.chunk)][size_t(index_of(s.micro_batch))];
    const int wire = wire_micro(s.micro_batch);
    if (s.phase == Phase::kF) {
      slot = take_slot(slot_busy_[size_t(s.chunk)]);
      const bool needs_data = model_.chunk_has_embed(s.chunk) || model_.chunk_has_head(s.chunk);
      if (needs_data) batch(s.micro_batch, tok.data(), tgt.data());
      forward(wire, s.micro_batch, s.chunk, slot, tok.data(), tgt.data(), grad_scale, &loss);
    } else if (s.phase == Phase::kB) {
      LOOM_ASSERT(slot >= 0);
      if (streams_ && stream->before_backward) stream->before_backward(backwards);
      --backwards;
      if (split) w_slot = take_slot(w_busy_[size_t(s.chunk)]);
      backward(wire, s.micro_batch, s.chunk, slot, split ? w_slot : -1);
    } else {
      LOOM_ASSERT(slot >= 0 && w_slot >= 0);
      model_.stage_backward_weight(s.chunk, slot, w_slot, B_, T_);
      w_busy_[size_t(s.chunk)][size_t(w_slot)] = false;
      w_slot = -1;
    }
    if (s.phase == grads_phase) {  // the micro-batch's activations are free now
      slot_busy_[size_t(s.chunk)][size_t(slot)] = false;
      slot = -1;
    }
    if (step_hook_) step_hook_(s.phase, s.micro_batch, s.chunk, false);
    if (streams_ && s.phase == Phase::kB && stream->after_backward) stream->after_backward(steps_back(s.micro_batch, m));
  }
  if (schedule_.vocab()) model_.vocab_grads_final();
  if (stream && stream->weights) stream->weights(-1, true);
  // A stream between flushes: a send may be received only in a later step (its trailing
  // backward), so it is not waited for here - a rendezvous send would hold this rank out of
  // the step's end; its slot's next use waits for it (wait_pending).
  if (!streams_ || stream->flush) wait_all_sends();
  const bool carries_on = streams_ && !stream->flush;  // Note [Vocabulary passes across a step's end]
  LOOM_ASSERT(early_.empty() && turn_.empty() && ((lookups_.empty() && embed_grads_.empty()) || carries_on) &&
                  (vocab_tokens_.empty() || carries_on),
              "pipeline rank ", pp_rank_, " ended a step with messages unused");
  expect_.clear();
  if (streams_) end_stream_step(stream->flush);
  return loss;
}

double PipelineRunner::forward_only(const int32_t* tokens, const int32_t* targets) {
  double loss = 0;
  const StepHook hook = std::exchange(step_hook_, nullptr);  // validation is not a schedule step
  for (auto& of : slot_of_) of[0] = 0;  // every chunk runs micro-batch 0 on slot 0 (ZB-V's turn reads it)
  if (schedule_.vocab()) {  // Note [Vocabulary passes]: the lookup, the chunks, then the head, on every rank
    model_.vocab_lookup(hold_vocab(lookups_, 0), tokens, B_, T_);
    if (!model_.chunk_has_embed(0)) release_vocab(lookups_, 0);
  }
  for (int c = 0; c < schedule_.vpp; c++) forward(0, 0, c, 0, tokens, targets, 0.0f, &loss);
  if (schedule_.vocab()) {
    const float l = model_.vocab_head(0, targets, B_, T_, 0.0f, false);
    if (holds_head()) loss += l;
  }
  for (auto& of : slot_of_) of[0] = -1;
  step_hook_ = hook;
  wait_all_sends();
  return loss;
}

}  // namespace loom::parallel
