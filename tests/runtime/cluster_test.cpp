// Jobs whose coordinator, shards and workers are separate "processes": each
// role runs as it does in its own process (its own bridge, ZeroMQ context
// and actor system), here on threads of the test, talking over ipc and tcp.

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <optional>
#include <stop_token>
#include <cstring>
#include <thread>

#include <unistd.h>

#include "coordinator_thread.hpp"
#include "messaging/bridge.hpp"
#include "messaging/untrusted.hpp"
#include "runtime/cluster.hpp"
#include "temp_dir.hpp"
#include "test_data.hpp"

namespace asgd {
namespace {

using namespace messaging;

// One of each kind of bad frame a confused or hostile peer might send.
std::vector<Message> bad_frames() {
  std::vector<Message> out;
  const Message good = encode(PushRequest{0, 0, 0, 1, true, {}}, 1, std::vector<float>(10, 1.0f));
  auto head = [&] { return std::vector<std::byte>(good[0].bytes.begin(), good[0].bytes.end()); };
  auto with = [&](std::vector<std::byte> h, bool tensor) {
    Message m;
    m.push_back(Part::take(std::move(h)));
    if (tensor) m.push_back(good[1]);
    return m;
  };
  auto h = head();
  h.resize(12);  // truncated header
  out.push_back(with(h, false));
  h = head();
  const std::uint32_t huge = 0x7FFFFFFF;  // claims a tensor over the limit
  std::memcpy(h.data() + 24, &huge, 4);
  out.push_back(with(h, true));
  h = head();
  h[4] = std::byte{kProtocolVersion + 1};  // a protocol version from the future
  out.push_back(with(h, true));
  h = head();
  h[kHeaderBytes] ^= std::byte{1};  // a flipped bit: bad checksum
  out.push_back(with(h, true));
  std::vector<std::byte> noise(300);
  for (std::size_t i = 0; i < noise.size(); ++i) noise[i] = static_cast<std::byte>((i * 7919) % 251);
  out.push_back(with(noise, false));  // random bytes
  out.push_back(with(head(), false));  // the tensor part missing
  return out;
}

TEST(ClusterProcesses, TrainMnistWhileAShardIsSentMalformedFramesWhichItCountsAndSurvives) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  // ipc paths must fit in a sockaddr_un (108 bytes): short names in /tmp.
  const std::string ipc = "ipc:///tmp/asgd-" + std::to_string(::getpid()) + "-shard";
  JobConfig c;
  c.data_dir = dir.string();
  c.workers = 2;
  c.shards = 2;
  c.epochs = 2;
  c.rpc_timeout_s = 30;
  const ProcessOptions coord = coordinator_options(c, 30);
  // The rogue stops sending once epoch 1 is done (or after 20,000 frames),
  // so every frame it sent has arrived long before the shard's statistics
  // are read at the end.
  std::atomic<bool> first_epoch_done = false;
  JobCallbacks callbacks;
  callbacks.on_epoch = [&](const EpochMetrics&) { first_epoch_done = true; };
  CoordinatorThread coordinator(c, coord, callbacks, [&] { first_epoch_done = true; });
  const std::string at = coordinator.endpoint();
  ASSERT_FALSE(at.empty()) << "the coordinator did not listen within 10 s";
  std::vector<std::thread> roles;
  std::vector<Status> role_status(4);
  for (std::uint32_t i = 0; i < 2; ++i) {
    roles.emplace_back([&, i] {
      ProcessOptions o;
      o.coordinator = at;
      o.listen = ipc + std::to_string(i);
      o.index = i;
      role_status[i] = run_shard_process(o, {});
    });
    roles.emplace_back([&, i] {
      ProcessOptions o;
      o.coordinator = at;
      o.index = i;
      role_status[2 + i] = run_worker_process(o, {});
    });
  }
  // A rogue peer: connects to shard 0 and sends every kind of bad frame,
  // over and over, while the job trains.
  // It stays connected until the job ends: a frame it sent that the shard,
  // busy training, has not read yet is still delivered (closed early, its
  // socket would drop what it had not handed over).
  std::uint64_t sent = 0;
  auto rogue = make_zmq_transport();
  {
    auto peer = rogue->connect(ipc + "0");
    EXPECT_TRUE(peer.ok()) << peer.status().to_string();
    const auto frames = bad_frames();
    for (const auto& f : frames) EXPECT_NE(check_untrusted(f), FrameError::none);
    while (peer.ok() && !first_epoch_done && sent < 20000) {
      for (const auto& f : frames) {
        auto r = rogue->send(*peer, f);
        if (r.ok() && *r) ++sent;
      }
      (void)rogue->receive(std::chrono::milliseconds(5));  // spread over the whole job
    }
  }
  coordinator.join();
  for (auto& t : roles) t.join();
  rogue.reset();
  for (int i = 0; i < 2; ++i) std::filesystem::remove(ipc.substr(6) + std::to_string(i));  // the sockets' files
  const auto& outcome = coordinator.outcome;
  ASSERT_TRUE(outcome.has_value());
  ASSERT_TRUE(outcome->ok()) << outcome->status().to_string();
  EXPECT_GE((*outcome)->final_test_accuracy, 0.9);
  EXPECT_GT(sent, 0u);
  EXPECT_EQ((*outcome)->malformed_frames, sent) << "every bad frame is counted";
  for (const auto& s : role_status) EXPECT_TRUE(s.ok()) << s.to_string();
}

TEST(ClusterProcesses, ACoordinatorThatNobodyJoinsGivesUpNamingWhoIsMissing) {
  JobConfig c;
  c.data_dir = "/nonexistent";  // never read: the job does not start
  c.shards = 1;
  c.workers = 2;
  ProcessOptions o;
  o.shards = 1;
  o.workers = 2;
  o.join_timeout_s = 0.3;
  o.rank_hosts = {"node1", "node1", "node2", "node2"};  // as a launcher says where each rank is
  const auto t0 = std::chrono::steady_clock::now();
  auto r = run_coordinator_process(c, o, {}, {}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::timeout);
  EXPECT_NE(r.status().message().find("0 of 1 shard and 0 of 2 worker processes"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("missing: shard 0 (rank 1 under a launcher, on node1), worker 0 (rank 2 under "
                                      "a launcher, on node2), worker 1 (rank 3 under a launcher, on node2)"),
            std::string::npos)
      << r.status().message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST(ClusterProcesses, ACancelBeforeAnyoneJoinsEndsTheWaitAtOnce) {
  JobConfig c;
  c.data_dir = "/nonexistent";  // never read: the job does not start
  ProcessOptions o;
  o.shards = c.shards;
  o.workers = c.workers;
  o.join_timeout_s = 30;
  std::stop_source stop;
  stop.request_stop();  // before the wait even starts
  const auto t0 = std::chrono::steady_clock::now();
  auto r = run_coordinator_process(c, o, {}, stop.get_token(), {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::cancelled) << r.status().to_string();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

// Placement does not block: a shard process that registers but never
// takes its assignment (never sends a heartbeat) fails the job at
// --join-timeout, naming it, and the worker process that registered is
// told to stop.
TEST(ClusterProcesses, AShardThatNeverTakesItsAssignmentFailsTheJobAtTheJoinTimeoutNamingIt) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  JobConfig c;
  c.data_dir = dir.string();
  c.shards = 1;
  c.workers = 1;
  CoordinatorThread coordinator(c, coordinator_options(c, 1.0));
  const std::string at = coordinator.endpoint();
  ASSERT_FALSE(at.empty()) << "the coordinator did not listen within 10 s";
  // Two silent processes: they register, and answer nothing.
  std::atomic<bool> worker_told_to_stop = false;
  auto silent = [&](Role role, std::uint32_t pid, bool listen) {
    BridgeOptions bo;
    bo.listen = listen ? "tcp://127.0.0.1:0" : "";
    auto b = Bridge::start(bo, [&, role](Inbound&& in) {
      if (role == Role::worker && std::holds_alternative<Shutdown>(in.body)) worker_told_to_stop = true;
    });
    EXPECT_TRUE(b.ok()) << b.status().to_string();
    auto peer = (*b)->connect(at);
    EXPECT_TRUE(peer.ok());
    (*b)->send(*peer, encode(Registration{role, 0, listen ? (*b)->endpoint() : "", "silent-host", pid, "", "", ""}, 1));
    return *b;
  };
  auto shard = silent(Role::shard, 4242, true);
  auto worker = silent(Role::worker, 4343, false);
  const auto t0 = std::chrono::steady_clock::now();
  coordinator.join();
  const auto& outcome = coordinator.outcome;
  ASSERT_TRUE(outcome.has_value());
  ASSERT_FALSE(outcome->ok());
  EXPECT_EQ(outcome->status().code(), StatusCode::timeout) << outcome->status().to_string();
  EXPECT_NE(outcome->status().message().find(
                "shard process 0 (pid 4242 on silent-host) did not take its assignment within 1 s"),
            std::string::npos)
      << outcome->status().message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  const auto told_by = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!worker_told_to_stop && std::chrono::steady_clock::now() < told_by)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(worker_told_to_stop);
  shard->stop(std::chrono::seconds(1));
  worker->stop(std::chrono::seconds(1));
}

TEST(ClusterProcesses, AWorkerWithoutACoordinatorGivesUpAfterItsJoinTimeout) {
  ProcessOptions o;
  o.coordinator = "tcp://127.0.0.1:9";  // nothing listens there
  o.join_timeout_s = 0.3;
  Status s = run_worker_process(o, {});
  EXPECT_EQ(s.code(), StatusCode::timeout) << s.to_string();
  EXPECT_NE(s.message().find("no assignment from the coordinator"), std::string::npos) << s.message();
}

TEST(ClusterProcesses, HogwildIsRefusedAcrossProcessesAndAutomaticWeightsAreTaken) {
  JobConfig c;
  c.policy = "hogwild";
  EXPECT_NE(validate_for_cluster(c, WorkersOn::their_hosts).message().find("cannot share one parameter buffer"), std::string::npos);
  for (const char* decentralized : {"allreduce", "gossip:2"}) {  // their workers' collective goes over ZeroMQ
    c.policy = decentralized;
    EXPECT_TRUE(validate_for_cluster(c, WorkersOn::their_hosts).ok()) << decentralized;
    c.workers = 65;
    EXPECT_NE(validate_for_cluster(c, WorkersOn::their_hosts).message().find("takes at most 64"), std::string::npos);
    c.workers = 2;
  }
  c.policy = "async";
  c.worker_weights = "auto";  // each worker process calibrates itself (DevicesCli trains with it)
  EXPECT_TRUE(validate_for_cluster(c, WorkersOn::their_hosts).ok());
}

// Issue 20: a coordinator's host need not have the workers' GPU; a worker
// checks its device where it runs.
TEST(ClusterProcesses, TheDeviceIsCheckedWhereTheWorkersRun) {
  JobConfig c;
  c.device = "cuda";
  EXPECT_TRUE(validate_for_cluster(c, WorkersOn::their_hosts).ok());
  c.device = "tpu";
  EXPECT_EQ(validate_for_cluster(c, WorkersOn::their_hosts).code(), StatusCode::invalid_argument);  // not a device
  c.device = "cuda:64";
  EXPECT_EQ(validate_for_cluster(c, WorkersOn::this_host).code(), StatusCode::invalid_argument)
      << "64 GPUs on this machine?";
}

}  // namespace
}  // namespace asgd
