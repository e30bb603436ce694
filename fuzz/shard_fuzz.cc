// libFuzzer target: the token shard reader (loom's format and llm.c's). The input is the
// file; opening either throws loom::Error or gives a shard whose every token is inside its
// vocabulary and whose document starts ascend from 0 inside the tokens.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "loom/core/error.h"
#include "loom/data/shards.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/loom-fuzz-shard-" + std::to_string(::getpid()) + ".bin";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    const loom::data::Shard s(path);
    for (uint64_t i = 0; i < s.size(); i++)
      if (s.token(i) >= s.header().vocab_size) std::abort();
    const auto& d = s.doc_starts();
    for (size_t i = 0; i < d.size(); i++)
      if (d[i] >= s.size() || (i == 0 ? d[i] != 0 : d[i] <= d[i - 1])) std::abort();
  } catch (const loom::Error&) {
  }
  return 0;
}
