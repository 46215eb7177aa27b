// A stand-in for libnvidia-ml.so.1 in the energy meter's tests: the NVML
// functions the meter calls, answering from the file named by
// $FAKE_NVML_STATE, read again on every call, so a test changes what the
// "GPUs" report between samples. Lines:
//   count N            N GPUs
//   energy I MJ        GPU I's total-energy counter, millijoules
//   power I MW         GPU I's power draw, milliwatts
// A GPU without an energy line answers that its counter is not supported
// (NVML_ERROR_NOT_SUPPORTED, 3), as older GPUs do.
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>

enum { kSuccess = 0, kUninitialized = 1, kInvalidArgument = 2, kNotSupported = 3 };

namespace {

int lookup(const char* what, unsigned index, unsigned long long* out) {
  const char* path = getenv("FAKE_NVML_STATE");
  std::FILE* f = path ? std::fopen(path, "r") : nullptr;
  if (!f) return 0;
  char key[32];
  unsigned i = 0;
  unsigned long long v = 0;
  int found = 0;
  char line[128];
  while (fgets(line, sizeof line, f)) {
    if (strcmp(what, "count") == 0 && sscanf(line, "count %llu", &v) == 1) {
      *out = v;
      found = 1;
    } else if (sscanf(line, "%31s %u %llu", key, &i, &v) == 3 && strcmp(key, what) == 0 && i == index) {
      *out = v;
      found = 1;
    }
  }
  fclose(f);
  return found;
}

}  // namespace

extern "C" {

int nvmlInit_v2(void) { return kSuccess; }
int nvmlShutdown(void) { return kSuccess; }

int nvmlDeviceGetCount_v2(unsigned* count) {
  unsigned long long n = 0;
  if (!lookup("count", 0, &n)) return kUninitialized;
  *count = static_cast<unsigned>(n);
  return kSuccess;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned index, void** device) {
  *device = reinterpret_cast<void*>(static_cast<std::size_t>(index + 1));
  return kSuccess;
}

int nvmlDeviceGetTotalEnergyConsumption(void* device, unsigned long long* mj) {
  if (!device) return kInvalidArgument;
  return lookup("energy", static_cast<unsigned>(reinterpret_cast<std::size_t>(device) - 1), mj) ? kSuccess : kNotSupported;
}

int nvmlDeviceGetPowerUsage(void* device, unsigned* mw) {
  unsigned long long v = 0;
  if (!device) return kInvalidArgument;
  if (!lookup("power", static_cast<unsigned>(reinterpret_cast<std::size_t>(device) - 1), &v)) return kNotSupported;
  *mw = static_cast<unsigned>(v);
  return kSuccess;
}

}  // extern "C"
