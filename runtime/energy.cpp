#include "runtime/energy.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <stop_token>
#include <thread>

namespace asgd {

namespace fs = std::filesystem;
using TimePoint = std::chrono::steady_clock::time_point;

// What the meter holds per source (named, not anonymous: EnergyMeter::State
// has members of these types).
namespace energy_sources {

// NVML's C interface, declared here so that nothing needs nvml.h: the
// library is loaded at run time, where it exists.
using NvmlReturn = int;  // nvmlReturn_t; 0 is NVML_SUCCESS
using NvmlDevice = void*;
struct Nvml {
  void* library = nullptr;
  NvmlReturn (*init)() = nullptr;
  NvmlReturn (*shutdown)() = nullptr;
  NvmlReturn (*count)(unsigned*) = nullptr;
  NvmlReturn (*handle)(unsigned, NvmlDevice*) = nullptr;
  NvmlReturn (*energy_mj)(NvmlDevice, unsigned long long*) = nullptr;
  NvmlReturn (*power_mw)(NvmlDevice, unsigned*) = nullptr;
};

struct RaplZone {
  std::string device;
  fs::path counter;        // .../energy_uj
  std::uint64_t range = 0; // max_energy_range_uj: where the counter wraps
  std::uint64_t last = 0;
  TimePoint last_at{};
  double joules = 0.0;
  bool went_back = false;  // a counter that went back without wrapping (a reset): the energy since the last sample lost
};

struct Gpu {
  std::string device;
  NvmlDevice handle = nullptr;
  bool counter = false;    // a total-energy counter; else power sampling
  unsigned long long last_mj = 0;
  double last_w = 0.0;
  TimePoint last_at{};
  double joules = 0.0;
  std::uint64_t missed = 0;  // samples NVML has not answered since its last answer
  bool went_back = false;    // the energy counter went back (a GPU reset)
};

}  // namespace energy_sources

namespace {

using energy_sources::Gpu;
using energy_sources::Nvml;
using energy_sources::NvmlDevice;
using energy_sources::RaplZone;

// More than any CPU package or its DRAM draws: a RAPL counter that went
// back by more energy than this in the time since the last sample was
// reset, not wrapped.
constexpr double kMaxZoneWatts = 5000.0;

bool read_number(const fs::path& path, std::uint64_t& out) {
  std::ifstream in(path);
  return static_cast<bool>(in >> out);
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

template <class F>
bool resolve(void* library, const char* name, F& into) {
  into = reinterpret_cast<F>(dlsym(library, name));
  return into != nullptr;
}

}  // namespace

struct EnergyMeter::State {
  Sources sources;
  std::mutex mutex;
  std::vector<RaplZone> zones;
  std::vector<Gpu> gpus;
  Nvml nvml;
  std::string rapl_reason, nvml_reason;
  // What was left out while the rest was measured: a zone that could not
  // be read, a GPU NVML would not answer for (the summary said "measured"
  // and nothing else: a second package's joules missing without a word).
  std::vector<std::string> gaps;
  TimePoint start{};
  bool stopped = false;
  std::condition_variable_any wake;
  std::jthread sampler;

  TimePoint now() const { return sources.now ? sources.now() : std::chrono::steady_clock::now(); }

  void open_rapl() {
    const fs::path& root = sources.powercap_root;
    std::error_code ec;
    std::vector<fs::path> entries;
    for (const auto& e : fs::directory_iterator(root, ec)) entries.push_back(e.path());
    std::sort(entries.begin(), entries.end());
    std::vector<std::string> unreadable;  // zones left out: a gap beside zones read, else the reason
    for (const fs::path& zone : entries) {
      const std::string id = zone.filename().string();  // intel-rapl:N or intel-rapl:N:M
      if (!id.starts_with("intel-rapl:")) continue;
      const std::string numbers = id.substr(std::string("intel-rapl:").size());
      const auto colon = numbers.find(':');
      const std::string name = read_text(zone / "name");
      // Packages, and their DRAM; core and uncore are inside the package,
      // psys (a laptop's whole platform) would count everything twice.
      const bool package = colon == std::string::npos && name != "psys";
      const bool dram = colon != std::string::npos && name == "dram";
      if (!package && !dram) continue;
      RaplZone z;
      z.device = package ? "cpu package " + numbers : "dram " + numbers.substr(0, colon);
      z.counter = zone / "energy_uj";
      if (!read_number(zone / "max_energy_range_uj", z.range) || !read_number(z.counter, z.last)) {
        unreadable.push_back(z.device + ": " + z.counter.string() + " is not readable");
        continue;
      }
      z.last_at = now();
      zones.push_back(z);
    }
    if (!zones.empty())
      gaps.insert(gaps.end(), unreadable.begin(), unreadable.end());
    else if (!unreadable.empty())
      rapl_reason = "the RAPL counters under " + root.string() +
                    " are not readable (energy_uj is root's alone since Linux 5.10)";
    else
      rapl_reason = "no RAPL counters under " + root.string() + " (a virtual machine, or no powercap)";
  }

  void open_nvml() {
    nvml.library = dlopen(sources.nvml_library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!nvml.library) {
      const char* why = dlerror();
      nvml_reason = "no NVML (" + (why ? std::string(why) : sources.nvml_library) + ")";
      return;
    }
    unsigned count = 0;
    if (!resolve(nvml.library, "nvmlInit_v2", nvml.init) || !resolve(nvml.library, "nvmlShutdown", nvml.shutdown) ||
        !resolve(nvml.library, "nvmlDeviceGetCount_v2", nvml.count) ||
        !resolve(nvml.library, "nvmlDeviceGetHandleByIndex_v2", nvml.handle) ||
        !resolve(nvml.library, "nvmlDeviceGetTotalEnergyConsumption", nvml.energy_mj) ||
        !resolve(nvml.library, "nvmlDeviceGetPowerUsage", nvml.power_mw)) {
      nvml_reason = sources.nvml_library + " lacks the NVML functions asgd reads";
      close_nvml(false);
      return;
    }
    if (nvml.init() != 0) {
      nvml_reason = "NVML did not start (no NVIDIA driver?)";
      close_nvml(false);
      return;
    }
    if (nvml.count(&count) != 0 || count == 0) {
      nvml_reason = "NVML sees no GPU";
      close_nvml(true);
      return;
    }
    const TimePoint at = now();
    std::vector<std::string> unmeasured;  // GPUs left out: a gap beside GPUs read, else the reason
    for (unsigned i = 0; i < count; ++i) {
      Gpu g;
      g.device = "gpu " + std::to_string(i);
      if (nvml.handle(i, &g.handle) != 0) {
        unmeasured.push_back(g.device + ": NVML gives no handle for it");
        continue;
      }
      g.counter = nvml.energy_mj(g.handle, &g.last_mj) == 0;
      unsigned mw = 0;
      if (!g.counter) {
        if (nvml.power_mw(g.handle, &mw) != 0) {  // neither: this GPU cannot be measured
          unmeasured.push_back(g.device + ": NVML reads neither its energy nor its power");
          continue;
        }
        g.last_w = mw / 1000.0;
      }
      g.last_at = at;
      gpus.push_back(g);
    }
    if (!gpus.empty()) {
      gaps.insert(gaps.end(), unmeasured.begin(), unmeasured.end());
    } else {
      nvml_reason = "NVML reads neither energy nor power on this machine's GPUs";
      close_nvml(true);
    }
  }

  void close_nvml(bool started) {
    if (started && nvml.shutdown) nvml.shutdown();
    if (nvml.library) dlclose(nvml.library);
    nvml = {};
  }

  void sample_locked() {
    const TimePoint at = now();
    for (RaplZone& z : zones) {
      std::uint64_t now_uj = 0;
      if (!read_number(z.counter, now_uj)) continue;  // a torn read: the next sample has it
      // A wrap passes the range (0 to range inclusive) once. A counter that
      // went back otherwise (a reset, or a value past the range) added
      // nearly the whole range: 262,138 J in a second.
      const double seconds = std::max(std::chrono::duration<double>(at - z.last_at).count(), 1e-3);
      const bool wrapped = now_uj < z.last && z.last <= z.range;
      const std::uint64_t delta = now_uj >= z.last ? now_uj - z.last : wrapped ? now_uj + (z.range - z.last) + 1 : 0;
      if (now_uj < z.last && (!wrapped || static_cast<double>(delta) / 1e6 > kMaxZoneWatts * seconds)) {
        z.went_back = true;
      } else {
        z.joules += static_cast<double>(delta) / 1e6;
      }
      z.last = now_uj;
      z.last_at = at;
    }
    for (Gpu& g : gpus) {
      if (g.counter) {
        unsigned long long mj = 0;
        if (nvml.energy_mj(g.handle, &mj) != 0) {
          ++g.missed;
          continue;
        }
        g.missed = 0;  // the counter's next answer holds what the missed samples did
        if (mj >= g.last_mj) g.joules += static_cast<double>(mj - g.last_mj) / 1e3;
        else g.went_back = true;
        g.last_mj = mj;
      } else {
        unsigned mw = 0;
        if (nvml.power_mw(g.handle, &mw) != 0) {
          ++g.missed;
          continue;
        }
        g.missed = 0;  // the next answer's trapezoid spans the gap
        const double w = mw / 1000.0;
        g.joules += std::chrono::duration<double>(at - g.last_at).count() * (w + g.last_w) / 2;  // trapezoids
        g.last_w = w;
        g.last_at = at;
      }
    }
  }
};

EnergyMeter::EnergyMeter(Sources sources) : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.sources = std::move(sources);
  s.start = s.now();
  s.open_rapl();
  s.open_nvml();
  if ((s.zones.empty() && s.gpus.empty()) || s.sources.period.count() <= 0) return;
  s.sampler = std::jthread([&s](std::stop_token stop) {
    std::unique_lock lock(s.mutex);
    while (!stop.stop_requested()) {
      s.wake.wait_for(lock, stop, s.sources.period, [] { return false; });
      if (!stop.stop_requested()) s.sample_locked();
    }
  });
}

EnergyMeter::~EnergyMeter() {
  if (!state_) return;
  if (state_->sampler.joinable()) {
    state_->sampler.request_stop();
    state_->sampler.join();
  }
  state_->close_nvml(!state_->gpus.empty());
}

void EnergyMeter::sample() {
  std::lock_guard lock(state_->mutex);
  if (!state_->stopped) state_->sample_locked();
}

EnergyMeter::Sources EnergyMeter::from_environment() {
  Sources s;
  if (const char* root = std::getenv("ASGD_POWERCAP_ROOT"); root && *root) s.powercap_root = root;
  if (const char* lib = std::getenv("ASGD_NVML_LIBRARY"); lib && *lib) s.nvml_library = lib;
  return s;
}

EnergyUse EnergyMeter::stop() {
  State& s = *state_;
  if (s.sampler.joinable()) {
    s.sampler.request_stop();
    s.sampler.join();
  }
  std::lock_guard lock(s.mutex);
  EnergyUse r;
  if (!s.stopped) s.sample_locked();
  s.stopped = true;
  r.seconds = std::chrono::duration<double>(s.now() - s.start).count();
  for (const RaplZone& z : s.zones) r.devices.push_back({z.device, z.joules});
  for (const Gpu& g : s.gpus) r.devices.push_back({g.device, g.joules});
  for (const DeviceEnergy& d : r.devices) r.joules += d.joules;
  r.measured = !r.devices.empty();
  std::vector<std::string> parts = s.gaps;
  for (const RaplZone& z : s.zones)
    if (z.went_back) parts.push_back(z.device + ": its counter went back without wrapping (a reset?): the energy of "
                                     "a sampling period is not counted");
  for (const Gpu& g : s.gpus) {
    if (g.missed > 0)
      parts.push_back(g.device + ": NVML stopped answering for it (the last " + std::to_string(g.missed) +
                      " sample(s)): its energy since is not counted");
    if (g.went_back)
      parts.push_back(g.device + ": its energy counter went back (a GPU reset?): some energy not counted");
  }
  if (!s.rapl_reason.empty()) parts.insert(parts.begin(), "CPU: " + s.rapl_reason);
  if (!s.nvml_reason.empty()) parts.push_back("GPU: " + s.nvml_reason);
  for (const std::string& p : parts) r.reason += (r.reason.empty() ? "" : "; ") + p;
  return r;
}

}  // namespace asgd
