// The workers' collective with CURVE (--auth-keys): ranks that hold allowed
// keys all-reduce and gossip as without it; a rank whose key is not
// allowed, or that speaks plain tcp, gets nothing in, and every rank
// refuses to connect to a peer whose key it does not know.

#include <gtest/gtest.h>

#include <zmq.hpp>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "captured_log.hpp"
#include "collective_helpers.hpp"
#include "curve_keys.hpp"
#include "test_helpers.hpp"
#include "messaging/collective.hpp"
#include "messaging/curve_auth.hpp"

namespace asgd::messaging {
namespace {

using namespace std::chrono_literals;
using asgd_test::curve_keypair;
using asgd_test::curve_options;
using asgd_test::random_vectors;
using asgd_test::Signal;

struct KeyedGroup {
  std::vector<CurveKeypair> keys;
  std::vector<CurveKey> allowed;
  std::vector<std::shared_ptr<NetworkCollective>> ranks;
  std::vector<std::string> endpoints;
};

// n ranks on 127.0.0.1, each with its own key, each allowing all n keys;
// listening, not yet connected.
KeyedGroup keyed_group(Rank n) {
  KeyedGroup g;
  for (Rank r = 0; r < n; ++r) {
    g.keys.push_back(curve_keypair());
    g.allowed.push_back(g.keys.back().public_key);
  }
  for (Rank r = 0; r < n; ++r) {
    auto c = make_zmq_collective("tcp://127.0.0.1:*", curve_options(g.keys[r], g.allowed),
                                 "collective " + std::to_string(r));
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    g.ranks.push_back(*c);
    g.endpoints.push_back(g.ranks.back()->endpoint());
  }
  return g;
}

TEST(ZmqCollectiveCurve, RanksWithAllowedKeysAllReduceAndGossipAndTheirEndpointsCarryTheirKeys) {
  if (!curve_supported()) GTEST_SKIP() << "libzmq without CURVE";
  KeyedGroup g = keyed_group(3);
  for (Rank r = 0; r < 3; ++r) {
    auto split = split_server_key(g.endpoints[r]);
    ASSERT_TRUE(split.ok() && split->second) << g.endpoints[r];
    EXPECT_EQ(*split->second, g.keys[r].public_key);
  }
  for (Rank r = 0; r < 3; ++r) ASSERT_TRUE(g.ranks[r]->connect(r, g.endpoints).ok());
  const auto data = random_vectors(3, 50'001, 4);
  std::vector<Signal> done(3);
  for (Rank r = 0; r < 3; ++r) ASSERT_TRUE(g.ranks[r]->allreduce_mean(r, 0, data[r], 1.0, done[r].ready()).ok());
  for (Rank r = 0; r < 3; ++r) ASSERT_TRUE(done[r].wait_for(1)) << g.ranks[r]->waiting_for(r);
  const auto mean = g.ranks[0]->mean(0);
  ASSERT_EQ(mean.size(), data[0].size());
  for (std::size_t i = 0; i < mean.size(); i += 1001)
    EXPECT_NEAR(mean[i], (data[0][i] + data[1][i] + data[2][i]) / 3.0, 1e-5);
  for (Rank r = 1; r < 3; ++r) {
    const auto m = g.ranks[r]->mean(r);
    EXPECT_TRUE(std::equal(m.begin(), m.end(), mean.begin(), mean.end())) << "rank " << r << " got other bits";
  }
  // Gossip: rank 0 sends its copy to rank 1, which waits for it.
  Signal sent, got;
  ASSERT_TRUE(g.ranks[1]->gossip(1, 1, data[1], {}, {0}, 1, got.ready()).ok());
  ASSERT_TRUE(g.ranks[0]->gossip(0, 1, data[0], {1}, {}, 0, sent.ready()).ok());
  ASSERT_TRUE(got.wait_for(1)) << g.ranks[1]->waiting_for(1);
  // Rank 0 waits for nobody, but says so on its own thread: wait for that
  // too before `sent` goes away.
  ASSERT_TRUE(sent.wait_for(1)) << g.ranks[0]->waiting_for(0);
  const auto copies = g.ranks[1]->peer_copies(1);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(*copies[0].params, data[0]);
}

TEST(ZmqCollectiveCurve, AStrangerGetsNothingInAndTheRoundCompletesWithoutIt) {
  if (!curve_supported()) GTEST_SKIP() << "libzmq without CURVE";
  asgd_test::CapturedLog log;
  KeyedGroup g = keyed_group(2);
  for (Rank r = 0; r < 2; ++r) ASSERT_TRUE(g.ranks[r]->connect(r, g.endpoints).ok());
  const std::string bare = split_server_key(g.endpoints[0])->first;
  zmq::context_t ctx;
  // A stranger that knows rank 0's key but holds a key rank 0 does not
  // allow, and one without CURVE: each sends a chunk of 1000s.
  const CurveKeypair stranger = curve_keypair();
  zmq::socket_t keyed(ctx, zmq::socket_type::push), plain(ctx, zmq::socket_type::push);
  keyed.set(zmq::sockopt::curve_serverkey, zmq::buffer(g.keys[0].public_key));
  keyed.set(zmq::sockopt::curve_publickey, zmq::buffer(stranger.public_key));
  keyed.set(zmq::sockopt::curve_secretkey, zmq::buffer(stranger.secret_key));
  for (zmq::socket_t* s : {&keyed, &plain}) {
    s->set(zmq::sockopt::linger, 0);
    s->connect(bare);
    std::vector<char> header(64, 0);
    (void)s->send(zmq::buffer(header), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    (void)s->send(zmq::buffer(std::vector<float>(16, 1000.0f)), zmq::send_flags::dontwait);
  }
  const auto data = random_vectors(2, 16, 5);
  std::vector<Signal> done(2);
  for (Rank r = 0; r < 2; ++r) ASSERT_TRUE(g.ranks[r]->allreduce_mean(r, 0, data[r], 1.0, done[r].ready()).ok());
  for (Rank r = 0; r < 2; ++r) ASSERT_TRUE(done[r].wait_for(1)) << g.ranks[r]->waiting_for(r);
  EXPECT_NEAR(g.ranks[0]->mean(0)[3], (data[0][3] + data[1][3]) / 2.0, 1e-6);
  const auto logged = [&](const std::string& what) { return log.all().find(what) != std::string::npos; };
  EXPECT_TRUE(asgd_test::eventually([&] { return logged("its key is not in the allow-list"); })) << log.all();
  EXPECT_EQ(g.ranks[0]->rejected(), 0u) << "nothing of a stranger's reached the collective to be checked";
  EXPECT_TRUE(asgd_test::eventually([&] { return logged("collective 0: refused a connection"); })) << log.all();
}

// Rank 1 does not allow rank 0's key: rank 0 hears it in the handshake
// and says so (the worker then stops the step with that, instead of
// waiting out --rpc-timeout); rank 1 is refused nothing.
TEST(ZmqCollectiveCurve, ARankWhoseKeyAPeerRefusesIsToldWhichPeerAndWhy) {
  if (!curve_supported()) GTEST_SKIP() << "libzmq without CURVE";
  KeyedGroup g;
  for (Rank r = 0; r < 2; ++r) g.keys.push_back(curve_keypair());
  const std::vector<std::vector<CurveKey>> allows = {{g.keys[0].public_key, g.keys[1].public_key},
                                                     {g.keys[1].public_key}};
  for (Rank r = 0; r < 2; ++r) {
    auto c = make_zmq_collective("tcp://127.0.0.1:*", curve_options(g.keys[r], allows[r]), "collective " + std::to_string(r));
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    g.ranks.push_back(*c);
    g.endpoints.push_back((*c)->endpoint());
  }
  ASSERT_TRUE(g.ranks[0]->connect(0, g.endpoints).ok());
  // Rank 1 cannot connect to rank 0, whose key it does not allow: it is
  // refused at connect() (the test above), and left out here.
  EXPECT_EQ(g.ranks[0]->refused(), "");
  const auto data = random_vectors(2, 16, 5);
  Signal done;
  ASSERT_TRUE(g.ranks[0]->allreduce_mean(0, 0, data[0], 1.0, done.ready()).ok());
  EXPECT_TRUE(asgd_test::eventually([&] { return !g.ranks[0]->refused().empty(); }));
  EXPECT_EQ(g.ranks[0]->refused(), "worker 1's collective refused this worker's key " +
                                       key_fingerprint(g.keys[0].public_key) +
                                       ": worker 1's --auth-keys folder lacks this process's .pub");
  EXPECT_EQ(g.ranks[1]->refused(), "");
  g.ranks[0]->leave(0);
}

TEST(ZmqCollectiveCurve, ARankRefusesAPeerWithoutAKeyOrWithAKeyItDoesNotAllowAndAPlainRankRefusesAKeyedPeer) {
  if (!curve_supported()) GTEST_SKIP() << "libzmq without CURVE";
  KeyedGroup g = keyed_group(2);
  auto plain = make_zmq_collective("tcp://127.0.0.1:*");
  ASSERT_TRUE(plain.ok());
  const std::string plain_at = (*plain)->endpoint();

  Status s = g.ranks[0]->connect(0, {g.endpoints[0], plain_at});
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("worker 1's collective at " + plain_at + ": CURVE is on, and the server's public key is "
                             "not known"),
            std::string::npos)
      << s.to_string();

  const CurveKeypair other = curve_keypair();
  auto unknown = make_zmq_collective("tcp://127.0.0.1:*", curve_options(other, {other.public_key}));
  ASSERT_TRUE(unknown.ok());
  s = g.ranks[1]->connect(1, {(*unknown)->endpoint(), g.endpoints[1]});
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("the server's key " + key_fingerprint(other.public_key) + " is not in the allow-list"),
            std::string::npos)
      << s.to_string();

  s = (*plain)->connect(1, {g.endpoints[0], plain_at});
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("worker 0's collective at " + split_server_key(g.endpoints[0])->first +
                             ": the server there uses CURVE (the endpoint carries its key); this process needs "
                             "--auth-keys"),
            std::string::npos)
      << s.to_string();
}

}  // namespace
}  // namespace asgd::messaging
