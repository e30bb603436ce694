// MPI backend (OpenMPI by default; builds against any MPI-3 library, e.g. MPICH).
//
// All MPI calls of a process go through one mutex, so the library only needs
// MPI_THREAD_SERIALIZED even when several groups run collectives on worker threads.
#pragma once

#include <memory>

#include "loom/comm/transport.h"

namespace loom::comm {

// Initialises MPI on first use (MPI_Init_thread) and finalises it when the backend is
// destroyed normally; when destroyed during an exception it does not finalise, so a rank
// that failed can exit without waiting for peers that may be gone.
std::unique_ptr<Backend> make_mpi_backend();

// True when this process was started by an MPI launcher (mpirun/mpiexec/srun).
bool launched_by_mpi();

}  // namespace loom::comm
