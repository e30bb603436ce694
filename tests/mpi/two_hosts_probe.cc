// Run by tests/mpi/check_two_hosts.sh across the two network namespaces of
// scripts/netns_two_hosts.sh (2 ranks per host): the world must see two nodes, mesh groups
// must place tp inside a node and dp across, and every all-reduce algorithm (hierarchical
// included) must produce the closed-form sums over TCP.
#include <cstdio>
#include <set>

#include "loom/comm/mpi_backend.h"
#include "loom/comm/world.h"

using namespace loom::comm;

int main() {
  int rank = -1;
  try {
    World w(make_mpi_backend(), CommOptions{});
    rank = w.global_rank();
    const int n = w.world_size();
    const std::set<std::string> hosts(w.hosts().begin(), w.hosts().end());
    LOOM_CHECK(hosts.size() == 2, "expected 2 hosts, the world sees ", hosts.size());
    LOOM_CHECK(w.world_group().nodes() == 2, "world group spans ", w.world_group().nodes(), " nodes, expected 2");
    const Mesh mesh({{"dp", 2}, {"tp", n / 2}}, n);
    std::unique_ptr<Group> tp = w.group(mesh, {"tp"}), dp = w.group(mesh, {"dp"});
    LOOM_CHECK(tp->nodes() == 1 && tp->has_shared_memory(), "tp group should sit inside one node");
    LOOM_CHECK(dp->nodes() == 2, "dp group should span both nodes");
    for (Algorithm a : {Algorithm::kAuto, Algorithm::kHierarchical, Algorithm::kRing, Algorithm::kRecursive})
      for (size_t count : {size_t(1), size_t(4099), size_t(1 << 20)}) {
        std::vector<float> x(count);
        for (size_t i = 0; i < count; ++i) x[i] = float((rank + 1) * int(i % 7 + 1));
        w.world_group().all_reduce(std::span(x), ReduceOp::kSum, {a});
        for (size_t i = 0; i < count; ++i)
          LOOM_CHECK(x[i] == float(n * (n + 1) / 2 * int(i % 7 + 1)), algorithm_name(a), " count ", count,
                     ": element ", i, " = ", x[i]);
      }
    if (w.ledger().entries().size() > 0 && rank == 0)
      std::printf("two hosts: %zu hosts, world spans %d nodes, all algorithms correct\n", hosts.size(),
                  w.world_group().nodes());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: FAIL: %s\n", rank, e.what());
    return 1;
  }
  return 0;
}
