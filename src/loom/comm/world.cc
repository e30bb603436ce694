#include "loom/comm/world.h"

#include <nlohmann/json.hpp>

#include <sstream>

namespace loom::comm {

World::World(std::unique_ptr<Backend> backend, CommOptions options)
    : backend_(std::move(backend)), options_(options) {
  LOOM_CHECK(options_.timeout.count() > 0, "comm.timeout_s must be > 0, got ", options_.timeout.count() * 1e-3);
  global_rank_ = backend_->global_rank();
  world_size_ = backend_->world_size();
  backend_->set_status_source([this] { return status(); });
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
  std::unique_ptr<Transport> t = backend_->make_transport(partition, name);
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
