// libFuzzer target for everything the receive path does with untrusted
// bytes: frame checks, body decoding by type, tensor decoding. Built by
// scripts/fuzz with clang (-fsanitize=fuzzer,address,undefined); its
// findings go to tests/messaging/corpus/, which ctest replays.

#include <cstddef>
#include <cstdint>

#include "messaging/untrusted.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  asgd::messaging::check_untrusted_bytes(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size));
  return 0;
}
