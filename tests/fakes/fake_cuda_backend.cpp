// A stand-in for the CUDA backend's plugin of another build of asgd
// (compute/cuda_backend.hpp): its build id is not the loading process's, and
// its entry point, which the loader must never call, ends the process.
#include <cstdlib>

extern "C" __attribute__((visibility("default"))) const char asgd_cuda_backend_build[] = "another-build";

extern "C" __attribute__((visibility("default"))) const void* asgd_cuda_backend(void*) { std::abort(); }
