#pragma once
// The CUDA backend as a plugin. compute/cuda/ builds into libasgd_cuda.so,
// which links cuDNN, cuBLAS and the CUDA runtime; nothing else in asgd does.
// A process loads it (compute/cuda_loader.cpp) the first time it asks for a
// GPU, so a process that computes on the CPU never maps those libraries:
// cuBLAS alone costs every process that links it about 210 MB of resident
// memory and 0.07 s at start-up, before any call.
//
// The plugin exports a C string, kCudaBackendBuildSymbol, and one C
// function, kCudaBackendEntry, that returns this table. The table passes
// C++ types, so both sides must come from the same build: the loader reads
// the string first and calls nothing in a plugin of another build.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "asgd/status.hpp"
#include "compute/device.hpp"
#include "compute/layer.hpp"

namespace spdlog {
class logger;
}

namespace asgd {

struct CudaBackendApi {
  std::uint32_t version;  // kCudaBackendVersion
  // cuda_device_count and make_cuda_model (device.hpp) as the backend has them.
  int (*device_count)(std::string* why);
  Result<std::unique_ptr<DeviceModel>> (*make_model)(const std::vector<Layer*>& layers, const Shape& sample_shape,
                                                     std::size_t param_count, int device_index);
};

inline constexpr std::uint32_t kCudaBackendVersion = 1;
// A random id each build folder draws once at configure time
// (compute/CMakeLists.txt): a plugin of another build (a stale file on the
// search path) has another.
#ifndef ASGD_BUILD_ID
#error "ASGD_BUILD_ID is set by compute/CMakeLists.txt for the files that include this header"
#endif
inline constexpr const char* kCudaBackendBuild = ASGD_BUILD_ID;

// The plugin's one export: takes the loading process's logger (the plugin's
// lines go where the process's go, at its level) and returns the table.
using CudaBackendEntry = const CudaBackendApi* (*)(spdlog::logger* host_logger);
inline constexpr const char* kCudaBackendEntry = "asgd_cuda_backend";
inline constexpr const char* kCudaBackendBuildSymbol = "asgd_cuda_backend_build";  // char[]: its ASGD_BUILD_ID
inline constexpr const char* kCudaBackendFile = "libasgd_cuda.so";

}  // namespace asgd
