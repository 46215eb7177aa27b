// InlineUnit: the actors it was given run on the thread that posts to them,
// every other actor as CAF schedules it. The actors are spawned lazily: one
// spawned otherwise first runs on CAF's threads (to start), and a message
// that comes meanwhile is handled there too.

#include "messaging/inline_unit.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <thread>

namespace asgd::messaging {
namespace {

using ask_atom = caf::atom_constant<caf::atom("ask")>;
using burst_atom = caf::atom_constant<caf::atom("burst")>;

caf::mailbox_element_ptr anonymous(caf::message m) {
  return caf::make_mailbox_element(nullptr, caf::make_message_id(), {}, std::move(m));
}

// Records the thread each message ran on, in order.
struct Seen {
  std::mutex mu;
  std::vector<std::thread::id> threads;
  void add() {
    std::lock_guard lock(mu);
    threads.push_back(std::this_thread::get_id());
  }
  std::vector<std::thread::id> get() {
    std::lock_guard lock(mu);
    return threads;
  }
};

caf::behavior recorder(caf::event_based_actor*, std::shared_ptr<Seen> seen) {
  return {[seen](int) { seen->add(); }};
}

// Answers an ask with its argument doubled, recording where it ran.
caf::behavior doubler(caf::event_based_actor*, std::shared_ptr<Seen> seen) {
  return {[seen](ask_atom, int x) {
    seen->add();
    return 2 * x;
  }};
}

// Asks `other` to double x and records the answer (and where it came).
caf::behavior asker(caf::event_based_actor* self, caf::actor other, std::shared_ptr<Seen> seen,
                    std::shared_ptr<std::atomic<int>> answer) {
  return {[=](int x) {
    seen->add();
    self->request(other, caf::infinite, ask_atom::value, x).then([=](int doubled) {
      seen->add();
      answer->store(doubled);
    });
  }};
}

// On a burst, sends itself n ints, which it counts.
caf::behavior burster(caf::event_based_actor* self, std::shared_ptr<Seen> seen, std::shared_ptr<std::atomic<int>> count) {
  return {[=](burst_atom, int n) {
            for (int i = 0; i < n; ++i) self->send(self, i);
          },
          [=](int) {
            seen->add();
            ++*count;
          }};
}

bool eventually(const std::function<bool()>& ok) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!ok()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(InlineUnit, AnActorItRunsHandlesAPostedMessageOnThePostingThreadBeforePostReturns) {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto seen = std::make_shared<Seen>();
  auto a = sys.spawn<caf::lazy_init>(recorder, seen);
  {
    InlineUnit unit(sys, {a});
    unit.post(a, anonymous(caf::make_message(1)));
    unit.post(a, anonymous(caf::make_message(2)));
    const auto threads = seen->get();
    ASSERT_EQ(threads.size(), 2u);
    EXPECT_EQ(threads[0], std::this_thread::get_id());
    EXPECT_EQ(threads[1], std::this_thread::get_id());
  }
  caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}

TEST(InlineUnit, AnActorItWasNotGivenRunsOnCafsThreads) {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto seen = std::make_shared<Seen>();
  auto mine = sys.spawn<caf::lazy_init>(recorder, std::make_shared<Seen>());
  auto other = sys.spawn<caf::lazy_init>(recorder, seen);
  {
    InlineUnit unit(sys, {mine});
    unit.post(other, anonymous(caf::make_message(1)));
    ASSERT_TRUE(eventually([&] { return seen->get().size() == 1; }));
    EXPECT_NE(seen->get()[0], std::this_thread::get_id());
  }
  for (auto& x : {mine, other}) caf::anon_send_exit(x, caf::exit_reason::user_shutdown);
}

TEST(InlineUnit, ARequestBetweenTwoOfItsActorsIsAskedAndAnsweredOnThePostingThread) {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto seen = std::make_shared<Seen>();
  auto answer = std::make_shared<std::atomic<int>>(0);
  auto d = sys.spawn<caf::lazy_init>(doubler, seen);
  auto a = sys.spawn<caf::lazy_init>(asker, d, seen, answer);
  {
    InlineUnit unit(sys, {a, d});
    unit.post(a, anonymous(caf::make_message(21)));
    EXPECT_EQ(answer->load(), 42);  // before post returned
    const auto threads = seen->get();
    ASSERT_EQ(threads.size(), 3u);  // asked, doubled, answered
    for (auto t : threads) EXPECT_EQ(t, std::this_thread::get_id());
  }
  for (auto& x : {a, d}) caf::anon_send_exit(x, caf::exit_reason::user_shutdown);
}

TEST(InlineUnit, AnActorWithMoreMessagesThanItsTurnAllowsHandlesTheRestOnCafsThreads) {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto seen = std::make_shared<Seen>();
  auto count = std::make_shared<std::atomic<int>>(0);
  auto b = sys.spawn<caf::lazy_init>(burster, seen, count);
  constexpr int kBurst = 5 * static_cast<int>(InlineUnit::kThroughput);
  {
    InlineUnit unit(sys, {b});
    unit.post(b, anonymous(caf::make_message(burst_atom::value, kBurst)));
    ASSERT_TRUE(eventually([&] { return count->load() == kBurst; }));
  }
  // Its first turn (the burst and the first messages) ran here; post()
  // returned without the rest, which CAF's threads took.
  const auto threads = seen->get();
  const auto here = std::count(threads.begin(), threads.end(), std::this_thread::get_id());
  EXPECT_GE(here, 1);
  EXPECT_LT(here, static_cast<long>(InlineUnit::kThroughput));
  EXPECT_EQ(threads.front(), std::this_thread::get_id());
  EXPECT_NE(threads.back(), std::this_thread::get_id());
  caf::anon_send_exit(b, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace asgd::messaging
