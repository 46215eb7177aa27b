#include "compute/device.hpp"

#include <charconv>

namespace asgd {

Result<Device> Device::parse(const std::string& text) {
  if (text == "cpu") return Device{};
  if (text == "cuda") return Device{Kind::cuda, 0};
  if (text.starts_with("cuda:")) {
    const std::string digits = text.substr(5);
    int index = -1;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (!digits.empty() && ec == std::errc() && end == digits.data() + digits.size() && index >= 0)
      return Device{Kind::cuda, index};
    if (ec == std::errc::result_out_of_range && digits.find_first_not_of("0123456789") == std::string::npos)
      return Status::InvalidArgument("GPU index " + digits + " is past any GPU's (cuda:K counts from 0)");
  }
  return Status::InvalidArgument("unknown device '" + text + "' (expected cpu, cuda or cuda:K)");
}

std::string Device::str() const { return kind == Kind::cpu ? "cpu" : "cuda:" + std::to_string(index); }

}  // namespace asgd
