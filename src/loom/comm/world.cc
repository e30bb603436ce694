#include "loom/comm/world.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <sstream>

namespace loom::comm {

World::World(std::unique_ptr<Backend> backend, CommOptions options)
    : backend_(std::move(backend)), options_(options) {
  LOOM_CHECK(options_.timeout.count() > 0, "comm.timeout_s must be > 0, got ", options_.timeout.count() * 1e-3);
  global_rank_ = backend_->global_rank();
  world_size_ = backend_->world_size();
  backend_->set_status_source([this] { return status(); });
  hosts_ = backend_->hosts();
  std::vector<int> all(world_size_);
  for (int r = 0; r < world_size_; ++r) all[r] = r;
  world_group_ = group({all}, "world");
}

World::~World() {
  world_group_.reset();
  backend_->set_status_source(nullptr);
}

namespace {

// "dp[1]{1,5,9}"; long member lists keep their ends: "{0,2,4,...,62}".
std::string group_name(const std::string& label, int index, const std::vector<int>& members) {
  std::ostringstream os;
  os << label << "[" << index << "]{";
  const size_t n = members.size();
  for (size_t i = 0; i < n; ++i) {
    if (n > 8 && i == 3) {
      os << ",...";
      i = n - 2;
      continue;
    }
    os << (i ? "," : "") << members[i];
  }
  os << "}";
  return os.str();
}

}  // namespace

std::unique_ptr<Group> World::group(const std::vector<std::vector<int>>& partition, const std::string& label) {
  std::vector<int> seen(world_size_, 0);
  int mine = -1;
  for (size_t g = 0; g < partition.size(); ++g)
    for (int r : partition[g]) {
      LOOM_CHECK(r >= 0 && r < world_size_, "group ", label, ": rank ", r, " is outside the world [0, ", world_size_, ")");
      LOOM_CHECK(seen[r]++ == 0, "group ", label, ": rank ", r, " appears in more than one group");
      if (r == global_rank_) mine = static_cast<int>(g);
    }
  LOOM_CHECK(mine >= 0, "group ", label, ": rank ", global_rank_, " is in none of the groups");
  const std::string name = group_name(label, mine, partition[mine]);
  // Making communicators blocks inside the library with no timeout: meet first in a
  // bounded barrier, so a rank that never arrives is diagnosed instead of hanging all.
  if (world_group_) world_group_->barrier();
  GroupTransports t;
  t.main = backend_->make_transport(partition, name);
  // Groups spanning hosts also get per-node and per-leader transports. Every rank knows
  // every host, so all ranks agree on whether these (world-collective) calls happen.
  bool any_spans = false;
  std::vector<std::vector<int>> by_node, leaders;
  for (size_t gi = 0; gi < partition.size(); ++gi) {
    std::vector<std::string> seen;
    std::vector<std::vector<int>> nodes;
    for (int r : partition[gi]) {
      const size_t k = std::find(seen.begin(), seen.end(), hosts_[r]) - seen.begin();
      if (k == seen.size()) {
        seen.push_back(hosts_[r]);
        nodes.emplace_back();
      }
      nodes[k].push_back(r);
    }
    any_spans = any_spans || nodes.size() > 1;
    if (static_cast<int>(gi) == mine) {
      t.nodes = static_cast<int>(nodes.size());
      for (const auto& node : nodes) t.per_node = std::max(t.per_node, static_cast<int>(node.size()));
    }
    leaders.emplace_back();
    for (auto& node : nodes) {
      leaders.back().push_back(node[0]);
      by_node.push_back(std::move(node));
    }
  }
  if (any_spans) {
    std::unique_ptr<Transport> intra = backend_->make_transport(by_node, name + "/node");
    std::unique_ptr<Transport> inter = backend_->make_transport(leaders, name + "/leaders");
    if (t.nodes > 1) {
      t.intra = std::move(intra);
      t.inter = std::move(inter);
    }
  }
  return std::make_unique<Group>(*this, name, partition[mine], std::move(t));
}

std::unique_ptr<Group> World::group(const Mesh& mesh, const std::vector<std::string>& axes) {
  LOOM_CHECK(mesh.world_size() == world_size_, "mesh ", mesh.to_string(), " has ", mesh.world_size(),
             " ranks but the world has ", world_size_);
  std::string label;
  for (const std::string& a : axes) label += (label.empty() ? "" : "+") + a;
  return group(mesh.groups(axes), label.empty() ? "self" : label);
}

std::string encode_status(const RankStatus& s) {
  nlohmann::json j;
  j["rank"] = s.global_rank;
  j["state"] = s.state;
  j["last"] = s.last;
  j["groups"] = nlohmann::json::array();
  for (const GroupProgress& g : s.groups)
    j["groups"].push_back({{"name", g.group}, {"issued", g.issued}, {"completed", g.completed}, {"last", g.last}});
  return j.dump();
}

RankStatus decode_status(std::string_view text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    RankStatus s;
    s.global_rank = j.at("rank").get<int>();
    s.state = j.at("state").get<std::string>();
    s.last = j.at("last").get<std::string>();
    for (const auto& g : j.at("groups"))
      s.groups.push_back({g.at("name").get<std::string>(), g.at("issued").get<uint64_t>(),
                          g.at("completed").get<uint64_t>(), g.at("last").get<std::string>()});
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw CommError(detail::cat("malformed status message from a peer: ", e.what()));
  }
}

}  // namespace loom::comm
