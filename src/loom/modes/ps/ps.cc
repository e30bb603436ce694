#include "loom/modes/ps/ps.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>

#include "loom/comm/mesh.h"
#include "loom/comm/world.h"
#include "loom/core/error.h"

namespace loom::parallel {

namespace {

// `groups` of some ranks, each other rank of the world alone (a partition of the world).
std::vector<std::vector<int>> padded(std::vector<std::vector<int>> groups, int world_size) {
  std::vector<char> in(size_t(world_size), 0);
  for (const std::vector<int>& g : groups)
    for (int r : g) in[size_t(r)] = 1;
  for (int r = 0; r < world_size; ++r)
    if (!in[size_t(r)]) groups.push_back({r});
  return groups;
}

}  // namespace

PsGroups ps_groups(comm::World& world, const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  const int workers = int(p.world()), n = world.world_size(), me = world.global_rank();
  LOOM_CHECK(n == p.ranks(), "a parameter-server job of ", workers, " workers and ", p.servers(), " servers needs ",
             p.ranks(), " ranks, got ", n);
  PsGroups g;
  std::vector<int> w(static_cast<size_t>(workers)), s(static_cast<size_t>(p.servers()));
  std::iota(w.begin(), w.end(), 0);
  std::iota(s.begin(), s.end(), workers);
  g.role = world.group(std::vector<std::vector<int>>{w, s}, "ps_role");
  // Worker r's link: r, then its shard's servers (the worker is member 0, server s member 1 + s).
  const bool server = me >= workers;
  const int my_shard = server ? rank::ps_place(p, me).shard : -1;
  for (int r = 0; r < workers; ++r) {
    std::vector<int> link = {r};
    const int shard = rank::ps_shard_of(p, r);
    for (int x : rank::ps_servers_of(p, shard)) link.push_back(x);
    std::unique_ptr<comm::Group> l = world.group(padded({link}, n), "ps_link");
    if (r == me || shard == my_shard) g.links.push_back(std::move(l));
  }
  // The training mesh's groups among the workers; every server alone in each.
  const comm::Mesh mesh = comm::training_mesh(p);
  auto keep = [&](std::unique_ptr<comm::Group> x) { return x->size() > 1 ? std::move(x) : nullptr; };
  if (p.tp > 1) g.tp = keep(world.group(padded(mesh.groups({"tp"}), n), "tp"));
  if (p.tp * p.pp > 1) g.replica = keep(world.group(padded(mesh.groups({"pp", "tp"}), n), "ps_replica"));
  if (p.pp > 1 && cfg.model.arch == Arch::kGpt && p.schedule != ScheduleKind::kZbV) {
    std::vector<std::vector<int>> ends;
    for (const std::vector<int>& pipe : mesh.groups({"pp"})) ends.push_back({pipe.front(), pipe.back()});
    g.embed = keep(world.group(padded(ends, n), "embed"));
  }
  if (p.pp > 1) g.pipe = parallel::make_pipe_links(world, mesh, p.vpp > 1 && p.schedule == ScheduleKind::kInterleaved1F1B);
  return g;
}

int ps_tag(int64_t clock) { return int(clock % kPsInitTag); }

PsWorker::PsWorker(comm::Group& link, std::vector<FlatRange> ranges)
    : link_(link), ranges_(std::move(ranges)), versions_(ranges_.size(), 0.0f), heads_(ranges_.size()),
      tails_(ranges_.size()), payloads_(ranges_.size()), answers_(ranges_.size()), back_(ranges_.size()) {
  LOOM_ASSERT(link_.size() == int(ranges_.size()) + 1, "a PS link holds the worker and every server");
}

void PsWorker::init_servers(const float* params) {
  for (size_t s = 0; s < ranges_.size(); ++s)
    link_.send(std::span<const float>(params + ranges_[s].offset, size_t(ranges_[s].count)), 1 + int(s), kPsInitTag);
}

// Note [Parameter server]: per server, the push's head (clock, version, norm) and then its
// slice of `grads`, sent from where they lie; both queue on the link's thread, so `grads`
// stays untouched until wait().
int64_t PsWorker::push(const float* grads, int64_t clock, double norm_sq) {
  if (before_push) before_push(clock);
  LOOM_ASSERT(pending_.empty(), "a PS push before the last one's wait");
  if (sparse_) return push_sparse(grads, clock, norm_sq);
  for (size_t s = 0; s < ranges_.size(); ++s) {
    const FlatRange& r = ranges_[s];
    heads_[s] = {float(clock), versions_[s], float(norm_sq)};
    pending_.push_back(link_.send(std::span<const float>(heads_[s]), 1 + int(s), ps_tag(clock), {.async = true}));
    pending_.push_back(link_.send(std::span<const float>(grads + r.offset, size_t(r.count)), 1 + int(s), ps_tag(clock),
                                  {.async = true}));
    back_[s] = {r};
    bytes_ += 4.0 * double(2 * r.count + PsPush::kTrailer + PsAnswer::kTrailer);
    table_bytes_ += 8.0 * double(floats_of(table_part(r, table_)));
  }
  return pushed_ = clock;
}

// The answers to push `pushed_`: each server's floats straight into `params` (its slice, or
// under sparse embeddings its dense pieces and the pulled rows), then its tail.
int64_t PsWorker::pull(float* params) {
  pulled_into_ = params;
  for (size_t s = 0; s < ranges_.size(); ++s) {
    if (sparse_) {  // one packed answer, scattered by wait()
      answers_[s].resize(size_t(floats_of(back_[s]) + PsAnswer::kTrailer));
      pending_.push_back(link_.recv(std::span<float>(answers_[s]), 1 + int(s), ps_tag(pushed_), {.async = true}));
      continue;
    }
    const FlatRange& r = ranges_[s];
    pending_.push_back(link_.recv(std::span<float>(params + r.offset, size_t(r.count)), 1 + int(s), ps_tag(pushed_),
                                  {.async = true}));
    pending_.push_back(link_.recv(std::span<float>(tails_[s]), 1 + int(s), ps_tag(pushed_), {.async = true}));
  }
  return pushed_;
}

PsReply PsWorker::wait(int64_t ts) {
  LOOM_ASSERT(ts == pushed_, "a PS wait for a pull that was not the last");
  for (comm::Work& w : pending_) w.wait();
  pending_.clear();
  calls_++;
  PsReply reply;
  stopped_.assign(ranges_.size(), 0);
  for (size_t s = 0; s < ranges_.size(); ++s) {
    if (sparse_) {
      const int64_t n = scatter_ranges(answers_[s].data(), back_[s], pulled_into_);
      std::copy_n(answers_[s].data() + n, PsAnswer::kTrailer, tails_[s].begin());
    }
    const std::array<float, PsAnswer::kTrailer>& t = tails_[s];
    versions_[s] = t[PsAnswer::kVersion];
    stopped_[s] = t[PsAnswer::kStop] != 0;
    reply.stop = reply.stop || stopped_[s];
    if (s == 0) reply.norm = std::sqrt(double(t[PsAnswer::kNormSq])), reply.lr = double(t[PsAnswer::kLr]);
  }
  return reply;
}

// A bye (a head with clock -1) to every server still waiting for our next push.
void PsWorker::bye() {
  for (size_t s = 0; s < ranges_.size(); ++s)
    if (!stopped_[s]) {
      LOOM_ASSERT(!sparse_, "sparse embeddings run under ps.mode = sync only: every server stops together");
      heads_[s] = {-1.0f, versions_[s], 0.0f};
      link_.send(std::span<const float>(heads_[s]), 1 + int(s), ps_tag(pushed_ + 1));
      stopped_[s] = 1;
    }
}

PsReply PsWorker::push_pull(const float* grads, float* params, int64_t clock, double norm_sq) {
  return wait(pull((push(grads, clock, norm_sq), params)));
}

void PsWorker::set_rows(int64_t step, std::vector<int32_t> push, std::vector<int32_t> pull, bool pull_all) {
  push_rows_ = std::move(push), pull_rows_ = std::move(pull), pull_all_ = pull_all, pulls_step_ = step + 1;
}

// Note [Sparse embeddings]: per server, the header, the ids of its rows, then the dense
// pieces and the pushed rows (packed: they stay in payloads_ until wait()); the answer
// brings the dense pieces and the pulled rows.
int64_t PsWorker::push_sparse(const float* grads, int64_t clock, double norm_sq) {
  for (size_t s = 0; s < ranges_.size(); ++s) {
    const FlatRange& r = ranges_[s];
    const std::vector<int32_t> push = rows_within(push_rows_, r, table_), pull = rows_within(pull_rows_, r, table_);
    sparse_head_ = {float(clock), versions_[s], float(norm_sq), float(push.size()), pull_all_ ? -1.0f : float(pull.size())};
    link_.send(std::span<const float>(sparse_head_), 1 + int(s), ps_tag(clock));
    std::vector<float> ids(push.begin(), push.end());
    if (!pull_all_) ids.insert(ids.end(), pull.begin(), pull.end());
    ids.push_back(0.0f);  // never empty
    link_.send(std::span<const float>(ids), 1 + int(s), ps_tag(clock));
    std::vector<FlatRange> pieces = dense_pieces(r, table_);
    const std::vector<FlatRange> pushed = row_pieces(push, r, table_);
    pieces.insert(pieces.end(), pushed.begin(), pushed.end());
    payloads_[s].resize(size_t(floats_of(pieces)));
    gather_ranges(grads, pieces, payloads_[s].data());
    pending_.push_back(link_.send(std::span<const float>(payloads_[s]), 1 + int(s), ps_tag(clock), {.async = true}));
    back_[s] = dense_pieces(r, table_);
    const std::vector<FlatRange> pulled = pull_all_ ? table_part(r, table_) : row_pieces(pull, r, table_);
    back_[s].insert(back_[s].end(), pulled.begin(), pulled.end());
    bytes_ += 4.0 * double(PsSparseHeader::kSize + int64_t(ids.size()) + int64_t(payloads_[s].size()) +
                           floats_of(back_[s]) + PsAnswer::kTrailer);
    table_bytes_ += 4.0 * double(floats_of(pushed) + floats_of(pulled) + int64_t(ids.size()));
  }
  return pushed_ = clock;
}

}  // namespace loom::parallel
