// Device mesh: named axes over the global ranks, and the process groups derived from it.
//
// Note [Mesh order]
// Axes are listed outermost first; the last axis is innermost and varies fastest over
// consecutive global ranks. With axes (pp=2, dp=3, tp=4) global rank r has coordinates
//   tp = r % 4, dp = (r / 4) % 3, pp = r / 12,
// so a tp group is 4 consecutive ranks (inside a node when tp <= devices per node).
//
// Note [Groups from the mesh]
// groups(axes) partitions the world into groups whose members differ only along `axes`.
// Groups are ordered by the coordinates of the axes NOT in `axes` (mesh order, outer
// first); inside a group members are ordered by their coordinates along `axes` (mesh
// order, outer first), so group_rank == the mixed-radix number those coordinates form.
// Every rank that builds groups(axes) gets the same list: this is the only place groups
// come from, and it is a pure function of (mesh, axes).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "loom/core/config.h"

namespace loom::comm {

struct MeshAxis {
  std::string name;
  int size = 1;
};

// Where one rank sits in one group.
struct GroupMembership {
  int group_index = 0;           // index into groups(axes)
  int group_rank = 0;            // position inside that group
  std::vector<int> global_ranks; // members, in group-rank order
};

// All groups along some axes as one flat table: group g is
// ranks[g * group_size, (g + 1) * group_size).
struct GroupTable {
  int group_size = 1;
  int group_count = 1;
  std::vector<int> ranks;
};

class Mesh {
 public:
  // Throws loom::Error when a size is < 1, a name repeats or is empty, or the product of
  // sizes differs from world_size (naming the axes and the product).
  Mesh(std::vector<MeshAxis> axes, int world_size);

  int world_size() const { return world_size_; }
  const std::vector<MeshAxis>& axes() const { return axes_; }
  // Index of axis `name`; throws loom::Error naming the known axes when absent.
  int axis_index(std::string_view name) const;
  int axis_size(std::string_view name) const { return axes_[axis_index(name)].size; }

  // Coordinates of a global rank, one per axis in mesh order.
  std::vector<int> coords(int global_rank) const;
  int global_rank(const std::vector<int>& coords) const;

  // Note [Groups from the mesh]. `axes` may be given in any order and may be empty (then
  // every rank is its own group); unknown or repeated names throw loom::Error.
  std::vector<std::vector<int>> groups(const std::vector<std::string>& axes) const;
  GroupTable group_table(const std::vector<std::string>& axes) const;
  // The group of `global_rank` along `axes`, without building the others.
  GroupMembership membership(const std::vector<std::string>& axes, int global_rank) const;

  // "pp=2 x dp=3 x tp=4"
  std::string to_string() const;

 private:
  std::vector<bool> axis_mask(const std::vector<std::string>& axes) const;

  std::vector<MeshAxis> axes_;
  std::vector<int> strides_;  // stride of each axis in global-rank space
  int world_size_ = 1;
};

// The training mesh: axes pp, dp, tp, outermost first (tp innermost, so a tp group is
// consecutive ranks). The one place loom writes that order.
Mesh training_mesh(const ParallelConfig& p);

}  // namespace loom::comm
