// cuda_device_count and make_cuda_model (device.hpp) in a build with the
// CUDA backend: the backend is the plugin libasgd_cuda.so
// (compute/cuda_backend.hpp), loaded on the first call. It is looked for at
//
//   1. $ASGD_CUDA_BACKEND, when set: the plugin's path, and only that;
//   2. DIR/../lib/libasgd_cuda.so and DIR/libasgd_cuda.so, DIR being the
//      folder of the running executable (a build folder's bin/, an installed
//      prefix's bin/, a GPU bundle's bin/);
//   3. libasgd_cuda.so on the loader's search path (the executable's run
//      path, which an installed package's consumers get, LD_LIBRARY_PATH).
//
// A plugin that is missing, cannot be loaded (cuDNN or cuBLAS missing
// beside it) or belongs to another build counts as no GPU, and `why` says
// which, as a driver without a GPU does.
#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

#include "base/log.hpp"
#include "compute/cuda_backend.hpp"
#include "compute/device.hpp"

namespace asgd {
namespace {

struct Loaded {
  const CudaBackendApi* api = nullptr;
  std::string path;  // where api came from
  std::string why;   // when api is null
};

// The paths to try, in order, and where they are, for a message that
// finds none.
struct Candidates {
  std::vector<std::string> paths;
  std::string looked;
};

Candidates candidates() {
  if (const char* path = std::getenv("ASGD_CUDA_BACKEND"); path && *path) return {{path}, ""};
  Candidates c;
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (const auto& p : {exe.parent_path().parent_path() / "lib" / kCudaBackendFile,
                          exe.parent_path() / kCudaBackendFile}) {
      if (std::filesystem::exists(p, ec)) c.paths.push_back(p.string());
      c.looked += p.string() + ", ";
    }
  }
  c.paths.emplace_back(kCudaBackendFile);  // the loader's own search
  c.looked = " (looked for it at " + c.looked +
             "and on the loader's search path; ASGD_CUDA_BACKEND=PATH names it anywhere else)";
  return c;
}

// The table of the plugin at `path`, or why not. A library refused before
// anything in it was called is unloaded again (with the CUDA libraries it
// brought); one whose entry point ran stays (unloading code that may have
// started threads is not safe), never called again.
const CudaBackendApi* open_plugin(const std::string& path, std::string& why) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* err = dlerror();
    why = err ? err : path + ": cannot be loaded";
    return nullptr;
  }
  auto entry = reinterpret_cast<CudaBackendEntry>(dlsym(handle, kCudaBackendEntry));
  const auto* build = static_cast<const char*>(dlsym(handle, kCudaBackendBuildSymbol));
  if (!entry || !build) {
    why = path + " has no " + kCudaBackendEntry + " (not asgd's CUDA backend)";
    dlclose(handle);
    return nullptr;
  }
  // Checked before anything in it is called: its table's C++ types are
  // this build's only if the plugin is.
  if (std::string(build) != kCudaBackendBuild) {
    why = path + " is the CUDA backend of another build of asgd (build " + build + ", this one " +
          kCudaBackendBuild + "): use the plugin of this build, or set ASGD_CUDA_BACKEND to it";
    dlclose(handle);
    return nullptr;
  }
  const CudaBackendApi* api = entry(&logger());
  if (!api || api->version != kCudaBackendVersion) {
    why = path + ": its table is not version " + std::to_string(kCudaBackendVersion);
    return nullptr;
  }
  return api;
}

const Loaded& backend() {
  static Loaded loaded;
  static std::once_flag once;
  std::call_once(once, [] {
    std::string reasons;
    const Candidates tried = candidates();
    for (const std::string& path : tried.paths) {
      std::string why;
      loaded.api = open_plugin(path, why);
      if (loaded.api) {
        Dl_info info{};  // the file the loader's search found, when it was by name
        loaded.path = dladdr(reinterpret_cast<const void*>(loaded.api), &info) != 0 && info.dli_fname
                          ? info.dli_fname
                          : path;
        logger().debug("CUDA backend: {}", loaded.path);
        return;
      }
      reasons += (reasons.empty() ? "" : "; ") + why;
    }
    loaded.why = "the CUDA backend (" + std::string(kCudaBackendFile) + ") could not be loaded: " + reasons;
    if (tried.paths.size() == 1) loaded.why += tried.looked;  // none beside the executable
  });
  return loaded;
}

}  // namespace

int cuda_device_count(std::string* why) {
  const Loaded& b = backend();
  if (b.api) return b.api->device_count(why);
  if (why) *why = b.why;
  return 0;
}

std::string cuda_backend_location() { return backend().path; }

Result<std::unique_ptr<DeviceModel>> make_cuda_model(const std::vector<Layer*>& layers, const Shape& sample_shape,
                                                     std::size_t param_count, int device_index) {
  const Loaded& b = backend();
  if (b.api) return b.api->make_model(layers, sample_shape, param_count, device_index);
  return Status::Unavailable("cuda:" + std::to_string(device_index) + ": " + b.why);
}

}  // namespace asgd
