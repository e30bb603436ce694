// Note [Ownership by content]: temporary names, the marker that proves a temporary
// directory loom's, and reads that never block on a FIFO or device.
#include "loom/core/owned.h"

#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "support/abandoned.h"

namespace loom::owned {
namespace {

namespace fs = std::filesystem;

std::string fresh(const std::string& name) {
  const std::string d = ::testing::TempDir() + "/owned_" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(Owned, TempNamesCarryASixteenDigitToken) {
  const std::string t = new_token();
  EXPECT_EQ(t.size(), 16u);
  EXPECT_NE(t, new_token());
  const auto p = parse_temp_name(temp_name("step-00000010", t));
  ASSERT_TRUE(p);
  EXPECT_EQ(p->first, "step-00000010");
  EXPECT_EQ(p->second, t);
  for (const char* n : {"step-00000010.tmp", "x.loom-tmp-", "x.loom-tmp-0123", "x.loom-tmp-0123456789ABCDEF",
                        ".loom-tmp-0123456789abcdef", "x.loom-tmp-0123456789abcdefg"})
    EXPECT_FALSE(parse_temp_name(n)) << n;
}

TEST(Owned, OnlyAMarkedDirectoryWhoseMakerIsGoneIsAbandoned) {
  const std::string d = fresh("abandoned");
  const std::string dead = testing_support::abandoned_temp(d, "ck");
  ASSERT_FALSE(dead.empty());
  const std::string dead_name = fs::path(dead).filename().string();
  bool live = true;
  EXPECT_TRUE(is_abandoned_temp(d, dead_name, &live));
  EXPECT_FALSE(live);
  {
    const TempDir mine(d, "ck");  // this process holds it: live, not abandoned
    const std::string name = fs::path(mine.path()).filename().string();
    EXPECT_FALSE(is_abandoned_temp(d, name, &live));
    EXPECT_TRUE(live);
    // Imitations: the right name without a marker, a marker naming another token, a
    // marker that is a symlink, a file in place of the directory.
    fs::create_directories(d + "/ck.loom-tmp-0000000000000001");
    fs::create_directories(d + "/ck.loom-tmp-0000000000000002");
    std::ofstream(d + "/ck.loom-tmp-0000000000000002/.loom-owner") << "loom-owned-1 0000000000000009 pid 1 host x\n";
    fs::create_directories(d + "/ck.loom-tmp-0000000000000003");
    std::ofstream(d + "/elsewhere") << "loom-owned-1 0000000000000003 pid 1 host x\n";
    fs::create_symlink(d + "/elsewhere", d + "/ck.loom-tmp-0000000000000003/.loom-owner");
    std::ofstream(d + "/ck.loom-tmp-0000000000000004") << "a file";
    for (const char* n : {"ck.loom-tmp-0000000000000001", "ck.loom-tmp-0000000000000002",
                          "ck.loom-tmp-0000000000000003", "ck.loom-tmp-0000000000000004"}) {
      EXPECT_FALSE(is_abandoned_temp(d, n, &live)) << n;
      EXPECT_FALSE(live) << n;
    }
    EXPECT_EQ(remove_abandoned(d, "ck"), std::vector<std::string>{dead_name});
    EXPECT_TRUE(fs::exists(mine.path()));
  }
  EXPECT_FALSE(fs::exists(dead));
  for (const char* n : {"ck.loom-tmp-0000000000000001", "ck.loom-tmp-0000000000000002",
                        "ck.loom-tmp-0000000000000003", "ck.loom-tmp-0000000000000004", "elsewhere"})
    EXPECT_TRUE(fs::exists(fs::symlink_status(d + "/" + n))) << n;
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator()), 5);  // `mine` removed itself
}

// Note [Ownership by content]: the states a kill can leave while a temporary directory is
// made, published or removed (its marker beside it, by a maker now gone), each proved and
// cleared; imitations of them are not.
TEST(Owned, EveryInstantOfATemporaryDirectoryLeavesItProved) {
  const std::string d = fresh("instants");
  const auto marker = [&](const std::string& path, const char* token) {
    std::ofstream(path) << "loom-owned-1 " << token << " pid 1 host x\n";
  };
  const std::string a = "ck.loom-tmp-00000000000000a1", b = "ck.loom-tmp-00000000000000b2",
                    c = "ck.loom-tmp-00000000000000c3";
  marker(d + "/" + a + ".loom-owner", "00000000000000a1");  // made: the marker, not yet the directory
  fs::create_directories(d + "/" + b);                       // made: the directory, the marker still beside
  marker(d + "/" + b + ".loom-owner", "00000000000000b2");
  fs::create_directories(d + "/" + c);                       // published or removed midway: files left
  std::ofstream(d + "/" + c + "/rank-0.bin") << "x";
  marker(d + "/" + c + ".loom-owner", "00000000000000c3");
  EXPECT_EQ(parse_marker_name(b + ".loom-owner"), b);
  EXPECT_FALSE(parse_marker_name("ck.loom-owner"));
  for (const std::string& n : {a + ".loom-owner", b, b + ".loom-owner", c, c + ".loom-owner"})
    EXPECT_TRUE(is_abandoned_temp(d, n)) << n;
  // Imitations: a directory beside a marker naming another token; a marker that is a symlink.
  const std::string x = "ck.loom-tmp-00000000000000d4", y = "ck.loom-tmp-00000000000000e5";
  fs::create_directories(d + "/" + x);
  marker(d + "/" + x + ".loom-owner", "00000000000000ff");
  fs::create_directories(d + "/" + y);
  marker(d + "/elsewhere", "00000000000000e5");
  fs::create_symlink(d + "/elsewhere", d + "/" + y + ".loom-owner");
  for (const std::string& n : {x, x + ".loom-owner", y, y + ".loom-owner"}) EXPECT_FALSE(is_abandoned_temp(d, n)) << n;
  EXPECT_EQ(remove_abandoned(d, "ck"), (std::vector<std::string>{a + ".loom-owner", b, c}));
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator()), 5);  // x, y, their markers, elsewhere
  {
    // A live maker's marker, moved out as it is while publishing: live, not abandoned.
    TempDir mine(d, "live");
    const std::string name = fs::path(mine.path()).filename().string();
    fs::rename(mine.path() + "/.loom-owner", mine.path() + ".loom-owner");
    bool live = false;
    EXPECT_FALSE(is_abandoned_temp(d, name, &live));
    EXPECT_TRUE(live);
    EXPECT_FALSE(is_abandoned_temp(d, name + ".loom-owner", &live));
    EXPECT_TRUE(live);
    fs::rename(mine.path() + ".loom-owner", mine.path() + "/.loom-owner");
    // A failed finish puts the marker back inside: still proved, still live.
    std::ofstream(mine.path() + "/left") << "x";
    EXPECT_THROW(mine.finish_empty(), Error);
    EXPECT_TRUE(fs::exists(mine.path() + "/.loom-owner"));
    EXPECT_FALSE(fs::exists(mine.path() + ".loom-owner"));
    EXPECT_FALSE(is_abandoned_temp(d, name, &live));
    EXPECT_TRUE(live);
  }
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator()), 5);  // `mine` and its marker gone
}

TEST(Owned, APublishedDirectoryKeepsNoMarker) {
  const std::string d = fresh("publish");
  {
    TempDir t(d, "out");
    std::ofstream(t.path() + "/a.bin") << "x";
    t.publish(d + "/out");
  }
  EXPECT_TRUE(fs::exists(d + "/out/a.bin"));
  EXPECT_FALSE(fs::exists(d + "/out/.loom-owner"));
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator()), 1);
}

TEST(Owned, ReadsRefuseFifosDevicesAndOversizedFiles) {
  const std::string d = fresh("read");
  ASSERT_EQ(::mkfifo((d + "/fifo").c_str(), 0644), 0);
  EXPECT_THROW(read_regular(d + "/fifo", 1 << 20), Error);  // returns at once: no writer is waited for
  EXPECT_THROW(read_file_bytes(d + "/fifo"), Error);
  EXPECT_THROW(read_file_bytes("/dev/zero"), Error);
  EXPECT_THROW(read_file_bytes("/dev/urandom"), Error);
  std::ofstream(d + "/f") << "0123456789";
  EXPECT_EQ(read_regular(d + "/f", 10), "0123456789");
  EXPECT_THROW(read_regular(d + "/f", 9), Error);
  fs::create_symlink(d + "/f", d + "/link");
  EXPECT_EQ(read_regular(d + "/link", 10), "0123456789");
  EXPECT_THROW(read_regular(d + "/link", 10, false), Error);
  EXPECT_EQ(kind_of(d + "/link"), Kind::kSymlink);
  EXPECT_EQ(kind_of(d + "/fifo"), Kind::kOther);
}

TEST(Owned, AtomicWritesNeverFollowASymlinkOrLeaveATemporary) {
  const std::string d = fresh("write");
  std::ofstream(d + "/victim") << "precious";
  // A user's symlink with the old temporary name is not followed (it is not the name used).
  fs::create_symlink(d + "/victim", d + "/latest.tmp");
  write_file_atomic(d + "/latest", "step-00000001\n");
  EXPECT_EQ(read_file_bytes(d + "/victim"), "precious");
  EXPECT_EQ(read_file_bytes(d + "/latest"), "step-00000001\n");
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator()), 3);
}

// Issue 59 "outputs check their size against free space first": what cannot fit is refused
// before a byte is written, naming the size, the directory, its free space and the fix.
TEST(Owned, OutputsThatCannotFitAreRefusedBeforeWriting) {
  const std::string d = fresh("space");
  EXPECT_NO_THROW(require_free_space(d, 1.0, "one byte", "-"));
  try {
    require_free_space(d, 1e18, "the export 'm.st'", "free space");
    ADD_FAILURE() << "an exabyte fitted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the export 'm.st' takes 1e+09 GB and '" + d + "' has "), std::string::npos) << what;
    EXPECT_NE(what.find(" GB free: free space"), std::string::npos) << what;
  }
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator()), 0);
}

}  // namespace
}  // namespace loom::owned
