// asgd bench allreduce's MPI side (built where Open MPI is found): one rank
// under mpirun, timing MPI_Allreduce (in place, a sum of floats) as ours is
// timed: two warm-up rounds, then `iterations`, each timed; rank 0 writes
// "floats median-seconds-per-all-reduce" lines to `out`.

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace asgd::cli {

int run_allreduce_mpi_rank(const std::string& out, const std::vector<std::uint64_t>& counts, int iterations) {
  MPI_Init(nullptr, nullptr);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::ofstream times;
  if (rank == 0) times.open(out);
  for (std::uint64_t n : counts) {
    std::vector<float> data(n, static_cast<float>(rank + 1));
    const int count = static_cast<int>(n);
    for (int warm = 0; warm < 2; ++warm)
      MPI_Allreduce(MPI_IN_PLACE, data.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    std::vector<double> took;
    for (int i = 0; i < iterations; ++i) {
      const double t0 = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, data.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      took.push_back(MPI_Wtime() - t0);
    }
    std::sort(took.begin(), took.end());
    const std::size_t k = took.size();
    const double t = k % 2 ? took[k / 2] : (took[k / 2 - 1] + took[k / 2]) / 2;
    if (rank == 0) times << n << ' ' << t << '\n';
  }
  MPI_Finalize();
  return 0;
}

}  // namespace asgd::cli
