#include "loom/comm/agree.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

#include "loom/comm/group.h"

namespace loom {

namespace {

constexpr size_t kMessageBytes = 2048;

AgreedFailure describe(const std::exception_ptr& e, int rank) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& x) {
    return {rank, x.what(), x.kind()};
  } catch (const std::exception& x) {
    return {rank, x.what(), Error::Kind::kRuntime};
  } catch (...) {
    return {rank, "unknown exception", Error::Kind::kRuntime};
  }
}

}  // namespace

std::optional<AgreedFailure> agree(comm::Group* group, int group_rank, std::exception_ptr mine) {
  if (!group) {
    if (!mine) return std::nullopt;
    return describe(mine, group_rank);
  }
  // max(-rank) over the failing ranks is minus the lowest of them.
  double lowest[1] = {mine ? -double(group_rank) : -1e18};
  group->all_reduce(std::span<double>(lowest), comm::ReduceOp::kMax);
  if (lowest[0] < -1e17) return std::nullopt;
  const int root = int(-lowest[0]);
  // The root's kind (1 byte) and message, NUL-padded.
  std::vector<uint8_t> buf(kMessageBytes, 0);
  if (group_rank == root) {
    const AgreedFailure own = describe(mine, group_rank);
    buf[0] = own.kind == Error::Kind::kConfig ? 2 : 1;
    const std::string& m = own.message;
    std::memcpy(buf.data() + 1, m.data(), std::min(m.size(), kMessageBytes - 2));
  }
  group->broadcast(std::span<uint8_t>(buf), root);
  AgreedFailure f;
  f.rank = root;
  f.kind = buf[0] == 2 ? Error::Kind::kConfig : Error::Kind::kRuntime;
  f.message = reinterpret_cast<const char*>(buf.data() + 1);
  return f;
}

void agree_or_throw(comm::Group* group, int group_rank, std::exception_ptr mine) {
  const std::optional<AgreedFailure> f = agree(group, group_rank, mine);
  if (!f) return;
  if (mine) std::rethrow_exception(mine);
  throw Error("rank " + std::to_string(f->rank) + " failed: " + f->message, f->kind);
}

}  // namespace loom
