#include "loom/comm/mesh.h"

#include <sstream>

#include "loom/core/error.h"

namespace loom::comm {

Mesh::Mesh(std::vector<MeshAxis> axes, int world_size) : axes_(std::move(axes)), world_size_(world_size) {
  LOOM_CHECK(world_size >= 1, "mesh: world size must be >= 1, got ", world_size);
  long long product = 1;
  for (size_t i = 0; i < axes_.size(); ++i) {
    const MeshAxis& a = axes_[i];
    LOOM_CHECK(!a.name.empty(), "mesh: axis ", i, " has an empty name");
    LOOM_CHECK(a.size >= 1, "mesh: axis ", a.name, " has size ", a.size, "; sizes must be >= 1");
    for (size_t j = 0; j < i; ++j)
      LOOM_CHECK(axes_[j].name != a.name, "mesh: axis name '", a.name, "' appears twice");
    product *= a.size;
    LOOM_CHECK(product <= world_size, "mesh ", to_string(), " needs more ranks than the world size ",
               world_size);
  }
  LOOM_CHECK(product == world_size, "mesh ", to_string(), " covers ", product, " ranks but the world has ",
             world_size, "; the axis sizes must multiply to the world size");
  strides_.assign(axes_.size(), 1);
  for (int i = static_cast<int>(axes_.size()) - 2; i >= 0; --i) strides_[i] = strides_[i + 1] * axes_[i + 1].size;
}

int Mesh::axis_index(std::string_view name) const {
  for (size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i].name == name) return static_cast<int>(i);
  std::ostringstream known;
  for (size_t i = 0; i < axes_.size(); ++i) known << (i ? ", " : "") << axes_[i].name;
  throw Error(detail::cat("mesh ", to_string(), " has no axis '", name, "'; axes are: ", known.str()));
}

std::vector<int> Mesh::coords(int global_rank) const {
  LOOM_CHECK(global_rank >= 0 && global_rank < world_size_, "mesh: global rank ", global_rank,
             " is outside [0, ", world_size_, ")");
  std::vector<int> c(axes_.size());
  for (size_t i = 0; i < axes_.size(); ++i) c[i] = (global_rank / strides_[i]) % axes_[i].size;
  return c;
}

int Mesh::global_rank(const std::vector<int>& coords) const {
  LOOM_CHECK(coords.size() == axes_.size(), "mesh: got ", coords.size(), " coordinates for ", axes_.size(),
             " axes");
  int r = 0;
  for (size_t i = 0; i < axes_.size(); ++i) {
    LOOM_CHECK(coords[i] >= 0 && coords[i] < axes_[i].size, "mesh: coordinate ", coords[i], " on axis ",
               axes_[i].name, " is outside [0, ", axes_[i].size, ")");
    r += coords[i] * strides_[i];
  }
  return r;
}

std::vector<bool> Mesh::axis_mask(const std::vector<std::string>& axes) const {
  std::vector<bool> mask(axes_.size(), false);
  for (const std::string& name : axes) {
    const int i = axis_index(name);
    LOOM_CHECK(!mask[i], "mesh: axis '", name, "' is named twice in a group request");
    mask[i] = true;
  }
  return mask;
}

// A rank's group index is the mixed-radix number of its coordinates on the axes outside
// the group, and its group rank the number formed by the axes inside (both mesh order).
GroupMembership Mesh::membership(const std::vector<std::string>& axes, int global_rank) const {
  const std::vector<bool> in = axis_mask(axes);
  const std::vector<int> c = coords(global_rank);
  GroupMembership m;
  int group_size = 1;
  for (size_t i = 0; i < axes_.size(); ++i) {
    if (in[i]) {
      m.group_rank = m.group_rank * axes_[i].size + c[i];
      group_size *= axes_[i].size;
    } else {
      m.group_index = m.group_index * axes_[i].size + c[i];
    }
  }
  // Members: walk the inside axes as a counter, innermost fastest, from this rank's base.
  int base = global_rank;
  for (size_t i = 0; i < axes_.size(); ++i)
    if (in[i]) base -= c[i] * strides_[i];
  m.global_ranks.reserve(group_size);
  std::vector<int> digit(axes_.size(), 0);
  for (int k = 0; k < group_size; ++k) {
    int r = base;
    for (size_t i = 0; i < axes_.size(); ++i) r += digit[i] * strides_[i];
    m.global_ranks.push_back(r);
    for (int i = static_cast<int>(axes_.size()) - 1; i >= 0; --i) {
      if (!in[i]) continue;
      if (++digit[i] < axes_[i].size) break;
      digit[i] = 0;
    }
  }
  return m;
}

GroupTable Mesh::group_table(const std::vector<std::string>& axes) const {
  const std::vector<bool> in = axis_mask(axes);
  GroupTable t;
  for (size_t i = 0; i < axes_.size(); ++i)
    if (in[i]) t.group_size *= axes_[i].size;
  t.group_count = world_size_ / t.group_size;
  t.ranks.resize(world_size_);
  // One pass over the ranks in order, keeping their mixed-radix digits as an odometer;
  // the digits inside the group form the position, the others the group index.
  const size_t n_axes = axes_.size();
  std::vector<int> digit(n_axes, 0);
  for (int r = 0; r < world_size_; ++r) {
    int index = 0, pos = 0;
    for (size_t i = 0; i < n_axes; ++i) {
      if (in[i]) pos = pos * axes_[i].size + digit[i];
      else index = index * axes_[i].size + digit[i];
    }
    t.ranks[static_cast<size_t>(index) * t.group_size + pos] = r;
    for (size_t i = n_axes; i-- > 0;) {
      if (++digit[i] < axes_[i].size) break;
      digit[i] = 0;
    }
  }
  return t;
}

std::vector<std::vector<int>> Mesh::groups(const std::vector<std::string>& axes) const {
  const GroupTable t = group_table(axes);
  std::vector<std::vector<int>> out(t.group_count);
  for (int g = 0; g < t.group_count; ++g)
    out[g].assign(t.ranks.begin() + static_cast<size_t>(g) * t.group_size,
                  t.ranks.begin() + static_cast<size_t>(g + 1) * t.group_size);
  return out;
}

std::string Mesh::to_string() const {
  std::ostringstream os;
  for (size_t i = 0; i < axes_.size(); ++i) os << (i ? " x " : "") << axes_[i].name << "=" << axes_[i].size;
  if (axes_.empty()) os << "(no axes)";
  return os.str();
}

Mesh training_mesh(const ParallelConfig& p) {
  // The dp axis holds dp x cp ranks, a replica's cp ranks consecutive (Note [Context-parallel chunks]).
  return Mesh({{"pp", int(p.pp)}, {"dp", int(p.dp_ranks())}, {"tp", int(p.tp)}}, int(p.world()));
}

}  // namespace loom::comm
