#pragma once
// --collective mpi (asgd cluster under mpirun): the allreduce policy's
// all-reduce through Open MPI's MPI_Allreduce instead of asgd's own ring or
// shared memory. Every rank of the job, whatever its role, holds an
// MpiSession for its whole life (MPI_Init and MPI_Finalize are collective
// over mpirun's ranks); a worker's also gives it the collective its
// process trains with. Built in where Debian's libopenmpi-dev is found
// (mpi_session.cpp); otherwise start() says so (mpi_session_none.cpp).

#include <memory>

#include "asgd/status.hpp"
#include "messaging/collective.hpp"

namespace asgd::cli {

class MpiSession {
 public:
  /// Initializes MPI on this rank and splits the workers' communicator off
  /// MPI_COMM_WORLD (a worker: `worker` set, ordered by `index`).
  static Result<std::unique_ptr<MpiSession>> start(bool worker, unsigned index);
  virtual ~MpiSession() = default;
  /// A worker's collective over the workers' communicator (null on other roles).
  virtual std::shared_ptr<messaging::NetworkCollective> collective() = 0;
  /// This rank failed: ends every rank of the job now (MPI_Abort), as the
  /// others' all-reduces would otherwise wait for it in MPI for good.
  [[noreturn]] virtual void abort(int code) = 0;
};

}  // namespace asgd::cli
