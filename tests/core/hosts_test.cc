// Note [Host lists], Note [Status over TCP] and Note [Elastic shapes].
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "loom/core/config.h"
#include "loom/core/elastic.h"
#include "loom/core/error.h"
#include "loom/core/hosts.h"
#include "loom/core/status_link.h"

namespace loom {
namespace {

std::string refusal(const std::string& spec) {
  try {
    parse_hosts(spec);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Hosts, InlineListsAndHostfilesGiveTheSameHostsInOrder) {
  const std::vector<HostSlots> inline_list = parse_hosts("node-a:2,10.0.0.7:3,c");
  ASSERT_EQ(inline_list.size(), 3u);
  EXPECT_EQ(host_arg(inline_list), "node-a:2,10.0.0.7:3,c:1");
  EXPECT_EQ(total_slots(inline_list), 6);
  EXPECT_EQ(host_of_ranks(inline_list),
            (std::vector<std::string>{"node-a", "node-a", "10.0.0.7", "10.0.0.7", "10.0.0.7", "c"}));
  // OpenMPI's and DeepSpeed's hostfile: comments, blank lines, max_slots, a bare host.
  const std::string file = ::testing::TempDir() + "/hosts_test_hostfile";
  std::ofstream(file) << "# the job's hosts\nnode-a slots=2   # first\n\n10.0.0.7 slots=3 max_slots=8\nc\n";
  EXPECT_EQ(host_arg(parse_hosts(file)), "node-a:2,10.0.0.7:3,c:1");
}

TEST(Hosts, BadListsAreRefusedNamingTheItemOrLine) {
  EXPECT_NE(refusal("a:2,a:1").find("host a is listed twice"), std::string::npos);
  EXPECT_NE(refusal("a:0").find("item 'a:0' (expected HOST or HOST:SLOTS): host a needs a positive slot count"),
            std::string::npos)
      << refusal("a:0");
  EXPECT_NE(refusal("a:two").find("item 'a:two'"), std::string::npos);
  EXPECT_NE(refusal("a b:2").find("'a b' is not a host name"), std::string::npos) << refusal("a b:2");
  EXPECT_NE(refusal("").find("names no host"), std::string::npos) << refusal("");
  EXPECT_NE(refusal("a,,b").find("item ''"), std::string::npos) << refusal("a,,b");
  EXPECT_NE(refusal("/no/such/hostfile").find("no hostfile '/no/such/hostfile'"), std::string::npos);
  try {
    parse_hostfile_text("a slots=2\nb cpus=4\n", "hosts.txt");
    FAIL() << "expected an error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("hosts.txt line 2: 'cpus=4' is not understood (expected HOST slots=N)"),
              std::string::npos)
        << e.what();
  }
}

std::string read(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

// Waits up to 5 s for `done`.
template <class F>
bool eventually(F done) {
  for (int i = 0; i < 500 && !done(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return done();
}

TEST(StatusOverTcp, ARanksLinesBecomeTheStatusFilesAndAClosedLinkIsALostRank) {
  namespace fs = std::filesystem;
  const std::string dir = ::testing::TempDir() + "/status_over_tcp";
  fs::remove_all(dir), fs::create_directories(dir);
  StatusServer server(dir, 3, "secret");
  const std::string addrs = server.addresses();
  EXPECT_NE(addrs.find("127.0.0.1:"), std::string::npos) << addrs;
  {
    StatusLink one(addrs, 1, "host-b", "secret");
    ASSERT_TRUE(eventually([&] { return server.host_of(1) == "host-b"; }));
    EXPECT_TRUE(one.send("beat 7 1234 0 41"));
    ASSERT_TRUE(eventually([&] { return read(dir + "/beat-1") == "7 1234 0 41"; })) << read(dir + "/beat-1");
    EXPECT_TRUE(one.send("exit 0"));
    ASSERT_TRUE(eventually([&] { return read(dir + "/rank-1") == "0"; }));
  }
  StatusLink two(addrs, 2, "host-c", "secret");
  ASSERT_TRUE(eventually([&] { return server.host_of(2) == "host-c"; }));
  EXPECT_FALSE(server.lost(1));  // it said exit before its connection closed
  // The supervisor ends a remote rank by saying kill.
  std::thread killer([&] { EXPECT_TRUE(server.kill(2)); });
  EXPECT_TRUE(two.wait_for_kill());
  killer.join();
  {
    StatusLink gone(addrs, 0, "host-a", "secret");
    ASSERT_TRUE(eventually([&] { return server.host_of(0) == "host-a"; }));
  }  // closed without exit: lost
  EXPECT_TRUE(eventually([&] { return server.lost(0); }));
  EXPECT_FALSE(fs::exists(dir + "/rank-0"));
  // A hello with another token speaks for nobody.
  StatusLink stranger(addrs, 2, "host-x", "guess");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(server.host_of(2), "host-c");
  EXPECT_FALSE(stranger.wait_for_kill());  // the server closed it
}

TEST(StatusOverTcp, NoSupervisorAtAnyAddressIsAnErrorNamingThem) {
  try {
    StatusLink link("127.0.0.1:1", 3, "host-d", "t");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3 on host host-d cannot reach its supervisor at any of 127.0.0.1:1"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// Note [Elastic shapes]: the model's split stays; dp shrinks to the largest that fits the
// slots and divides the global batch's micro-batches; the micro-batch stays.
TEST(ElasticShape, DataParallelismShrinksAndAccumulationKeepsTheGlobalBatch) {
  const Config c = load_config("", {"parallel.dp=4", "parallel.tp=2", "train.batch=24", "train.grad_accum=1"});
  EXPECT_EQ(c.micro_batch(), 6);
  const ElasticShape six = elastic_shape(c, 6);  // 3 replicas fit; 4 micro-batches: dp 2
  EXPECT_EQ(six.dp, 2);
  EXPECT_EQ(six.grad_accum, 2);
  EXPECT_EQ(six.micro_batch, 6);
  EXPECT_EQ(six.ranks, 4);
  EXPECT_EQ(elastic_shape(c, 8).dp, 4);
  EXPECT_EQ(elastic_shape(c, 2).grad_accum, 4);
  EXPECT_FALSE(elastic_shape(c, 2).replanned);
  const Config ps = load_config("", {"parallel.dp=2", "parallel.ps_servers=1"});
  EXPECT_NE(elastic_shape(ps, 8).problem.find("parameter-server"), std::string::npos);
}

// Note [Elastic shapes]: slots that hold no replica re-plan the split: the most slots used,
// then the most of tp, then of pp, each candidate through the engine's config checks.
TEST(ElasticShape, TooFewSlotsForTheSplitReplanIt) {
  const Config c = load_config("", {"parallel.dp=4", "parallel.tp=2", "train.batch=24", "train.grad_accum=1"});
  const ElasticShape one = elastic_shape(c, 1);  // was: "1 slots hold no replica of the model's split"
  EXPECT_TRUE(one.replanned);
  EXPECT_EQ(one.problem, "");
  EXPECT_EQ(one.split_text(), "tp 1 pp 1 cp 1");
  EXPECT_EQ(one.dp, 1);
  EXPECT_EQ(one.grad_accum, 4);
  EXPECT_EQ(one.micro_batch, 6);
  // tp 4 x pp 2 (8 ranks a replica) on 3 slots: tp 2 x pp 1, tp 1 x pp 2 and dp 2 of tp 1 x pp 1
  // all use 2 slots; tp 2 is kept.
  const Config big = load_config("", {"model.layers=4", "model.heads=4", "parallel.tp=4", "parallel.pp=2",
                                      "parallel.vpp=2", "parallel.schedule=interleaved", "parallel.sp=true",
                                      "train.batch=8", "train.grad_accum=4"});
  const ElasticShape three = elastic_shape(big, 3);
  EXPECT_TRUE(three.replanned);
  EXPECT_EQ(three.split_text(), "tp 2 pp 1 cp 1");
  EXPECT_EQ(three.ranks, 2);
  EXPECT_EQ(three.vpp, 1);  // no pipeline left: no chunks, and the schedule is 1f1b
  EXPECT_EQ(three.schedule, ScheduleKind::k1F1B);
  EXPECT_TRUE(three.sp);
  const Config shaped = with_shape(big, three);
  EXPECT_EQ(validation_errors(shaped), std::vector<std::string>{});
  EXPECT_EQ(shaped.train.batch, 8);
  EXPECT_EQ(shaped.micro_batch() * shaped.train.grad_accum * shaped.parallel.dp, 8);
  // The sets a relaunch passes give the same config.
  std::vector<std::string> sets = {"model.layers=4", "model.heads=4", "parallel.tp=4", "parallel.pp=2", "parallel.vpp=2",
                                   "parallel.schedule=interleaved", "parallel.sp=true", "train.batch=8",
                                   "train.grad_accum=4"};
  for (const std::string& s : three.sets()) sets.push_back(s);
  const Config relaunched = load_config("", sets);
  EXPECT_EQ(relaunched.parallel.tp, 2);
  EXPECT_EQ(relaunched.parallel.pp, 1);
  EXPECT_EQ(relaunched.parallel.ranks(), 2);
  EXPECT_EQ(relaunched.micro_batch(), shaped.micro_batch());
  // A split whose smaller forms the config refuses is not offered: 3 heads take no tp 2.
  const Config odd = load_config("", {"model.heads=3", "model.d_model=96", "parallel.tp=3", "train.batch=4"});
  EXPECT_EQ(elastic_shape(odd, 2).split_text(), "tp 1 pp 1 cp 1");
}

// Note [Elastic shapes]: what `refuses` turns down (memory, in the supervisor) moves the choice
// on tier by tier: the split kept, smaller splits, a higher ZeRO stage, then any split the slots
// hold, the smallest first.
TEST(ElasticShape, ARefusedShapeMovesTheChoiceToTheNextTier) {
  const Config c = load_config("", {"parallel.dp=4", "parallel.zero=1", "model.heads=4", "train.batch=8",
                                    "train.grad_accum=1"});
  std::vector<std::string> asked;
  auto refuse = [&](int64_t up_to_split, int64_t up_to_zero) {
    return [&asked, up_to_split, up_to_zero](const ElasticShape& s) -> std::string {
      asked.push_back(s.split_text() + " dp " + std::to_string(s.dp));
      return s.tp * s.pp * s.cp <= up_to_split && s.zero <= up_to_zero ? "too big" : "";
    };
  };
  EXPECT_EQ(elastic_shape(c, 4, refuse(0, 3)).split_text(), "tp 1 pp 1 cp 1");  // nothing refused: kept
  asked.clear();
  const ElasticShape z2 = elastic_shape(c, 4, refuse(1, 1));
  EXPECT_EQ(z2.split_text(), "tp 1 pp 1 cp 1 zero 2");
  EXPECT_EQ(z2.dp, 4);
  EXPECT_EQ(asked, (std::vector<std::string>{"tp 1 pp 1 cp 1 dp 4", "tp 1 pp 1 cp 1 zero 2 dp 4"}));
  asked.clear();
  const ElasticShape tp2 = elastic_shape(c, 4, refuse(1, 3));  // every unsplit shape refused
  EXPECT_EQ(tp2.split_text(), "tp 2 pp 1 cp 1");  // the smallest split using 4 slots, the most tp
  EXPECT_EQ(tp2.dp, 2);
  EXPECT_EQ(tp2.zero, 1);
  EXPECT_FALSE(tp2.zero_raised);
  EXPECT_EQ(asked.size(), 4u);  // zero 1, 2, 3 unsplit, then tp 2
  const ElasticShape none = elastic_shape(c, 4, refuse(64, 3));
  EXPECT_NE(none.problem.find("slots hold fits; the first (tp 1 pp 1 cp 1, dp 4): too big"), std::string::npos)
      << none.problem;
}

TEST(ElasticShape, TheRangeIsMinToMaxHosts) {
  EXPECT_EQ(parse_elastic("2:4").min_hosts, 2);
  EXPECT_EQ(parse_elastic("2:4").max_hosts, 4);
  EXPECT_EQ(parse_elastic("3").max_hosts, 3);
  for (const char* bad : {"4:2", "0:2", "a:b", ":", "2:"}) {
    try {
      parse_elastic(bad);
      ADD_FAILURE() << bad;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("--elastic ") + bad), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace loom
