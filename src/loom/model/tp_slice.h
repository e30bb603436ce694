// Moving a tensor-parallel tensor between its whole form and one rank's slice, by the
// placement in its ParamSpec (Note [Tensor parallel] in model.h).
#pragma once

#include <cstdint>
#include <vector>

#include "loom/model/layout.h"

namespace loom {

// whole: the whole tensor of `whole_shape` (dim 0 = spec.global_rows: vocabulary padding
// excluded); local: this rank's slice (spec.shape). A replicated spec copies as is; one
// split over the vocabulary parts (spec.vocab_parts) is cut by those, whatever tp says.
// whole -> local; padding rows become zero.
void slice_to_local(const ParamSpec& spec, const std::vector<int64_t>& whole_shape, const float* whole, float* local,
                    int tp, int tp_rank);
// local -> whole (this rank's part of it); padding rows are dropped.
void local_to_whole(const ParamSpec& spec, const std::vector<int64_t>& whole_shape, const float* local, float* whole,
                    int tp, int tp_rank);

}  // namespace loom
