// A data feeder that cannot make a batch (out of memory) answers the worker
// waiting for it with that error instead of leaving its request open.

#include <gtest/gtest.h>

#include <caf/all.hpp>

#include <memory>
#include <string>

#include "actors/data_feeder.hpp"
#include "messaging/protocol.hpp"

namespace asgd {
namespace {

TEST(DataFeeder, ABatchThatCannotBeMadeAnswersTheWaitingRequestWithTheError) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer aborts on a 4 PiB request instead of throwing bad_alloc";
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

  caf::actor_system_config cfg;
  cfg.add_message_types<caf::id_block::asgd>();
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

}  // namespace
}  // namespace asgd
