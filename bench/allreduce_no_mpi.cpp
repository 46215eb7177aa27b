// asgd bench allreduce's MPI side where Open MPI was not found at build
// time: the hidden allreduce-mpi subcommand says so.

#include <cstdint>
#include <string>
#include <vector>

#include "tools/asgd/commands.hpp"

namespace asgd::cli {

int run_allreduce_mpi_rank(const std::string&, const std::vector<std::uint64_t>&, int) {
  print_error("bench allreduce-mpi: this build has no Open MPI (install libopenmpi-dev and build again)");
  return kExitFailure;
}

}  // namespace asgd::cli
