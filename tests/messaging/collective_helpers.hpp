#pragma once
// What the tests of the workers' collective share: a Ready that can be
// waited for, a group of ZeroMQ collectives on loopback, and random vectors.

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "messaging/collective.hpp"

namespace asgd_test {

// Counts the ready calls of one rank; wait_for() blocks until the n-th.
// A test waits for every call it asked for before its Signal goes away: a
// collective calls ready on its own thread, and a call after that would
// find nothing there.
struct Signal {
  std::mutex mu;
  std::condition_variable cv;
  int calls = 0;
  Signal() = default;
  Signal(const Signal&) = delete;
  Signal& operator=(const Signal&) = delete;
  // A call still inside ready() (notifying) is done before cv goes.
  ~Signal() { std::lock_guard lock(mu); }
  asgd::messaging::Collective::Ready ready() {
    return [this] {
      std::lock_guard lock(mu);
      ++calls;
      cv.notify_all();
    };
  }
  bool wait_for(int n, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, limit, [&] { return calls >= n; });
  }
};

// n ranks on 127.0.0.1, each made by `make` (which sets them up before
// they connect), connected to each other.
template <class Make>
std::vector<std::shared_ptr<asgd::messaging::NetworkCollective>> collective_group(asgd::messaging::Rank n, Make make) {
  std::vector<std::shared_ptr<asgd::messaging::NetworkCollective>> ranks;
  std::vector<std::string> endpoints;
  for (asgd::messaging::Rank r = 0; r < n; ++r) {
    ranks.push_back(make());
    endpoints.push_back(ranks.back()->endpoint());
  }
  for (asgd::messaging::Rank r = 0; r < n; ++r) EXPECT_TRUE(ranks[r]->connect(r, endpoints).ok());
  return ranks;
}

// n vectors of len standard normal values, seeded.
inline std::vector<std::vector<float>> random_vectors(std::size_t n, std::size_t len, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<std::vector<float>> v(n, std::vector<float>(len));
  for (auto& x : v)
    for (float& f : x) f = d(rng);
  return v;
}

}  // namespace asgd_test
