// A data feeder that cannot make a batch (out of memory) answers the worker
// waiting for it with that error instead of leaving its request open; one
// told to stop serves the end-of-data marker from then on.

#include <gtest/gtest.h>

#include <caf/all.hpp>

#include <memory>
#include <string>

#include "actors/data_feeder.hpp"
#include "actors/synthetic_data.hpp"
#include "messaging/protocol.hpp"

namespace asgd {
namespace {

// An actor system's configuration with our message types.
struct WithOurTypes : caf::actor_system_config {
  WithOurTypes() { add_message_types<caf::id_block::asgd>(); }
};

TEST(DataFeeder, ABatchThatCannotBeMadeAnswersTheWaitingRequestWithTheError) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers' allocators abort on a 4 PiB request instead of throwing bad_alloc";
#endif
  // Two samples of 2^50 floats each, declared and never stored: making a
  // batch asks for 4 PiB before it reads a value, and gets bad_alloc.
  auto data = std::make_shared<data::DatasetSplits>();
  data->train.count = 2;
  data->train.rows = std::size_t{1} << 25;
  data->train.cols = std::size_t{1} << 25;
  data->train.labels = {0, 1};
  FeederSetup setup;
  setup.data = data;
  setup.partition = {0, 2};
  setup.batch = 1;
  setup.capacity = 1;

  WithOurTypes cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  // Lazily started: the request is in the mailbox before the feeder's first
  // batch is asked for, so the request waits for that batch, which fails.
  auto feeder = sys.spawn<caf::lazy_init>(data_feeder, setup);
  std::string answer;
  self->request(feeder, std::chrono::seconds(10), next_atom::value)
      .receive([&](const data::Batch&) { answer = "a batch"; },
               [&](const caf::error& e) { answer = sys.render(e); });
  EXPECT_NE(answer.find("a data feeder failed: out of memory"), std::string::npos) << answer;
}

// --stop-at-target: after stop_atom a feeder with batches ready and epochs
// left answers every request with the end-of-data marker (size 0), as after
// its last epoch, so its worker stops after the step it is in.
TEST(DataFeeder, AfterStopEveryRequestGetsTheEndOfDataMarker) {
  FeederSetup setup;
  setup.data = asgd_test::synthetic_splits(64);
  setup.partition = {0, 64};
  setup.epochs = 3;
  setup.batch = 8;
  setup.capacity = 4;
  WithOurTypes cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto feeder = sys.spawn(data_feeder, setup);
  auto next = [&] {
    std::uint32_t size = 99;
    self->request(feeder, std::chrono::seconds(10), next_atom::value)
        .receive([&](const data::Batch& b) { size = b.size; }, [&](const caf::error&) { size = 98; });
    return size;
  };
  EXPECT_EQ(next(), 8u);
  self->send(feeder, stop_atom::value);
  EXPECT_EQ(next(), 0u) << "batches were ready and 23 more were due";
  EXPECT_EQ(next(), 0u);
  self->send_exit(feeder, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace asgd
