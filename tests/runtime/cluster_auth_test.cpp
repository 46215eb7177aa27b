// "Admit only known peers": a shard and a whole job with --auth-keys. A
// peer without an allowed key, or without CURVE at all, gets no update
// applied and no parameters back, and is counted; with valid keys the job
// trains as it does without them.

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <future>
#include <thread>

#include <nlohmann/json.hpp>

#include "captured_log.hpp"
#include "actors/parameter_shard.hpp"
#include "actors/thrown.hpp"
#include "cli/cli_run.hpp"
#include "coordinator_thread.hpp"
#include "http_client.hpp"
#include "messaging/bridge.hpp"
#include "messaging/curve_auth.hpp"
#include "messaging/curve_keys.hpp"
#include "messaging/served_shard.hpp"
#include "runtime/cluster.hpp"
#include "temp_dir.hpp"
#include "test_data.hpp"
#include "test_helpers.hpp"

namespace asgd {
namespace {

namespace fs = std::filesystem;
using namespace messaging;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

using asgd_test::curve_keypair;
using asgd_test::curve_options;

using asgd_test::eventually;

// A peer outside the job: sends well-formed push and pull frames to a
// shard and counts whatever comes back. (Its transport queues them until
// the handshake is refused, and takes no more after that.)
struct Rogue {
  std::unique_ptr<Transport> transport;
  Result<PeerId> peer = Status::NotFound("not connected");
  std::uint64_t tried = 0;
  std::uint64_t answers = 0;

  Rogue(std::unique_ptr<Transport> t, const std::string& endpoint) : transport(std::move(t)) {
    peer = transport->connect(endpoint);
    EXPECT_TRUE(peer.ok()) << peer.status().to_string();
  }
  void knock(std::size_t floats, std::uint64_t id) {
    if (!peer.ok()) return;
    // A gradient of 1000s: applied even once it would show in the parameters.
    for (auto& m : {encode(PushRequest{0, 0, 0, 1, true, {}}, id, std::vector<float>(floats, 1000.0f)),
                    encode(PullRequest{0, 0}, id + 1)}) {
      EXPECT_TRUE(transport->send(*peer, m).ok());
      ++tried;
    }
    auto in = transport->receive(5ms);
    if (in.ok() && *in) ++answers;
  }
};

TEST(ClusterAuth, AShardGivesAPeerWithoutAnAllowedKeyNoUpdateAndNoParametersAndCountsIt) {
  caf::actor_system_config cfg;
  cfg.add_message_types<caf::id_block::asgd>();
  caf::actor_system sys{cfg};
  const CurveKeypair shard_keys = curve_keypair(), worker_keys = curve_keypair(), rogue_keys = curve_keypair();

  BridgeOptions so;
  so.name = "auth shard";
  so.curve = curve_options(shard_keys, {worker_keys.public_key});
  auto served = asgd_test::ServedShard::start(sys, 4, so);
  ASSERT_TRUE(served.ok()) << served.status().to_string();
  const auto& shard_side = served->bridge;
  const std::string endpoint = shard_side->endpoint();
  const std::string bare = split_server_key(endpoint)->first;

  {
    // One rogue knows the shard's public key (it is no secret) but holds a
    // key the shard does not allow; the other speaks plain text.
    Rogue keyed(make_zmq_transport({}, curve_options(rogue_keys, {shard_keys.public_key})), endpoint);
    Rogue plain(make_zmq_transport(), bare);
    const auto until = Clock::now() + 1s;
    for (std::uint64_t id = 1; Clock::now() < until; id += 2) {
      keyed.knock(4, id);
      plain.knock(4, id);
    }
    EXPECT_EQ(keyed.answers, 0u);
    EXPECT_EQ(plain.answers, 0u);
    EXPECT_TRUE(eventually([&] { return shard_side->stats().auth_rejected >= 2; }))
        << "auth_rejected " << shard_side->stats().auth_rejected;
  }
  EXPECT_EQ(shard_side->stats().frames_in, 0u) << "no rogue frame reached the shard's bridge";

  // The allowed worker: the shard is untouched, then takes its one push.
  BridgeOptions wo;
  wo.name = "auth worker";
  wo.curve = curve_options(worker_keys, {shard_keys.public_key});
  auto worker_side = Bridge::start(wo, nullptr);
  ASSERT_TRUE(worker_side.ok());
  auto peer = (*worker_side)->connect(endpoint);
  ASSERT_TRUE(peer.ok()) << peer.status().to_string();
  auto remote = sys.spawn(remote_shard, *worker_side, *peer, 0u);
  caf::scoped_actor self{sys};
  auto stats = [&] {
    ShardStats out;
    self->request(remote, std::chrono::seconds(10), stats_atom::value)
        .receive([&](ShardStats& s) { out = std::move(s); }, [&](caf::error& e) { ADD_FAILURE() << sys.render(e); });
    return out;
  };
  EXPECT_EQ(stats().updates_applied, 0u);
  ShardReply reply;
  self->request(remote, std::chrono::seconds(10), push_atom::value, PushRequest{0, 0, 0, 1, true, {1, 1, 1, 1}})
      .receive([&](ShardReply& r) { reply = std::move(r); }, [&](caf::error& e) { FAIL() << sys.render(e); });
  ASSERT_EQ(reply.params.size(), 4u);
  EXPECT_EQ(reply.params[0], 99.0f) << "sgd at lr 1 from 100: one step of the worker's gradient, none of the rogues'";
  const ShardStats after = stats();
  EXPECT_EQ(after.updates_applied, 1u);
  EXPECT_EQ(after.malformed_frames, 0u);

  (*worker_side)->stop();
  served->stop();
  self->send_exit(remote, caf::exit_reason::user_shutdown);
}


// A worker whose key a shard does not admit hears it at once: the
// request waiting on the shard, and every later one, fails with the reason,
// instead of waiting out its timeout.
TEST(ClusterAuth, ARequestToAShardThatRefusesThisProcesssKeyFailsAtOnceSayingWhy) {
  caf::actor_system_config cfg;
  cfg.add_message_types<caf::id_block::asgd>();
  caf::actor_system sys{cfg};
  const CurveKeypair shard_keys = curve_keypair(), worker_keys = curve_keypair();
  BridgeOptions so;
  so.name = "auth shard";
  so.curve = curve_options(shard_keys, {});  // admits nobody
  auto served = asgd_test::ServedShard::start(sys, 4, so);
  ASSERT_TRUE(served.ok()) << served.status().to_string();
  BridgeOptions wo;
  wo.name = "auth worker";
  wo.curve = curve_options(worker_keys, {shard_keys.public_key});
  auto worker_side = Bridge::start(wo, nullptr);
  ASSERT_TRUE(worker_side.ok());
  auto peer = (*worker_side)->connect(served->bridge->endpoint());
  ASSERT_TRUE(peer.ok()) << peer.status().to_string();
  auto remote = sys.spawn(remote_shard, *worker_side, *peer, 0u);
  caf::scoped_actor self{sys};
  auto push = [&] {
    std::string why;
    self->request(remote, std::chrono::seconds(30), push_atom::value, PushRequest{0, 0, 0, 1, true, {1, 1, 1, 1}})
        .receive([&](ShardReply&) { ADD_FAILURE() << "a shard that admits nobody answered"; },
                 [&](caf::error& e) { why = reason_text(sys, e); });
    return why;
  };
  const std::string expected = split_server_key(served->bridge->endpoint())->first + " refused this process's key " +
                               key_fingerprint(worker_keys.public_key) +
                               ": the --auth-keys folder of the process there lacks this process's .pub";
  const auto start = Clock::now();
  EXPECT_EQ(push(), expected);
  EXPECT_LT(Clock::now() - start, 10s) << "told by the handshake, not by a timeout";
  EXPECT_EQ((*worker_side)->refusal(*peer), expected);
  EXPECT_EQ(push(), expected) << "a later request is told at once";
  EXPECT_EQ(served->bridge->stats().frames_in, 0u);
  (*worker_side)->stop();
  served->stop();
  self->send_exit(remote, caf::exit_reason::user_shutdown);
}

TEST(ClusterAuth, AJobWithKeysTrainsMnistWhileRoguesKnockOnAShardInVain) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  asgd_test::CapturedLog warnings;
  // Every process its own key, as on separate hosts; each allows all five.
  const CurveKeypair coordinator_keys = curve_keypair();
  const std::vector<CurveKeypair> shard_keys = {curve_keypair(), curve_keypair()}, worker_keys = {curve_keypair(), curve_keypair()};
  std::vector<CurveKey> job = {coordinator_keys.public_key};
  for (const auto* group : {&shard_keys, &worker_keys})
    for (const auto& k : *group) job.push_back(k.public_key);
  const std::string ipc = "ipc:///tmp/asgd-" + std::to_string(::getpid()) + "-auth";

  JobConfig c;
  c.data_dir = dir.string();
  c.workers = 2;
  c.shards = 2;
  c.epochs = 1;
  c.rpc_timeout_s = 30;
  ProcessOptions coord = coordinator_options(c, 30);
  coord.curve = curve_options(coordinator_keys, job);
  std::atomic<bool> done = false;
  CoordinatorThread coordinator(c, coord, {}, [&] { done = true; });
  const std::string at = coordinator.endpoint();
  ASSERT_FALSE(at.empty()) << "the coordinator did not listen within 10 s";
  ASSERT_NE(at.find(" curve:" + to_z85(coordinator_keys.public_key)), std::string::npos) << at;
  std::vector<std::thread> roles;
  std::vector<Status> role_status(4);
  for (std::uint32_t i = 0; i < 2; ++i) {
    roles.emplace_back([&, i] {
      ProcessOptions o;
      o.coordinator = at;  // the endpoint as printed: it carries the coordinator's key
      o.listen = ipc + std::to_string(i);
      o.index = i;
      o.curve = curve_options(shard_keys[i], job);
      role_status[i] = run_shard_process(o, {});
    });
    roles.emplace_back([&, i, at] {
      ProcessOptions o;
      o.coordinator = split_server_key(at)->first;  // a bare endpoint: the key comes from --coordinator-key
      o.index = i;
      o.curve = curve_options(worker_keys[i], job);
      o.curve->server_key = coordinator_keys.public_key;
      role_status[2 + i] = run_worker_process(o, {});
    });
  }
  const std::size_t shard0_floats = 117573;  // the mlp's first half (any size: nothing of it is read)
  std::uint64_t tried = 0, answers = 0;
  {
    // Full-size pushes, but only a few queued at a time: nothing takes them.
    TransportLimits few;
    few.send_high_water_mark = 4;
    Rogue keyed(make_zmq_transport(few, curve_options(curve_keypair(), {shard_keys[0].public_key})),
                with_server_key(ipc + "0", shard_keys[0].public_key));
    Rogue plain(make_zmq_transport(few), ipc + "0");
    for (std::uint64_t id = 1; !done; id += 2) {
      keyed.knock(shard0_floats, id);
      plain.knock(shard0_floats, id);
      std::this_thread::sleep_for(20ms);
    }
    tried = keyed.tried + plain.tried;
    answers = keyed.answers + plain.answers;
  }
  coordinator.join();
  for (auto& t : roles) t.join();
  for (int i = 0; i < 2; ++i) fs::remove(ipc.substr(6) + std::to_string(i));  // (libzmq may leave them)
  const auto& outcome = coordinator.outcome;
  ASSERT_TRUE(outcome.has_value());
  ASSERT_TRUE(outcome->ok()) << outcome->status().to_string();
  EXPECT_GE((*outcome)->final_test_accuracy, 0.9);
  EXPECT_GT(tried, 0u);
  EXPECT_EQ(answers, 0u) << "a rogue got an answer";
  EXPECT_EQ((*outcome)->malformed_frames, 0u);
  // 55000 training images, 27500 a worker, in batches of 64: 430 pushes
  // each. A rogue push applied would be one more.
  EXPECT_EQ((*outcome)->updates_applied, 2u * 430u);
  for (const auto& s : role_status) EXPECT_TRUE(s.ok()) << s.to_string();
  const std::string log = warnings.all();
  // (The process is "shard" until the coordinator gives it its index.)
  EXPECT_NE(log.find("shard: refused a connection from localhost"), std::string::npos) << log;
  EXPECT_NE(log.find("its key is not in the allow-list"), std::string::npos) << log;
  // The plain rogue is named by its pid, unless it was gone before the
  // gatekeeper looked at its socket (a loaded machine): then the line says so.
  const bool named = log.find("shard: refused a connection from a local process (pid " +
                              std::to_string(::getpid()) + ")") != std::string::npos;
  const bool gone = log.find("shard: refused a connection from a peer that left at once, on ipc://") != std::string::npos;
  EXPECT_TRUE(named || gone) << log;
  EXPECT_NE(log.find("connections to its endpoint"), std::string::npos) << log;
}

// ---------------------------------------------------------------------------
// The command line.

using asgd_test::asgd;
using asgd_test::CliRun;
using asgd_test::expect_one_line_error;

TEST(ClusterAuthCli, KeysGenerateWritesAnOwnerOnlySecretAndRefusesToReplaceIt) {
  const asgd_test::TempDir scratch;
  const fs::path keys = scratch / "keys";
  CliRun r = asgd("keys generate --out " + keys.string() + " --name host-a");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("host-a.key"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fingerprint"), std::string::npos) << r.out;
  struct stat st {};
  ASSERT_EQ(::stat((keys / "host-a.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  const auto pub = read_public_key_file(keys / "host-a.pub");
  ASSERT_TRUE(pub.ok()) << pub.status().to_string();
  EXPECT_EQ(read_secret_key_file(keys / "host-a.key")->public_key, *pub);

  expect_one_line_error(asgd("keys generate --out " + keys.string() + " --name host-a"), 2, "host-a.key exists");
  EXPECT_EQ(read_public_key_file(keys / "host-a.pub").value(), *pub);
  EXPECT_EQ(asgd("keys generate --out " + keys.string() + " --name host-a --force").exit_code, 0);
  EXPECT_NE(read_public_key_file(keys / "host-a.pub").value(), *pub);
  expect_one_line_error(asgd("keys generate --out " + keys.string()), 2, "--name");
  expect_one_line_error(asgd("keys generate --out " + keys.string() + " --name ../x"), 2, "--name '../x'");
  expect_one_line_error(asgd("keys"), 2, "the commands: generate (asgd keys --help says what each does)");
  expect_one_line_error(asgd("keys list"), 2, "unknown command list; the commands: generate");
}

TEST(ClusterAuthCli, MissingOrInvalidKeysAreUsageErrorsNamingTheFile) {
  const asgd_test::TempDir scratch;
  const fs::path keys = scratch / "keys";
  ASSERT_EQ(asgd("keys generate --out " + keys.string() + " --name self").exit_code, 0);
  const std::string data = " --data-dir " + scratch.path().string();
  expect_one_line_error(asgd("cluster --workers 1 --shards 1 --auth-keys " + (scratch / "none").string() + data), 2,
                        "--auth-keys " + (scratch / "none").string() + ": no such folder");
  expect_one_line_error(asgd("cluster --workers 1 --shards 1 --auth-keys " + keys.string() + " --key " +
                             (keys / "missing.key").string() + data),
                        2, "missing.key: no such key file");
  expect_one_line_error(asgd("cluster --workers 1 --shards 1 --key " + (keys / "self.key").string() + data), 2,
                        "--key needs --auth-keys");
  expect_one_line_error(
      asgd("shard --coordinator tcp://127.0.0.1:9 --auth-keys " + keys.string()), 2,
      "the coordinator's public key is not known: give --coordinator-key FILE, or put it in " + keys.string() +
          "/coordinator.pub");
  std::ofstream(keys / "broken.pub") << "# not a key\nhello\n";
  expect_one_line_error(asgd("worker --coordinator tcp://127.0.0.1:9 --auth-keys " + keys.string()), 2,
                        (keys / "broken.pub").string() + ": line 2 is not a CURVE key");
  fs::remove(keys / "broken.pub");
  // A public key copied to NAME.key: another identity, which every peer
  // refused later (it was taken as this process's secret key).
  fs::copy_file(keys / "self.pub", keys / "copied.key");
  fs::permissions(keys / "copied.key", fs::perms::owner_read | fs::perms::owner_write);
  expect_one_line_error(asgd("coordinator --workers 1 --shards 1 --auth-keys " + keys.string() + " --key " +
                             (keys / "copied.key").string() + data),
                        2, (keys / "copied.key").string() + ": holds a public key of --auth-keys");
  fs::remove(keys / "copied.key");
  fs::create_directories(keys / "folder.pub");
  expect_one_line_error(asgd("coordinator --workers 1 --shards 1 --auth-keys " + keys.string() + data), 2,
                        (keys / "folder.pub").string() + ": not a key file (not a regular file)");
  fs::remove(keys / "folder.pub");
  ASSERT_EQ(asgd("keys generate --out " + keys.string() + " --name second").exit_code, 0);
  expect_one_line_error(asgd("coordinator --workers 1 --shards 1 --auth-keys " + keys.string() + data), 2,
                        "several secret keys (second.key, self.key)");
}

TEST(ClusterAuthCli, AClusterWithKeysFromOneKeysGenerateTrainsMnist) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path keys = scratch / "keys", metrics = scratch / "auth.jsonl";
  ASSERT_EQ(asgd("keys generate --out " + keys.string() + " --name self").exit_code, 0);
  CliRun r = asgd("cluster --workers 2 --shards 2 --epochs 1 --auth-keys " + keys.string() + " --data-dir " +
                  mnist.string() + " --metrics-out " + metrics.string() + " --log-level warn");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("authenticated and encrypted (CURVE)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("refused"), std::string::npos) << "no process of the job was refused:\n" << r.out;
  const std::string m = asgd_test::slurp(metrics);
  const std::string last = m.substr(m.rfind('\n', m.size() - 2) + 1);
  const auto summary = nlohmann::json::parse(last);
  EXPECT_EQ(summary["event"], "summary");
  EXPECT_GE(summary["final_test_accuracy"].get<double>(), 0.9) << last;
}

// A shard whose --auth-keys folder lacks the worker's key refuses the
// worker's connection in the handshake. The worker hears it and the job
// stops at once saying so; it waited out --rpc-timeout, which said only
// that the shard's process died, stopped or hung. A worker the
// coordinator does not admit is told as soon as it registers.
TEST(ClusterAuthCli, AWorkerAShardOrTheCoordinatorDoesNotAllowIsToldSoAtOnce) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path all = scratch / "all";
  for (const char* name : {"coordinator", "shard", "worker"})
    ASSERT_EQ(asgd("keys generate --out " + all.string() + " --name " + name).exit_code, 0);
  // Each process's folder: its own key, and the public keys it admits.
  auto folder = [&](const char* own, std::vector<const char*> admits) {
    const fs::path dir = scratch / own;
    fs::create_directories(dir);
    fs::copy_file(all / (std::string(own) + ".key"), dir / (std::string(own) + ".key"));
    fs::permissions(dir / (std::string(own) + ".key"), fs::perms::owner_read | fs::perms::owner_write);
    for (const char* p : admits) fs::copy_file(all / (std::string(p) + ".pub"), dir / (std::string(p) + ".pub"));
    return dir.string();
  };
  const std::string kc = folder("coordinator", {"coordinator", "shard", "worker"});
  const std::string ks = folder("shard", {"coordinator", "shard"});  // not the worker's
  const std::string kw = folder("worker", {"coordinator", "shard", "worker"});
  const std::string at = "tcp://127.0.0.1:" + std::to_string(asgd_test::free_port());
  auto coordinator = std::async(std::launch::async, [&] {
    return asgd("coordinator --listen " + at + " --workers 1 --shards 1 --epochs 1 --rpc-timeout 120 "
                "--heartbeat-timeout 2 --join-timeout 30 --data-dir " + mnist.string() + " --auth-keys " + kc);
  });
  std::this_thread::sleep_for(500ms);
  const auto start = Clock::now();
  auto shard = std::async(std::launch::async, [&] { return asgd("shard --coordinator " + at + " --auth-keys " + ks); });
  const CliRun worker = asgd("worker --coordinator " + at + " --auth-keys " + kw);
  EXPECT_EQ(worker.exit_code, 2) << worker.err;  // the keys' folders to fix
  const CliRun c = coordinator.get();
  EXPECT_LT(Clock::now() - start, 60s) << "the refusal was told, not waited out (--rpc-timeout 120)";
  EXPECT_EQ(c.exit_code, 2) << c.err;
  EXPECT_EQ(c.err.find("timeout"), std::string::npos) << c.err;
  const std::string refused = " refused this process's key " + key_fingerprint(*read_public_key_file(all / "worker.pub")) +
                              ": the --auth-keys folder of the process there lacks this process's .pub";
  EXPECT_NE(c.err.find("worker 0: no pull reply from shard 0 at step 0: tcp://"), std::string::npos) << c.err;
  EXPECT_NE(c.err.find(refused), std::string::npos) << c.err;
  EXPECT_NE(worker.err.find(refused), std::string::npos) << worker.err;
  const CliRun s = shard.get();
  EXPECT_NE((s.out + s.err).find("refused a connection"), std::string::npos) << s.out << s.err;

  // The coordinator's folder lacks the worker's key: exit 2, one line.
  const fs::path kc2 = scratch / "coordinator2";
  fs::copy(kc, kc2);
  fs::remove(kc2 / "worker.pub");
  const std::string at2 = "tcp://127.0.0.1:" + std::to_string(asgd_test::free_port());
  auto coordinator2 = std::async(std::launch::async, [&] {
    return asgd("coordinator --listen " + at2 + " --workers 1 --shards 1 --epochs 1 --join-timeout 8 --data-dir " +
                mnist.string() + " --auth-keys " + kc2.string());
  });
  std::this_thread::sleep_for(500ms);
  const CliRun refused_worker = asgd("worker --coordinator " + at2 + " --auth-keys " + kw + " --join-timeout 60");
  expect_one_line_error(refused_worker, 2, "worker: the coordinator at " + at2 + refused);
  (void)coordinator2.get();
}

// The decentralized policies with keys: the workers' collective speaks
// CURVE too, and goes round the ring instead of through shared memory.
TEST(ClusterAuthCli, AllreduceAndGossipWithKeysTrainMnistWithTheirCollectiveAuthenticated) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path keys = scratch / "keys";
  ASSERT_EQ(asgd("keys generate --out " + keys.string() + " --name self").exit_code, 0);
  for (const std::string policy : {"allreduce", "gossip:2"}) {
    const fs::path metrics = scratch / (policy.substr(0, 6) + ".jsonl");
    CliRun r = asgd("cluster --workers 2 --epochs 1 --policy " + policy + " --auth-keys " + keys.string() +
                    " --data-dir " + mnist.string() + " --metrics-out " + metrics.string());
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_EQ(r.out.find("refused"), std::string::npos) << policy << ": no process of the job was refused:\n" << r.out;
    for (const char* w : {"worker 0", "worker 1"})
      EXPECT_NE(r.out.find(std::string(w) + "'s collective: authenticated and encrypted (CURVE)"), std::string::npos)
          << policy << ":\n" << r.out;
    EXPECT_EQ(r.out.find("the all-reduce goes through shared memory"), std::string::npos) << r.out;
    const std::string m = asgd_test::slurp(metrics);
    const auto summary = nlohmann::json::parse(m.substr(m.rfind('\n', m.size() - 2) + 1));
    EXPECT_GE(summary["final_test_accuracy"].get<double>(), 0.9) << policy << ": " << summary.dump();
  }
}

}  // namespace
}  // namespace asgd
