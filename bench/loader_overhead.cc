// Loader overhead against step time (issue 15): config B (GPT-2 vocabulary, 6 layers,
// d 384, seq 256, batch 8) trained for a few steps on GPT-2 token shards through the real
// trainer, then the loader alone filling the same batches (Note [Epoch order]) for as many
// steps. Prints both per step and their ratio.
//   build/release/bench/loader_overhead SHARDS_DIR [STEPS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "loom/comm/world.h"
#include "loom/data/loader.h"
#include "loom/train/trainer.h"

using namespace loom;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s SHARDS_DIR [STEPS]\n", argv[0]);
    return 2;
  }
  const std::string shards = argv[1];
  const int steps = argc > 2 ? std::atoi(argv[2]) : 8;
  char tmpl[] = "/tmp/loom-loader-bench-XXXXXX";
  const std::string ckpt = std::string(mkdtemp(tmpl)) + "/ck";
  const Config c = load_config("", {"model.preset=gpt2", "model.layers=6", "model.d_model=384", "model.heads=6",
                                    "model.ffn=1536", "model.ctx=256", "train.batch=8", "train.val_every=0",
                                    "train.val_batches=1", "train.steps=" + std::to_string(steps),
                                    "data.shards=" + shards, "optim.warmup_steps=1", "checkpoint.dir=" + ckpt});
  std::ostringstream sink;
  TrainOptions o;
  o.out = o.err = &sink;
  TrainSummary s;
  const auto errors = comm::run_threads(1, {}, [&](comm::World& w) { s = train(c, o, w); });
  if (!errors.empty() && !errors[0].empty()) {
    std::fprintf(stderr, "training failed: %s\n", errors[0].c_str());
    return 1;
  }
  std::filesystem::remove_all(std::filesystem::path(ckpt).parent_path());
  std::vector<double> st = s.step_seconds;
  std::sort(st.begin(), st.end());
  const double step_s = st[st.size() / 2];  // median: the first step warms caches

  const int64_t T = c.seq_len(), B = c.train.batch;
  const auto data = load_train_data(c, T);
  const DataLoader loader(*data->train, T, uint64_t(c.train.seed), 0, 1, data->order);
  std::vector<int32_t> tok(size_t(B * T)), tgt(size_t(B * T));
  const int reps = 200;
  const auto t0 = Clock::now();
  for (int i = 0; i < reps; i++) loader.train_batch(i, 0, 1, B, tok.data(), tgt.data());
  const double load_s = std::chrono::duration<double>(Clock::now() - t0).count() / reps;
  std::printf("{\"config\":\"B\",\"step_s\":%.4f,\"loader_s_per_step\":%.7f,\"loader_fraction\":%.6f,"
              "\"train_tokens\":%llu}\n",
              step_s, load_s, load_s / step_s, (unsigned long long)data->train->size());
  return 0;
}
