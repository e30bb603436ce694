// Naive reference kernels: the oracle for loom::cpu. Straight loops, double accumulators.
#pragma once
#include <cstdint>
namespace loom::ref {
#include "loom/kernels/ops.inc"
}  // namespace loom::ref
