// The CPU reference the CUDA model tests start from: a bf16 Model on the naive kernels with
// random weights, and random tokens and targets of a (B, T) batch.
#pragma once

#include <cstdint>
#include <vector>

#include "loom/model/model.h"
#include "cuda/cuda_test_util.h"

namespace loom::cuda {

struct CpuReference {
  Model cpu;
  std::vector<int32_t> tok, tgt;  // B T each, below m.vocab
  CpuReference(const ModelConfig& m, int64_t B, int64_t T)
      : cpu(m, B, T, KernelBackend::kRef, bf16()), tok(size_t(B * T)), tgt(size_t(B * T)) {
    cpu.init_weights(uint64_t(rng()()));
    for (int32_t& t : tok) t = int32_t(rng()() % m.vocab);
    for (int32_t& t : tgt) t = int32_t(rng()() % m.vocab);
  }

 private:
  static ModelOptions bf16() {
    ModelOptions o;
    o.precision = Precision::kBf16;
    return o;
  }
};

}  // namespace loom::cuda
