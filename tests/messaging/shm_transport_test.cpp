// Shared memory between processes on one host (make_shm_transport): large
// parts go through slots and arrive whole, a peer that refuses gets
// everything on the wire, held slots make parts fall back to the wire, a
// forged descriptor is dropped, and a sender killed while writing a slot
// delivers nothing of that message while its peer goes on serving.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>
#include <optional>
#include <string>
#include <vector>

#include "messaging/shm_ring.hpp"
#include "messaging/shm_slots.hpp"
#include "messaging/transport.hpp"
#include "messaging/shm_helpers.hpp"
#include "messaging/transport_helpers.hpp"

namespace asgd::messaging {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

using namespace asgd::messaging::testing;

// `n` bytes that differ from place to place, starting from `seed`.
Part big(std::size_t n, unsigned seed) {
  std::vector<std::byte> b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>((i * 131 + seed) & 0xFF);
  return Part::take(std::move(b));
}

bool same_bytes(const Part& a, const Part& b) {
  return a.bytes.size() == b.bytes.size() && std::memcmp(a.bytes.data(), b.bytes.data(), a.bytes.size()) == 0;
}

// Sends `label` and `payload` from `from` to `to` and returns what `at`
// receives, after checking it arrived whole.
std::optional<Incoming> delivered(Transport& from, const PeerId& to, Transport& at, std::string_view label,
                                  const Part& payload) {
  if (!sent(from, to, {text(label), payload})) return std::nullopt;
  auto in = next(at);
  EXPECT_TRUE(in && in->message.size() == 2 && text_of(in->message[0]) == label &&
              same_bytes(in->message[1], payload))
      << label;
  return in;
}

std::unique_ptr<Transport> shm(SharedMemoryOptions o = {}) { return make_shm_transport(make_zmq_transport(), {}, o); }

// Names this process left in /dev/shm.
std::vector<std::string> names_left_by(pid_t pid) {
  std::vector<std::string> left;
  const std::string prefix = "asgd-" + std::to_string(pid) + "-";
  std::error_code none;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", none))
    if (e.path().filename().string().starts_with(prefix)) left.push_back(e.path().string());
  return left;
}

struct Pair {
  std::unique_ptr<Transport> server, client;
  PeerId to_server, to_client;
  std::string server_endpoint;
};

// A bound server and a connected client that have said hello both ways, so
// each has had the other's offer and answered it.
Pair handshake(SharedMemoryOptions server_options = {}, SharedMemoryOptions client_options = {}) {
  Pair p{shm(server_options), shm(client_options), {}, {}, {}};
  auto bound = p.server->bind("tcp://127.0.0.1:0");
  EXPECT_TRUE(bound.ok()) << bound.status().to_string();
  if (bound.ok()) p.server_endpoint = *bound;
  auto id = p.client->connect(*bound);
  EXPECT_TRUE(id.ok()) << id.status().to_string();
  p.to_server = *id;
  EXPECT_TRUE(sent(*p.client, p.to_server, {text("hello")}));
  auto hello = next(*p.server);
  EXPECT_TRUE(hello && text_of(hello->message[0]) == "hello");
  if (hello) p.to_client = hello->from;
  EXPECT_TRUE(sent(*p.server, p.to_client, {text("hi")}));
  auto hi = next(*p.client);
  EXPECT_TRUE(hi && text_of(hi->message[0]) == "hi");
  // The answers to the offers travel with the next calls: one more each way.
  EXPECT_TRUE(sent(*p.client, p.to_server, {text("ping")}));
  EXPECT_TRUE(next(*p.server));
  EXPECT_TRUE(sent(*p.server, p.to_client, {text("pong")}));
  EXPECT_TRUE(next(*p.client));
  return p;
}

// A client's options with one slot for its peer: a second large part in
// flight finds it held.
SharedMemoryOptions one_slot() {
  SharedMemoryOptions o;
  o.slots_per_peer = 1;
  return o;
}

// A process killed between its offer and the peer's answer leaves its
// offer's slot files behind (nobody else knows their names): the next
// process that makes a shared-memory transport removes those of processes
// that no longer run, and nothing else.
TEST(SharedMemory, SlotFilesOfAProcessThatNoLongerRunsAreRemovedAndOthersStay) {
  const pid_t gone = fork();
  ASSERT_GE(gone, 0);
  if (gone == 0) _exit(0);
  ASSERT_EQ(waitpid(gone, nullptr, 0), gone);
  const std::string stale = "/asgd-" + std::to_string(gone) + "-4242-0";
  const std::string live = "/asgd-" + std::to_string(getpid()) + "-4242-0";
  const std::string other = "/asgd-" + std::to_string(gone) + "-not-ours";
  for (const auto& name : {stale, live, other}) {
    const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    ASSERT_GE(fd, 0) << name << ": " << std::strerror(errno);
    close(fd);
  }
  EXPECT_GE(asgd::messaging::shm_detail::remove_stale_slots(), 1u);
  const auto exists = [](const std::string& name) { return std::filesystem::exists("/dev/shm" + name); };
  EXPECT_FALSE(exists(stale));
  EXPECT_TRUE(exists(live));
  EXPECT_TRUE(exists(other));
  shm_unlink(live.c_str());
  shm_unlink(other.c_str());
  shm_unlink(stale.c_str());
}

TEST(SharedMemory, ALargePartGoesThroughASlotAndArrivesWholeBesideTheSmallOnes) {
  ASGD_REQUIRE_SHARED_MEMORY();
  Pair p = handshake();
  EXPECT_EQ(p.client->stats().shm_peers, 1u);
  EXPECT_EQ(p.server->stats().shm_peers, 1u);
  // Both sides hold the slots open, so their names are gone already.
  EXPECT_TRUE(names_left_by(getpid()).empty());

  const Part payload = big(1 << 20, 7);
  ASSERT_TRUE(sent(*p.client, p.to_server, {text("header"), payload, text("")}));
  auto in = next(*p.server);
  ASSERT_TRUE(in);
  ASSERT_EQ(in->message.size(), 3u);
  EXPECT_EQ(text_of(in->message[0]), "header");
  EXPECT_TRUE(same_bytes(in->message[1], payload));
  EXPECT_TRUE(in->message[1].exclusive);  // the receiver may write it (a reply over a gradient)
  EXPECT_EQ(text_of(in->message[2]), "");
  EXPECT_EQ(p.client->stats().shm_sent, 1u);
  EXPECT_EQ(p.server->stats().shm_received, 1u);

  // And back, from the bound side, with a slot that has to grow.
  ASSERT_TRUE(delivered(*p.server, p.to_client, *p.client, "reply", big(3 << 20, 9)));
  EXPECT_EQ(p.client->stats().shm_received, 1u);
}

// A shard writes its reply over the gradient it received; sending that
// back hands the sender's own slot back instead of copying it into one of
// its own. Here the server's slots cannot grow (max_bytes), so the reply
// could not have gone through them: it went back in the client's.
TEST(SharedMemory, APartWrittenOverInPlaceGoesBackInTheSendersOwnSlotWithoutACopy) {
  ASGD_REQUIRE_SHARED_MEMORY();
  SharedMemoryOptions small;
  small.max_bytes = 4 * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  Pair p = handshake(small, {});
  ASSERT_TRUE(sent(*p.client, p.to_server, {text("push"), big(1 << 20, 4)}));
  auto in = next(*p.server);
  ASSERT_TRUE(in);
  ASSERT_TRUE(in->message[1].exclusive);
  auto* bytes = const_cast<std::byte*>(in->message[1].bytes.data());
  for (std::size_t i = 0; i < in->message[1].bytes.size(); ++i) bytes[i] = ~bytes[i];  // the reply, in place
  const Part expected = Part::copy_of(in->message[1].bytes);
  ASSERT_TRUE(sent(*p.server, p.to_client, {text("reply"), in->message[1]}));
  in.reset();  // the server lets go of its copy of the part: the slot stays the client's
  auto back = next(*p.client);
  ASSERT_TRUE(back);
  EXPECT_TRUE(same_bytes(back->message[1], expected));
  EXPECT_EQ(p.server->stats().shm_fallbacks, 0u);
  EXPECT_EQ(p.server->stats().shm_sent, 1u);
  EXPECT_EQ(p.client->stats().shm_received, 1u);
  // While the client holds the reply its slot is taken; once it lets go,
  // the next push may use it again.
  back.reset();
  for (unsigned k = 0; k < 8; ++k) ASSERT_TRUE(delivered(*p.client, p.to_server, *p.server, "push", big(1 << 20, k)));
  EXPECT_EQ(p.client->stats().shm_fallbacks, 0u);
}

// Once the slots are taken, every message goes through the peer's ring,
// small ones whole and large ones as descriptors; one too large for the
// ring (a large part that found every slot held) goes on the wire, and all
// arrive in the order they were sent.
TEST(SharedMemory, EveryMessageGoesThroughTheRingOrOnTheWireAndArrivesInTheOrderSent) {
  ASGD_REQUIRE_RINGS();
  Pair p = handshake({}, one_slot());
  const TransportStats before = p.client->stats();
  EXPECT_GE(before.ring_sent, 1u);  // the handshake's ping
  const Part large1 = big(256 << 10, 1), large2 = big(256 << 10, 2);
  ASSERT_TRUE(sent(*p.client, p.to_server, {text("a")}));
  ASSERT_TRUE(sent(*p.client, p.to_server, {text("b"), large1}));
  ASSERT_TRUE(sent(*p.client, p.to_server, {text("c")}));
  ASSERT_TRUE(sent(*p.client, p.to_server, {text("d"), large2}));  // the one slot is held by b
  ASSERT_TRUE(sent(*p.client, p.to_server, {text("e")}));
  std::vector<Incoming> got;
  while (got.size() < 5) {
    auto in = next(*p.server);
    ASSERT_TRUE(in) << "after " << got.size() << " messages";
    got.push_back(std::move(*in));
  }
  std::vector<std::string> order;
  for (const Incoming& in : got) order.push_back(text_of(in.message[0]));
  EXPECT_EQ(order, (std::vector<std::string>{"a", "b", "c", "d", "e"}));
  EXPECT_TRUE(same_bytes(got[1].message[1], large1));
  EXPECT_TRUE(same_bytes(got[3].message[1], large2));
  const TransportStats after = p.client->stats();
  EXPECT_EQ(after.ring_sent - before.ring_sent, 4u);  // all but d
  EXPECT_EQ(after.shm_fallbacks - before.shm_fallbacks, 1u);
  EXPECT_EQ(p.server->stats().shm_rejected, 0u);
  EXPECT_FALSE(next(*p.server, kNothingComes));
}

// A receiver asleep in receive() is woken by the sender's doorbell, long
// before its wait is up.
TEST(SharedMemory, AReceiverWaitingIsWokenByTheDoorbell) {
  ASGD_REQUIRE_RINGS();
  Pair p = handshake();
  for (int round = 0; round < 3; ++round) {
    auto waiting = std::async(std::launch::async, [&] {
      const auto start = Clock::now();
      auto in = p.server->receive(std::chrono::milliseconds(kArrives));
      return std::make_pair(in.ok() && *in ? text_of((*in)->message[0]) : std::string(), Clock::now() - start);
    });
    std::this_thread::sleep_for(50ms);  // it sleeps by now
    ASSERT_TRUE(sent(*p.client, p.to_server, {text("ding")}));
    const auto [what, took] = waiting.get();
    EXPECT_EQ(what, "ding");
    EXPECT_LT(took, kArrives / 2);
  }
  EXPECT_GE(p.client->stats().ring_sent, 4u);
}

// A receiver whose rings always hold more (a shard busy with its workers'
// pushes) still reads the wire between them: a message from a peer without
// shared memory comes within a few turns, not after every ring message.
TEST(SharedMemory, AReceiverKeptBusyByItsRingsStillReadsTheWire) {
  ASGD_REQUIRE_RINGS();
  Pair p = handshake();
  SharedMemoryOptions off;
  off.enabled = false;
  auto plain = shm(off);  // a peer on the wire alone
  constexpr int kQueued = 200;
  for (int i = 0; i < kQueued; ++i) ASSERT_TRUE(p.client->send_now(p.to_server, {text(std::to_string(i))}));
  auto at = plain->connect(p.server_endpoint);
  ASSERT_TRUE(at.ok()) << at.status().to_string();
  ASSERT_TRUE(sent(*plain, *at, {text("wire")}));
  std::this_thread::sleep_for(200ms);  // on the server's socket by now
  int before_wire = -1;
  for (int k = 0; k <= kQueued && before_wire < 0; ++k) {
    auto in = next(*p.server);
    ASSERT_TRUE(in) << "after " << k << " messages";
    if (text_of(in->message[0]) == "wire") before_wire = k;
  }
  EXPECT_GE(before_wire, 0);
  EXPECT_LE(before_wire, 20) << "the wire waited behind the rings";
}

// send_now() writes the ring from any thread while the owning thread
// waits in receive(); what it cannot send whole through shared memory (a
// large part with every slot held) it leaves alone; to a peer that refused
// shared memory it sends on the wire.
TEST(SharedMemory, SendNowGoesThroughTheRingFromAnotherThreadAndLeavesWhatNeedsTheWire) {
  ASGD_REQUIRE_RINGS();
  Pair p = handshake({}, one_slot());
  std::thread other([&] {
    for (int i = 0; i < 100; ++i) EXPECT_TRUE(p.client->send_now(p.to_server, {text(std::to_string(i))}));
  });
  for (int k = 0; k < 5; ++k) (void)p.client->receive(10ms);  // the owner waits meanwhile
  other.join();
  for (int i = 0; i < 100; ++i) {
    auto in = next(*p.server);
    ASSERT_TRUE(in);
    EXPECT_EQ(text_of(in->message[0]), std::to_string(i));
  }
  auto held = delivered(*p.client, p.to_server, *p.server, "push", big(256 << 10, 1));  // holds the one slot
  ASSERT_TRUE(held);
  EXPECT_FALSE(p.client->send_now(p.to_server, {text("push"), big(256 << 10, 2)}));
  EXPECT_FALSE(next(*p.server, kNothingComes));

  SharedMemoryOptions off;
  off.enabled = false;
  Pair q = handshake(off, {});
  EXPECT_TRUE(q.client->send_now(q.to_server, {text("x")}));
  auto in = next(*q.server);
  ASSERT_TRUE(in);
  EXPECT_EQ(text_of(in->message[0]), "x");
  EXPECT_EQ(q.client->stats().ring_sent, 0u);
}

TEST(SharedMemory, WithEverySlotHeldAPartGoesOnTheWireAndASlotLetGoIsUsedAgain) {
  ASGD_REQUIRE_SHARED_MEMORY();
  SharedMemoryOptions two;
  two.slots_per_peer = 2;
  Pair p = handshake({}, two);
  std::vector<Incoming> held;
  for (unsigned k = 0; k < 3; ++k) {
    auto in = delivered(*p.client, p.to_server, *p.server, "push", big(256 << 10, k));
    ASSERT_TRUE(in);
    held.push_back(std::move(*in));
  }
  EXPECT_EQ(p.client->stats().shm_sent, 2u);
  EXPECT_EQ(p.client->stats().shm_fallbacks, 1u);
  held.clear();  // the receiver lets go: both slots are free again
  ASSERT_TRUE(delivered(*p.client, p.to_server, *p.server, "push", big(256 << 10, 5)));
  EXPECT_EQ(p.client->stats().shm_sent, 3u);
}

TEST(SharedMemory, APeerThatRefusesGetsEverythingOnTheWireAndNoNameIsLeftBehind) {
  SharedMemoryOptions off;
  off.enabled = false;
  Pair p = handshake(off, {});
  EXPECT_EQ(p.client->stats().shm_peers, 0u);
  ASSERT_TRUE(delivered(*p.client, p.to_server, *p.server, "push", big(1 << 20, 3)));
  EXPECT_EQ(p.client->stats().shm_sent, 0u);
  EXPECT_TRUE(names_left_by(getpid()).empty());
}

// What a forged data descriptor looks like: the control part of a slot
// nobody offered this receiver.
Message forged_descriptor() {
  std::vector<std::byte> head(24), table(24);
  const std::uint32_t magic = shm_detail::kShmMagic, count = 1, slot = 0;
  const std::uint16_t version = shm_detail::kShmVersion, kind = static_cast<std::uint16_t>(shm_detail::Kind::data);
  const std::uint64_t token = 42, length = 1 << 20, generation = 1;
  std::memcpy(head.data(), &magic, 4);
  std::memcpy(head.data() + 4, &version, 2);
  std::memcpy(head.data() + 6, &kind, 2);
  std::memcpy(head.data() + 8, &token, 8);
  std::memcpy(head.data() + 16, &count, 4);
  std::memcpy(table.data(), &slot, 4);
  std::memcpy(table.data() + 8, &length, 8);
  std::memcpy(table.data() + 16, &generation, 8);
  return {Part::take(std::move(head)), Part::take(std::move(table))};
}

TEST(SharedMemory, ADescriptorOfASlotNeverOfferedIsDroppedAndCountedAndTheNextMessageArrives) {
  auto server = shm();
  auto bound = server->bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(bound.ok());
  auto plain = make_zmq_transport();  // speaks the wire only: no offer precedes it
  auto id = plain->connect(*bound);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(sent(*plain, *id, forged_descriptor()));
  ASSERT_TRUE(sent(*plain, *id, {text("after")}));
  auto in = next(*server);
  ASSERT_TRUE(in);
  EXPECT_EQ(text_of(in->message[0]), "after");
  EXPECT_EQ(server->stats().shm_rejected, 1u);
}

// The child: connects to `endpoint`, waits until the server has accepted
// its slots, then sends a large part and is killed (SIGKILL) half way
// through copying it into its slot, before any descriptor leaves.
[[noreturn]] void send_and_die_mid_write(const std::string& endpoint) {
  SharedMemoryOptions o;
  o.mid_write_hook = [] { ::raise(SIGKILL); };
  auto t = shm(o);
  auto id = t->connect(endpoint);
  if (!id.ok() || !t->send(*id, {text("hello")}).ok()) ::_exit(2);
  const auto deadline = Clock::now() + kArrives;
  while (t->stats().shm_peers == 0 && Clock::now() < deadline) (void)t->receive(10ms);
  if (t->stats().shm_peers == 0) ::_exit(3);
  (void)t->send(*id, {text("doomed"), big(4 << 20, 1)});
  ::_exit(4);  // not reached: the hook kills the process
}

// A server bound in this process, and a child process that runs `body`
// with the server's endpoint. Forked before the test makes any thread (no
// transport yet); pid 0 when that failed (and the test with it).
struct ServedChild {
  pid_t pid = 0;
  std::unique_ptr<Transport> server;
  std::string endpoint;
};

ServedChild fork_with_server(void (*body)(const std::string& endpoint)) {
  int fds[2];
  if (::pipe(fds) != 0) {
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
    return {};
  }
  const pid_t child = ::fork();
  if (child < 0) {
    ADD_FAILURE() << "fork: " << std::strerror(errno);
    return {};
  }
  if (child == 0) {
    ::close(fds[1]);
    char buf[256] = {};
    const ssize_t n = ::read(fds[0], buf, sizeof buf - 1);
    if (n <= 0) ::_exit(1);
    body(std::string(buf, static_cast<std::size_t>(n)));
    ::_exit(5);
  }
  ::close(fds[0]);
  ServedChild c{child, shm(), {}};
  auto bound = c.server->bind("tcp://127.0.0.1:0");
  if (bound.ok() && ::write(fds[1], bound->data(), bound->size()) == static_cast<ssize_t>(bound->size()))
    c.endpoint = *bound;
  else
    ADD_FAILURE() << "bind or hand over: " << bound.status().to_string();
  ::close(fds[1]);
  return c;
}

TEST(SharedMemory, ASenderKilledMidWriteDeliversNothingOfThatMessageAndItsPeerServesTheNext) {
  ASGD_REQUIRE_SHARED_MEMORY();
  ServedChild c = fork_with_server(send_and_die_mid_write);
  ASSERT_NE(c.pid, 0);
  Transport& server = *c.server;

  std::vector<std::string> seen;
  int status = 0;
  const auto deadline = Clock::now() + kArrives;
  while (::waitpid(c.pid, &status, WNOHANG) == 0 && Clock::now() < deadline)
    if (auto in = next(server, 10ms)) seen.push_back(text_of(in->message[0]));
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "the child ended otherwise: " << status;
  while (auto in = next(server, kNothingComes)) seen.push_back(text_of(in->message[0]));
  EXPECT_EQ(seen, std::vector<std::string>{"hello"});  // nothing of the message it was writing
  EXPECT_EQ(server.stats().shm_received, 0u);
  EXPECT_EQ(server.stats().shm_rejected, 0u);
  EXPECT_TRUE(names_left_by(c.pid).empty());  // unlinked once accepted: the kill leaves no file

  // The server goes on: another sender's large part arrives, once and whole.
  auto other = shm();
  auto id = other->connect(c.endpoint);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(sent(*other, *id, {text("hello")}));
  ASSERT_TRUE(next(server));
  while (other->stats().shm_peers == 0) {
    ASSERT_TRUE(sent(*other, *id, {text("ping")}));
    ASSERT_TRUE(next(server));
    (void)next(*other, 10ms);
  }
  const Part payload = big(4 << 20, 2);
  ASSERT_TRUE(sent(*other, *id, {text("lives"), payload}));
  auto in = next(server);
  ASSERT_TRUE(in);
  EXPECT_EQ(text_of(in->message[0]), "lives");
  EXPECT_TRUE(same_bytes(in->message[1], payload));
  EXPECT_FALSE(next(server, kNothingComes));
  EXPECT_EQ(server.stats().shm_received, 1u);
}

// The child: connects to `endpoint` and answers the first two messages it
// gets with "ping" (so both sides hear the other's answer to its offer and
// use their rings), then waits to be killed.
[[noreturn]] void ping_until_killed(const std::string& endpoint) {
  auto t = shm();
  auto id = t->connect(endpoint);
  if (!id.ok() || !t->send(*id, {text("hello")}).ok()) ::_exit(2);
  for (int answered = 0; true;) {
    auto in = t->receive(100ms);
    if (in.ok() && *in && answered++ < 2) (void)t->send(*id, {text("ping")});
  }
}

// A process whose peer died keeps writing its ring until it is full; then
// it finds the peer's process gone (its doorbell refuses) and goes to the
// wire, as for any peer that left (here: "not connected"), instead of
// reporting "would block" for good.
TEST(SharedMemory, ARingWhoseReaderDiedGivesWayToTheWire) {
  ASGD_REQUIRE_RINGS();
  ServedChild c = fork_with_server(ping_until_killed);
  ASSERT_NE(c.pid, 0);
  Transport& server = *c.server;
  auto hello = next(server);
  ASSERT_TRUE(hello);
  const PeerId to = hello->from;
  for (const char* say : {"hi", "pong"}) {  // the offers' answers cross with these; pong goes through the ring
    ASSERT_TRUE(sent(server, to, {text(say)}));
    auto ping = next(server);
    ASSERT_TRUE(ping && text_of(ping->message[0]) == "ping");
  }
  ASSERT_GE(server.stats().ring_sent, 1u);
  ::kill(c.pid, SIGKILL);
  ASSERT_EQ(::waitpid(c.pid, nullptr, 0), c.pid);

  int until_full = 0;
  while (until_full < 100000 && *server.send(to, {text("into the ring")})) ++until_full;
  EXPECT_GT(until_full, 100);  // half the ring's 256 KiB
  // On the wire: queued while ZeroMQ has not yet seen the connection end
  // (its I/O thread may not have run since the kill, on a loaded machine),
  // then refused.
  std::optional<Status> answer;
  int queued = 0, would_block = 0;
  const auto deadline = Clock::now() + kArrives;
  while (!answer && Clock::now() < deadline) {
    auto r = server.send(to, {text("on the wire")});
    if (!r.ok()) {
      answer = r.status();
    } else {
      ++(*r ? queued : would_block);
      std::this_thread::sleep_for(20ms);
    }
  }
  ASSERT_TRUE(answer) << "after " << until_full << " messages into the ring, " << queued << " queued on the wire and "
                      << would_block << " \"would block\"; ring_sent " << server.stats().ring_sent << ", fallbacks "
                      << server.stats().shm_fallbacks;
  EXPECT_EQ(answer->code(), StatusCode::not_found) << answer->to_string();  // the peer is not connected
  EXPECT_FALSE(server.send_now(to, {text("not through the ring")}));
}

// The shared memory files mapped into this process (slots and rings, ours
// and our peers'), from /proc/self/maps.
std::size_t mapped_shm_files() {
  std::ifstream maps("/proc/self/maps");
  std::size_t n = 0;
  for (std::string line; std::getline(maps, line);) n += line.find("/dev/shm/asgd-") != std::string::npos;
  return n;
}

// A long-running shard whose workers are restarted: each dead worker's
// slots and ring, those it made and those the shard made for it, are let
// go once its doorbell refuses, and a new peer gets shared memory again.
TEST(SharedMemory, APeerWhoseProcessIsGoneHasTheMemoryBetweenUsLetGoAndTheNextGetsItsOwn) {
  ASGD_REQUIRE_RINGS();
  SharedMemoryOptions every_20ms;
  every_20ms.peer_check_every = 20ms;
  Pair p = handshake(every_20ms);
  ASSERT_TRUE(delivered(*p.client, p.to_server, *p.server, "push", big(256 << 10, 1)));
  ASSERT_TRUE(delivered(*p.server, p.to_client, *p.client, "reply", big(256 << 10, 2)));
  ASSERT_EQ(p.server->stats().shm_peers, 1u);
  const auto receive_for = [&](std::chrono::milliseconds how_long) {
    for (const auto until = Clock::now() + how_long; Clock::now() < until;) (void)p.server->receive(10ms);
  };
  receive_for(200ms);  // ten checks of a live peer
  EXPECT_EQ(p.server->stats().shm_peers_gone, 0u);
  ASSERT_TRUE(delivered(*p.client, p.to_server, *p.server, "push", big(256 << 10, 3)));
  ASSERT_GT(mapped_shm_files(), 0u);

  // Its last words are in its ring when it ends: read before anything goes.
  const auto rings_before = p.client->stats().ring_sent;
  for (const char* say : {"last", "words"}) ASSERT_TRUE(sent(*p.client, p.to_server, {text(say)}));
  EXPECT_EQ(p.client->stats().ring_sent, rings_before + 2);
  p.client.reset();  // its process ends: its doorbell closes
  std::this_thread::sleep_for(100ms);  // five checks due
  for (const char* said : {"last", "words"}) {
    auto in = next(*p.server);
    ASSERT_TRUE(in && text_of(in->message[0]) == said) << said;
  }
  for (const auto until = Clock::now() + kArrives; p.server->stats().shm_peers_gone == 0 && Clock::now() < until;)
    receive_for(20ms);
  EXPECT_EQ(p.server->stats().shm_peers_gone, 1u);
  EXPECT_EQ(p.server->stats().shm_peers, 0u);
  EXPECT_EQ(mapped_shm_files(), 0u) << "the server still maps what it shared with the client";

  auto next_client = shm();
  auto id = next_client->connect(p.server_endpoint);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(sent(*next_client, *id, {text("hello")}));
  auto hello = next(*p.server);
  ASSERT_TRUE(hello);
  ASSERT_TRUE(sent(*p.server, hello->from, {text("hi")}));
  ASSERT_TRUE(next(*next_client));
  ASSERT_TRUE(delivered(*next_client, *id, *p.server, "push", big(256 << 10, 4)));
  EXPECT_EQ(next_client->stats().shm_sent, 1u);
  EXPECT_EQ(p.server->stats().shm_peers, 1u);
}

}  // namespace
}  // namespace asgd::messaging
