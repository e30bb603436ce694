// GPU data parallelism (Note [GPU data parallelism] in cuda/nccl.h): the GPU assignment and
// the refusals (host logic, run everywhere), the NCCL communicator on one rank, and two
// ranks on the one GPU a lent machine has, which NCCL either runs or refuses: either way
// every rank returns (no hang) with the same outcome.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <atomic>
#include <string>
#include <vector>

#include "loom/comm/transport.h"
#include "loom/comm/world.h"
#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/cuda/check.h"
#include "loom/cuda/nccl.h"
#include "loom/cuda/train.h"
#include "cuda/cuda_test_util.h"

namespace loom::cuda {
namespace {

TEST(CudaNccl, GpuForRankIsTheRankIndexOnItsHostAndRefusesTooFewGpus) {
  const std::vector<std::string> hosts = {"a", "a", "b", "a"};
  EXPECT_EQ(gpu_for_rank(hosts, 0, 3), 0);
  EXPECT_EQ(gpu_for_rank(hosts, 1, 3), 1);
  EXPECT_EQ(gpu_for_rank(hosts, 2, 3), 0);
  EXPECT_EQ(gpu_for_rank(hosts, 3, 3), 2);
  EXPECT_EQ(gpu_for_rank(hosts, 1, 2), 1);
  try {
    gpu_for_rank(hosts, 3, 2);
    FAIL() << "the third rank on host a with 2 GPUs was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("host a runs 3 ranks but has 2 GPUs"), std::string::npos) << e.what();
  }
}

std::string refusal(const std::vector<std::string>& sets, int ranks) {
  std::vector<std::string> all = {"model.preset=tiny", "train.precision=bf16"};
  all.insert(all.end(), sets.begin(), sets.end());
  try {
    check_supported(load_config("", all), ranks);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(CudaNccl, DataParallelRunsNeedOneProcessPerRankAndPlainReplicas) {
  if (nccl_available()) {
    EXPECT_EQ(refusal({"parallel.dp=2"}, 2), "");
    EXPECT_NE(refusal({"parallel.dp=2"}, 1).find("add --nproc 2"), std::string::npos);
  } else {
    EXPECT_NE(refusal({"parallel.dp=2"}, 2).find("needs NCCL"), std::string::npos);
  }
  EXPECT_NE(refusal({"parallel.dp=2", "parallel.zero=1"}, 2).find("zero = 0"), std::string::npos);
  EXPECT_NE(refusal({"parallel.dp=2", "parallel.compress=topk"}, 2).find("gradient compression"), std::string::npos);
}

TEST(CudaNccl, OneRankSumsBroadcastsAndWaits) {
  REQUIRE_DEVICE();
  if (!nccl_available()) GTEST_SKIP() << "no NCCL here (libnccl.so.2 not on the library path)";
  const auto errors = comm::run_threads(1, comm::CommOptions{}, [](comm::World& w) {
    LOOM_CUDA_OK(cudaSetDevice(0));
    Nccl nccl(w.world_group(), 30.0);
    EXPECT_EQ(nccl.size(), 1);
    EXPECT_EQ(nccl.rank(), 0);
    cudaStream_t s;
    LOOM_CUDA_OK(cudaStreamCreate(&s));
    const std::vector<float> h = randn(1001);
    Dev<float> d(h);
    nccl.all_reduce_sum(d.p, int64_t(h.size()), s);
    nccl.broadcast(d.p, int64_t(h.size()), 0, s);
    nccl.wait(s, "test collectives");
    EXPECT_EQ(d.get(), h);
    const std::vector<double> hd = {1.5, -2.25, 3.0};
    Dev<double> dd(hd);
    nccl.all_reduce_sum(dd.p, 3, s);
    nccl.wait(s, "test double sum");
    EXPECT_EQ(dd.get(), hd);
    LOOM_CUDA_OK(cudaStreamDestroy(s));
  });
  EXPECT_EQ(errors, std::vector<std::string>(1));
}

// NCCL has refused two ranks on one device ("Duplicate GPU"); if this one runs them, the
// sum is checked, else each rank must get the communicator's error, not a hang.
TEST(CudaNccl, TwoRanksOnOneGpuRunOrFailTogether) {
  REQUIRE_DEVICE();
  if (!nccl_available()) GTEST_SKIP() << "no NCCL here (libnccl.so.2 not on the library path)";
  std::atomic<int> ran{0};
  const auto errors = comm::run_threads(2, comm::CommOptions{}, [&](comm::World& w) {
    LOOM_CUDA_OK(cudaSetDevice(0));
    Nccl nccl(w.world_group(), 20.0);
    cudaStream_t s;
    LOOM_CUDA_OK(cudaStreamCreate(&s));
    const std::vector<float> h = {1.0f + float(w.global_rank()), 2.0f};
    Dev<float> d(h);
    nccl.all_reduce_sum(d.p, 2, s);
    nccl.wait(s, "two-rank sum");
    EXPECT_EQ(d.get(), (std::vector<float>{3.0f, 4.0f}));
    LOOM_CUDA_OK(cudaStreamDestroy(s));
    ran++;
  });
  if (ran == 2) {
    std::cout << "NCCL ran two ranks on one GPU\n";
    EXPECT_EQ(errors, std::vector<std::string>(2));
  } else {
    std::cout << "NCCL refused two ranks on one GPU: " << errors[0] << "\n";
    EXPECT_EQ(ran, 0) << "one rank ran and the other failed: " << errors[0] << " | " << errors[1];
    for (const std::string& e : errors) EXPECT_NE(e.find("NCCL"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace loom::cuda
