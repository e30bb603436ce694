// main() of a GoogleTest binary run under mpirun: one MPI World for the whole process
// (handed to the tests through `bind`), progress printed by rank 0 only, and the exit
// code is a failure on any rank.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <span>

#include "loom/comm/mpi_backend.h"
#include "loom/comm/world.h"

namespace testing_support {

inline int run_mpi_tests(int argc, char** argv, const std::function<void(loom::comm::World*)>& bind) {
  ::testing::InitGoogleTest(&argc, argv);
  int failed = 0;
  {
    loom::comm::CommOptions options;
    options.timeout = std::chrono::milliseconds(60'000);
    loom::comm::World world(loom::comm::make_mpi_backend(), options);
    bind(&world);
    if (world.global_rank() != 0) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
    }
    failed = RUN_ALL_TESTS();
    int any = failed;
    world.world_group().all_reduce(std::span(&any, 1), loom::comm::ReduceOp::kMax);
    failed = any;
    bind(nullptr);
  }
  return failed;
}

}  // namespace testing_support
