// Optimizer offload in training (Note [Optimizer offload]) and the per-rank memory budget
// (Note [Memory budget]).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <functional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/train/memory_budget.h"
#include "loom/train/trainer.h"
#include "support/error_message.h"
#include "support/temp_dir.h"
#include "support/train_threads.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using testing_support::TempDir;

Config small(std::vector<std::string> extra) {
  std::vector<std::string> sets = {"model.layers=2", "model.d_model=64", "model.heads=4", "model.ffn=256",
                                   "model.ctx=32", "train.batch=12", "train.steps=4", "train.val_batches=1",
                                   "train.val_every=0", "train.threads=1", "checkpoint.dir=", "comm.timeout_s=60",
                                   "optim.warmup_steps=2"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return load_config("", sets);
}

// Trains each layout in memory and with `offload` added; expects the same losses and
// final weights bit for bit, and calls check(in memory, offloaded, what) for the rest.
void expect_offload_equals_in_memory(
    const std::vector<std::vector<std::string>>& layouts, const std::vector<std::string>& offload,
    const std::function<void(const TrainSummary&, const TrainSummary&, const std::string&)>& check) {
  for (const std::vector<std::string>& layout : layouts) {
    const std::vector<TrainSummary> mem = testing_support::train_keeping_params(small(layout));
    std::vector<std::string> sets = layout;
    sets.insert(sets.end(), offload.begin(), offload.end());
    const std::vector<TrainSummary> off = testing_support::train_keeping_params(small(sets));
    std::string what;
    for (const std::string& s : layout) what += s + " ";
    ASSERT_EQ(off[0].losses.size(), 4u) << what;
    EXPECT_EQ(off[0].losses, mem[0].losses) << what;
    EXPECT_EQ(off[0].final_params, mem[0].final_params) << what;
    for (size_t r = 0; r < off.size(); r++) check(mem[r], off[r], what);
  }
}

// Offloaded training equals in-memory training bit for bit: GPT and Llama, grad_accum 1
// and 3, one process, dp 2 and ZeRO-1/2/3 (ranks as threads). Sub-groups of 0.01 MiB
// (2,621 floats) cut every tensor's run of moments many times.
TEST(OptimizerOffload, TrainingEqualsInMemoryBitForBit) {
  TempDir dir("loom-offload");
  expect_offload_equals_in_memory(
      {{}, {"train.grad_accum=3"}, {"model.arch=llama", "model.kv_heads=2", "model.ffn=128", "train.grad_accum=3"},
       {"parallel.dp=2"}, {"parallel.dp=2", "parallel.zero=1", "train.grad_accum=3"},
       {"parallel.dp=2", "parallel.zero=2"}, {"parallel.dp=2", "parallel.zero=3", "train.grad_accum=3"},
       {"offload.direct=true"}},  // O_DIRECT (ignored by the in-memory run)
      {"offload.optimizer=disk", "offload.dir=" + dir.path.string(), "offload.sub_group_mb=0.01"},
      [](const TrainSummary& mem, const TrainSummary& off, const std::string& what) {
        EXPECT_GT(off.offload_written_bytes, 0) << what;  // every rank streamed its moments
        EXPECT_EQ(off.offload_written_bytes % 4, 0) << what;
        EXPECT_EQ(mem.offload_written_bytes, 0) << what;
      });
  EXPECT_TRUE(fs::is_empty(dir.path)) << "the scratch files are unlinked at once";
}

// Context parallelism (Note [Context-parallel chunks]) beside the offloaded optimizer: a cp
// rank's moments are its replica's whole, streamed as any rank's; all three cp modes, alone
// and with dp 2 x ZeRO-3, equal their in-memory runs bit for bit.
TEST(OptimizerOffload, ContextParallelTrainingEqualsInMemoryBitForBit) {
  TempDir dir("loom-offload-cp");
  expect_offload_equals_in_memory(
      {{"parallel.cp=2"}, {"parallel.cp=2", "parallel.cp_mode=ring"}, {"parallel.cp=2", "parallel.cp_mode=ulysses"},
       {"parallel.cp=2", "parallel.dp=2", "parallel.zero=3"}},
      {"offload.optimizer=disk", "offload.dir=" + dir.path.string(), "offload.sub_group_mb=0.01"},
      [](const TrainSummary&, const TrainSummary& off, const std::string& what) {
        EXPECT_GT(off.offload_written_bytes, 0) << what;
      });
}

// Parameter offload (Note [Parameter offload]) equals in-memory training bit for bit: GPT
// and Llama, grad_accum 1 and 3, full recompute (units read again in backward), dp 2 (ZeRO
// 0), tp 2, and a GPT pipeline whose stages each hold a copy of the tied embedding.
TEST(ParameterOffload, TrainingEqualsInMemoryBitForBit) {
  TempDir dir("loom-offload");
  auto params_peak = [](const TrainSummary& t) {
    for (const auto& [name, bytes] : t.memory_peak_bytes)
      if (name == "params") return bytes;
    return int64_t(-1);
  };
  expect_offload_equals_in_memory(
      {{}, {"train.grad_accum=3", "parallel.recompute=full"},
       {"model.arch=llama", "model.kv_heads=2", "model.ffn=128", "train.grad_accum=3"},
       {"parallel.dp=2"}, {"parallel.tp=2"}, {"parallel.pp=2", "train.grad_accum=3"},
       // Note [ZeRO-3 offload]: each rank's own pieces in its file, gathered from there (also
       // bf16 gathers with a kept layer).
       {"parallel.dp=2", "parallel.zero=3", "train.grad_accum=3", "parallel.recompute=full"},
       {"parallel.dp=2", "parallel.zero=3", "model.arch=llama", "model.kv_heads=2", "model.ffn=128"},
       {"parallel.dp=2", "parallel.zero=3", "comm.param_dtype=bf16", "parallel.zero_keep=keep,shard"},
       // Note [Replicated-parameter offload]: the whole parameters in a file of their own, the
       // own pieces streamed with their moments and all-gathered into that file.
       {"parallel.dp=2", "parallel.zero=1", "train.grad_accum=3"},
       {"parallel.dp=2", "parallel.zero=2", "model.arch=llama", "model.kv_heads=2", "model.ffn=128"},
       {"parallel.dp=2", "parallel.zero=2", "parallel.pp=2", "train.grad_accum=3"}},
      {"offload.optimizer=disk", "offload.params=disk", "offload.dir=" + dir.path.string(), "offload.sub_group_mb=0.01"},
      [&](const TrainSummary& mem, const TrainSummary& off, const std::string& what) {
        // At most the whole buffer resident (the budget test shows a few units of a larger model).
        // Under ZeRO-3 the peak is sampled while the other rank's gathers come and go, so two
        // runs' peaks can differ by a few pages (seen: 3.5 KiB with the suite running beside).
        EXPECT_LE(params_peak(off), params_peak(mem) + 4 * 4096) << what;
        EXPECT_GT(params_peak(off), 0) << what;
      });
  // Note [Chunk manager]: 40 KiB chunks cutting across units, kept under a budget that holds
  // them all, through the pipeline's interleaved micro-batches, recompute and tp.
  expect_offload_equals_in_memory(
      {{"train.grad_accum=3", "parallel.recompute=full"}, {"parallel.tp=2"},
       {"parallel.pp=2", "train.grad_accum=3"}, {"parallel.pp=2", "parallel.schedule=1f1b", "train.grad_accum=4"},
       {"parallel.dp=2", "parallel.zero=3", "train.grad_accum=3"}, {"parallel.dp=2", "parallel.zero=3", "parallel.pp=2"},
       {"parallel.dp=2", "parallel.zero=1", "train.grad_accum=3"}},
      {"offload.optimizer=disk", "offload.params=disk", "offload.dir=" + dir.path.string(),
       "offload.sub_group_mb=0.01", "offload.chunk_mb=0.04", "memory.limit_gib=0.25"},
      [&](const TrainSummary&, const TrainSummary& off, const std::string& what) {
        EXPECT_GT(off.param_chunk_read_bytes, 0) << what;
      });
}

// A resume with offload on or off continues the same run: the checkpoint holds the
// parameters and moments, not the scratch file. Modes: 0 in memory, 1 optimizer offload,
// 2 optimizer and parameter offload; every pair (the save under one, the resume under the
// other), dp 2 with ZeRO-0 and with ZeRO-3 (parameter offload's layouts; under ZeRO-3 the
// checkpoint is written from the offload file's packed own pieces), and a ZeRO-3 offloaded
// save resumed by ZeRO-0 and back (resharding).
TEST(OptimizerOffload, ResumeWithOffloadOnOrOffIsTheSameRun) {
  TempDir dir("loom-offload");
  auto with = [&](const std::string& ckpt, int mode, int zero) {
    std::vector<std::string> sets = {"parallel.dp=2", "parallel.zero=" + std::to_string(zero), "train.steps=6",
                                     "checkpoint.save_every=3", "checkpoint.dir=" + (dir / ckpt)};
    if (mode >= 1)
      for (const std::string& s : {std::string("offload.optimizer=disk"), "offload.dir=" + dir.path.string(),
                                   std::string("offload.sub_group_mb=0.01")})
        sets.push_back(s);
    if (mode == 2) sets.push_back("offload.params=disk");
    return small(sets);
  };
  // The run saved under (first, zero_first) and resumed under (second, zero_second).
  auto resumed = [&](int first, int zero_first, int second, int zero_second) {
    const std::string a = "a" + std::to_string(first) + std::to_string(zero_first) + std::to_string(second) +
                          std::to_string(zero_second);
    testing_support::train_keeping_params(with(a, first, zero_first));
    return testing_support::train_keeping_params(with(a + "b", second, zero_second), dir / a + "/step-00000003")[0];
  };
  auto expect_same = [](const TrainSummary& got, const TrainSummary& want, const std::string& what) {
    ASSERT_EQ(got.losses.size(), 3u) << what;
    EXPECT_EQ(got.losses, std::vector<float>(want.losses.end() - 3, want.losses.end())) << what;
    EXPECT_EQ(got.final_params, want.final_params) << what;
  };
  for (const int zero : {0, 1, 3}) {  // 1: Note [Replicated-parameter offload]
    const TrainSummary whole = testing_support::train_keeping_params(with("whole" + std::to_string(zero), 0, zero))[0];
    for (const int first : {0, 1, 2})
      for (const int second : {0, 1, 2})
        expect_same(resumed(first, zero, second, zero), whole,
                    "zero " + std::to_string(zero) + ", offload mode " + std::to_string(first) + " then " +
                        std::to_string(second));
  }
  // Under ZeRO-3 parameter offload a rank file holds its own pieces packed: as many floats of
  // parameters as of each moment (in memory, the whole flat buffer).
  for (const auto& [ckpt, packed] : {std::pair{"a2323", true}, std::pair{"a0303", false}}) {
    std::ifstream in(dir / ckpt + "/step-00000003/manifest.json");
    const nlohmann::json m = nlohmann::json::parse(in);
    ASSERT_EQ(m.at("ranks").size(), 2u);
    for (const auto& r : m.at("ranks"))
      EXPECT_EQ(r.at("floats").at("params") == r.at("floats").at("m"), packed) << ckpt << ": " << r.dump();
  }
  // Resharding: as the same change of layout in memory (ZeRO-3 and ZeRO-0 agree on the
  // losses, not on every last bit of the parameters).
  expect_same(resumed(2, 3, 2, 0), resumed(0, 3, 0, 0), "zero 3 offloaded, then zero 0 offloaded");
  expect_same(resumed(2, 0, 2, 3), resumed(0, 0, 0, 3), "zero 0 offloaded, then zero 3 offloaded");
}

std::string train_error(const Config& c) {
  std::ostringstream sink;
  TrainOptions o;
  o.out = o.err = &sink;
  try {
    train(c, o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// One process, its output swallowed, its final parameters kept.
TrainSummary train_keeping(const Config& c) {
  TrainOptions o;
  o.keep_params = true;
  std::ostringstream sink;
  o.out = o.err = &sink;
  return train(c, o);
}

// A budget below the in-memory need is refused up front naming the categories and
// offload; with the optimizer offloaded the same budget fits, the run equals the
// in-memory one, and its measured peak (mincore) stays within the budget.
TEST(MemoryBudget, RefusedUpFrontThenFitsWithOffloadAndStaysWithinIt) {
  TempDir dir("loom-offload");
  // ~3.2M parameters: 12.6 MiB per fp32 copy, 25 MiB of moments; small activations.
  const std::vector<std::string> model = {"model.layers=4", "model.d_model=256", "model.heads=4", "model.ffn=1024",
                                          "train.batch=2", "train.steps=2", "memory.limit_gib=0.045"};
  const std::string refused = train_error(small(model));
  EXPECT_NE(refused.find("memory.limit_gib allows 46 MiB"), std::string::npos) << refused;
  EXPECT_NE(refused.find("optimizer 25 MiB"), std::string::npos) << refused;
  EXPECT_NE(refused.find("set offload.optimizer = disk with offload.dir (optimizer 25 MiB -> 6 MiB of buffers at offload.sub_group_mb = 1)"),
            std::string::npos)
      << refused;
  // Offload on at the default 16 MiB sub-groups: the buffers outweigh the moments they stream.
  std::vector<std::string> big_groups = model;
  big_groups.insert(big_groups.end(), {"offload.optimizer=disk", "offload.dir=" + dir.path.string()});
  const std::string buffers = train_error(small(big_groups));
  EXPECT_NE(buffers.find("lower offload.sub_group_mb to 1 (optimizer buffers 74 MiB -> 6 MiB)"), std::string::npos)
      << buffers;
  std::vector<std::string> sets = model;
  for (const std::string& s : std::vector<std::string>{"offload.optimizer=disk", "offload.dir=" + dir.path.string(), "offload.sub_group_mb=1"})
    sets.push_back(s);
  const TrainSummary off = train_keeping(small(sets));
  std::vector<std::string> unbounded = model;
  unbounded.back() = "memory.limit_gib=0";
  const TrainSummary mem = train_keeping(small(unbounded));
  EXPECT_EQ(off.final_params, mem.final_params);
  EXPECT_GT(off.memory_peak_total_bytes, 0);
  EXPECT_LE(off.memory_peak_total_bytes, int64_t(0.045 * double(int64_t(1) << 30)));
  EXPECT_GT(mem.memory_peak_total_bytes, int64_t(0.045 * double(int64_t(1) << 30)));
  // Lower still (30 MiB: 12.3 MiB of parameters, as much of gradients, 5 of activations):
  // refused with optimizer offload alone, naming parameter offload; fits with it.
  sets.back() = "offload.sub_group_mb=0.25";
  sets[6] = "memory.limit_gib=0.0293";
  const std::string refused_again = train_error(small(sets));
  EXPECT_NE(refused_again.find("set offload.params = disk with offload.optimizer = disk (params 12 MiB -> "),
            std::string::npos)
      << refused_again;
  sets.push_back("offload.params=disk");
  const TrainSummary both = train_keeping(small(sets));
  EXPECT_EQ(both.final_params, mem.final_params);
  EXPECT_LE(both.memory_peak_total_bytes, int64_t(0.0293 * double(int64_t(1) << 30)));
}

// Note [Chunk manager]: parameter offload in 128 KiB chunks under a budget (8 blocks of
// 0.75 MiB). In the last of 4 steps (the steady state after the warm-up), a budget that
// holds every chunk reads none (the update refreshes the resident chunks); one that leaves
// room for 60% of them reads at least the 40% it cannot hold, and less than no budget does
// (every unit at each use, the next one kept); each run equals in-memory training bit for
// bit and its measured peak stays within its budget.
TEST(ParameterOffload, ChunksUnderABudgetReadLessAndStayWithinIt) {
  TempDir dir("loom-offload");
  const std::vector<std::string> model = {"model.layers=8", "model.d_model=128", "model.heads=4", "model.ffn=512",
                                          "train.batch=2", "offload.optimizer=disk", "offload.params=disk",
                                          "offload.dir=" + dir.path.string(), "offload.sub_group_mb=0.25",
                                          "offload.chunk_mb=0.125"};
  auto run = [&](double limit_gib, int steps, bool offload = true) {
    std::vector<std::string> sets = offload ? model : std::vector<std::string>(model.begin(), model.begin() + 5);
    sets.push_back("train.steps=" + std::to_string(steps));
    sets.push_back("memory.limit_gib=" + std::to_string(limit_gib));
    return train_keeping(small(sets));
  };
  const TrainSummary mem = run(0, 4, false);
  const int64_t param_bytes = int64_t(mem.final_params.size() * sizeof(float));
  auto per_step = [&](double limit_gib, TrainSummary* four) {
    *four = run(limit_gib, 4);
    EXPECT_EQ(four->final_params, mem.final_params) << "memory.limit_gib " << limit_gib;
    if (limit_gib > 0) EXPECT_LE(four->memory_peak_total_bytes, int64_t(limit_gib * double(int64_t(1) << 30)));
    return four->param_chunk_last_step_read_bytes;
  };
  TrainSummary none, all, half;
  const int64_t unbudgeted = per_step(0, &none);
  EXPECT_EQ(per_step(0.5, &all), 0);
  int64_t non_model = 0;
  for (const auto& [name, bytes] : all.memory_peak_bytes)
    if (name != "params") non_model += bytes;
  const double tight = double(non_model + param_bytes * 6 / 10) / double(int64_t(1) << 30);
  const int64_t halved = per_step(tight, &half);
  EXPECT_GT(halved, param_bytes / 4);
  EXPECT_LT(halved, unbudgeted);
  EXPECT_GT(half.param_chunk_evictions, none.param_chunk_evictions / 4);
}

// Note [ZeRO-3 offload]: under a budget below what ZeRO-3 holds in memory (each rank's own
// pieces and the gather pool), the own pieces are read from each rank's file, every rank
// stays within the budget, and training equals in-memory ZeRO-3 bit for bit.
TEST(ParameterOffload, ZeroThreeOwnPiecesUnderABudget) {
  TempDir dir("loom-offload");
  const std::vector<std::string> layout = {"model.layers=16", "model.d_model=128", "model.heads=4", "model.ffn=512",
                                           "train.batch=2", "parallel.dp=2", "parallel.zero=3"};
  std::vector<std::string> offload = layout;
  for (const std::string& s : std::vector<std::string>{"offload.optimizer=disk", "offload.params=disk",
                                                        "offload.dir=" + dir.path.string(), "offload.sub_group_mb=0.25",
                                                        "offload.chunk_mb=0.0625"})
    offload.push_back(s);
  auto under = [&](double limit_gib) {
    std::vector<std::string> sets = offload;
    sets.push_back("memory.limit_gib=" + std::to_string(limit_gib));
    return testing_support::train_keeping_params(small(sets));
  };
  const std::vector<TrainSummary> mem = testing_support::train_keeping_params(small(layout));
  const std::vector<TrainSummary> roomy = under(0.5);  // every own piece stays
  ASSERT_EQ(roomy.size(), 2u);
  // Each rank's own pieces: half the parameters. A budget half of them below the roomy peak.
  const int64_t own = int64_t(mem[0].final_params.size() * sizeof(float)) / 2;
  int64_t tight = 0;
  for (const TrainSummary& r : roomy) {
    EXPECT_EQ(r.param_chunk_last_step_read_bytes, 0);
    tight = std::max(tight, r.memory_peak_total_bytes - own / 2);
  }
  const std::vector<TrainSummary> off = under(double(tight) / double(int64_t(1) << 30));
  for (const std::vector<TrainSummary>* run : {&roomy, &off}) {
    EXPECT_EQ((*run)[0].losses, mem[0].losses);
    EXPECT_EQ((*run)[0].final_params, mem[0].final_params);
  }
  for (const TrainSummary& r : off) {
    EXPECT_LE(r.memory_peak_total_bytes, tight);
    EXPECT_GT(r.param_chunk_last_step_read_bytes, own / 4);  // what the budget cannot hold is read each step
  }
}

// Note [Gradient chunks]: gradients in 1 MiB chunks too (8 blocks of 3 MiB: 25 chunks),
// spilled to the offload file and read back. Without a budget (GPT, one micro-batch) every
// chunk is spilled after each use; under a budget below parameters plus gradients some stay. Each run equals
// in-memory training bit for bit (GPT and Llama, grad_accum 1 and 3, full recompute, the
// norm clipping the first steps), and the budgeted one stays within its budget.
TEST(GradientChunks, TrainingEqualsInMemoryBitForBit) {
  TempDir dir("loom-offload");
  const std::vector<std::string> model = {"model.layers=8", "model.d_model=256", "model.heads=4", "model.ffn=1024",
                                          "train.batch=2", "train.steps=3", "optim.grad_clip=0.5"};
  const std::vector<std::string> offload = {"offload.optimizer=disk", "offload.params=disk", "offload.grads=disk",
                                            "offload.dir=" + dir.path.string(), "offload.sub_group_mb=0.25",
                                            "offload.chunk_mb=1"};
  for (const std::vector<std::string>& layout : std::vector<std::vector<std::string>>{
           {}, {"train.batch=3", "train.grad_accum=3", "parallel.recompute=full"},
           {"model.arch=llama", "model.kv_heads=2", "model.ffn=512", "train.batch=3", "train.grad_accum=3"}}) {
    std::vector<std::string> sets = model;
    sets.insert(sets.end(), layout.begin(), layout.end());
    const TrainSummary mem = train_keeping(small(sets));
    sets.insert(sets.end(), offload.begin(), offload.end());
    std::vector<std::string> what = layout;
    for (const double limit_gib : {0.0, 0.042}) {
      if (limit_gib == 0 && !layout.empty()) continue;  // spilling every use: one layout is enough
      sets.push_back("memory.limit_gib=" + std::to_string(limit_gib));
      const TrainSummary off = train_keeping(small(sets));
      sets.pop_back();
      std::string where = "memory.limit_gib " + std::to_string(limit_gib);
      for (const std::string& s : layout) where += " " + s;
      EXPECT_EQ(off.losses, mem.losses) << where;
      EXPECT_EQ(off.final_params, mem.final_params) << where;
      EXPECT_GT(off.grad_chunk_written_bytes, 0) << where;  // some gradients went to disk and back
      if (limit_gib > 0) EXPECT_LE(off.memory_peak_total_bytes, int64_t(limit_gib * double(int64_t(1) << 30))) << where;
    }
  }
}

// The engine's trace shows the chunk manager's transfers as "io" spans on the compute thread
// (Note [Trace schema]): parameter reads, gradient spills and read-backs.
TEST(GradientChunks, TraceShowsTheChunkTransfers) {
  TempDir dir("loom-offload");
  TrainOptions o;
  std::ostringstream sink;
  o.out = o.err = &sink;
  o.trace_path = dir / "trace.json";
  train(small({"offload.optimizer=disk", "offload.params=disk", "offload.grads=disk", "offload.dir=" + dir.path.string(),
               "offload.chunk_mb=1"}),
        o);
  std::ifstream f(o.trace_path);
  const nlohmann::json j = nlohmann::json::parse(f);
  std::map<std::string, int> io;
  for (const auto& e : j.at("traceEvents"))
    if (e.at("ph") == "X" && e.at("cat") == "io") io[e.at("name").get<std::string>()]++;
  EXPECT_GT(io["parameter read"], 0);
  EXPECT_GT(io["gradient spill"], 0);
  EXPECT_GT(io["gradient read-back"], 0);
}

// While training, a rank whose measured state passes the budget stops with the peaks named.
TEST(MemoryBudget, MeasuredPeakOverTheBudgetStopsTheRun) {
  Config c = small({"memory.limit_gib=0.01"});
  MemoryTracker t;
  std::vector<float> big(size_t(4) << 20, 1.0f);  // 16 MiB, resident
  t.track(t.category("activations"), big.data(), int64_t(big.size() * sizeof(float)));
  t.sample();
  try {
    check_budget(c, t, nullptr, 0);
    FAIL() << "a 16 MiB peak passed a 10 MiB budget";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("this rank held 16 MiB at its peak, over the budget of 10 MiB (peaks: "
                                         "activations 16 MiB)"),
              std::string::npos)
        << e.what();
  }
  c.memory.limit_gib = 0.02;
  EXPECT_NO_THROW(check_budget(c, t, nullptr, 0));
}

TEST(OptimizerOffload, ConfigRefusesWhatCannotWork) {
  auto errors = [](std::vector<std::string> sets) {
    return testing_support::error_message([&] { small(sets); });
  };
  EXPECT_NE(errors({"offload.optimizer=disk"}).find("offload.optimizer = disk needs offload.dir"), std::string::npos);
  EXPECT_NE(errors({"offload.optimizer=nvme"}).find("offload.optimizer = 'nvme': expected none or disk"),
            std::string::npos);
  EXPECT_NE(errors({"offload.slots=1"}).find("offload.slots = 1: expected 2 to 64"), std::string::npos);
  EXPECT_NE(errors({"offload.params=disk", "offload.dir=/tmp"}).find("offload.params = disk needs offload.optimizer = disk"),
            std::string::npos);
  EXPECT_EQ(errors({"offload.optimizer=disk", "offload.params=disk", "offload.dir=/tmp", "parallel.dp=2",
                    "parallel.zero=1"}),
            "no error");  // Note [Replicated-parameter offload]
  EXPECT_NE(errors({"offload.chunk_mb=4"}).find("offload.chunk_mb = 4.0 sizes parameter offload's chunks: set "
                                                "offload.params = disk"),
            std::string::npos);
  EXPECT_NE(errors({"offload.chunk_mb=-1"}).find("offload.chunk_mb = -1.0: expected MiB in [0, 65536]"),
            std::string::npos);
  EXPECT_NE(errors({"offload.optimizer=disk", "offload.params=disk", "offload.grads=disk", "offload.dir=/tmp",
                    "offload.chunk_mb=0.5"})
                .find("gradient chunks are a whole number of MiB"),
            std::string::npos);
  EXPECT_NE(errors({"offload.optimizer=disk", "offload.params=disk", "offload.grads=disk", "offload.dir=/tmp",
                    "offload.chunk_mb=1", "parallel.dp=2"})
                .find("gradient chunks run in one process"),
            std::string::npos);
  EXPECT_NE(errors({"offload.optimizer=disk", "offload.grads=disk", "offload.dir=/tmp", "offload.chunk_mb=1"})
                .find("offload.grads = disk needs offload.params = disk"),
            std::string::npos);
  EXPECT_NE(errors({"memory.limit_gib=-1"}).find("memory.limit_gib = -1.0: expected >= 0"), std::string::npos);
  EXPECT_NE(errors({"offload.optimizer=disk", "offload.dir=/tmp", "parallel.dp=2", "parallel.compress=onebit_adam"})
                .find("offload works with compress = none"),
            std::string::npos);
  // A directory that is not there is refused before the first step, by every rank.
  const std::string missing = train_error(small({"offload.optimizer=disk", "offload.dir=/nonexistent/loom"}));
  EXPECT_NE(missing.find("offload.dir '/nonexistent/loom': no such directory"), std::string::npos) << missing;
}

}  // namespace
}  // namespace loom
