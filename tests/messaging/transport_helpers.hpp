#pragma once
// What the transport tests share: text parts, and a receive or send that
// fails the test on an error instead of returning it.

#include <gtest/gtest.h>

#include <chrono>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "messaging/transport.hpp"

namespace asgd::messaging::testing {

using namespace std::chrono_literals;

// Long enough for any message that was sent to arrive on a loaded machine.
inline constexpr auto kArrives = 10s;
// How long to listen before concluding that nothing is coming.
inline constexpr auto kNothingComes = 100ms;

inline Part text(std::string_view s) { return Part::copy_of(std::as_bytes(std::span(s.data(), s.size()))); }

inline std::string text_of(const Part& p) { return {reinterpret_cast<const char*>(p.bytes.data()), p.bytes.size()}; }

inline Message message_of(std::initializer_list<std::string_view> parts) {
  Message m;
  for (auto p : parts) m.push_back(text(p));
  return m;
}

inline std::vector<std::string> texts_of(const Message& m) {
  std::vector<std::string> out;
  for (const Part& p : m) out.push_back(text_of(p));
  return out;
}

// The next message, or nullopt after `timeout`; a receive error fails the test.
inline std::optional<Incoming> next(Transport& t, std::chrono::milliseconds timeout = kArrives) {
  auto r = t.receive(timeout);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (!r.ok()) return std::nullopt;
  return std::move(r).value();
}

// Whether `m` was queued; an error fails the test.
inline bool sent(Transport& t, const PeerId& to, Message m) {
  auto r = t.send(to, std::move(m));
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() && *r;
}

}  // namespace asgd::messaging::testing
