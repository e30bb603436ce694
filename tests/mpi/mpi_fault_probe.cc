// A misbehaving MPI job for tests/mpi/check_fault.sh. Modes:
//   late     - the last rank computes (sleeps) past the timeout before collective #2;
//   skip     - the last rank skips collective #2 and waits in a receive instead;
//   desync   - debug mode; the last rank issues all_gather where the others all_reduce.
// Every rank prints its error to stderr and exits 1, as `loom` does.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "loom/comm/mpi_backend.h"
#include "loom/comm/world.h"

using namespace loom::comm;

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "late";
  CommOptions options;
  options.timeout = std::chrono::milliseconds(1000);
  options.status_grace = std::chrono::milliseconds(500);
  options.check_desync = std::strcmp(mode, "desync") == 0;
  int rank = -1;
  try {
    World w(make_mpi_backend(), options);
    rank = w.global_rank();
    const bool last = rank == w.world_size() - 1;
    std::vector<float> x(1000, 1.f), all(1000 * w.world_size());
    w.world_group().all_reduce(std::span(x));
    if (last && std::strcmp(mode, "late") == 0) std::this_thread::sleep_for(std::chrono::seconds(30));
    if (last && std::strcmp(mode, "skip") == 0) {
      w.world_group().recv(std::span(x), 0, 1);
    } else if (last && options.check_desync) {
      w.world_group().all_gather(std::span<const float>(x), std::span(all));
    } else {
      w.world_group().all_reduce(std::span(x));
    }
    std::printf("rank %d finished\n", rank);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d error: %s\n", rank, e.what());
    return 1;
  }
  return 0;
}
