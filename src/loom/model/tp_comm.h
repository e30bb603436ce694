// The collectives a tensor-parallel model calls on its tp group. The rank context
// (train/rank_context.cc) implements them over the tp comm::Group; model code does not
// depend on comm.
#pragma once

#include <cstdint>

namespace loom {

class TpComm {
 public:
  virtual ~TpComm() = default;
  // In place over the tp group; every member gets identical bits.
  virtual void all_reduce_sum(float* x, int64_t n) = 0;
  virtual void all_reduce_max(float* x, int64_t n) = 0;
  // Sequence parallel, in place on `full` = tp blocks of `block` floats, block r belonging
  // to tp rank r: all-gather fills every block from its owner; reduce-scatter leaves the
  // sum over ranks of this rank's block in that block (the other blocks are left as is).
  virtual void all_gather_blocks(float* full, int64_t block) = 0;
  virtual void reduce_scatter_blocks(float* full, int64_t block) = 0;
};

}  // namespace loom
