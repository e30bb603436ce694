#include "loom/parallel/ps.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "loom/comm/world.h"
#include "loom/core/error.h"

namespace loom::parallel {

std::vector<FlatRange> ps_partition(int64_t floats, int servers, int64_t key_floats) {
  LOOM_CHECK(servers >= 1 && key_floats >= 1 && floats >= 0, "ps_partition: ", servers, " servers, keys of ",
             key_floats, " floats");
  const int64_t keys = (floats + key_floats - 1) / key_floats;
  LOOM_CHECK(keys >= servers, "parallel.ps_servers = ", servers, " but the model has only ", keys, " keys of ",
             key_floats, " floats (", floats, " parameters): use at most ", keys, " servers");
  std::vector<FlatRange> out;
  int64_t key = 0;
  for (int s = 0; s < servers; ++s) {
    const int64_t n = keys / servers + (s < keys % servers ? 1 : 0);
    const int64_t lo = key * key_floats, hi = std::min(floats, (key + n) * key_floats);
    out.push_back({lo, hi - lo});
    key += n;
  }
  return out;
}

std::unique_ptr<comm::Group> ps_role_group(comm::World& world, int workers, int servers) {
  LOOM_CHECK(world.world_size() == workers + servers, "a parameter-server job of ", workers, " workers and ", servers,
             " servers needs ", workers + servers, " ranks, got ", world.world_size());
  std::vector<int> w(static_cast<size_t>(workers)), s(static_cast<size_t>(servers));
  std::iota(w.begin(), w.end(), 0);
  std::iota(s.begin(), s.end(), workers);
  return world.group(std::vector<std::vector<int>>{w, s}, "ps_role");
}

int ps_tag(int64_t step) { return int(step % kPsInitTag); }

PsWorker::PsWorker(comm::Group& all, std::vector<FlatRange> ranges, int first_server)
    : all_(all), ranges_(std::move(ranges)), first_server_(first_server) {
  int64_t most = 0;
  for (const FlatRange& r : ranges_) most = std::max(most, r.count);
  pulled_.resize(size_t(most + 1));
}

void PsWorker::init_servers(const float* params) {
  std::vector<comm::Work> sent;
  for (size_t s = 0; s < ranges_.size(); ++s)
    sent.push_back(all_.send(std::span<const float>(params + ranges_[s].offset, size_t(ranges_[s].count)),
                             first_server_ + int(s), kPsInitTag, {.async = true}));
  for (comm::Work& w : sent) w.wait();
}

double PsWorker::push_pull(const float* grads, float* params, int64_t step) {
  if (before_push) before_push(step);
  std::vector<comm::Work> pushed;
  for (size_t s = 0; s < ranges_.size(); ++s)
    pushed.push_back(all_.send(std::span<const float>(grads + ranges_[s].offset, size_t(ranges_[s].count)),
                               first_server_ + int(s), ps_tag(step), {.async = true}));
  double norm_sq = 0;
  for (size_t s = 0; s < ranges_.size(); ++s) {
    const FlatRange& r = ranges_[s];
    const std::span<float> in(pulled_.data(), size_t(r.count + 1));
    all_.recv(in, first_server_ + int(s), ps_tag(step));
    std::copy(in.begin(), in.end() - 1, params + r.offset);
    if (s == 0) norm_sq = double(in.back());
  }
  for (comm::Work& w : pushed) w.wait();
  return std::sqrt(norm_sq);
}

}  // namespace loom::parallel
