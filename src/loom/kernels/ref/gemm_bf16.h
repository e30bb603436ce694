// The reference bf16 kernels (contracts in kernels/ops_bf16.inc): the exact products of the
// bf16 inputs summed in fp64, rounded once to fp32 (Note [bf16 rounding points]).
#pragma once

#include <cstdint>

#include "loom/core/bf16.h"

namespace loom::ref {

#include "loom/kernels/ops_bf16.inc"

}  // namespace loom::ref
