#include "loom/comm/mesh.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loom/core/error.h"
#include "support/error_message.h"

namespace loom::comm {
namespace {

using Groups = std::vector<std::vector<int>>;

// The definition of Note [Groups from the mesh] written as plain nested loops over a
// 3-axis mesh (a, b, c), c innermost: outer loops walk the coordinates of the axes outside
// the group (range 1 for axes inside it), inner loops walk the axes inside the group.
// Flattened: group after group.
std::vector<int> naive_groups3(int a, int b, int c, bool in_a, bool in_b, bool in_c) {
  std::vector<int> out;
  out.reserve(static_cast<size_t>(a) * b * c);
  for (int oa = 0; oa < (in_a ? 1 : a); ++oa)
    for (int ob = 0; ob < (in_b ? 1 : b); ++ob)
      for (int oc = 0; oc < (in_c ? 1 : c); ++oc)
        for (int ia = 0; ia < (in_a ? a : 1); ++ia)
          for (int ib = 0; ib < (in_b ? b : 1); ++ib)
            for (int ic = 0; ic < (in_c ? c : 1); ++ic)
              out.push_back((oa + ia) * b * c + (ob + ib) * c + (oc + ic));
  return out;
}

Groups naive_groups4(const int s[4], const bool in[4]) {
  Groups out;
  for (int o0 = 0; o0 < (in[0] ? 1 : s[0]); ++o0)
    for (int o1 = 0; o1 < (in[1] ? 1 : s[1]); ++o1)
      for (int o2 = 0; o2 < (in[2] ? 1 : s[2]); ++o2)
        for (int o3 = 0; o3 < (in[3] ? 1 : s[3]); ++o3) {
          std::vector<int> g;
          for (int i0 = 0; i0 < (in[0] ? s[0] : 1); ++i0)
            for (int i1 = 0; i1 < (in[1] ? s[1] : 1); ++i1)
              for (int i2 = 0; i2 < (in[2] ? s[2] : 1); ++i2)
                for (int i3 = 0; i3 < (in[3] ? s[3] : 1); ++i3)
                  g.push_back((((o0 + i0) * s[1] + (o1 + i1)) * s[2] + (o2 + i2)) * s[3] + (o3 + i3));
          out.push_back(std::move(g));
        }
  return out;
}

std::vector<std::string> names_of(unsigned mask, const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (size_t i = 0; i < names.size(); ++i)
    if (mask & (1u << i)) out.push_back(names[i]);
  return out;
}

// Every ordered factorisation world = pp * dp * tp for world in [lo, hi], every axis
// subset (the empty one included), compared with the nested loops; membership() is checked
// against the table for every rank of small worlds and a stride of ranks in the others.
long check_three_axis_worlds(int lo, int hi) {
  const std::vector<std::string> names = {"pp", "dp", "tp"};
  long meshes = 0;
  for (int world = lo; world <= hi; ++world)
    for (int a = 1; a <= world; ++a) {
      if (world % a) continue;
      for (int b = 1; b <= world / a; ++b) {
        if ((world / a) % b) continue;
        const int c = world / a / b;
        const Mesh mesh({{"pp", a}, {"dp", b}, {"tp", c}}, world);
        ++meshes;
        for (unsigned mask = 0; mask < 8; ++mask) {
          const GroupTable got = mesh.group_table(names_of(mask, names));
          if (got.ranks != naive_groups3(a, b, c, mask & 1, mask & 2, mask & 4)) {
            ADD_FAILURE() << mesh.to_string() << " axis mask " << mask;
            return meshes;
          }
          const int step = world <= 64 ? 1 : world / 5 + 1;
          for (int r = 0; r < world; r += step) {
            const GroupMembership m = mesh.membership(names_of(mask, names), r);
            const auto* first = got.ranks.data() + static_cast<size_t>(m.group_index) * got.group_size;
            EXPECT_EQ(m.global_ranks, std::vector<int>(first, first + got.group_size)) << mesh.to_string();
            EXPECT_EQ(first[m.group_rank], r);
          }
        }
      }
    }
  return meshes;
}

TEST(Mesh, GroupsMatchNestedLoopsForEveryFactorisationUpTo1024) {
  EXPECT_GT(check_three_axis_worlds(1, 1024), 20000);
}

// The rest of the range to 4096 (about 30 s): ctest label `slow`: `ctest --test-dir build/release -L slow`.
TEST(MeshSlow, GroupsMatchNestedLoopsForEveryFactorisation1025To4096) {
  EXPECT_GT(check_three_axis_worlds(1025, 4096), 100000);
}

TEST(Mesh, FourAxesMatchNestedLoops) {
  const std::vector<std::string> names = {"pp", "dp", "cp", "tp"};
  for (int world = 1; world <= 256; ++world)
    for (int a = 1; a <= world; ++a)
      for (int b = 1; a * b <= world; ++b)
        for (int c = 1; a * b * c <= world; ++c) {
          if (world % (a * b * c)) continue;
          const int s[4] = {a, b, c, world / (a * b * c)};
          const Mesh mesh({{"pp", s[0]}, {"dp", s[1]}, {"cp", s[2]}, {"tp", s[3]}}, world);
          for (unsigned mask = 0; mask < 16; ++mask) {
            const bool in[4] = {bool(mask & 1), bool(mask & 2), bool(mask & 4), bool(mask & 8)};
            ASSERT_EQ(mesh.groups(names_of(mask, names)), naive_groups4(s, in)) << mesh.to_string();
          }
        }
}

TEST(Mesh, AxisOrderInRequestDoesNotMatter) {
  const Mesh mesh({{"pp", 2}, {"dp", 3}, {"tp", 4}}, 24);
  EXPECT_EQ(mesh.groups({"tp", "pp"}), mesh.groups({"pp", "tp"}));
  EXPECT_EQ(mesh.groups({"tp"})[0], (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(mesh.groups({"dp"})[1], (std::vector<int>{1, 5, 9}));
  EXPECT_EQ(mesh.groups({"pp"})[0], (std::vector<int>{0, 12}));
  EXPECT_EQ(mesh.coords(23), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(mesh.global_rank({1, 2, 3}), 23);
}

TEST(Mesh, BadMeshesAreRefusedWithTheValues) {
  const auto message = [](auto fn) { return testing_support::error_message(fn); };
  EXPECT_NE(message([] { Mesh({{"dp", 2}, {"tp", 3}}, 8); }).find("covers 6 ranks but the world has 8"),
            std::string::npos);
  EXPECT_NE(message([] { Mesh({{"dp", 0}}, 1); }).find("axis dp has size 0"), std::string::npos);
  EXPECT_NE(message([] { Mesh({{"dp", 2}, {"dp", 2}}, 4); }).find("'dp' appears twice"), std::string::npos);
  const Mesh mesh({{"dp", 2}, {"tp", 2}}, 4);
  EXPECT_NE(message([&] { mesh.groups({"pp"}); }).find("axes are: dp, tp"), std::string::npos);
  EXPECT_NE(message([&] { mesh.groups({"tp", "tp"}); }).find("named twice"), std::string::npos);
  EXPECT_NE(message([&] { mesh.coords(4); }).find("outside [0, 4)"), std::string::npos);
}

}  // namespace
}  // namespace loom::comm
