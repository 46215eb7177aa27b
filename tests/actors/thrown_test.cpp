// What an actor's failure says: thrown exceptions and exit reasons as the
// sentences they were made with.

#include "actors/thrown.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace asgd {
namespace {

TEST(Thrown, AnExitReasonMadeWithASentenceReadsAsThatSentence) {
  caf::actor_system_config cfg;
  caf::actor_system system{cfg};
  const caf::error made = caf::make_error(caf::sec::runtime_error, std::string("its process sent no heartbeat for 3 s"));
  EXPECT_EQ(reason_text(system, made), "its process sent no heartbeat for 3 s");
  // Without one, CAF's own rendering.
  const caf::error bare = caf::make_error(caf::sec::runtime_error);
  EXPECT_EQ(reason_text(system, bare), system.render(bare));
  EXPECT_NE(reason_text(system, bare).find("runtime_error"), std::string::npos);
}

TEST(Thrown, AThrownExceptionIsAnErrorThatNamesWhoAndWhat) {
  caf::actor_system_config cfg;
  caf::actor_system system{cfg};
  const caf::error e = thrown_error(std::make_exception_ptr(std::runtime_error("disk on fire")), "worker 3");
  const std::string text = reason_text(system, e);
  EXPECT_NE(text.find("worker 3"), std::string::npos) << text;
  EXPECT_NE(text.find("disk on fire"), std::string::npos) << text;
}

}  // namespace
}  // namespace asgd
