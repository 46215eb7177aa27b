// The energy meter against a fake powercap tree (the files Linux's RAPL
// driver shows) and a fake NVML library (tests/fakes/fake_nvml.cpp), with a
// clock the test moves: exact joules, a counter that wraps, a GPU without an
// energy counter measured by power, and "not measured" with the reason.

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "runtime/energy.hpp"
#include "temp_dir.hpp"
#include "test_helpers.hpp"

namespace asgd {
namespace {

namespace fs = std::filesystem;
using asgd_test::TempDir;
using TimePoint = std::chrono::steady_clock::time_point;

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text << "\n";
}

// A RAPL zone as the kernel lays it out: name, energy_uj, max_energy_range_uj.
void zone(const fs::path& root, const std::string& id, const std::string& name, std::uint64_t uj, std::uint64_t range) {
  write(root / id / "name", name);
  write(root / id / "energy_uj", std::to_string(uj));
  write(root / id / "max_energy_range_uj", std::to_string(range));
}

struct FakeClock {
  TimePoint t{};
  EnergyMeter::Clock clock() {
    return [this] { return t; };
  }
  void advance(double s) { t += std::chrono::duration_cast<TimePoint::duration>(std::chrono::duration<double>(s)); }
};

EnergyMeter::Sources sources(const fs::path& root, FakeClock& clock, const std::string& nvml = "/nonexistent/libnvidia-ml.so.1") {
  EnergyMeter::Sources s;
  s.powercap_root = root;
  s.nvml_library = nvml;
  s.period = std::chrono::milliseconds(0);  // the test samples by hand
  s.now = clock.clock();
  return s;
}

TEST(EnergyMeter, AddsPackageAndDramJoulesAcrossACounterWrapAndLeavesCoreAndPsysOut) {
  TempDir tmp;
  const fs::path root = tmp / "powercap";
  zone(root, "intel-rapl:0", "package-0", 1'000'000, 262'143'000'000);
  zone(root, "intel-rapl:0:0", "core", 500'000, 262'143'000'000);
  zone(root, "intel-rapl:0:1", "dram", 7'000'000, 65'712'999'613);
  zone(root, "intel-rapl:1", "psys", 9'000'000, 262'143'000'000);
  FakeClock clock;
  EnergyMeter meter(sources(root, clock));
  clock.advance(1.0);
  write(root / "intel-rapl:0" / "energy_uj", "41000000");      // +40 J
  write(root / "intel-rapl:0:1" / "energy_uj", "12000000");    // +5 J
  write(root / "intel-rapl:0:0" / "energy_uj", "999000000");   // core: inside the package
  meter.sample();
  clock.advance(1.0);
  write(root / "intel-rapl:0" / "energy_uj", "262142000000");  // +262,101 J
  write(root / "intel-rapl:0:1" / "energy_uj", "65712000000");  // +65,700 J
  meter.sample();
  clock.advance(2.0);
  write(root / "intel-rapl:0" / "energy_uj", "9000000");       // wrapped: +1 J to the range, +9 J after
  write(root / "intel-rapl:0:1" / "energy_uj", "2000000");     // wrapped as well
  const EnergyUse e = meter.stop();
  ASSERT_TRUE(e.measured) << e.reason;
  ASSERT_EQ(e.devices.size(), 2u);
  EXPECT_EQ(e.devices[0].device, "cpu package 0");
  EXPECT_DOUBLE_EQ(e.devices[0].joules, 40.0 + 262'101.0 + 1.000001 + 9.0);  // the range's own value counts
  EXPECT_EQ(e.devices[1].device, "dram 0");
  EXPECT_DOUBLE_EQ(e.devices[1].joules,
                   5.0 + 65'700.0 + (65'712'999'613 - 65'712'000'000 + 1 + 2'000'000) / 1e6);
  EXPECT_DOUBLE_EQ(e.seconds, 4.0);
  EXPECT_DOUBLE_EQ(e.joules, e.devices[0].joules + e.devices[1].joules);
  EXPECT_DOUBLE_EQ(e.mean_power_w(), e.joules / 4.0);
  EXPECT_DOUBLE_EQ(e.edp_js(), e.joules * 4.0);
  EXPECT_NE(e.reason.find("GPU: no NVML"), std::string::npos) << e.reason;  // measured, but not the GPUs
}

std::string fake_nvml_path() { return asgd_test::built_test_library(ASGD_FAKE_NVML_PATH, "libfake_nvml.so"); }

TEST(EnergyMeter, ReadsEachGpusEnergyCounterOrIntegratesItsPower) {
  TempDir tmp;
  const fs::path state = tmp / "nvml.txt";
  write(state, "count 2\nenergy 0 5000\npower 1 100000");
  ::setenv("FAKE_NVML_STATE", state.c_str(), 1);
  FakeClock clock;
  EnergyMeter meter(sources(tmp / "no-powercap", clock, fake_nvml_path()));
  clock.advance(0.5);
  write(state, "count 2\nenergy 0 65000\npower 1 100000");  // GPU 0 +60 J; GPU 1 100 W for 0.5 s
  meter.sample();
  clock.advance(0.5);
  write(state, "count 2\nenergy 0 125000\npower 1 300000");  // +60 J; 100 W -> 300 W over 0.5 s
  const EnergyUse e = meter.stop();
  ::unsetenv("FAKE_NVML_STATE");
  ASSERT_TRUE(e.measured) << e.reason;
  ASSERT_EQ(e.devices.size(), 2u);
  EXPECT_EQ(e.devices[0].device, "gpu 0");
  EXPECT_DOUBLE_EQ(e.devices[0].joules, 120.0);
  EXPECT_EQ(e.devices[1].device, "gpu 1");
  EXPECT_DOUBLE_EQ(e.devices[1].joules, 0.5 * 100 + 0.5 * 200);  // trapezoids
  EXPECT_DOUBLE_EQ(e.joules, 270.0);
  EXPECT_NE(e.reason.find("CPU: no RAPL counters under"), std::string::npos) << e.reason;
}

TEST(EnergyMeter, WithNeitherSourceItSaysNotMeasuredAndWhy) {
  TempDir tmp;
  FakeClock clock;
  EnergyMeter meter(sources(tmp / "empty", clock));
  const EnergyUse e = meter.stop();
  EXPECT_FALSE(e.measured);
  EXPECT_TRUE(e.devices.empty());
  EXPECT_EQ(e.joules, 0.0);
  EXPECT_NE(e.reason.find("CPU: no RAPL counters under " + (tmp / "empty").string()), std::string::npos) << e.reason;
  EXPECT_NE(e.reason.find("GPU: no NVML (/nonexistent/libnvidia-ml.so.1"), std::string::npos) << e.reason;
}

// What was left out while the rest was measured is said: a second package
// whose counter cannot be read, a counter that went back without wrapping
// (a reset: it added nearly the whole range, 262,138 J), a GPU NVML stops
// answering for. (The summary said "measured" and nothing else.)
TEST(EnergyMeter, WhatWasLeftOutOfAMeasurementIsNamedInTheReason) {
  TempDir tmp;
  const fs::path root = tmp / "powercap";
  zone(root, "intel-rapl:0", "package-0", 5'000'000, 262'143'000'000);
  write(root / "intel-rapl:1" / "name", "package-1");
  write(root / "intel-rapl:1" / "max_energy_range_uj", "262143000000");
  fs::create_directories(root / "intel-rapl:1" / "energy_uj");  // not a number (root reads any file)
  const fs::path state = tmp / "nvml.txt";
  write(state, "count 2\nenergy 0 1000\nenergy 1 1000");
  ::setenv("FAKE_NVML_STATE", state.c_str(), 1);
  FakeClock clock;
  EnergyMeter meter(sources(root, clock, fake_nvml_path()));
  clock.advance(0.5);
  write(root / "intel-rapl:0" / "energy_uj", "15000000");  // +10 J
  write(state, "count 2\nenergy 0 11000\nenergy 1 11000");  // +10 J each
  meter.sample();
  clock.advance(0.5);
  write(root / "intel-rapl:0" / "energy_uj", "100");  // back, 0.5 s later: a reset, not a wrap
  write(state, "count 2\nenergy 0 21000");            // GPU 1 no longer answers
  meter.sample();
  clock.advance(0.5);
  write(root / "intel-rapl:0" / "energy_uj", "2000100");  // +2 J after the reset
  const EnergyUse e = meter.stop();
  ::unsetenv("FAKE_NVML_STATE");
  ASSERT_TRUE(e.measured) << e.reason;
  ASSERT_EQ(e.devices.size(), 3u);
  EXPECT_DOUBLE_EQ(e.devices[0].joules, 12.0) << "the reset is not counted as a wrap";
  EXPECT_DOUBLE_EQ(e.devices[1].joules, 20.0);
  EXPECT_DOUBLE_EQ(e.devices[2].joules, 10.0);
  for (const char* said : {"cpu package 1: ", "is not readable", "cpu package 0: its counter went back without wrapping",
                           "gpu 1: NVML stopped answering for it (the last 2 sample(s)): its energy since is not counted"})
    EXPECT_NE(e.reason.find(said), std::string::npos) << said << " not in: " << e.reason;
  EXPECT_EQ(e.reason.find("gpu 0"), std::string::npos) << e.reason;
}

TEST(EnergyMeter, CountersItCannotReadAreNamedAsSuch) {
  // A counter that cannot be read as a number (root reads any file
  // whatever its mode, so a folder stands in for a root-only file).
  TempDir tmp;
  const fs::path root = tmp / "powercap";
  write(root / "intel-rapl:0" / "name", "package-0");
  write(root / "intel-rapl:0" / "max_energy_range_uj", "1000");
  fs::create_directories(root / "intel-rapl:0" / "energy_uj");
  FakeClock clock;
  EnergyMeter meter(sources(root, clock));
  const EnergyUse e = meter.stop();
  EXPECT_FALSE(e.measured);
  EXPECT_NE(e.reason.find("are not readable"), std::string::npos) << e.reason;
}

}  // namespace
}  // namespace asgd
