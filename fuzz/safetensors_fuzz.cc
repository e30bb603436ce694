// libFuzzer target: the safetensors reader. Any input either parses (every tensor's bytes
// match its shape) or throws loom::Error.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "loom/core/error.h"
#include "loom/core/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const loom::StFile f = loom::parse_safetensors(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
    for (const auto& [name, t] : f.tensors)
      if (int64_t(t.bytes.size()) != t.numel() * 4) std::abort();
  } catch (const loom::Error&) {
  }
  return 0;
}
