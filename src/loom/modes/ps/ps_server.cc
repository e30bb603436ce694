// A parameter server's run (Note [Parameter server], Note [Asynchronous parameter server] in
// modes/ps/ps.h): its key range's weights and AdamW moments; synchronous rounds, or pushes
// applied as they arrive.
#include "loom/modes/ps/ps_server.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <functional>
#include <iomanip>
#include <sstream>
#include <thread>

#include "loom/comm/world.h"
#include "loom/core/error.h"
#include "loom/core/memory.h"
#include "loom/kernels/kernels.h"
#include "loom/model/layout.h"
#include "loom/optim/optimizer.h"
#include "loom/modes/ps/ps.h"
#include "loom/data/loader.h"
#include "loom/train/rank_context.h"
#include "loom/train/run_start.h"
#include "loom/train/step_loop.h"
#include "loom/train/step_observers.h"
#include "loom/train/report.h"

namespace loom {
namespace {

using parallel::PsAnswer;
using parallel::PsPush;

class PsServer {
 public:
  PsServer(const Config& cfg, const TrainOptions& opt, comm::World& world);
  // Note [PS checkpoints]: with the workers' load (collective over the world); returns the
  // step to go on from.
  int64_t resume();
  void sync_round(int64_t step);  // ps.mode = sync: one step's round
  void run_free(int64_t first);   // async / ssp: the whole run
  // Note [PS checkpoints]: the server's shard as saved (ps_saved_ranges) or as loaded (its
  // whole key range), and its key range's weights.
  ShardState state(bool saving = true);
  std::span<const float> params() const { return p_; }
  double pushes = 0, max_stale = 0, sum_stale = 0;

 private:
  // Note [Exact push count]: what run_free tracks. Per worker: pushes taken (clock), an
  // answer owed, a push parked until the leader's verdict, the last push refused; on a
  // non-leader, how many of its pushes the leader decided and the first it refused.
  struct VerdictOut {
    std::array<float, 3> msg;  // worker, clock, admitted
    comm::Work sent;
  };
  struct FreeRun {
    int64_t budget = 0, applied = 0, taken = 0, verdicts = 0;
    std::vector<comm::Work> rx, tx;
    std::vector<int64_t> clock, decided, first_rejected, applied_of;
    std::vector<char> running, owed, parked, rejected;
    std::deque<VerdictOut> verdicts_out;  // the leader's sends in flight (deque: stable addresses)
    std::array<float, 3> verdict_in{};
    comm::Work verdict_rx;
    bool verdict_posted = false;
  };
  static constexpr int kVerdictTag = 1;
  void post_push(int w);
  bool take_free(int w, int& left);
  void decide(int w, bool admitted, bool parked);
  void send_verdict(int w, int64_t c, bool admitted);
  bool take_verdicts();
  bool answer_free(int& left);

  // One AdamW step on `ranges` of the range from the gradient in grad_, clipped by the global
  // `norm` (lazy for the table's rows: Note [Sparse embeddings]).
  void apply(double norm, double lr, const std::vector<FlatRange>& ranges);
  // A sync round's pushes summed into grad_, in worker order; returns the ranges they cover.
  std::vector<FlatRange> take_dense(int64_t step);
  std::vector<FlatRange> take_sparse(int64_t step);
  comm::Work answer_sparse(int w, double norm_sq, int64_t version, bool stop, double lr);
  std::span<float> head_of(int w);
  // Answers worker w with the range as it is now; the sends run on w's link.
  comm::Work answer(int w, double norm_sq, int64_t version, bool stop, double lr);
  void record(int w, const float* trailer);

  const Config& cfg_;
  const TrainOptions& opt_;
  comm::World& world_;
  // W_: the workers of this server's shard; me_: this server among all the job's (server 0
  // leads: Note [Exact push count]).
  const int W_, me_;
  parallel::PsGroups groups_;
  const std::unique_ptr<comm::Group> peers_;  // the servers
  std::vector<std::unique_ptr<comm::Group>> links_;
  const RankPlan plan_;  // Note [Parameter server with model parallelism]: its shard's layout, its key range
  const ParamLayout& layout_;
  const FlatRange own_;
  std::vector<FlatRange> counted_;  // own_ less what the global norm counts elsewhere
  // Whole-buffer vectors indexed by flat offset (AdamW's convention); only the own range is
  // ever written, the rest of the pages are handed back untouched.
  std::vector<float> params_, grad_;
  AdamW adamw_;
  std::span<float> p_, g_;
  std::vector<std::vector<float>> in_, out_;  // per worker: its push, its answer
  // Note [Sparse embeddings]: the table, the step's touched rows (marks over the table) and
  // each worker's pull request (rows; pull_all_ the whole part).
  parallel::PsTable table_;
  std::vector<char> touched_;
  std::vector<std::vector<int32_t>> pulls_;
  std::vector<char> pull_all_;
  FreeRun free_;
};

PsServer::PsServer(const Config& cfg, const TrainOptions& opt, comm::World& world)
    : cfg_(cfg),
      opt_(opt),
      world_(world),
      W_(int(cfg.parallel.dp)),
      me_(world.global_rank() - int(cfg.parallel.world())),
      groups_(parallel::ps_groups(world, cfg)),
      peers_(std::move(groups_.role)),
      links_(std::move(groups_.links)),
      plan_(plan_rank(cfg, world.global_rank())),
      layout_(plan_.layout),
      own_(plan_.param_ranges.at(0)),
      params_(size_t(layout_.total_floats())),
      grad_(params_.size()),
      adamw_(layout_, cfg.optim, {own_}),
      p_(params_.data() + own_.offset, size_t(own_.count)),
      g_(grad_.data() + own_.offset, size_t(own_.count)) {
  LOOM_ASSERT(int(links_.size()) == W_, "a server links to its shard's ", W_, " workers");
  // The global norm counts every parameter once (RankContext::counts): tp rank 0's servers
  // count the replicated tensors, the first stage's the tied wte.
  counted_ = {own_};
  const bool tied_copy = plan_.part.holds_tied_copy(cfg.model);
  for (const ParamSpec& s : layout_.specs())
    if ((s.name == "wte" && tied_copy) || (s.split_dim < 0 && plan_.tp_rank != 0))
      counted_ = subtract(counted_, {s.offset, s.numel});
  release_pages(params_.data(), int64_t(params_.size() * sizeof(float)));
  release_pages(grad_.data(), int64_t(grad_.size() * sizeof(float)));
  for (int w = 0; w < W_; ++w) {
    in_.emplace_back(size_t(own_.count + PsPush::kTrailer));
    out_.emplace_back(size_t(own_.count + PsAnswer::kTrailer));
  }
  links_[0]->recv(p_, 0, parallel::kPsInitTag);  // worker 0's initial weights
  if (cfg.ps.sparse_embedding) {
    const ParamSpec& wte = layout_.at("wte");
    table_ = {wte.offset, wte.shape[0], wte.shape[1]};
    touched_.assign(size_t(table_.rows), 0);
    pulls_.resize(size_t(W_)), pull_all_.assign(size_t(W_), 0);
  }
}

void PsServer::apply(double norm, double lr, const std::vector<FlatRange>& ranges) {
  const Kernels& k = kernels(KernelBackend::kCpu);
  if (const double coef = clip_coef(norm, cfg_.optim.grad_clip); coef != 1.0)
    for (const FlatRange& r : ranges) k.scale_inplace(grad_.data() + r.offset, r.count, float(coef));
  const int64_t t = adamw_.steps_taken() + 1;
  adamw_.step_ranges(k, params_, grad_, lr, t, ranges);
  adamw_.set_steps_taken(t);
}

comm::Work PsServer::answer(int w, double norm_sq, int64_t version, bool stop, double lr) {
  std::vector<float>& out = out_[size_t(w)];
  std::copy(p_.begin(), p_.end(), out.begin());
  float* t = out.data() + own_.count;
  t[PsAnswer::kNormSq] = float(norm_sq), t[PsAnswer::kVersion] = float(version);
  t[PsAnswer::kStop] = stop ? 1.0f : 0.0f, t[PsAnswer::kLr] = float(lr);
  const int64_t clock = int64_t(in_[size_t(w)][size_t(own_.count) + PsPush::kClock]);
  // The slice, then the tail (the worker receives the slice straight into its weights); the
  // link runs them in order, so the tail's Work completes last.
  comm::Group& link = *links_[size_t(w)];
  link.send(std::span<const float>(out.data(), size_t(own_.count)), 0, parallel::ps_tag(clock), {.async = true});
  return link.send(std::span<const float>(t, PsAnswer::kTrailer), 0, parallel::ps_tag(clock), {.async = true});
}

// A push's head (clock, version, norm) lands after the slice in in_[w].
std::span<float> PsServer::head_of(int w) {
  return std::span<float>(in_[size_t(w)].data() + own_.count, PsPush::kTrailer);
}

void PsServer::record(int w, const float* t) {
  const int64_t clock = int64_t(t[PsPush::kClock]), version = int64_t(t[PsPush::kVersion]);
  const double stale = double(clock - version);
  pushes += 1, sum_stale += stale, max_stale = std::max(max_stale, stale);
  if (opt_.on_ps_apply) opt_.on_ps_apply(me_, w, clock, version);
}

// Note [PS checkpoints]: a server's shard is its key range of the parameters and both
// moments (a worker's is empty); saved, less a head stage's tied wte copy, which opens the
// layout, so what is saved is one range at the end of the key range (or nothing).
ShardState PsServer::state(bool saving) {
  const int tp = int(cfg_.parallel.tp);
  ShardState s{&layout_, params_, adamw_.moment(0), adamw_.moment(1), {own_}, adamw_.owned(),
               tp, plan_.tp_rank, adamw_.steps_taken(), {}};
  if (!saving) return s;
  const std::vector<FlatRange> saved = ps_saved_ranges(plan_, cfg_.model);
  LOOM_ASSERT(saved.size() <= 1 && (saved.empty() || saved[0].offset + saved[0].count == own_.offset + own_.count),
              "a server saves the end of its key range");
  const int64_t skip = saved.empty() ? own_.count : saved[0].offset - own_.offset;
  s.m = s.m.subspan(size_t(skip)), s.v = s.v.subspan(size_t(skip));
  s.param_ranges = s.moment_ranges = saved;
  return s;
}

int64_t PsServer::resume() {
  if (opt_.resume.empty()) return 0;
  std::ostringstream sink;  // the workers report the resume
  TrainOptions quiet;
  quiet.out = quiet.err = &sink;
  Reporter rep(quiet, cfg_.train.steps);
  ShardState s = state(false);
  const int64_t step = load_resume(cfg_, opt_.resume, s, &world_.world_group(), rep);
  adamw_.set_steps_taken(s.optimizer_steps);
  return step;
}

// Note [Parameter server]: every worker's push, in worker order; the mean's global norm over
// the servers clips it.
void PsServer::sync_round(int64_t step) {
  const Kernels& k = kernels(KernelBackend::kCpu);
  const float inv = 1.0f / float(W_);
  const std::vector<FlatRange> ranges = table_.on() ? take_sparse(step) : take_dense(step);
  for (const FlatRange& r : ranges)
    for (float& x : std::span<float>(grad_.data() + r.offset, size_t(r.count))) x *= inv;
  double norm_sq[1] = {sum_squares(k, grad_.data(), table_.on() ? ranges : counted_)};
  peers_->all_reduce(std::span<double>(norm_sq, 1), comm::ReduceOp::kSum);
  const double lr = lr_at(cfg_.optim, step, cfg_.train.steps);
  apply(std::sqrt(norm_sq[0]), lr, ranges);
  const bool last = step + 1 == cfg_.train.steps;
  std::vector<comm::Work> sent;
  for (int w = 0; w < W_; ++w)
    sent.push_back(table_.on() ? answer_sparse(w, norm_sq[0], step + 1, last, lr)
                               : answer(w, norm_sq[0], step + 1, last, lr));
  for (comm::Work& s : sent) s.wait();
  if (table_.on())  // the touched rows' gradient back to zero for the next round's sums
    for (const FlatRange& r : ranges) std::fill_n(grad_.data() + r.offset, r.count, 0.0f);
}

std::vector<FlatRange> PsServer::take_dense(int64_t step) {
  for (int w = 0; w < W_; ++w) {
    std::vector<float>& in = in_[size_t(w)];
    comm::Group& link = *links_[size_t(w)];
    link.recv(head_of(w), 0, parallel::ps_tag(step));
    LOOM_ASSERT(int64_t(head_of(w)[PsPush::kClock]) == step, "a sync push out of its round");
    record(w, head_of(w).data());
    link.recv(w == 0 ? g_ : std::span<float>(in.data(), size_t(own_.count)), 0, parallel::ps_tag(step));
    if (w > 0) std::transform(g_.begin(), g_.end(), in.begin(), g_.begin(), std::plus<float>());
  }
  return {own_};
}

// Note [Sparse embeddings]: grad_ is zero on the table between rounds; every push adds its
// dense pieces and rows (x + 0 is x: the first worker's bits as a copy would give them).
std::vector<FlatRange> PsServer::take_sparse(int64_t step) {
  using parallel::PsSparseHeader;
  std::vector<FlatRange> ranges = parallel::dense_pieces(own_, table_);
  for (const FlatRange& r : ranges) std::fill_n(grad_.data() + r.offset, r.count, 0.0f);
  std::vector<int32_t> rows;
  for (int w = 0; w < W_; ++w) {
    comm::Group& link = *links_[size_t(w)];
    float head[PsSparseHeader::kSize];
    link.recv(std::span<float>(head, PsSparseHeader::kSize), 0, parallel::ps_tag(step));
    LOOM_ASSERT(int64_t(head[PsSparseHeader::kClock]) == step, "a sync push out of its round");
    record(w, head);
    const int64_t n_push = int64_t(head[PsSparseHeader::kPushRows]), n_pull = int64_t(head[PsSparseHeader::kPullRows]);
    std::vector<float> ids(size_t(n_push + std::max<int64_t>(n_pull, 0) + 1));
    link.recv(std::span<float>(ids), 0, parallel::ps_tag(step));
    const std::vector<int32_t> push(ids.begin(), ids.begin() + n_push);
    pulls_[size_t(w)].assign(ids.begin() + n_push, ids.end() - 1);
    pull_all_[size_t(w)] = n_pull < 0;
    std::vector<FlatRange> pieces = parallel::dense_pieces(own_, table_);
    const std::vector<FlatRange> pushed = parallel::row_pieces(push, own_, table_);
    pieces.insert(pieces.end(), pushed.begin(), pushed.end());
    std::vector<float> payload(size_t(parallel::floats_of(pieces)));
    link.recv(std::span<float>(payload), 0, parallel::ps_tag(step));
    const float* at = payload.data();
    for (const FlatRange& r : pieces)
      for (int64_t i = 0; i < r.count; ++i) grad_[size_t(r.offset + i)] += *at++;
    for (int32_t r : push)
      if (!touched_[size_t(r)]) touched_[size_t(r)] = 1, rows.push_back(r);
  }
  std::sort(rows.begin(), rows.end());
  for (int32_t r : rows) touched_[size_t(r)] = 0;
  const std::vector<FlatRange> touched = parallel::row_pieces(rows, own_, table_);
  ranges.insert(ranges.end(), touched.begin(), touched.end());
  return ranges;
}

comm::Work PsServer::answer_sparse(int w, double norm_sq, int64_t version, bool stop, double lr) {
  std::vector<FlatRange> pieces = parallel::dense_pieces(own_, table_);
  const std::vector<FlatRange> pulled = pull_all_[size_t(w)] ? parallel::table_part(own_, table_)
                                                             : parallel::row_pieces(pulls_[size_t(w)], own_, table_);
  pieces.insert(pieces.end(), pulled.begin(), pulled.end());
  std::vector<float>& out = out_[size_t(w)];
  out.resize(size_t(parallel::floats_of(pieces) + PsAnswer::kTrailer));
  parallel::gather_ranges(params_.data(), pieces, out.data());
  float* t = out.data() + out.size() - PsAnswer::kTrailer;
  t[PsAnswer::kNormSq] = float(norm_sq), t[PsAnswer::kVersion] = float(version);
  t[PsAnswer::kStop] = stop ? 1.0f : 0.0f, t[PsAnswer::kLr] = float(lr);
  return links_[size_t(w)]->send(std::span<const float>(out), 0, parallel::ps_tag(version - 1), {.async = true});
}

// Note [Asynchronous parameter server]: one receive per running link at once; each push is
// decided (Note [Exact push count]) and, if admitted, applied as it lands; answers are held
// while ssp's bound says so.
void PsServer::run_free(int64_t first) {
  FreeRun& f = free_;
  f.budget = W_ * cfg_.train.steps;
  f.applied = f.taken = W_ * first;  // a resumed run's pushes go on from its step
  f.rx.resize(size_t(W_)), f.tx.resize(size_t(W_));
  f.clock.assign(size_t(W_), first), f.decided.assign(size_t(W_), first), f.applied_of.assign(size_t(W_), first);
  f.first_rejected.assign(size_t(W_), INT64_MAX);
  f.running.assign(size_t(W_), 1), f.owed.assign(size_t(W_), 0), f.parked.assign(size_t(W_), 0);
  f.rejected.assign(size_t(W_), 0);
  for (int w = 0; w < W_; ++w) post_push(w);
  int turn = 0;
  for (int left = W_; left > 0 || (me_ != 0 && f.verdicts < f.taken);) {
    bool moved = false;
    for (int w = 0; w < W_; ++w) moved = take_free(w, left) || moved;
    moved = take_verdicts() || moved;
    moved = answer_free(left) || moved;
    if (moved) continue;
    // Nothing landed: block (no spinning; a step takes milliseconds) on one pending receive
    // for up to a millisecond, taking the links in turn.
    bool waited = false;
    for (int i = 0; i < W_ && !waited; ++i, turn = (turn + 1) % W_)
      if (f.running[size_t(turn)] && !f.owed[size_t(turn)] && !f.parked[size_t(turn)])
        waited = true, f.rx[size_t(turn)].wait_for(std::chrono::milliseconds(1));
    if (!waited) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  for (comm::Work& s : f.tx) s.wait();
  for (auto& v : f.verdicts_out) v.sent.wait();
}

void PsServer::post_push(int w) {  // the next head; its slice follows it (a bye has none)
  free_.rx[size_t(w)] = links_[size_t(w)]->recv(head_of(w), 0, parallel::ps_tag(free_.clock[size_t(w)]), {.async = true});
}

// Worker w's push if it landed: its slice into in_[w], then decided now or parked until the
// leader's verdict. Returns whether anything happened.
bool PsServer::take_free(int w, int& left) {
  FreeRun& f = free_;
  if (!f.running[size_t(w)] || f.owed[size_t(w)] || f.parked[size_t(w)] || !f.rx[size_t(w)].done()) return false;
  f.rx[size_t(w)].wait();  // rethrows a failed receive's diagnosis
  const float* t = in_[size_t(w)].data() + own_.count;
  if (t[PsPush::kClock] < 0) {  // bye: the worker heard "stop" from another server
    f.running[size_t(w)] = 0, --left;
    return true;
  }
  const int64_t c = f.clock[size_t(w)];
  LOOM_ASSERT(int64_t(t[PsPush::kClock]) == c, "a push out of its worker's order");
  const int64_t before = f.taken++;
  ++f.clock[size_t(w)];
  // Note [Exact push count]: the leader decides; another server when it is certain: all
  // admitted pushes are in (refused), the leader's verdict is here, or the leader had taken
  // at most before + W - 1 pushes when this one reached it (admitted).
  const bool known = c < f.decided[size_t(w)];
  const bool certain = me_ == 0 || f.applied >= f.budget || known || before + W_ - 1 < f.budget;
  const bool admitted = me_ == 0 ? f.applied < f.budget
                        : f.applied >= f.budget ? false
                        : known ? c < f.first_rejected[size_t(w)]
                                : true;
  // An admitted push's slice lands straight in the gradient; a parked one's waits in in_[w].
  float* slice = certain && admitted ? g_.data() : in_[size_t(w)].data();
  links_[size_t(w)]->recv(std::span<float>(slice, size_t(own_.count)), 0, parallel::ps_tag(c));
  if (!certain) {
    f.parked[size_t(w)] = 1;
    return true;
  }
  decide(w, admitted, false);
  if (me_ == 0) send_verdict(w, c, admitted);
  return true;
}

// Applies worker w's taken push when admitted (its slice in g_, or in in_[w] when it was
// parked); either way an answer is owed.
void PsServer::decide(int w, bool admitted, bool parked) {
  FreeRun& f = free_;
  f.owed[size_t(w)] = 1, f.rejected[size_t(w)] = !admitted;
  if (!admitted) return;
  const float* t = in_[size_t(w)].data() + own_.count;
  record(w, t);
  ++f.applied_of[size_t(w)];
  if (parked) std::copy_n(in_[size_t(w)].data(), own_.count, g_.begin());
  const double lr = lr_at(cfg_.optim, f.applied / W_, cfg_.train.steps) / W_;
  apply(std::sqrt(double(t[PsPush::kNormSq])), lr, {own_});
  ++f.applied;
}

// The leader: its verdict on (w, c) to every other server, in the order it decides.
void PsServer::send_verdict(int w, int64_t c, bool admitted) {
  auto& out = free_.verdicts_out;
  while (!out.empty() && out.front().sent.done()) out.front().sent.wait(), out.pop_front();
  for (int s = 1; s < peers_->size(); ++s) {
    out.push_back({{float(w), float(c), admitted ? 1.0f : 0.0f}, {}});
    out.back().sent = peers_->send(std::span<const float>(out.back().msg), s, kVerdictTag, {.async = true});
  }
}

// A non-leader: the leader's verdicts as they land (one receive posted while one is owed),
// then every parked push whose verdict is known. Returns whether anything happened.
bool PsServer::take_verdicts() {
  FreeRun& f = free_;
  bool moved = false;
  for (;;) {
    if (!f.verdict_posted && f.verdicts < f.taken && me_ != 0) {
      f.verdict_rx = peers_->recv(std::span<float>(f.verdict_in), 0, kVerdictTag, {.async = true});
      f.verdict_posted = true;
    }
    if (!f.verdict_posted || !f.verdict_rx.done()) break;
    f.verdict_rx.wait();
    f.verdict_posted = false, moved = true, ++f.verdicts;
    const int w = int(f.verdict_in[0]);
    const int64_t c = int64_t(f.verdict_in[1]);
    LOOM_ASSERT(w >= 0 && w < W_ && c == f.decided[size_t(w)], "the leader's verdicts out of a worker's order");
    ++f.decided[size_t(w)];
    if (f.verdict_in[2] == 0) f.first_rejected[size_t(w)] = std::min(f.first_rejected[size_t(w)], c);
    // A push this server decided before the verdict came was decided as the leader did (the
    // bound of Note [Exact push count]).
    const bool decided_here = f.clock[size_t(w)] > c && !(f.parked[size_t(w)] && f.clock[size_t(w)] == c + 1);
    LOOM_ASSERT(!decided_here || (f.verdict_in[2] != 0) == (f.applied_of[size_t(w)] > c),
                "server ", me_, " decided push ", c, " of worker ", w, " otherwise than the leader");
  }
  for (int w = 0; w < W_; ++w) {
    const int64_t c = f.clock[size_t(w)] - 1;  // the parked push
    if (!f.parked[size_t(w)] || c >= f.decided[size_t(w)]) continue;
    f.parked[size_t(w)] = 0, moved = true;
    decide(w, c < f.first_rejected[size_t(w)], true);
  }
  return moved;
}

// Owed answers, unless ssp holds them: "stop" once the budget is in or for a refused push.
bool PsServer::answer_free(int& left) {
  FreeRun& f = free_;
  const bool full = f.applied >= f.budget;
  int64_t slowest = INT64_MAX;
  for (int w = 0; w < W_; ++w)
    if (f.running[size_t(w)]) slowest = std::min(slowest, f.clock[size_t(w)]);
  bool moved = false;
  for (int w = 0; w < W_; ++w) {
    if (!f.owed[size_t(w)]) continue;
    const bool stop = full || f.rejected[size_t(w)];
    if (cfg_.ps.mode == PsMode::kSsp && !stop && f.clock[size_t(w)] - slowest > cfg_.ps.staleness) continue;
    const float* t = in_[size_t(w)].data() + own_.count;
    f.tx[size_t(w)] = answer(w, double(t[PsPush::kNormSq]), slowest, stop,
                             lr_at(cfg_.optim, std::max<int64_t>(f.applied - 1, 0) / W_, cfg_.train.steps));
    f.owed[size_t(w)] = 0, moved = true;
    if (stop) f.running[size_t(w)] = 0, --left;
    else post_push(w);
  }
  return moved;
}

// A server's part in the one step loop (Note [One step loop]): a synchronous round per
// step; free-running, the whole run as one step (its pushes arrive in no step order), the
// checkpoint at its end.
class ServerRole final : public Role {
 public:
  ServerRole(const Config& cfg, PsServer& server) : cfg_(cfg), s_(server) {}
  int64_t resume() override { return s_.resume(); }
  bool runs(int64_t step, int64_t first) const override {
    if (cfg_.ps.free_running()) return step == first && first < cfg_.train.steps;  // else the workers run none either
    return step < cfg_.train.steps;
  }
  Step step(int64_t step) override {
    Step out;
    out.outcome.step = step;
    if (cfg_.ps.free_running()) s_.run_free(step);
    else s_.sync_round(step);
    out.outcome.last = cfg_.ps.free_running() || step + 1 == cfg_.train.steps;
    return out;
  }
  ShardState state() override { return s_.state(); }
  std::span<const float> params() override { return s_.params(); }

 private:
  const Config& cfg_;
  PsServer& s_;
};

}  // namespace

TrainSummary run_ps_server(const Config& cfg, const TrainOptions& opt, comm::World& world) {
  auto owned = std::make_unique<PsServer>(cfg, opt, world);
  PsServer& server = *owned;
  try {
    ServerRole role(cfg, server);
    const Spans spans(nullptr);  // servers write no trace
    CheckpointTrigger checkpoints(cfg, role, &world, spans);
    StepObserver* const observers[] = {&checkpoints};  // its workers log and validate
    run_steps(role, cfg, world.global_rank(), spans, observers);
  } catch (...) {
    // A failed link (a dead worker) leaves the other links' receives posted into this
    // server's buffers, and their threads wait in them: freeing the buffers would let a live
    // worker's next push land in freed memory, and joining the threads could wait out the
    // timeout. The run is over; the server is left to the process's exit.
    (void)owned.release();
    throw;
  }
  TrainSummary sum;
  sum.params = ParamLayout(cfg.model).param_count();
  agree_ps_figures(world.world_group(), sum, server.pushes, server.max_stale,
                   server.pushes > 0 ? server.sum_stale / server.pushes : 0.0);
  return sum;
}

void agree_ps_figures(comm::Group& world_group, TrainSummary& sum, double pushes, double max_stale,
                      double mean_stale) {
  double v[3] = {pushes, max_stale, mean_stale};
  world_group.all_reduce(std::span<double>(v, 3), comm::ReduceOp::kMax);
  sum.ps_pushes = int64_t(v[0]), sum.ps_max_staleness = v[1], sum.ps_mean_staleness = v[2];
}

void finish_ps_worker(const Config& cfg, const RankContext& rc, const parallel::PsWorker& ps, Reporter& rep,
                      TrainSummary& sum, int64_t& tokens) {
  if (cfg.ps.free_running()) {
    double t[1] = {double(tokens)};
    everyone(rc)->all_reduce(std::span<double>(t, 1), comm::ReduceOp::kSum);
    tokens = int64_t(t[0]);
  }
  agree_ps_figures(rc.world->world_group(), sum, 0, 0, 0);
  sum.ps_worker_pushes = int64_t(sum.losses.size());
  sum.ps_bytes_per_step = ps.bytes_per_step(), sum.ps_table_bytes_per_step = ps.table_bytes_per_step();
  std::ostringstream os;
  os << "parameter servers (ps.mode " << name_of(cfg.ps.mode) << (cfg.ps.sparse_embedding ? ", sparse embedding" : "")
     << "): " << sum.ps_pushes << " pushes applied, worker 0 made " << sum.ps_worker_pushes << "; gradient staleness max "
     << sum.ps_max_staleness << ", mean " << std::fixed << std::setprecision(2) << sum.ps_mean_staleness << " steps";
  if (cfg.ps.mode == PsMode::kSsp) os << " (bound ps.staleness = " << cfg.ps.staleness << ")";
  os << "; worker 0 sent + received " << sum.ps_bytes_per_step / 1e6 << " MB per step, the embedding table's "
     << sum.ps_table_bytes_per_step / 1e6 << " MB";
  rep.info(os.str());
}

void choose_ps_rows(const Config& cfg, const DataLoader& data, parallel::PsWorker& ps, int64_t step, int64_t mb,
                    int64_t T) {
  const int64_t accum = cfg.train.grad_accum;
  parallel::RowSet set(cfg.model.vocab);
  std::vector<int32_t> tok(size_t(mb * T)), tgt(tok.size());
  auto rows_of = [&](int64_t s) {
    for (int64_t micro = 0; micro < accum; ++micro) {
      const int64_t rows = data.train_batch(s, micro, accum, cfg.train.batch, tok.data(), tgt.data());
      set.add(tok.data(), rows * T);
    }
    return set.take();
  };
  // The last step's pulls were this step's rows: read the batch again only when it pulled all.
  const std::vector<int32_t>* known = ps.rows_known_for(step);
  std::vector<int32_t> push = known ? *known : rows_of(step);
  const bool all = validates(cfg, step) || step + 1 == cfg.train.steps;
  ps.set_rows(step, std::move(push), all ? std::vector<int32_t>{} : rows_of(step + 1), all);
}

}  // namespace loom
