// The tiny model and short run most layout tests train (4 layers, d 64, 4 heads, batch 8,
// one thread, no checkpoints), with `extra` applied after it (a later key wins).
#pragma once

#include <string>
#include <vector>

namespace loom::testing_support {

inline std::vector<std::string> tiny_sets(const std::vector<std::string>& extra) {
  std::vector<std::string> s = {"model.layers=4",  "model.d_model=64", "model.heads=4",         "model.ffn=128",
                                "train.batch=8",   "train.val_batches=1", "train.threads=1",   "checkpoint.dir=",
                                "comm.timeout_s=60", "optim.warmup_steps=2"};
  s.insert(s.end(), extra.begin(), extra.end());
  return s;
}

}  // namespace loom::testing_support
