// In-process backend: every rank is a thread of one process (multi-rank unit tests in
// plain ctest). Messages are copied into the receiver's inbox at send time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "loom/comm/transport.h"

namespace loom::comm {

class ThreadHub;

// hosts: the host name each rank pretends to run on (empty: all on "localhost"), so
// node-aware algorithms can be tested in one process.
std::shared_ptr<ThreadHub> make_thread_hub(int world_size, std::vector<std::string> hosts = {});
std::unique_ptr<Backend> make_thread_backend(std::shared_ptr<ThreadHub> hub, int global_rank);
// Marks a rank's thread as finished (its status then reads "exited: note").
void mark_thread_exited(ThreadHub& hub, int global_rank, const std::string& note);

}  // namespace loom::comm
