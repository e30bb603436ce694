// The collectives a tensor-parallel model calls on its tp group. The parallel layer
// implements them over comm::Group; model code does not depend on comm.
#pragma once

#include <cstdint>

namespace loom {

class TpComm {
 public:
  virtual ~TpComm() = default;
  // In place over the tp group; every member gets identical bits.
  virtual void all_reduce_sum(float* x, int64_t n) = 0;
  virtual void all_reduce_max(float* x, int64_t n) = 0;
};

}  // namespace loom
