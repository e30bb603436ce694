// libFuzzer target: the sharded-checkpoint manifest parser (Note [Sharded checkpoints]).
// Any input either parses into a manifest whose every piece lies inside its tensor and its
// file section, or throws loom::Error.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "loom/core/error.h"
#include "loom/ckpt/shard_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const loom::shard::Manifest m =
        loom::shard::parse_manifest(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
    for (const auto& r : m.ranks)
      for (const auto& p : r.pieces)
        if (p.tensor < 0 || size_t(p.tensor) >= m.tensors.size() || p.count <= 0) std::abort();
  } catch (const loom::Error&) {
  }
  return 0;
}
