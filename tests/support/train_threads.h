// Trains a parallel layout with its ranks as threads of this process (the thread backend)
// and returns every rank's summary; any rank's error fails the calling test.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <sstream>
#include <string>
#include <vector>

#include "loom/comm/world.h"
#include "loom/train/trainer.h"

namespace loom::testing_support {

// `hosts` (one per rank) makes the ranks pretend to sit on those hosts.
inline std::vector<TrainSummary> train_as_threads(const Config& c, TrainOptions o = {},
                                                  std::vector<std::string> hosts = {}) {
  std::vector<TrainSummary> out(size_t(c.parallel.ranks()));
  std::ostringstream sink;
  if (!o.out) o.out = &sink;
  if (!o.err) o.err = &sink;
  comm::CommOptions copt;  // the config's bound, as loom verify and loom train use it
  copt.timeout = std::chrono::milliseconds(int64_t(c.comm.timeout_s * 1000));
  const auto errors = comm::run_threads(int(c.parallel.ranks()), copt, [&](comm::World& w) {
    out[size_t(w.global_rank())] = train(c, o, w);
  }, std::move(hosts));
  EXPECT_EQ(errors, std::vector<std::string>(errors.size()));
  return out;
}

// As above with every rank's final parameters kept, resumed from `resume` when given.
inline std::vector<TrainSummary> train_keeping_params(const Config& c, const std::string& resume = "") {
  TrainOptions o;
  o.keep_params = true;
  o.resume = resume;
  return train_as_threads(c, o);
}

}  // namespace loom::testing_support
