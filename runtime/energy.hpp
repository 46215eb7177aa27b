#pragma once
// Energy meters: how many joules the CPUs' packages and DRAM (RAPL, through
// Linux powercap) and the GPUs (NVML, loaded at run time) used while a job
// ran, for the summary's energy, mean power and energy-delay product.
//
// RAPL: every top-level zone under the powercap root (intel-rapl:N, the
// packages; AMD's RAPL shows there too) and each of its "dram" subzones;
// "core" and "uncore" are inside the package and are not added again. Each
// counter (energy_uj) wraps at max_energy_range_uj: the meter samples every
// `period` and adds each difference modulo that range, so a wrap between two
// samples costs nothing (one wrap takes minutes even at full power).
// NVML: each GPU's total-energy counter (millijoules) where the GPU has one,
// else its power (milliwatts) sampled every `period` and integrated.
// Where neither source exists, the report says "not measured" and why.
// The powercap root, the NVML library's path and the clock are injectable,
// so tests run against a fake powercap tree and a fake NVML.

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "asgd/job.hpp"

namespace asgd {

class EnergyMeter {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  struct Sources {
    std::filesystem::path powercap_root = "/sys/class/powercap";
    std::string nvml_library = "libnvidia-ml.so.1";  ///< a name the loader finds, or a path
    std::chrono::milliseconds period{500};  ///< 0: no sampling thread (sample() by hand)
    Clock now;                              ///< empty: steady_clock
  };

  /// The sources a job's meter reads: the defaults, or $ASGD_POWERCAP_ROOT
  /// and $ASGD_NVML_LIBRARY where set.
  static Sources from_environment();

  /// Opens every source it finds and takes the first sample.
  explicit EnergyMeter(Sources sources);
  EnergyMeter() : EnergyMeter(Sources{}) {}
  ~EnergyMeter();
  EnergyMeter(const EnergyMeter&) = delete;
  EnergyMeter& operator=(const EnergyMeter&) = delete;

  /// Reads every counter now (the sampling thread calls it each period).
  void sample();
  /// Takes a last sample and reports the window since construction; the
  /// meter stops sampling. Called once.
  EnergyUse stop();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace asgd
