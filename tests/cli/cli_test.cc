// The `loom` binary's exit codes and messages for usage, config and runtime errors.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/loom_cli.h"

namespace {

using Result = loom::testing_support::CliResult;
using loom::testing_support::expect_usage_error;

Result run(const std::string& args) { return loom::testing_support::run_loom(args); }

TEST(Cli, HelpDescribesEveryCommandAndKey) {
  Result r = run("--help");
  EXPECT_EQ(r.code, 0);
  for (const char* cmd : {"train", "sample", "export", "import"}) EXPECT_NE(r.output.find(cmd), std::string::npos);
  Result t = run("train --help");
  EXPECT_EQ(t.code, 0);
  for (const char* key : {"--set", "--json", "model.preset", "optim.lr", "checkpoint.dir", "train.grad_accum"})
    EXPECT_NE(t.output.find(key), std::string::npos) << key;
  EXPECT_EQ(run("sample --help").code, 0);
}

TEST(Cli, UsageAndConfigErrorsExitTwo) {
  EXPECT_EQ(run("").code, 2);
  EXPECT_EQ(run("frobnicate").code, 2);
  expect_usage_error("train --set model.layyers=3", "unknown config key 'model.layyers'");
  expect_usage_error("train --set model.heads=5", "does not divide model.d_model = 128");
  expect_usage_error("train --set train.steps=0", "train.steps = 0");
  EXPECT_EQ(run("sample --prompt hi").code, 2);  // missing --checkpoint
  EXPECT_EQ(run("ckpt").code, 2);                  // inspect or convert
  expect_usage_error("ckpt convert --in /nonexistent --out /tmp/x --dp 2", "holds no sharded checkpoint");
  expect_usage_error("ckpt inspect --verify /nonexistent", "holds no sharded checkpoint");
  expect_usage_error("train --set train.device=tpu", "train.device = 'tpu': expected cpu or cuda");
  // The default build has no CUDA backend: asked for, it says how to get one.
  expect_usage_error("train --device cuda --precision bf16", "built without CUDA; rebuild with");
}

TEST(Cli, RuntimeErrorsExitOneWithoutPartialCheckpoints) {
  const std::string dir = ::testing::TempDir() + "/loom_cli";
  std::ofstream(dir + "_latin1.txt") << std::string(500, 'x') << "\xe9t\xe9";
  Result r = run("train --set data.path=" + dir + "_latin1.txt --set checkpoint.dir=" + dir + "_ck");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("not valid UTF-8 at byte offset 500"), std::string::npos) << r.output;
  EXPECT_NE(std::system(("test -e " + dir + "_ck").c_str()), 0);  // nothing written
  r = run("sample --checkpoint /no/such/dir --prompt hi");
  EXPECT_EQ(r.code, 2);  // a path that does not exist is a usage error everywhere (issue 59)
  EXPECT_NE(r.output.find("/no/such/dir"), std::string::npos);
}

}  // namespace

namespace {

// `loom bench comm` on 3 thread ranks: every op and algorithm row is present, has the
// JSON fields scripts rely on, and checked correct; bad flags exit 2 naming the value.
TEST(Cli, BenchCommJsonRowsAreCompleteAndCorrect) {
  Result r = run("bench comm --threads 3 --op all --algorithm all --sizes 4K,64K+13 --iters 2 --json");
  ASSERT_EQ(r.code, 0) << r.output;
  int rows = 0;
  size_t pos = 0;
  while ((pos = r.output.find("{\"", pos)) != std::string::npos) {
    const std::string line = r.output.substr(pos, r.output.find('\n', pos) - pos);
    for (const char* field : {"\"op\":", "\"algorithm\":", "\"bytes\":", "\"ranks\":3", "\"time_us\":", "\"algbw_gbps\":",
                              "\"busbw_gbps\":"})
      EXPECT_NE(line.find(field), std::string::npos) << field << " in " << line;
    EXPECT_NE(line.find("\"correct\":true"), std::string::npos) << line;
    EXPECT_NE(line.find("\"iters\":2,"), std::string::npos) << line;
    ++rows;
    ++pos;
  }
  // all_reduce: auto, shm, ring, recursive, ring+bf16, ring+int8; 4 other ops x auto; 2 sizes.
  EXPECT_EQ(rows, 2 * (6 + 4));
  expect_usage_error("bench comm --threads 2 --sizes 4Q", "bad size '4Q'");
  expect_usage_error("bench comm --threads 2 --algorithm fastest", "unknown collective algorithm 'fastest'");
  expect_usage_error("bench comm --threads 2 --set comm.timeout_s=0", "comm.timeout_s = 0");
}

}  // namespace

namespace {

TEST(Cli, SimulatePrintsOneJsonObjectWithTheIssueFields) {
  const std::string trace = testing::TempDir() + "/sim_trace.json", svg = testing::TempDir() + "/sim.svg";
  std::filesystem::remove(trace), std::filesystem::remove(svg);  // those of an older loom carry no mark
  Result r = run("simulate --model gpt3-175b --gpus 64 --tp 8 --pp 8 --global-batch 64 --recompute full --json --trace " +
                 trace + " --svg " + svg);
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* key : {"\"step_time_s\"", "\"tokens_per_s\"", "\"tflops_per_gpu\"", "\"mfu\"", "\"hfu\"",
                          "\"bubble_fraction\"", "\"bubble_floor\"", "\"peak_memory_bytes\"", "\"breakdown\"", "\"layout\""})
    EXPECT_NE(r.output.find(key), std::string::npos) << key;
  std::ifstream t(trace), s(svg);
  std::string text((std::istreambuf_iterator<char>(t)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(text.find("\"F63\""), std::string::npos);  // the last micro-batch's forward
  std::string pic((std::istreambuf_iterator<char>(s)), std::istreambuf_iterator<char>());
  EXPECT_NE(pic.find("<svg"), std::string::npos);
}

// Note [Goodput] and Note [Elastic shapes]: simulate reports the goodput and save interval, and
// the layout an elastic job re-forms to after losing nodes; a partial failure model is refused.
TEST(Cli, SimulateReportsGoodputAndTheShrunkLayout) {
  const std::string base = "simulate --model llama3-70b --cluster dgx-h100 --gpus 1024 --tp 8 --pp 4 --global-batch 960 "
                           "--seq 8192 --sp --recompute selective";
  Result r = run(base + " --node-mtbf-h 50000 --save-s 60 --restart-s 600 --shrink-nodes 4");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("goodput: job MTBF 390.62 h over 128 nodes; save every"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("shrink: losing 4 node(s) (32 GPUs) of 128: dp 32 -> 30, grad_accum 30 -> 32 on 960 GPUs"),
            std::string::npos)
      << r.output;
  r = run(base + " --node-mtbf-h 50000");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("needs --node-mtbf-h H"), std::string::npos) << r.output;
}

// --ops itemizes the cost model per op; the block's GEMMs, attention and norms are there,
// and each row's step column is its forward + backward times the blocks and micro-batches.
TEST(Cli, SimulateOpsItemizesTheCostModel) {
  Result r = run("simulate --model gpt-1.7b --gpus 8 --tp 8 --global-batch 8 --ops");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* op : {"cost model per op", "block     qkv", "block     norm1", "head      logits", "total per step"})
    EXPECT_NE(r.output.find(op), std::string::npos) << op << "\n" << r.output;
}

TEST(Cli, SimulateNamesWhatDoesNotFit) {
  expect_usage_error("simulate --model gpt3-175b --gpus 12 --tp 8", "--gpus 12");
  expect_usage_error("simulate --model gpt3-175b --gpus 64 --tp 8 --pp 4 --dp 4", "set --gpus 128");
  expect_usage_error("simulate --model gpt3-175b --gpus 16 --tp 8 --cluster dgx-b900", "dgx-a100");
  expect_usage_error("simulate --model gpt3-175b --gpus 56 --tp 7", "parallel.tp = 7 does not divide model.heads = 96");
}

}  // namespace

namespace {

// A CPU cluster as `loom calibrate` writes one (shared device: loom's engine), at `path`.
void write_cpu_cluster(const std::string& path) {
  std::ofstream f(path);
  f << "name = \"cpu\"\ndevices_per_node = 2\n[device]\npeak_tflops = 0.1\nmemory_gib = 4\nmemory_gbps = 20\n"
       "dtype_bytes = 4\nmixed_precision = false\nshared = true\ngemm_efficiency = [[1e6, 0.5], [1e9, 1.0]]\n"
       "memory_efficiency = [[1e5, 0.5], [1e7, 1.0]]\n[intra]\ngbps = 5\n[inter]\ngbps = 5\n";
}

// A plan written by `loom plan --emit loom` trains as is, and `loom compare` lines up that
// layout's simulated and measured traces per rank and category.
TEST(Cli, PlanEmitsAConfigThatTrainsAndCompareLinesUpTraces) {
  const std::string dir = testing::TempDir(), cluster = dir + "/cpu_cluster.toml", plan = dir + "/plan.toml";
  write_cpu_cluster(cluster);
  const std::string model = " --set model.layers=2 model.ctx=32 train.steps=2 train.val_batches=1 checkpoint.dir=";
  Result r = run("plan --cluster " + cluster + " --gpus 1 --global-batch 4 --emit loom --out " + plan + model);
  ASSERT_EQ(r.code, 0) << r.output;
  r = run("train --plan " + plan + " --trace " + dir + "/measured.json");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("step 2/2"), std::string::npos) << r.output;
  r = run("simulate --cluster " + cluster + " --gpus 1 --config " + plan + " --trace " + dir + "/predicted.json");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run("compare " + dir + "/predicted.json " + dir + "/measured.json");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* row : {"step", "compute", "memory params", "memory activations"})
    EXPECT_NE(r.output.find(row), std::string::npos) << row << "\n" << r.output;
  EXPECT_EQ(run("compare " + dir + "/predicted.json /nonexistent.json").code, 2);
}

// Note [Measured bubble] and Note [Bubble floor] on hand-made traces (times in ms). Measured:
// rank 0 works 4 + 4 of its 9 ms window, rank 1 2 + 2: bubble 1 - 12 / 18 = 1/3, floor
// 1 - 12 / (2 x 8) = 1/4. Predicted: one 5 ms step a rank, one after the other: bubble 1/2,
// floor 0 (even work).
TEST(Cli, CompareReportsTheBubbleAndTheFloorOfUnequalStages) {
  const std::string dir = testing::TempDir();
  auto write = [&](const std::string& name, const std::vector<std::array<double, 3>>& spans) {
    std::ofstream f(dir + "/" + name);
    f << "{\"traceEvents\": [";
    for (int pid : {0, 1}) f << "{\"ph\": \"X\", \"cat\": \"step\", \"pid\": " << pid << ", \"ts\": 0, \"dur\": 10000},";
    for (size_t i = 0; i < spans.size(); i++)
      f << (i ? "," : "") << "{\"ph\": \"X\", \"cat\": \"pipeline\", \"name\": \"F" << i << "\", \"pid\": "
        << spans[i][0] << ", \"ts\": " << 1000 * spans[i][1] << ", \"dur\": " << 1000 * (spans[i][2] - spans[i][1]) << "}";
    f << "]}";
  };
  write("bubble_m.json", {{0, 0, 4}, {0, 5, 9}, {1, 1, 3}, {1, 6, 8}});
  write("bubble_p.json", {{0, 0, 5}, {1, 5, 10}});
  Result r = run("compare --json " + dir + "/bubble_p.json " + dir + "/bubble_m.json");
  ASSERT_EQ(r.code, 0) << r.output;
  std::map<std::string, std::pair<double, double>> got;  // category -> (predicted, measured)
  for (const auto& row : nlohmann::json::parse(r.output))
    if (row["rank"] == "all") got[row["category"]] = {row["predicted"], row["measured"]};
  ASSERT_EQ(got.size(), 2u) << r.output;
  EXPECT_NEAR(got["pipeline bubble"].first, 0.5, 1e-9);
  EXPECT_NEAR(got["pipeline bubble"].second, 1.0 / 3, 1e-9);
  EXPECT_NEAR(got["bubble floor"].first, 0.0, 1e-9);
  EXPECT_NEAR(got["bubble floor"].second, 0.25, 1e-9);
}

// `loom compare` of a trace with itself: its measured (pipeline bubble, bubble floor).
std::pair<double, double> measured_bubble(const std::string& trace) {
  const Result r = run("compare --json " + trace + " " + trace);
  EXPECT_EQ(r.code, 0) << r.output;
  std::map<std::string, double> got;
  for (const auto& row : nlohmann::json::parse(r.output))
    if (row["rank"] == "all") got[row["category"]] = row["measured"];
  return std::pair{got["pipeline bubble"], got["bubble floor"]};
}

// Note [Measured bubble]: a stream's flushing steps are left out while steady ones exist. Four
// 10 ms steps a rank (the first left out), each rank busy from 1 to 9 ms of its step: windows
// of 9 ms, bubble 1 - 16 / 18 = 1/9, floor 0; in the flushing step 4 (marked) rank 1 is busy
// 2 ms: bubble 1 - 10 / 18 = 4/9, floor 1 - 10 / 16 = 0.375. Marked all through, every counted
// step counts.
TEST(Cli, CompareLeavesOutAStreamsFlushingSteps) {
  const std::string dir = testing::TempDir();
  auto write = [&](const std::string& name, bool all_flush) {
    std::ofstream f(dir + "/" + name);
    f << "{\"traceEvents\": [";
    for (int k = 0; k < 4; k++)
      for (int pid : {0, 1}) {
        const bool flush = all_flush || k == 3, short_one = k == 3 && pid == 1;
        f << (k || pid ? "," : "") << "{\"ph\": \"X\", \"cat\": \"step\", \"pid\": " << pid
          << ", \"ts\": " << 10000 * k << ", \"dur\": 10000" << (flush ? ", \"args\": {\"flush\": 1}" : "")
          << "},{\"ph\": \"X\", \"cat\": \"pipeline\", \"name\": \"F\", \"pid\": " << pid
          << ", \"ts\": " << 10000 * k + 1000 << ", \"dur\": " << (short_one ? 2000 : 8000) << "}";
      }
    f << "]}";
  };
  write("flush_last.json", false);
  write("flush_all.json", true);
  const auto [bubble, floor] = measured_bubble(dir + "/flush_last.json");
  EXPECT_NEAR(bubble, 1.0 / 9, 1e-9);
  EXPECT_NEAR(floor, 0.0, 1e-9);
  const auto [all_bubble, all_floor] = measured_bubble(dir + "/flush_all.json");
  EXPECT_NEAR(all_bubble, (1.0 / 9 + 1.0 / 9 + 4.0 / 9) / 3, 1e-9);
  EXPECT_NEAR(all_floor, 0.375 / 3, 1e-9);
}

// Note [Measured bubble]: a 2bw update's work inside the stream (category "update") is busy
// time, as a pipeline step is. One 10 ms step a rank: rank 0 works 1-7 ms and updates 7-9,
// rank 1 works 2-8: windows of 9 ms, bubble 1 - (8 + 6) / 18 = 2/9, floor 1 - 14 / 16 =
// 1/8. Counted as idle (category "compute", which the flushing schedules' updates carry) the
// same span leaves 1 - 12 / 16 = 1/4 and a floor of 0.
TEST(Cli, CompareCountsAStreamsUpdateAsBusy) {
  const std::string dir = testing::TempDir();
  auto write = [&](const std::string& name, const std::string& update_cat) {
    std::ofstream f(dir + "/" + name);
    f << "{\"traceEvents\": [";
    for (int pid : {0, 1}) f << "{\"ph\": \"X\", \"cat\": \"step\", \"pid\": " << pid << ", \"ts\": 0, \"dur\": 10000},";
    f << "{\"ph\": \"X\", \"cat\": \"pipeline\", \"name\": \"F0\", \"pid\": 0, \"ts\": 1000, \"dur\": 6000},"
      << "{\"ph\": \"X\", \"cat\": \"" << update_cat << "\", \"name\": \"U\", \"pid\": 0, \"ts\": 7000, \"dur\": 2000},"
      << "{\"ph\": \"X\", \"cat\": \"pipeline\", \"name\": \"F0\", \"pid\": 1, \"ts\": 2000, \"dur\": 6000}]}";
  };
  write("update_busy.json", "update");
  write("update_idle.json", "compute");
  const auto [bubble, floor] = measured_bubble(dir + "/update_busy.json");
  EXPECT_NEAR(bubble, 2.0 / 9, 1e-9);
  EXPECT_NEAR(floor, 1.0 / 8, 1e-9);
  const auto [idle_bubble, idle_floor] = measured_bubble(dir + "/update_idle.json");
  EXPECT_NEAR(idle_bubble, 1.0 / 4, 1e-9);
  EXPECT_NEAR(idle_floor, 0.0, 1e-9);
}

// Note [Measured bubble]: an update inside a pipeline step (2bw's update of its vocabulary rows
// in a pass: Note [Vocabulary passes across a step's end]) is counted once. Both ranks in V0 at
// 1-7 ms of a 10 ms step, rank 0's U at 5-7 inside it: windows of 7 ms, busy 6 + 6, bubble
// 1 - 12 / 14 = 1/7 (0 were the U counted again), floor 0.
TEST(Cli, CompareCountsAnUpdateInsideAPassOnce) {
  const std::string path = testing::TempDir() + "/update_nested.json";
  {
    std::ofstream f(path);
    f << "{\"traceEvents\": [";
    for (int pid : {0, 1}) f << "{\"ph\": \"X\", \"cat\": \"step\", \"pid\": " << pid << ", \"ts\": 0, \"dur\": 10000},";
    f << "{\"ph\": \"X\", \"cat\": \"pipeline\", \"name\": \"V0\", \"pid\": 0, \"ts\": 1000, \"dur\": 6000},"
      << "{\"ph\": \"X\", \"cat\": \"update\", \"name\": \"U\", \"pid\": 0, \"ts\": 5000, \"dur\": 2000},"
      << "{\"ph\": \"X\", \"cat\": \"pipeline\", \"name\": \"V0\", \"pid\": 1, \"ts\": 1000, \"dur\": 6000}]}";
  }
  const auto [bubble, floor] = measured_bubble(path);
  EXPECT_NEAR(bubble, 1.0 / 7, 1e-9);
  EXPECT_NEAR(floor, 0.0, 1e-9);
}

// On a calibrated CPU `loom simulate` prices the batch split `loom train` runs (one
// micro-batch of the whole batch unless grad_accum says otherwise); Megatron's micro-batch 1
// stays the default of the GPU frameworks.
TEST(Cli, SimulateOnACpuSplitsTheBatchAsTrainDoes) {
  const std::string cluster = testing::TempDir() + "/cpu_cluster_split.toml";
  write_cpu_cluster(cluster);
  const std::string args = "simulate --json --cluster " + cluster + " --gpus 1 --set model.layers=2 model.ctx=32 train.batch=8";
  auto split = [](const std::string& cmd) {
    const Result r = run(cmd);
    EXPECT_EQ(r.code, 0) << r.output;
    auto field = [&](const std::string& key) {
      const size_t at = r.output.find("\"" + key + "\":");
      return at == std::string::npos ? -1 : std::stoll(r.output.substr(at + key.size() + 3));
    };
    return std::pair{field("micro_batch"), field("grad_accum")};
  };
  EXPECT_EQ(split(args), (std::pair<long long, long long>{8, 1}));
  EXPECT_EQ(split(args + " train.grad_accum=2"), (std::pair<long long, long long>{4, 2}));
  EXPECT_EQ(split(args + " --framework megatron"), (std::pair<long long, long long>{1, 8}));
}

// Note [Stack efficiency]: --compute-efficiency runs the cluster's GEMMs and attention at that
// fraction, says so in the cluster's name, and refuses what is not a fraction, naming it.
TEST(Cli, SimulateAtAStacksComputeEfficiency) {
  const std::string args = "simulate --json --cluster dgx-h100 --gpus 8 --model gpt2 --global-batch 64";
  auto step = [](const Result& r) {
    const size_t at = r.output.find("\"step_time_s\":");
    return at == std::string::npos ? -1.0 : std::stod(r.output.substr(at + 14));
  };
  const Result full = run(args), slow = run(args + " --compute-efficiency 0.5");
  ASSERT_EQ(full.code, 0) << full.output;
  ASSERT_EQ(slow.code, 0) << slow.output;
  EXPECT_GT(step(slow), step(full));
  EXPECT_NE(slow.output.find("dgx-h100 at 0.5 compute"), std::string::npos) << slow.output;
  const Result plan = run("plan --cluster dgx-h100 --gpus 8 --model gpt2 --global-batch 64 --top 1 --compute-efficiency 0.5");
  ASSERT_EQ(plan.code, 0) << plan.output;
  EXPECT_NE(plan.output.find("(dgx-h100 at 0.5 compute)"), std::string::npos) << plan.output;
  // Note [Backward prefetch]: FSDP's BACKWARD_POST exposes backward's gathers; other frameworks refuse it.
  const std::string fsdp = "simulate --json --cluster dgx-a100 --gpus 16 --model gpt2 --global-batch 128 "
                           "--framework fsdp --set parallel.zero=3";
  const Result pre = run(fsdp), post = run(fsdp + " --backward-prefetch post");
  ASSERT_EQ(post.code, 0) << post.output;
  EXPECT_GT(step(post), step(pre));
  EXPECT_EQ(run(args + " --backward-prefetch post").code, 2);
  for (const char* bad : {"0", "1.5"}) {
    const Result r = run(args + " --compute-efficiency " + bad);
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find(std::string("--compute-efficiency ") + bad), std::string::npos) << r.output;
  }
}

// Note [fp8 GEMMs]: `loom simulate` prices the config's train.gemm_format (what `loom train`
// runs) unless --precision says otherwise, and refuses fp8 under loom's own framework, which
// it does not price, naming the key.
TEST(Cli, SimulatePricesTheConfigsGemmFormat) {
  // A 1.1B Llama, large enough that its GEMMs gain more than the casts cost.
  const std::string args = "simulate --json --cluster dgx-h100 --gpus 1 --model llama --global-batch 8 "
                           "--set model.layers=16 model.d_model=2048 model.heads=16 model.kv_heads=8 model.ffn=8192 "
                           "model.vocab=32000 model.ctx=2048 train.seq=2048 train.device=cuda train.precision=bf16";
  auto step = [](const Result& r) {
    const size_t at = r.output.find("\"step_time_s\":");
    return at == std::string::npos ? -1.0 : std::stod(r.output.substr(at + 14));
  };
  const Result bf16 = run(args), fp8 = run(args + " --set train.gemm_format=fp8"),
               back = run(args + " --set train.gemm_format=fp8 --precision bf16");
  ASSERT_EQ(bf16.code, 0) << bf16.output;
  ASSERT_EQ(fp8.code, 0) << fp8.output;
  EXPECT_LT(step(fp8), step(bf16));
  EXPECT_EQ(step(back), step(bf16));
  const Result loom = run(args + " --set train.gemm_format=fp8 --framework loom");
  EXPECT_EQ(loom.code, 2) << loom.output;
  EXPECT_NE(loom.output.find("train.gemm_format"), std::string::npos) << loom.output;
  // A config invalid as given is reported for what it says: the batch split simulate derives
  // comes from its train.batch (8 here, set by key), not from the default's 16.
  const Result only = run("simulate --cluster dgx-h100 --gpus 1 --model llama --set train.batch=8 "
                          "train.device=cuda train.precision=bf16 train.gemm_format=mxfp8");
  EXPECT_EQ(only.code, 2) << only.output;
  EXPECT_NE(only.output.find("train.gemm_format = mxfp8"), std::string::npos) << only.output;
  EXPECT_EQ(only.output.find("grad_accum"), std::string::npos) << only.output;
}

}  // namespace

// Issue 24: `loom simulate` given a model by shape says what it derived and what it took
// from the default preset, instead of silently simulating tiny's ffn and vocabulary.
TEST(Cli, SimulateNamesKeysDerivedForAModelGivenByShape) {
  const auto r = loom::testing_support::run_loom(
      "simulate --set model.layers=24 --set model.d_model=2048 --set model.heads=16 --gpus 8 --global-batch 64");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("model by shape on dgx-a100"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("note: model.ffn = 8192 (4 x d_model, GPT)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model.vocab = 256, model.ctx = 128 from the default preset 'tiny'"), std::string::npos)
      << r.output;
}

// Issue 24: the framework's overlap is a flag, not an assumption. Without overlap the whole
// gradient reduction is exposed; blocking sends lengthen a pipelined step.
TEST(Cli, SimulateOverlapFlagsChangeWhatTheyModel) {
  auto field = [](const std::string& args, const std::string& key) {
    const auto r = loom::testing_support::run_loom("simulate --json " + args);
    EXPECT_EQ(r.code, 0) << r.output;
    const size_t at = r.output.find("\"" + key + "\":");
    EXPECT_NE(at, std::string::npos) << r.output;
    return std::stod(r.output.substr(at + key.size() + 3));
  };
  const std::string dp = "--model gpt-7.5b --gpus 64 --global-batch 512 --tp 4";
  EXPECT_GT(field(dp + " --dp-overlap off", "dp_exposed_s"), 2 * field(dp + " --dp-overlap on", "dp_exposed_s"));
  const std::string pp = "--model gpt-18b --gpus 64 --global-batch 512 --tp 8 --pp 4";
  EXPECT_GT(field(pp + " --blocking-p2p", "step_time_s"), field(pp, "step_time_s"));
  expect_usage_error("simulate " + dp + " --dp-overlap maybe", "--dp-overlap");
  // Note [Fused attention kernels]: a Hopper kernel beats FlashAttention-2 at 16k tokens on
  // H100; an unknown kernel, or a Megatron kernel for loom's engine, is refused by name.
  const std::string seq = "--model gpt-7.5b --cluster dgx-h100 --gpus 8 --global-batch 8 --tp 8 --set model.ctx=16384";
  EXPECT_LT(field(seq + " --attention flash3", "step_time_s"), field(seq + " --attention flash2", "step_time_s"));
  expect_usage_error("simulate " + seq + " --attention flash4", "--attention");
  expect_usage_error("simulate " + seq + " --attention flash2 --framework loom", "--framework megatron");
}

// Issue 21 item 4: every plan line carries the simulator's expected error for its kind of
// layout (Note [Error bands]), in text and JSON, and --explain compares #1 with #2 term by
// term (Note [Plan explanation]).
TEST(Cli, PlanLinesCarryErrorBandsAndExplainComparesTheFirstTwo) {
  const std::string args = "plan --model gpt-1.7b --gpus 16 --global-batch 64 --top 2 --framework fsdp";
  auto r = loom::testing_support::run_loom(args + " --explain");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("expected error: step time"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("published sharded data-parallel runs on A100"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("why #1 ("), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("peak memory:"), std::string::npos) << r.output;
  r = loom::testing_support::run_loom(args + " --json --explain");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("\"error_band\":{\"basis\":"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"explain\":{\"gap_rel\":"), std::string::npos) << r.output;
  // The plan alone on stdout has no room for the explanation: refused, naming the fix.
  expect_usage_error(args + " --explain --emit loom", "add --out FILE");
}
