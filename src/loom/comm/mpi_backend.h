// MPI backend (OpenMPI by default; builds against any MPI-3 library, e.g. MPICH).
//
// All MPI calls of a process go through one mutex, so the library only needs
// MPI_THREAD_SERIALIZED even when several groups run collectives on worker threads.
#pragma once

#include <memory>
#include <span>

#include "loom/comm/transport.h"

namespace loom::comm {

// Initialises MPI on first use (MPI_Init_thread) and finalises it when the backend is
// destroyed normally; when destroyed during an exception it does not finalise, so a rank
// that failed can exit without waiting for peers that may be gone.
std::unique_ptr<Backend> make_mpi_backend();

// MPI's own blocking collective on MPI_COMM_WORLD, called the way a user calls it (the
// peer rows of `loom bench comm`): in-place all_reduce/broadcast (root 0), out-of-place
// reduce_scatter_block, all_gather and all_to_all. Only while no loom collective runs.
void mpi_user_collective(OpKind op, std::span<const std::byte> in, std::span<std::byte> out, size_t count, DType dtype);

// True when this process was started by an MPI launcher (mpirun/mpiexec/srun).
bool launched_by_mpi();

}  // namespace loom::comm
