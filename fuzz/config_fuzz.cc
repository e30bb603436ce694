// libFuzzer target: the TOML config parser. Any input either loads or throws loom::Error;
// a loaded config renders to TOML that loads back to the same rendering.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "loom/core/config.h"
#include "loom/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  loom::Config c;
  try {
    c = loom::config_from_toml_string(text);
  } catch (const loom::Error&) {
    return 0;
  }
  const std::string once = loom::to_toml(c);
  if (loom::to_toml(loom::config_from_toml_string(once)) != once) std::abort();  // round trip must hold
  return 0;
}
