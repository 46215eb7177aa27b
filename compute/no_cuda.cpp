// The device entry points of a build without the CUDA backend (no nvcc or
// cuDNN where it was configured): every GPU request is refused plainly.
#include "compute/device.hpp"

namespace asgd {

int cuda_device_count(std::string* why) {
  if (why) *why = "this build of asgd has no CUDA backend (configure with nvcc and cuDNN present)";
  return 0;
}

std::string cuda_backend_location() { return {}; }

Result<std::unique_ptr<DeviceModel>> make_cuda_model(const std::vector<Layer*>& /*layers*/,
                                                     const Shape& /*sample_shape*/, std::size_t /*param_count*/,
                                                     int /*device_index*/) {
  std::string why;
  cuda_device_count(&why);
  return Status::Unavailable(why);
}

}  // namespace asgd
