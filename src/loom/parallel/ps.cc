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

std::vector<std::unique_ptr<comm::Group>> ps_links(comm::World& world, int workers, int servers) {
  std::vector<std::unique_ptr<comm::Group>> out;
  const bool server = world.global_rank() >= workers;
  for (int w = 0; w < workers; ++w) {
    std::vector<std::vector<int>> partition(1, {w});
    for (int s = 0; s < servers; ++s) partition[0].push_back(workers + s);
    for (int o = 0; o < workers; ++o)
      if (o != w) partition.push_back({o});
    std::unique_ptr<comm::Group> g = world.group(partition, "ps_link");
    if (server || w == world.global_rank()) out.push_back(std::move(g));
  }
  return out;
}

int ps_tag(int64_t clock) { return int(clock % kPsInitTag); }

PsWorker::PsWorker(comm::Group& link, std::vector<FlatRange> ranges)
    : link_(link), ranges_(std::move(ranges)), versions_(ranges_.size(), 0.0f) {
  LOOM_ASSERT(link_.size() == int(ranges_.size()) + 1, "a PS link holds the worker and every server");
  int64_t most = 0;
  for (const FlatRange& r : ranges_) most = std::max(most, r.count);
  out_.resize(size_t(most + PsPush::kTrailer));
  in_.resize(size_t(most + PsAnswer::kTrailer));
}

void PsWorker::init_servers(const float* params) {
  for (size_t s = 0; s < ranges_.size(); ++s)
    link_.send(std::span<const float>(params + ranges_[s].offset, size_t(ranges_[s].count)), 1 + int(s), kPsInitTag);
}

void PsWorker::read_answer(size_t s, std::span<const float> in, PsReply& reply, std::vector<bool>& stopped) {
  const float* t = in.data() + in.size() - PsAnswer::kTrailer;
  versions_[s] = t[PsAnswer::kVersion];
  stopped[s] = t[PsAnswer::kStop] != 0;
  reply.stop = reply.stop || stopped[s];
  if (s == 0) reply.norm = std::sqrt(double(t[PsAnswer::kNormSq])), reply.lr = double(t[PsAnswer::kLr]);
}

// A bye to every server still waiting for our next push (clock + 1).
void PsWorker::send_byes(int64_t clock, const std::vector<bool>& stopped) {
  for (size_t s = 0; s < ranges_.size(); ++s) {
    if (stopped[s]) continue;
    float* t = out_.data() + ranges_[s].count;
    t[PsPush::kClock] = -1;
    link_.send(std::span<const float>(out_.data(), size_t(ranges_[s].count + PsPush::kTrailer)), 1 + int(s),
               ps_tag(clock + 1));
  }
}

PsReply PsWorker::push_pull(const float* grads, float* params, int64_t clock, double norm_sq) {
  if (before_push) before_push(clock);
  if (sparse_) return push_pull_sparse(grads, params, clock, norm_sq);
  const size_t S = ranges_.size();
  // Sends go one server after another from one buffer; the answers come back in server order.
  for (size_t s = 0; s < S; ++s) {
    const FlatRange& r = ranges_[s];
    std::copy(grads + r.offset, grads + r.offset + r.count, out_.begin());
    float* t = out_.data() + r.count;
    t[PsPush::kClock] = float(clock), t[PsPush::kVersion] = versions_[s], t[PsPush::kNormSq] = float(norm_sq);
    link_.send(std::span<const float>(out_.data(), size_t(r.count + PsPush::kTrailer)), 1 + int(s), ps_tag(clock));
    bytes_ += 4.0 * double(2 * r.count + PsPush::kTrailer + PsAnswer::kTrailer);
    table_bytes_ += 8.0 * double(floats_of(table_part(r, table_)));
  }
  PsReply reply;
  std::vector<bool> stopped(S, false);
  for (size_t s = 0; s < S; ++s) {
    const FlatRange& r = ranges_[s];
    const std::span<float> in(in_.data(), size_t(r.count + PsAnswer::kTrailer));
    link_.recv(in, 1 + int(s), ps_tag(clock));
    std::copy(in.begin(), in.begin() + r.count, params + r.offset);
    read_answer(s, in, reply, stopped);
  }
  calls_++;
  if (reply.stop) send_byes(clock, stopped);
  return reply;
}

void PsWorker::set_rows(std::vector<int32_t> push, std::vector<int32_t> pull, bool pull_all) {
  push_rows_ = std::move(push), pull_rows_ = std::move(pull), pull_all_ = pull_all;
}

// Note [Sparse embeddings]: per server, the header, the ids of its rows, then the dense
// pieces and the pushed rows; the answer brings the dense pieces and the pulled rows.
PsReply PsWorker::push_pull_sparse(const float* grads, float* params, int64_t clock, double norm_sq) {
  const size_t S = ranges_.size();
  std::vector<std::vector<FlatRange>> back(S);  // where each answer's floats land
  for (size_t s = 0; s < S; ++s) {
    const FlatRange& r = ranges_[s];
    const std::vector<int32_t> push = rows_within(push_rows_, r, table_), pull = rows_within(pull_rows_, r, table_);
    float head[PsSparseHeader::kSize] = {float(clock), versions_[s], float(norm_sq), float(push.size()),
                                         pull_all_ ? -1.0f : float(pull.size())};
    link_.send(std::span<const float>(head, PsSparseHeader::kSize), 1 + int(s), ps_tag(clock));
    std::vector<float> ids(push.begin(), push.end());
    if (!pull_all_) ids.insert(ids.end(), pull.begin(), pull.end());
    ids.push_back(0.0f);  // never empty
    link_.send(std::span<const float>(ids), 1 + int(s), ps_tag(clock));
    std::vector<FlatRange> pieces = dense_pieces(r, table_);
    const std::vector<FlatRange> pushed = row_pieces(push, r, table_);
    pieces.insert(pieces.end(), pushed.begin(), pushed.end());
    std::vector<float> payload(size_t(floats_of(pieces)));
    gather_ranges(grads, pieces, payload.data());
    link_.send(std::span<const float>(payload), 1 + int(s), ps_tag(clock));
    back[s] = dense_pieces(r, table_);
    const std::vector<FlatRange> pulled = pull_all_ ? table_part(r, table_) : row_pieces(pull, r, table_);
    back[s].insert(back[s].end(), pulled.begin(), pulled.end());
    bytes_ += 4.0 * double(PsSparseHeader::kSize + int64_t(ids.size()) + int64_t(payload.size()) + floats_of(back[s]) +
                           PsAnswer::kTrailer);
    table_bytes_ += 4.0 * double(floats_of(pushed) + floats_of(pulled) + int64_t(ids.size()));
  }
  PsReply reply;
  std::vector<bool> stopped(S, false);
  for (size_t s = 0; s < S; ++s) {
    std::vector<float> in(size_t(floats_of(back[s]) + PsAnswer::kTrailer));
    link_.recv(std::span<float>(in), 1 + int(s), ps_tag(clock));
    scatter_ranges(in.data(), back[s], params);
    read_answer(s, in, reply, stopped);
  }
  calls_++;
  LOOM_ASSERT(!reply.stop || std::all_of(stopped.begin(), stopped.end(), [](bool b) { return b; }),
              "sparse embeddings run under ps.mode = sync only: every server stops together");
  return reply;
}

}  // namespace loom::parallel
