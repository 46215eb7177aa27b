// MpiSession where asgd was built without Open MPI (tools/asgd/mpi_session.hpp).
#include "tools/asgd/mpi_session.hpp"

namespace asgd::cli {

Result<std::unique_ptr<MpiSession>> MpiSession::start(bool, unsigned) {
  return Status::InvalidArgument(
      "--collective mpi: this asgd was built without Open MPI (install libopenmpi-dev, as scripts/setup does, and "
      "build again), so its all-reduce is its own: leave out --collective");
}

}  // namespace asgd::cli
