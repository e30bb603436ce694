// One rank's view of the collective layer: its backend, ledger and options, and the
// groups made from a mesh (Note [Groups from the mesh]). Nothing here is global: every
// rank's World is an object the caller owns.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loom/comm/group.h"
#include "loom/comm/ledger.h"
#include "loom/comm/mesh.h"
#include "loom/comm/transport.h"

namespace loom::comm {

struct CommOptions {
  // Bound on every collective (comm.timeout_s).
  std::chrono::milliseconds timeout{300'000};
  // How long a rank that timed out waits for the others' status, at most half the timeout;
  // collectives give up that much early, so a failure is diagnosed by `timeout`.
  std::chrono::milliseconds status_grace{5'000};
  // Debug mode: group members compare each collective's descriptor before running it.
  bool check_desync = false;
};

class World {
 public:
  World(std::unique_ptr<Backend> backend, CommOptions options);
  ~World();

  int global_rank() const { return global_rank_; }
  int world_size() const { return world_size_; }
  const CommOptions& options() const { return options_; }
  Ledger& ledger() { return ledger_; }
  Backend& backend() { return *backend_; }
  RankStatus status() const { return ledger_.status(global_rank_); }

  // Groups must be destroyed before their World (they use its backend and ledger).
  // Collective over the world: every rank makes the same groups in the same order. Starts
  // with a world barrier bounded by comm.timeout_s (the library's own communicator
  // creation cannot time out).
  // The returned group is the one containing this rank, named like "dp[1]{1,5,9}".
  std::unique_ptr<Group> group(const Mesh& mesh, const std::vector<std::string>& axes);
  std::unique_ptr<Group> group(const std::vector<std::vector<int>>& partition, const std::string& label);
  // All ranks, made at construction.
  Group& world_group() { return *world_group_; }
  const std::vector<std::string>& hosts() const { return hosts_; }

 private:
  std::unique_ptr<Backend> backend_;
  CommOptions options_;
  Ledger ledger_;
  int global_rank_ = 0, world_size_ = 1;
  std::vector<std::string> hosts_;  // host of every global rank
  std::unique_ptr<Group> world_group_;
};

// Runs fn(world) on n threads, each with its own World over one in-process thread
// backend. Returns one entry per rank: empty if fn returned, else the error text.
// `hosts` (one per rank) makes ranks pretend to sit on different nodes.
std::vector<std::string> run_threads(int n, const CommOptions& options, const std::function<void(World&)>& fn,
                                     std::vector<std::string> hosts = {});

}  // namespace loom::comm
