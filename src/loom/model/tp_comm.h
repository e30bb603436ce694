// The collectives a tensor-parallel model calls on its tp group. The rank context
// (train/rank_context.cc) implements them over the tp comm::Group; model code does not
// depend on comm.
#pragma once

#include <cstdint>
#include <functional>

namespace loom {

class TpComm {
 public:
  virtual ~TpComm() = default;
  // In place over the tp group; every member gets identical bits.
  virtual void all_reduce_sum(float* x, int64_t n) = 0;
  virtual void all_reduce_max(float* x, int64_t n) = 0;
  // In place: every member gets group rank root's x; the sum over the group lands in root's
  // x (the others' x is left undefined).
  virtual void broadcast(float* x, int64_t n, int root) = 0;
  virtual void reduce_sum(float* x, int64_t n, int root) = 0;
  // Sequence parallel, in place on `full` = tp blocks of `block` floats, block r belonging
  // to tp rank r: all-gather fills every block from its owner; reduce-scatter leaves the
  // sum over ranks of this rank's block in that block (the other blocks are left as is).
  virtual void all_gather_blocks(float* full, int64_t block) = 0;
  virtual void reduce_scatter_blocks(float* full, int64_t block) = 0;
  // in, out: group-size blocks of `block` floats; block j of in goes to rank j, and block j of
  // out comes from rank j (Note [Ulysses attention]).
  virtual void all_to_all_blocks(const float* in, float* out, int64_t block) = 0;
  // One ring step (Note [Ring attention]): `n` floats of `send` to the next group rank and `n`
  // from the previous into `recv`, started now; the returned function waits for both.
  virtual std::function<void()> ring_shift(const float* send, float* recv, int64_t n) = 0;
};

}  // namespace loom
