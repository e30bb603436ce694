// The reference fp16 kernels (contracts in kernels/ops_fp16.inc): the exact products of
// the fp16-rounded inputs summed in fp64, rounded once to fp32.
#pragma once

#include <cstdint>

#include "loom/core/fp16.h"

namespace loom::ref {

#include "loom/kernels/ops_fp16.inc"

}  // namespace loom::ref
