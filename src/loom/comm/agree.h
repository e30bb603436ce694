// Outcome agreement across ranks: an operation that may fail on some ranks only (a file
// check, a checkpoint load) is followed by one agreement, so that no rank goes on into a
// collective the failed ones will never join, and every rank can say what went wrong.
#pragma once

#include <exception>
#include <optional>
#include <string>

#include "loom/core/error.h"

namespace loom {

namespace comm {
class Group;
}

struct AgreedFailure {
  int rank = 0;              // the lowest failing rank of the group
  std::string message;       // its error (truncated to 2,000 bytes)
  Error::Kind kind = Error::Kind::kRuntime;
};

// Collective over `group` (nullptr: one process, no communication). `mine` is this rank's
// error, if any. Returns the lowest failing rank's error on every rank, or nullopt when
// no rank failed.
std::optional<AgreedFailure> agree(comm::Group* group, int group_rank, std::exception_ptr mine);

// As agree(), then throws: the failing rank its own exception, the others an Error that
// names the failing rank and quotes it, with its kind (so the exit code is the same).
void agree_or_throw(comm::Group* group, int group_rank, std::exception_ptr mine);

}  // namespace loom
