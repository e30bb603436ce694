// libFuzzer target: the corpus reader and the data loader. The input's first bytes choose
// seq, batch, data-parallel shards and a step; the rest is the corpus file. Loading either
// throws loom::Error or gives batches whose every token and target is a byte of the split.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "loom/core/error.h"
#include "loom/data/loader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const int64_t seq = 1 + data[0] % 64, shards = 1 + data[1] % 4, batch = shards * (1 + data[2] % 4);
  const int64_t step = data[3];
  static const std::string path = "/tmp/loom-fuzz-corpus-" + std::to_string(::getpid()) + ".txt";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data + 4, 1, size - 4, f);
  std::fclose(f);
  try {
    const loom::Corpus c = loom::load_corpus(path, 0.25, seq);
    for (int64_t k = 0; k < shards; ++k) {
      const loom::DataLoader train(c.train, seq, 7, int(k), int(shards));
      const int64_t rows = train.shard_rows(batch);
      std::vector<int32_t> tok(size_t(rows * seq)), tgt(size_t(rows * seq));
      if (train.train_batch(step, 0, 1, batch, tok.data(), tgt.data()) != rows) std::abort();
      for (size_t i = 0; i < tok.size(); ++i)
        if (tok[i] < 0 || tok[i] > 255 || tgt[i] < 0 || tgt[i] > 255) std::abort();
      const loom::DataLoader val(c.val, seq, 7, int(k), int(shards));
      val.val_batch(0, 1, batch, tok.data(), tgt.data());
    }
  } catch (const loom::Error&) {
  }
  return 0;
}
