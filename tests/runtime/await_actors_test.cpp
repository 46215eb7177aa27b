// A job's actor system is waited for with a word every so often, so a job
// whose outcome is known and whose wait() has not returned says why.

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "captured_log.hpp"
#include "runtime/job_internal.hpp"

namespace asgd {
namespace {

using namespace std::chrono_literals;

TEST(AwaitActors, SaysHowManyActorsAreStillRunningUntilTheLastStops) {
  asgd_test::CapturedLog log;
  {
    caf::actor_system_config cfg;
    caf::actor_system system{cfg};
    // One actor inside a handler that takes 450 ms, as a worker inside a step.
    // (It takes its time as an argument: CAF's spawn of a function with no
    // arguments but `self` binds a reference to null, docs/sanitizers.md.)
    system.spawn<caf::detached>(
        [](caf::event_based_actor* self, int ms) -> caf::behavior {
          self->send(self, ms);
          return {[self](int busy_ms) {
            std::this_thread::sleep_for(std::chrono::milliseconds(busy_ms));
            self->quit();
          }};
        },
        450);
    const auto t0 = std::chrono::steady_clock::now();
    await_actors(system, 100ms);
    EXPECT_GE(std::chrono::steady_clock::now() - t0, 400ms);
    EXPECT_EQ(system.registry().running(), 0u);
  }
  EXPECT_GE(log.count("1 of its actors are still running"), 2u) << log.all();
  EXPECT_LE(log.count("1 of its actors are still running"), 20u) << log.all();
}

TEST(AwaitActors, ReturnsAtOnceAndSaysNothingWhenNoActorRuns) {
  asgd_test::CapturedLog log;
  caf::actor_system_config cfg;
  caf::actor_system system{cfg};
  const auto t0 = std::chrono::steady_clock::now();
  await_actors(system, 100ms);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 50ms);
  EXPECT_EQ(log.count("still running"), 0u);
}

}  // namespace
}  // namespace asgd
