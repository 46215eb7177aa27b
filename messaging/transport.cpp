#include "messaging/transport.hpp"

#include <cstring>

namespace asgd::messaging {

Part Part::copy_of(std::span<const std::byte> bytes) {
  Part p;
  if (bytes.empty()) return p;
  auto holder = std::make_shared_for_overwrite<std::byte[]>(bytes.size());
  std::memcpy(holder.get(), bytes.data(), bytes.size());
  p.bytes = std::span<const std::byte>(holder.get(), bytes.size());
  p.owner = std::move(holder);
  return p;
}

}  // namespace asgd::messaging
