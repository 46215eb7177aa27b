#pragma once
// CURVE keys for tests of --auth-keys: a fresh key pair, and the transport
// options of a process holding `own` that admits the `allowed` keys.

#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "messaging/curve_auth.hpp"

namespace asgd_test {

inline asgd::messaging::CurveKeypair curve_keypair() {
  auto k = asgd::messaging::new_curve_keypair();
  EXPECT_TRUE(k.ok()) << k.status().to_string();
  return k.ok() ? *k : asgd::messaging::CurveKeypair{};
}

inline asgd::messaging::CurveOptions curve_options(const asgd::messaging::CurveKeypair& own,
                                                   std::vector<asgd::messaging::CurveKey> allowed) {
  asgd::messaging::CurveOptions o;
  o.public_key = own.public_key;
  o.secret_key = own.secret_key;
  o.allowed = std::move(allowed);
  return o;
}

}  // namespace asgd_test
