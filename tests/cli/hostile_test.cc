// Issue 59 through the `loom` binary, the findings that are not about ownership: no runaway
// run exits 0, nothing non-finite is imported, nothing loom reads blocks on a FIFO or reads
// a device without bound, and nothing in a checkpoint is followed as a path.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdint>
#include <cstring>
#include <limits>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "loom/core/safetensors.h"

#include "support/loom_cli.h"

namespace {

namespace fs = std::filesystem;

using namespace loom::testing_support::cli_case;  // Result, run, kTiny, train

std::string fresh(const std::string& name) { return loom::testing_support::fresh_dir("hostile_" + name); }

std::string read(const std::string& path) { return loom::testing_support::read_bytes(path); }

// Finding 4: weights that overflow at step 1 make every later step's loss non-finite: the
// run stops there, exits non-zero, never says "done" and saves nothing.
TEST(Hostile, ARunawayFp16RunStopsAndSavesNothing) {
  const std::string d = fresh("runaway");
  for (const char* scale : {"auto", "1024"}) {
    const std::string ck = d + "/ck_" + scale;
    const Result r = run(train(ck, 6, std::string("--precision fp16 --set optim.lr=1e30 --set train.loss_scale=") + scale));
    EXPECT_EQ(r.code, 1) << scale << "\n" << r.output;
    EXPECT_NE(r.output.find("training diverged: loss is"), std::string::npos) << scale << "\n" << r.output;
    EXPECT_EQ(r.output.find("done"), std::string::npos) << scale << "\n" << r.output;
    for (const auto& e : fs::directory_iterator(ck))
      EXPECT_EQ(e.path().filename().string().rfind("step-", 0), std::string::npos) << e.path();
  }
}

// Finding 7: an export whose weights hold a NaN or an infinity is refused by import.
TEST(Hostile, ImportRefusesNonFiniteWeights) {
  const std::string d = fresh("nan");
  ASSERT_EQ(run(train(d + "/ck", 1)).code, 0);
  ASSERT_EQ(run("export --checkpoint " + d + "/ck --format safetensors --out " + d + "/m.st").code, 0);
  std::string bytes = read(d + "/m.st");
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = (header << 8) | uint8_t(bytes[size_t(i)]);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bytes.data() + 8 + header + 4 * 100, &nan, 4);  // the 101st float of the data
  std::ofstream(d + "/nan.st", std::ios::binary) << bytes;
  const Result r = run("import --format safetensors --in " + d + "/nan.st --checkpoint " + d + "/imp");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("NaN or infinite values"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(d + "/imp/model.safetensors"));
}

// Findings 9 and 11 and 17: a FIFO in place of a checkpoint's file, a device as a config or
// an input: each is refused at once (a blocked read would hang the test).
TEST(Hostile, FifosAndDevicesAreRefusedNotRead) {
  const std::string d = fresh("fifo");
  const std::string ck = d + "/ck";
  ASSERT_EQ(run(train(ck, 2)).code, 0);
  const std::string rank = ck + "/step-00000002/rank-00000.bin";
  fs::remove(rank);
  ASSERT_EQ(::mkfifo(rank.c_str(), 0644), 0);
  for (const std::string& cmd : {"ckpt inspect --verify " + ck, "sample --checkpoint " + ck + " --prompt x --tokens 2"}) {
    const Result r = run(cmd);
    EXPECT_NE(r.code, 0) << cmd << "\n" << r.output;
    EXPECT_NE(r.output.find("a FIFO, socket or device"), std::string::npos) << cmd << "\n" << r.output;
  }
  Result r = run(train(ck, 3, "--resume auto"));
  EXPECT_NE(r.output.find("skipping step-00000002"), std::string::npos) << r.output;
  ASSERT_EQ(::mkfifo((d + "/config.toml").c_str(), 0644), 0);
  for (const std::string& cfg : {d + "/config.toml", std::string("/dev/urandom"), std::string("/dev/zero")}) {
    r = run("train --config " + cfg + " --set checkpoint.dir=" + d + "/never");
    EXPECT_EQ(r.code, 2) << cfg << "\n" << r.output;
    EXPECT_NE(r.output.find("a FIFO, socket or device"), std::string::npos) << cfg << "\n" << r.output;
  }
  EXPECT_FALSE(fs::exists(d + "/never"));
  ASSERT_EQ(::mkfifo((d + "/train_00000.bin").c_str(), 0644), 0);  // a FIFO as a token shard
  r = run("data inspect " + d + "/train_00000.bin");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("a FIFO, socket or device"), std::string::npos) << r.output;
  r = run("tokenizer encode --tokenizer byte --in /dev/zero");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("a FIFO, socket or device"), std::string::npos) << r.output;
}

// Finding 10 and the export's absolute paths: an export carries no path of the machine
// that wrote it, and an import follows none that a file's metadata names.
TEST(Hostile, NothingInACheckpointIsFollowedAsAPath) {
  const std::string d = fresh("paths");
  ASSERT_EQ(run(train(d + "/ck", 1)).code, 0);
  ASSERT_EQ(run("export --checkpoint " + d + "/ck --format safetensors --out " + d + "/m.st").code, 0);
  const std::string bytes = read(d + "/m.st");
  EXPECT_EQ(bytes.find(d), std::string::npos) << "the export names a path of this machine";
  // Metadata that names a FIFO as the tokenizer: import drops it, sample never opens it.
  ASSERT_EQ(::mkfifo((d + "/tok.json").c_str(), 0644), 0);
  loom::StFile f = loom::read_safetensors(d + "/m.st");
  std::string& cfg = f.metadata.at("loom_config");
  cfg = std::regex_replace(cfg, std::regex("tokenizer = '[^']*'"), "tokenizer = '" + d + "/tok.json'");
  ASSERT_NE(cfg.find("tok.json"), std::string::npos);
  loom::write_safetensors(d + "/forged.st", f);
  ASSERT_EQ(run("import --format safetensors --in " + d + "/forged.st --checkpoint " + d + "/imp").code, 0);
  EXPECT_EQ(read(d + "/imp/config.toml").find("tok.json"), std::string::npos);
  const Result r = run("sample --checkpoint " + d + "/imp --prompt x --tokens 2");
  EXPECT_EQ(r.code, 0) << r.output;
}

// Exit codes: a path the user names that does not exist is a usage error (2) in every
// command, and the message names it.
TEST(Hostile, AMissingPathIsAUsageErrorEverywhere) {
  const std::string none = fresh("missing") + "/none";
  for (const std::string& cmd :
       {"import --format safetensors --in " + none + " --checkpoint " + none + "_imp",
        "sample --checkpoint " + none + " --prompt a", "export --checkpoint " + none + " --out " + none + ".st",
        "tokenizer encode --tokenizer byte --in " + none, "tokenizer decode --tokenizer byte --in " + none,
        "tokenizer encode --tokenizer " + none + ".json --text a", "ckpt inspect " + none,
        "ckpt convert --in " + none + " --out " + none + "_conv --dp 2",
        "data prepare --tokenizer byte --in " + none + " --out " + none + "_prep", "data inspect " + none,
        "train --config " + none, "train --resume " + none + " --set checkpoint.dir=" + none + "_ck"}) {
    const Result r = run(cmd);
    EXPECT_EQ(r.code, 2) << cmd << "\n" << r.output;
    EXPECT_NE(r.output.find(none), std::string::npos) << cmd << "\n" << r.output;
  }
}

// Finding 5 and the oversized simulation: a model whose training state exceeds all the
// memory the cluster has is pruned whole before the search (Note [Impossible models]), and
// simulate says when its peak does not fit.
TEST(Hostile, ImpossibleModelsAreRefusedBeforeTheSearch) {
  const std::string absurd = " --model gpt2 --set model.layers=20000 --set model.d_model=65536 --set model.heads=512";
  Result r = run("plan" + absurd + " --gpus 8");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("state over the cluster's memory: 351666 billion parameters"), std::string::npos) << r.output;
  r = run("simulate --model gpt2 --set model.layers=2000 --set model.d_model=8192 --set model.heads=64 --gpus 8 "
          "--tp 8 --global-batch 8");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("DOES NOT FIT"), std::string::npos) << r.output;
}

// Note [Vocabulary passes]: loom simulate prices parallel.pp_vocab; loom plan, which
// recommends only what the engine runs, refuses to search it by name.
// The planner searches the vocabulary split over the pipeline only where the engine runs it
// (Note [Vocabulary passes]): no ranked plan pairs it with a stream schedule or parameter servers.
TEST(Hostile, ThePlannerSearchesTheVocabularySplitOnlyWhereTheEngineRunsIt) {
  const std::string vocab = " --model gpt2 --set model.layers=4 --set parallel.pp=2 --set parallel.pp_vocab=true";
  Result r = run("plan" + vocab + " --gpus 4 --framework loom --ps dense --top 400");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(" pp_vocab "), std::string::npos) << r.output;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);)  // the ranked plans: "#N  dp .. tp .. pp .."
    if (line.size() > 1 && line[0] == '#' && std::isdigit(static_cast<unsigned char>(line[1])) &&
        line.find(" pp_vocab ") != std::string::npos)
      for (const char* no : {" pipedream ", " pipemare ", "parameter servers"})  // 2bw runs it (issue 55)
        EXPECT_EQ(line.find(no), std::string::npos) << line;
  r = run("simulate" + vocab + " --gpus 2 --pp 2 --grad-accum 4 --global-batch 4");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("vocabulary passes' comm"), std::string::npos) << r.output;
}

// Finding 16: an end-of-document token past 32 bits (CRCs made valid) is refused, not cut.
TEST(Hostile, AShardHeaderEndOfDocumentPast32BitsIsRefused) {
  const std::string d = fresh("eod");
  std::ofstream(d + "/in.txt") << "one\n%\ntwo\n%\nthree\n";
  ASSERT_EQ(run("data prepare --tokenizer byte --in " + d + "/in.txt --doc-separator % --val-fraction 0 --out " + d +
                "/out").code, 0);
  const std::string shard = d + "/out/train_00000.bin";
  std::string bytes = read(shard);
  const int64_t eod = (int64_t(1) << 32) + 10;
  std::memcpy(bytes.data() + 40, &eod, 8);
  // Header CRC over bytes [0, 52): zlib's crc32, computed here the same way.
  uint32_t c = 0xffffffffu;
  for (int i = 0; i < 52; ++i) {
    c ^= uint8_t(bytes[size_t(i)]);
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  c ^= 0xffffffffu;
  std::memcpy(bytes.data() + 52, &c, 4);
  std::ofstream(shard, std::ios::binary | std::ios::trunc) << bytes;
  const Result r = run("data inspect " + shard);
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("end_of_document 4294967306"), std::string::npos) << r.output;
}

// "Also weak": `sample --tokens 1e8` printed nothing until the end. Now the first text comes
// out while the command is still sampling (it is killed once it has shown 64 bytes).
TEST(Hostile, SampleStreamsItsTokens) {
  const std::string d = fresh("stream");
  ASSERT_EQ(run(train(d + "/ck", 1)).code, 0);
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(out[1], 1);
    close(out[0]);
    const std::string ck = d + "/ck";
    execl(LOOM_BINARY, LOOM_BINARY, "sample", "--checkpoint", ck.c_str(), "--tokens", "100000000", "--temperature",
          "1", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  std::string got;
  bool running_after_64 = false;
  for (int waited_ms = 0; waited_ms < 120000 && got.size() < 64; waited_ms += 100) {
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buf[256];
    const ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n <= 0) break;
    got.append(buf, size_t(n));
    if (got.size() >= 64) running_after_64 = waitpid(pid, nullptr, WNOHANG) == 0;
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  close(out[0]);
  EXPECT_GE(got.size(), 64u) << got;
  EXPECT_TRUE(running_after_64) << "the text must come out while 1e8 tokens are still being sampled";
}

// Finding 18: an async parameter-server job with a slow worker announced W x steps = 12
// pushes and applied 13. Each run (timings differ) now applies exactly the 12 it announced.
TEST(Hostile, AnAsyncParameterServerAppliesThePushesItAnnounced) {
  const std::string d = fresh("ps");
  for (int run_no = 0; run_no < 3; ++run_no) {
    const Result r = run(train(d + "/ck", 6, "--nproc 3 --dp 2 --set parallel.ps_servers=1 --set ps.mode=async "
                                             "--set ps.slow_worker=1 --set ps.slow_factor=2 --set comm.timeout_s=30 "
                                             "--set checkpoint.dir="));
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("the run ends after 12 pushes"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("): 12 pushes applied"), std::string::npos) << r.output;
  }
}

}  // namespace
