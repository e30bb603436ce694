#include "loom/train/rank_context.h"

#include <algorithm>
#include <string>

#include "loom/comm/world.h"
#include "loom/core/error.h"
#include "loom/model/tp_slice.h"
#include "loom/modes/ps/ps.h"

namespace loom {

namespace {

class GroupTpComm : public TpComm {
 public:
  explicit GroupTpComm(comm::Group& g) : g_(g) {}
  void all_reduce_sum(float* x, int64_t n) override { g_.all_reduce(std::span<float>(x, size_t(n)), comm::ReduceOp::kSum); }
  void all_reduce_max(float* x, int64_t n) override { g_.all_reduce(std::span<float>(x, size_t(n)), comm::ReduceOp::kMax); }
  void broadcast(float* x, int64_t n, int root) override { g_.broadcast(std::span<float>(x, size_t(n)), root); }
  void reduce_sum(float* x, int64_t n, int root) override {
    in_.assign(x, x + n);  // the reduce reads and writes separate buffers
    g_.reduce(std::span<const float>(in_), std::span<float>(x, size_t(n)), root, comm::ReduceOp::kSum);
  }
  void all_gather_blocks(float* full, int64_t block) override {
    std::span<float> all(full, size_t(block * g_.size()));
    g_.all_gather(std::span<const float>(all.subspan(size_t(block * g_.group_rank()), size_t(block))), all);
  }
  void reduce_scatter_blocks(float* full, int64_t block) override {
    std::span<float> all(full, size_t(block * g_.size()));
    g_.reduce_scatter(std::span<const float>(all), all.subspan(size_t(block * g_.group_rank()), size_t(block)),
                      comm::ReduceOp::kSum);
  }
  std::function<void()> ring_shift(const float* send, float* recv, int64_t n) override {
    constexpr int kTag = 7;  // the cp group carries only ring shifts; sends and receives pair in issue order
    const int me = g_.group_rank(), size = g_.size();
    comm::Work w = g_.batch({comm::isend_op(std::span<const float>(send, size_t(n)), (me + 1) % size, kTag),
                             comm::irecv_op(std::span<float>(recv, size_t(n)), (me + size - 1) % size, kTag)},
                            {.async = true});
    return [w]() mutable { w.wait(); };
  }
  void all_to_all_blocks(const float* in, float* out, int64_t block) override {
    const size_t n = size_t(block * g_.size());
    g_.all_to_all(std::span<const float>(in, n), std::span<float>(out, n));
  }

 private:
  comm::Group& g_;
  std::vector<float> in_;
};


// Note [hpZ]: every dp group split by host, each part in dp order; every host must hold the
// same number of each dp group's ranks (the secondary pieces split units evenly).
std::unique_ptr<comm::Group> host_group(comm::World& world, const comm::Mesh& mesh) {
  std::vector<std::vector<int>> partition;
  for (const std::vector<int>& dp : mesh.groups({"dp"})) {
    std::vector<std::string> hosts;
    std::vector<std::vector<int>> parts;
    for (int r : dp) {
      const std::string& h = world.hosts()[size_t(r)];
      const size_t i = size_t(std::find(hosts.begin(), hosts.end(), h) - hosts.begin());
      if (i == hosts.size()) hosts.push_back(h), parts.emplace_back();
      parts[i].push_back(r);
    }
    for (size_t i = 1; i < parts.size(); i++)
      LOOM_CHECK(parts[i].size() == parts[0].size(), "parallel.zeropp_hpz needs the same number of a dp group's ",
                 "ranks on every host; host ", hosts[i], " has ", parts[i].size(), " and host ", hosts[0], " has ",
                 parts[0].size(), ": place ranks evenly or leave parallel.zeropp_hpz = false");
    partition.insert(partition.end(), parts.begin(), parts.end());
  }
  return world.group(partition, "dp_node");
}

}  // namespace

comm::Group* everyone(const RankContext& rc) {
  if (rc.ps) return rc.stats ? rc.stats.get() : rc.ps_workers.get();
  return rc.world ? &rc.world->world_group() : nullptr;
}

void RankContext::stats_sum(std::span<double> x) const {
  if (stats) stats->all_reduce(x, comm::ReduceOp::kSum);
}

RankContext make_rank_context(const Config& cfg, comm::World* world) {
  const ParallelConfig& p = cfg.parallel;
  RankContext rc;
  rc.world = world;
  rc.zero = int(p.zero);
  rc.plan = std::make_shared<const RankPlan>(plan_rank(cfg, world ? world->global_rank() : 0));
  const int pp = int(p.pp), vpp = int(p.vpp);
  if (world && p.ps_servers > 0) {  // Note [Parameter server]: a worker; no collective dp group
    parallel::PsGroups g = parallel::ps_groups(*world, cfg);
    rc.logging = world->global_rank() == 0;
    rc.dp_rank = rc.plan->dp_rank, rc.dp_size = int(p.dp);
    rc.pp_rank = rc.plan->pp_rank, rc.pp_size = pp;
    rc.tp_rank = rc.plan->tp_rank, rc.tp_size = int(p.tp);
    (cfg.ps.free_running() ? rc.ps_workers : rc.stats) = std::move(g.role);
    rc.ps = std::move(g.links[0]);
    rc.ps_replica = std::move(g.replica), rc.embed = std::move(g.embed), rc.links = std::move(g.pipe);
    if ((rc.tp = std::move(g.tp))) rc.tp_comm = std::make_unique<GroupTpComm>(*rc.tp);
    LOOM_ASSERT(!rc.tp || rc.tp->group_rank() == rc.tp_rank, "the tp group disagrees with the mesh");
  } else if (world) {
    const comm::Mesh mesh = comm::training_mesh(p);
    rc.pp_rank = rc.plan->pp_rank, rc.pp_size = pp;
    rc.logging = world->global_rank() == 0;
    if (p.dp_ranks() > 1) {  // dp x cp ranks (Note [Context-parallel chunks])
      rc.dp = world->group(mesh, {"dp"});
      rc.dp_rank = rc.dp->group_rank(), rc.dp_size = rc.dp->size();
    }
    if (p.cp > 1) {  // a replica's cp ranks: consecutive along the dp axis
      std::vector<std::vector<int>> partition;
      for (const std::vector<int>& dp : mesh.groups({"dp"}))
        for (size_t i = 0; i < dp.size(); i += size_t(p.cp)) partition.emplace_back(dp.begin() + long(i), dp.begin() + long(i) + p.cp);
      rc.cp = world->group(partition, "cp");
      rc.cp_rank = rc.cp->group_rank(), rc.cp_size = rc.cp->size();
      rc.cp_comm = std::make_unique<GroupTpComm>(*rc.cp);
      LOOM_ASSERT(rc.cp_rank == rc.dp_rank % int(p.cp), "the cp group disagrees with the mesh");
    }
    if (p.dp_ranks() > 1 && p.zeropp_hpz) rc.dp_node = host_group(*world, mesh);
    if (p.tp > 1) {
      rc.tp = world->group(mesh, {"tp"});
      rc.tp_rank = rc.tp->group_rank(), rc.tp_size = rc.tp->size();
      rc.tp_comm = std::make_unique<GroupTpComm>(*rc.tp);
    }
    LOOM_ASSERT(rc.dp_rank == rc.plan->dp_rank && rc.tp_rank == rc.plan->tp_rank, "groups disagree with the mesh");
    if (world->world_size() > 1) rc.stats = world->group(mesh, {"pp", "dp", "tp"});
    if (p.pp_vocab) {  // Note [Vocabulary passes]: a pipeline's ranks (x tp where the vocabulary splits over it)
      rc.vocab = world->group(mesh, p.vocab_parallel ? std::vector<std::string>{"pp", "tp"} : std::vector<std::string>{"pp"});
      rc.vocab_comm = std::make_unique<GroupTpComm>(*rc.vocab);
      LOOM_ASSERT(rc.vocab->group_rank() == rc.plan->part.vocab_index(), "the vocabulary group disagrees with the mesh");
    }
    // GPT's tied wte: the first and last stage hold a copy each, unless one rank holds both
    // (ZB-V) or every rank holds its rows of the one table (pp_vocab).
    if (pp > 1 && cfg.model.arch == Arch::kGpt && p.schedule != ScheduleKind::kZbV && !p.pp_vocab) {
      std::vector<std::vector<int>> partition;
      for (const auto& pipe : mesh.groups({"pp"})) {
        partition.push_back({pipe.front(), pipe.back()});
        for (size_t i = 1; i + 1 < pipe.size(); i++) partition.push_back({pipe[i]});
      }
      std::unique_ptr<comm::Group> g = world->group(partition, "embed");
      if (g->size() == 2) rc.embed = std::move(g);
      if (updates_per_batch(p.schedule)) {
        std::unique_ptr<comm::Group> down = world->group(partition, "tied_down");
        if (down->size() == 2) rc.tied_down = std::move(down);
      }
    }
    if (pp > 1) rc.links = parallel::make_pipe_links(*world, mesh, vpp > 1 && p.schedule == ScheduleKind::kInterleaved1F1B);
  }
  rc.part = rc.plan->part;
  rc.schedule = rc.plan->schedule;
  rc.act_slots = rc.plan->act_slots;
  return rc;
}


std::vector<float> gather_whole(const ModelConfig& m, const ParamLayout& mine, const float* flat,
                                const RankContext& rc) {
  const ParamLayout whole(m);
  std::vector<float> out(size_t(whole.total_floats()), 0.0f);
  if (rc.dp_rank == 0)
    for (const ParamSpec& s : mine.specs()) {
      if (!rc.counts(s, m)) continue;
      const ParamSpec& w = whole.at(s.name);
      local_to_whole(s, w.shape, flat + s.offset, out.data() + w.offset, rc.tp_size, rc.tp_rank);
    }
  // A free-running PS job's workers have no stats group: everyone(rc) is all of them.
  if (comm::Group* all = rc.ps ? everyone(rc) : rc.stats.get()) all->all_reduce(std::span<float>(out), comm::ReduceOp::kSum);
  return out;
}


}  // namespace loom
