#pragma once
// The whole receive path for bytes from an untrusted peer, in one function:
// what the bridge runs on every frame, and what the fuzz target and its
// regression corpus exercise.

#include <cstddef>
#include <span>

#include "messaging/messages.hpp"

namespace asgd::messaging {

/// Checks a frame and decodes its body (by its type) and tensor. Returns
/// FrameError::none or why it was rejected. Never throws, never allocates
/// more than the frame's checked lengths allow.
FrameError check_untrusted(const Message& message);

/// Fuzzing entry: splits raw bytes into a one- or two-part message and runs
/// check_untrusted on it. The first byte steers: bit 0 two parts (the next
/// two bytes give part 0's length), bit 1 a correct checksum filled in.
FrameError check_untrusted_bytes(std::span<const std::byte> data);

}  // namespace asgd::messaging
