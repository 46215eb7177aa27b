// `asgd devices`: what a job can compute on here, as this build sees it:
// the CPUs this process may use, and each CUDA device with a model started
// on it (where a busy, prohibited or broken GPU shows), or why there is none
// (no driver, no CUDA backend in this build, a plugin that cannot load).
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "base/cpus.hpp"
#include "commands.hpp"
#include "compute/blas.hpp"
#include "compute/device.hpp"
#include "compute/layers/dense.hpp"

namespace asgd::cli {

std::function<int()> add_devices_command(CLI::App& app) {
  app.add_subcommand("devices", "the CPUs and GPUs a job can compute on here, or why a GPU cannot be used");
  return [] {
    // A list that could not be written (a full disk, a closed pipe) exited 0.
    auto written = [] {
      std::cout.flush();
      if (std::cout) return kExitOk;
      print_error("asgd devices: writing the list to standard output failed");
      return kExitFailure;
    };
    std::cout << "cpu: " << usable_cpus() << " usable CPU(s), OpenBLAS " << blas::core_name() << " kernels\n";
    std::string why;
    const int count = cuda_device_count(&why);
    if (count == 0) {
      std::cout << "cuda: none: " << why << "\n";
      return written();
    }
    std::cout << "cuda: " << count << " device(s) (backend " << cuda_backend_location() << ")\n";
    Dense layer(4, 2);
    const std::vector<Layer*> layers{&layer};
    for (int i = 0; i < count; ++i) {
      auto made = make_cuda_model(layers, {4}, 10, i);
      std::cout << "  " << (made.ok() ? (*made)->description() + ": usable"
                                      : "cuda:" + std::to_string(i) + ": " + made.status().message())
                << "\n";
    }
    return written();
  };
}

}  // namespace asgd::cli
