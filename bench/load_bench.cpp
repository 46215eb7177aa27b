// asgd bench load: --workers simulated workers push gradients to --shards
// real shard processes (`asgd shard`, started here, with this process as
// their coordinator) as fast as the shards take them, for --seconds. Each
// worker is a thread with a ZeroMQ DEALER per shard and keeps up to
// --window pushes in flight on each (pushes with increasing clocks, each
// answered with the shard's parameters, as a real worker's; under --policy
// async unless told otherwise). At the end each worker leaves, as a real
// one does, so that a bsp or ssp shard releases the reads it holds.
//
// Every second it reads each shard process's resident memory (VmRSS); at
// the end it asks each shard for its statistics over the wire, as the
// coordinator does, and checks that
//   - RSS stayed within --rss-tolerance of its value at --settle seconds
//     (the "within 10% of its value after the first minute"), and
//   - every push was answered, and the pushes the workers saw applied (or
//     aggregated, under bsp) are exactly the shard's own updates_applied
//     (none lost, none twice).
// Exit 0 when both hold, 1 otherwise, naming which.

#include <signal.h>
#include "base/log.hpp"
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/process.hpp"
#include "messaging/bridge.hpp"
#include "runtime/cluster.hpp"
#include "runtime/config_file.hpp"
#include "base/paths.hpp"
#include "tools/asgd/commands.hpp"

namespace asgd::cli {

namespace {

using SteadyClock = std::chrono::steady_clock;
using namespace messaging;
namespace fs = std::filesystem;

struct LoadOptions {
  std::uint32_t workers = 32;
  std::uint32_t shards = 2;
  double seconds = 300.0;
  std::uint64_t keys = 100'000;   // floats in the model, split over the shards
  std::uint32_t window = 16;      // pushes in flight per worker per shard; 0: as many as ZeroMQ takes
  std::string policy = "async";
  std::string optimizer = "sgd";  // the shards' (adam costs them about three times sgd's work a push)
  double rss_tolerance = 10.0;    // percent
  std::optional<double> settle;   // default: 60 s, or a third of --seconds when shorter
  double rss_abort_mib = 4096.0;  // a shard over this ends the run (a shared machine must survive a bad build)
  std::string json;
};

// ---------------------------------------------------------------------------
// This process as the shards' coordinator: it takes their registrations,
// assigns each its key range and echoes their heartbeats.

struct Coordination {
  std::mutex mu;
  std::condition_variable cv;
  std::weak_ptr<Bridge> bridge;                      // weak: the bridge's handler holds this
  std::vector<std::pair<PeerId, Registration>> registered;
  std::set<PeerId> beating;                          // peers that sent a heartbeat

  void operator()(Inbound&& in) {
    std::lock_guard lock(mu);
    if (auto* r = std::get_if<Registration>(&in.body)) {
      registered.emplace_back(in.peer, std::move(*r));
    } else if (auto* h = std::get_if<Heartbeat>(&in.body)) {
      beating.insert(in.peer);
      if (auto b = bridge.lock()) b->send(in.peer, encode(Heartbeat{Role::coordinator, 0, h->sequence}, in.request_id));
    }
    cv.notify_all();
  }
};

struct ShardProcess {
  pid_t pid = -1;
  fs::path log;
  PeerId peer;           // at our bound endpoint
  std::string endpoint;  // where it serves
  std::uint64_t begin = 0, end = 0;

  ~ShardProcess() { stop(std::chrono::seconds(0)); }

  // Waits up to `grace` for it to exit (after a Shutdown), then SIGTERM,
  // then SIGKILL. Its exit status; -1 when it had to be killed.
  int stop(std::chrono::seconds grace) {
    if (pid <= 0) return -1;
    int status = 0;
    auto wait_for = [&](std::chrono::milliseconds d) {
      const auto until = SteadyClock::now() + d;
      do {
        if (waitpid(pid, &status, WNOHANG) == pid) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      } while (SteadyClock::now() < until);
      return false;
    };
    int code = -1;
    if (wait_for(grace)) {
      code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    } else {
      kill(pid, SIGTERM);
      if (!wait_for(std::chrono::seconds(5))) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
      }
    }
    pid = -1;
    return code;
  }
};

Result<pid_t> spawn_shard(const std::string& coordinator, std::uint32_t index, const fs::path& log) {
  auto pid = spawn_logged({sibling_program("asgd"), "shard", "--coordinator", coordinator, "--index",
                           std::to_string(index), "--join-timeout", "30", "--log-level", "info",
                           // The simulated workers are bare ZeroMQ sockets: no offers of shared memory.
                           "--shared-memory", "off"},
                          log);
  if (!pid) return Status::IOError("starting shard process " + std::to_string(index) + " failed: " + pid.status().message());
  return pid;
}

// VmRSS of `pid` in MiB; nullopt when it is gone.
std::optional<double> rss_mib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) != 0) continue;
    std::istringstream fields(line.substr(6));
    double kib = 0;
    fields >> kib;
    return kib / 1024.0;
  }
  return std::nullopt;
}

// User plus system CPU seconds `pid` has used so far; 0 when it is gone.
double cpu_seconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto after_name = stat.rfind(')');  // the name may hold spaces
  if (after_name == std::string::npos) return 0.0;
  std::istringstream fields(stat.substr(after_name + 2));
  std::string field;
  double ticks = 0;
  for (int k = 3; k <= 15 && fields >> field; ++k)
    if (k >= 14) ticks += std::stod(field);  // utime, stime
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

// ---------------------------------------------------------------------------
// The simulated workers.

struct ShardCounters {
  std::atomic<std::uint64_t> sent{0};
  std::atomic<std::uint64_t> replies{0};
  std::atomic<std::uint64_t> applied{0};   // replies with outcome applied or aggregated
  std::atomic<std::uint64_t> other{0};     // replies with any other outcome, or malformed
};

void release_owner(void*, void* hint) { delete static_cast<std::shared_ptr<const void>*>(hint); }

// A ZeroMQ message over `part`'s bytes without copying them: the frame
// shares the part's owner until ZeroMQ has sent it.
zmq::message_t to_zmq(const Part& part) {
  if (!part.owner || part.bytes.size() <= 64) return zmq::message_t(part.bytes.data(), part.bytes.size());
  auto* hint = new std::shared_ptr<const void>(part.owner);
  return zmq::message_t(const_cast<std::byte*>(part.bytes.data()), part.bytes.size(), &release_owner, hint);
}

// False when the socket would block (nothing sent).
bool send_message(zmq::socket_t& s, const Message& m) {
  for (std::size_t i = 0; i < m.size(); ++i) {
    zmq::message_t z = to_zmq(m[i]);
    auto flags = zmq::send_flags::dontwait;
    if (i + 1 < m.size()) flags = flags | zmq::send_flags::sndmore;
    if (!s.send(z, flags)) {
      if (i == 0) return false;
      throw std::runtime_error("ZeroMQ refused a later part of a multipart message");
    }
  }
  return true;
}

// One whole message if there is one.
std::optional<std::vector<zmq::message_t>> receive_message(zmq::socket_t& s) {
  std::vector<zmq::message_t> parts;
  zmq::message_t m;
  if (!s.recv(m, zmq::recv_flags::dontwait)) return std::nullopt;
  bool more = m.more();
  parts.push_back(std::move(m));
  while (more) {
    zmq::message_t next;
    (void)s.recv(next, zmq::recv_flags::none);  // the rest of a multipart message is already here
    more = next.more();
    parts.push_back(std::move(next));
  }
  return parts;
}

Message view_of(const std::vector<zmq::message_t>& parts) {
  Message m;
  for (const auto& z : parts) {
    Part p;
    p.bytes = std::span<const std::byte>(static_cast<const std::byte*>(z.data()), z.size());
    m.push_back(p);
  }
  return m;
}

struct Run {
  const LoadOptions& o;
  zmq::context_t& ctx;
  std::vector<std::unique_ptr<ShardProcess>>& shards;
  std::vector<ShardCounters>& counters;
  std::atomic<bool>& stop;
  std::atomic<bool>& abandon;  // with stop: do not wait for replies (a shard is gone)
  std::atomic<std::uint64_t>& unanswered_at_end;
  // When any worker last had a reply (steady clock, ns): the shards are
  // stuck only when none has, not when this worker's turn is slow to come.
  std::atomic<std::int64_t>& last_reply_ns;
};

// No reply for this long means the shards are stuck.
constexpr auto kStalled = std::chrono::seconds(15);

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now().time_since_epoch()).count();
}

// With --window 0 a worker sends while ZeroMQ takes its pushes: this many
// queued per connection (then the kernel's socket buffers) before it would
// block. Small, so that the end of a run does not wait for a long queue.
constexpr int kWorkerSendQueue = 64;

// One worker: pushes to every shard, keeping up to `window` pushes in flight
// on each, until told to stop; then waits for the replies still due.
void worker_loop(const Run& run, std::uint32_t worker) {
  struct Conn {
    zmq::socket_t socket;
    Part tensor;             // the gradient, shared by every push (only read)
    std::uint32_t crc = 0;
    std::uint64_t next_id = 0;
    Clock clock = 0;         // of the next push
    Clock complete = 0;      // the shard's complete clock in its latest reply
    std::uint64_t in_flight = 0;
    std::size_t expect_bytes = 0;
    bool blocked = false;    // ZeroMQ would not take the last push
  };
  std::vector<Conn> conns;
  for (const auto& s : run.shards) {
    Conn c;
    c.socket = zmq::socket_t(run.ctx, zmq::socket_type::dealer);
    c.socket.set(zmq::sockopt::linger, 0);
    c.socket.set(zmq::sockopt::sndhwm, kWorkerSendQueue);
    c.socket.connect(s->endpoint);
    const std::size_t n = s->end - s->begin;
    std::vector<float> gradient(n, 1e-3f);  // (range size,)
    c.tensor = Part::take(std::move(gradient));
    c.crc = crc32c(c.tensor.bytes);
    c.expect_bytes = n * sizeof(float);
    conns.push_back(std::move(c));
  }
  auto push = [&](Conn& c) {
    PushRequest req;
    req.worker = worker;
    req.clock = c.clock;
    req.base_clock = std::min(c.clock, c.complete);
    req.samples = 64;
    req.want_params = true;
    const auto body = serialize_body([&](cereal::PortableBinaryOutputArchive& ar) { archive_message(ar, req); });
    return build_frame(static_cast<std::uint16_t>(MsgType::push), 0, ++c.next_id, body, c.tensor, c.crc);
  };
  auto read_replies = [&](std::size_t s) {
    Conn& c = conns[s];
    ShardCounters& n = run.counters[s];
    while (auto parts = receive_message(c.socket)) {
      run.last_reply_ns.store(steady_ns(), std::memory_order_relaxed);
      Frame f;
      ShardReply r;
      const Message m = view_of(*parts);
      const bool ok = parse_frame(m, f) == FrameError::none && decode(f, r) == FrameError::none &&
                      f.tensor.size() == c.expect_bytes;
      if (c.in_flight > 0) --c.in_flight;
      n.replies.fetch_add(1, std::memory_order_relaxed);
      if (ok && (r.outcome == static_cast<std::uint8_t>(PushOutcome::applied) ||
                 r.outcome == static_cast<std::uint8_t>(PushOutcome::aggregated))) {
        n.applied.fetch_add(1, std::memory_order_relaxed);
        c.complete = std::max(c.complete, r.clock);
      } else {
        n.other.fetch_add(1, std::memory_order_relaxed);
      }
    }
  };
  std::vector<zmq::pollitem_t> items(conns.size());
  while (!run.stop.load(std::memory_order_relaxed)) {
    for (std::size_t s = 0; s < conns.size(); ++s) {
      Conn& c = conns[s];
      c.blocked = false;
      while (run.o.window == 0 || c.in_flight < run.o.window) {
        if (!send_message(c.socket, push(c))) {
          --c.next_id;  // not sent: the id is still free
          c.blocked = true;
          break;
        }
        ++c.clock;
        ++c.in_flight;
        run.counters[s].sent.fetch_add(1, std::memory_order_relaxed);
      }
    }
    for (std::size_t s = 0; s < conns.size(); ++s) {
      const bool may_send = run.o.window == 0 || conns[s].in_flight < run.o.window;
      items[s] = {conns[s].socket.handle(), 0, static_cast<short>(ZMQ_POLLIN | (may_send ? ZMQ_POLLOUT : 0)), 0};
    }
    zmq::poll(items, std::chrono::milliseconds(50));
    for (std::size_t s = 0; s < conns.size(); ++s)
      if (items[s].revents & ZMQ_POLLIN) read_replies(s);
  }
  // Leave, as a real worker does when it has finished: a shard stops
  // waiting for us (bsp, ssp hold the others' reads until we push or go).
  for (Conn& c : conns) {
    while (!send_message(c.socket, encode(ClockNotice{worker, c.clock, true}, ++c.next_id)) &&
           !run.abandon.load())
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // Every push sent is owed a reply: wait for them (the shards are busy
  // with the other workers' backlog too: a backlog of 64 workers' pushes
  // to an adam shard took a minute to drain), unless no worker has had one
  // for a while. (This worker giving up alone, its socket closed, counted
  // replies still on their way as pushes never answered.)
  const std::int64_t draining_since = steady_ns();
  auto owed = [&] {
    std::uint64_t n = 0;
    for (const Conn& c : conns) n += c.in_flight;
    return n;
  };
  auto stalled = [&] {
    const std::int64_t last = std::max(draining_since, run.last_reply_ns.load(std::memory_order_relaxed));
    return steady_ns() - last >= std::chrono::duration_cast<std::chrono::nanoseconds>(kStalled).count();
  };
  while (owed() > 0 && !run.abandon.load() && !stalled()) {
    for (std::size_t s = 0; s < conns.size(); ++s) items[s] = {conns[s].socket.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(items, std::chrono::milliseconds(100));
    for (std::size_t s = 0; s < conns.size(); ++s)
      if (items[s].revents & ZMQ_POLLIN) read_replies(s);
  }
  run.unanswered_at_end.fetch_add(owed());
}

// A shard's statistics over the wire, as the coordinator asks for them.
Result<ShardStats> ask_stats(zmq::context_t& ctx, const std::string& endpoint) {
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.connect(endpoint);
  if (!send_message(s, encode(StatsRequest{}, 1))) return Status::IOError("could not send a stats request");
  const auto give_up = SteadyClock::now() + std::chrono::seconds(30);
  while (SteadyClock::now() < give_up) {
    zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(100));
    if (!(item.revents & ZMQ_POLLIN)) continue;
    auto parts = receive_message(s);
    if (!parts) continue;
    Frame f;
    ShardStats st;
    const Message m = view_of(*parts);
    if (parse_frame(m, f) != FrameError::none || decode(f, st) != FrameError::none)
      return Status::Internal("a malformed stats reply");
    return st;
  }
  return Status::Timeout("no stats reply within 30 s");
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct ShardSummary {
  double rss_ref = 0, rss_min = 0, rss_max = 0, deviation_pct = 0;
  std::uint64_t sent = 0, replies = 0, applied = 0, other = 0;
  std::optional<ShardStats> stats;
  bool agree = false;
  double cpu_s = 0;  // the shard process's CPU time when the workers had stopped
};

int run_load(const LoadOptions& o) {
  logger().set_level(spdlog::level::warn);
  if (o.keys < o.shards) {
    print_error("--keys " + std::to_string(o.keys) + ": fewer keys than shards");
    return kExitUsage;
  }
  if (Status s = writable_file(o.json); !s.ok()) {  // before minutes of measuring, not after
    print_error("--json " + o.json + ": " + s.message());
    return kExitUsage;
  }
  const double settle = o.settle ? *o.settle : std::min(60.0, o.seconds / 3.0);
  if (settle < 0 || settle >= o.seconds) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", settle);
    print_error(std::string("--settle ") + text + ": must be below --seconds");
    return kExitUsage;
  }
  std::string tmpl = (fs::temp_directory_path() / "asgd_bench_load_XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) {
    print_error("bench load: could not make a scratch folder in " + fs::temp_directory_path().string());
    return kExitFailure;
  }
  const fs::path scratch = tmpl;
  bool keep_scratch = false;
  struct RemoveDir {
    const fs::path& path;
    const bool& keep;
    ~RemoveDir() {
      std::error_code ec;
      if (!keep) fs::remove_all(path, ec);
    }
  } remove_scratch{scratch, keep_scratch};
  struct Sample {
    double t;
    std::vector<double> rss;
  };
  std::vector<Sample> samples;
  bool json_written = false;
  // A run stopped early (--rss-abort, a stall, a shard gone, Ctrl-C) still
  // leaves its --json: why, and the RSS samples up to then.
  auto fail = [&](const std::string& what) {
    keep_scratch = true;
    print_error("bench load: " + what + " (shard logs in " + scratch.string() + ")");
    if (!o.json.empty() && !json_written) {
      nlohmann::json j = {{"workers", o.workers}, {"shards", o.shards}, {"keys", o.keys}, {"window", o.window},
                          {"ok", false}, {"error", what}, {"rss_samples", nlohmann::json::array()}};
      for (const auto& sm : samples) j["rss_samples"].push_back({{"t", sm.t}, {"rss_mib", sm.rss}});
      std::ofstream(o.json) << j.dump(1) << "\n";
    }
    return kExitFailure;
  };

  // Ctrl-C or SIGTERM: stop early, and still stop the shard processes (from
  // the start: one during the start-up ended the bench by the signal, its
  // shard processes left to their heartbeat timeout).
  const Interrupts interrupts;

  // The coordinator's side.
  auto coordination = std::make_shared<Coordination>();
  // Up to 30 s for `ready` (the coordination's lock held), or until Ctrl-C;
  // empty when ready, else why not.
  auto await_ready = [&](std::unique_lock<std::mutex>& lock, const std::function<bool()>& ready,
                         const std::string& late) -> std::string {
    const auto deadline = SteadyClock::now() + std::chrono::seconds(30);
    while (!coordination->cv.wait_for(lock, std::chrono::milliseconds(100), ready)) {
      if (interrupts.token().stop_requested()) return "interrupted while the shard processes started";
      if (SteadyClock::now() >= deadline) return late;
    }
    return {};
  };
  BridgeOptions bo;
  bo.listen = "tcp://127.0.0.1:0";
  bo.name = "load bench";
  auto started = Bridge::start(bo, [coordination](Inbound&& in) { (*coordination)(std::move(in)); });
  if (!started) return fail(started.status().message());
  std::shared_ptr<Bridge> bridge = *started;
  {
    std::lock_guard lock(coordination->mu);
    coordination->bridge = bridge;
  }
  std::vector<std::unique_ptr<ShardProcess>> shards;
  for (std::uint32_t i = 0; i < o.shards; ++i) {
    auto sp = std::make_unique<ShardProcess>();
    sp->log = scratch / ("shard-" + std::to_string(i) + ".log");
    auto pid = spawn_shard(bridge->endpoint(), i, sp->log);
    if (!pid) return fail(pid.status().message());
    sp->pid = *pid;
    sp->begin = o.keys * i / o.shards;
    sp->end = o.keys * (i + 1) / o.shards;
    shards.push_back(std::move(sp));
  }
  {
    std::unique_lock lock(coordination->mu);
    if (const std::string why = await_ready(
            lock, [&] { return coordination->registered.size() >= o.shards; },
            std::to_string(coordination->registered.size()) + " of " + std::to_string(o.shards) +
                " shard processes registered within 30 s");
        !why.empty())
      return fail(why);
    for (const auto& [peer, reg] : coordination->registered) {
      if (reg.role != Role::shard || reg.index >= o.shards) return fail("an unexpected registration");
      shards[reg.index]->peer = peer;
      shards[reg.index]->endpoint = reg.endpoint;
    }
  }
  JobConfig job;
  if (Status s = set_job_field(job, "policy", o.policy); !s.ok()) {
    print_error(s.message());
    return kExitUsage;
  }
  job.workers = o.workers;
  job.shards = o.shards;
  job.optimizer = o.optimizer;
  job.lr = 1e-4;  // with gradients of 1e-3: parameters move 1e-7 a push, and stay finite for the whole run
  job.lr_schedule = "constant";
  if (Status s = validate_for_cluster(job, WorkersOn::this_host); !s.ok()) {
    print_error(s.message());
    return kExitUsage;
  }
  const std::string config = to_toml(job);
  for (std::uint32_t i = 0; i < o.shards; ++i) {
    const ShardProcess& s = *shards[i];
    Assignment a;
    a.role = Role::shard;
    a.index = i;
    a.config = config;
    a.workers = o.workers;
    a.range_begin = s.begin;
    a.range_end = s.end;
    a.schedule_steps = 1;
    bridge->send(s.peer, encode(a, bridge->next_id(), std::vector<float>(s.end - s.begin, 0.5f)));
  }
  {
    // A shard's first heartbeat comes once it serves.
    std::unique_lock lock(coordination->mu);
    if (const std::string why = await_ready(
            lock,
            [&] {
              return std::all_of(shards.begin(), shards.end(),
                                 [&](const auto& s) { return coordination->beating.count(s->peer) > 0; });
            },
            "a shard process did not start serving within 30 s of its assignment");
        !why.empty())
      return fail(why);
  }

  std::printf("bench load: %u workers -> %u shard processes (asgd shard), %llu floats (%llu per shard), %s, %s, "
              "window %u%s per worker per shard, %g s; load average %s\n",
              o.workers, o.shards, static_cast<unsigned long long>(o.keys),
              static_cast<unsigned long long>(o.keys / o.shards), o.policy.c_str(), o.optimizer.c_str(), o.window,
              o.window == 0 ? " (no limit)" : "", o.seconds, load_average().c_str());
  std::fflush(stdout);
  const std::string load_start = load_average();

  zmq::context_t ctx(2);
  std::vector<ShardCounters> counters(o.shards);
  std::atomic<bool> stop{false}, abandon{false};
  std::atomic<std::uint64_t> unanswered{0};
  std::atomic<std::int64_t> last_reply_ns{steady_ns()};
  Run run{o, ctx, shards, counters, stop, abandon, unanswered, last_reply_ns};
  std::vector<std::thread> workers;
  for (std::uint32_t w = 0; w < o.workers; ++w) workers.emplace_back([&run, w] { worker_loop(run, w); });

  const auto t0 = SteadyClock::now();
  std::uint64_t last_sent = 0, last_applied = 0;
  double last_t = 0;
  std::string stopped_early;
  std::uint64_t replies_seen = 0;  // a deadlock shows as no reply at all for a while
  auto replies_changed = SteadyClock::now();
  for (int tick = 1;; ++tick) {
    // (A run of under a second ran a whole one.)
    std::this_thread::sleep_until(std::min(
        t0 + std::chrono::seconds(tick),
        t0 + std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(o.seconds))));
    const double t = std::chrono::duration<double>(SteadyClock::now() - t0).count();
    Sample sm{t, {}};
    for (std::uint32_t i = 0; i < o.shards; ++i) {
      // Reaped first: a process that ended has no VmRSS line (a zombie),
      // and it was left one, its end unsaid.
      int status = 0;
      const bool ended = waitpid(shards[i]->pid, &status, WNOHANG) == shards[i]->pid;
      const auto r = ended ? std::nullopt : rss_mib(shards[i]->pid);
      if (ended || !r) {
        stopped_early = "shard process " + std::to_string(i) + " (pid " + std::to_string(shards[i]->pid) + ") " +
                        (ended ? how_it_ended(status) : "could not be looked at (/proc)") + " during the run";
        if (ended) shards[i]->pid = -1;
        break;
      }
      if (*r > o.rss_abort_mib)
        stopped_early = "shard process " + std::to_string(i) + "'s RSS, " + std::to_string(static_cast<int>(*r)) +
                        " MiB, passed --rss-abort " + std::to_string(static_cast<int>(o.rss_abort_mib)) +
                        " MiB after " + std::to_string(static_cast<int>(t)) + " s";
      sm.rss.push_back(*r);
    }
    if (sm.rss.size() == o.shards) samples.push_back(sm);  // (the one that passed --rss-abort too)
    std::uint64_t replies = 0;
    for (const auto& c : counters) replies += c.replies.load();
    if (replies != replies_seen) {
      replies_seen = replies;
      replies_changed = SteadyClock::now();
    } else if (SteadyClock::now() - replies_changed > kStalled) {
      stopped_early = "no push was answered for 15 s: the shards are stuck (a deadlock?)";
    }
    if (interrupts.token().stop_requested()) stopped_early = "interrupted after " + std::to_string(static_cast<int>(t)) + " s";
    if (!stopped_early.empty()) break;
    if (tick % 10 == 0 || t >= o.seconds) {
      std::uint64_t sent = 0, applied = 0;
      for (const auto& c : counters) {
        sent += c.sent.load();
        applied += c.applied.load();
      }
      std::printf("[%4.0f s] RSS", t);
      for (std::uint32_t i = 0; i < o.shards; ++i) std::printf(" shard %u %.1f MiB%s", i, sm.rss[i], i + 1 < o.shards ? "," : ";");
      std::printf(" %.0f pushes/s, %.0f applied/s, %llu in flight; load average %s\n",
                  static_cast<double>(sent - last_sent) / (t - last_t),
                  static_cast<double>(applied - last_applied) / (t - last_t),
                  static_cast<unsigned long long>(sent - applied), load_average().c_str());
      std::fflush(stdout);
      last_sent = sent;
      last_applied = applied;
      last_t = t;
    }
    if (t >= o.seconds) break;
  }
  const double wall = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  // The rates count pushes answered within the window: those still in
  // flight at its end are answered while the workers stop, after it.
  std::vector<std::uint64_t> answered_in_window, applied_in_window;
  for (const auto& c : counters) {
    answered_in_window.push_back(c.replies.load());
    applied_in_window.push_back(c.applied.load());
  }
  abandon = !stopped_early.empty();
  stop = true;
  for (auto& w : workers) w.join();
  const std::string load_end = load_average();
  if (!stopped_early.empty()) return fail(stopped_early);

  std::vector<ShardSummary> summary(o.shards);
  bool rss_ok = true, counters_ok = unanswered.load() == 0;
  std::vector<std::string> problems;
  for (std::uint32_t i = 0; i < o.shards; ++i) {
    ShardSummary& s = summary[i];
    auto ref = std::find_if(samples.begin(), samples.end(), [&](const Sample& x) { return x.t >= settle; });
    if (ref == samples.end()) return fail("no RSS sample after --settle");
    s.rss_ref = s.rss_min = s.rss_max = ref->rss[i];
    for (auto it = ref; it != samples.end(); ++it) {
      s.rss_min = std::min(s.rss_min, it->rss[i]);
      s.rss_max = std::max(s.rss_max, it->rss[i]);
    }
    s.deviation_pct = 100.0 * std::max(s.rss_max - s.rss_ref, s.rss_ref - s.rss_min) / s.rss_ref;
    if (s.deviation_pct > o.rss_tolerance) {
      rss_ok = false;
      char buf[200];
      std::snprintf(buf, sizeof buf, "shard %u's RSS moved %.1f%% from its %.1f MiB at %.0f s (limit %g%%)", i,
                    s.deviation_pct, s.rss_ref, ref->t, o.rss_tolerance);
      problems.push_back(buf);
    }
    s.sent = counters[i].sent.load();
    s.replies = counters[i].replies.load();
    s.applied = counters[i].applied.load();
    s.other = counters[i].other.load();
    auto st = ask_stats(ctx, shards[i]->endpoint);
    if (!st) return fail("shard " + std::to_string(i) + ": " + st.status().message());
    s.stats = *st;
    s.cpu_s = cpu_seconds(shards[i]->pid);
    s.agree = s.replies == s.sent && s.other == 0 && s.applied == st->updates_applied && st->duplicate_requests == 0;
    if (!s.agree) {
      counters_ok = false;
      problems.push_back("shard " + std::to_string(i) + "'s counters disagree: " + std::to_string(s.sent) +
                         " pushes sent, " + std::to_string(s.replies) + " answered, " + std::to_string(s.applied) +
                         " answered applied, " + std::to_string(s.other) + " answered otherwise; the shard applied " +
                         std::to_string(st->updates_applied));
    }
  }
  if (unanswered.load() > 0) problems.push_back(std::to_string(unanswered.load()) + " pushes were never answered");
  for (const auto& s : shards) bridge->send(s->peer, encode(Shutdown{std::string(messaging::kJobDone)}, bridge->next_id()));
  std::vector<std::string> shard_lines;
  for (std::uint32_t i = 0; i < o.shards; ++i) {
    const int code = shards[i]->stop(std::chrono::seconds(10));
    if (code != 0) problems.push_back("shard process " + std::to_string(i) + " did not exit cleanly");
    std::istringstream log(read_file(shards[i]->log));
    for (std::string line; std::getline(log, line);)
      if (line.find("unanswered") != std::string::npos || line.find(" warn") != std::string::npos ||
          line.find(" error") != std::string::npos)
        shard_lines.push_back(line);
  }
  bridge->stop();

  std::uint64_t answered = 0, applied = 0;  // within the window, over every shard
  for (std::uint32_t i = 0; i < o.shards; ++i) {
    answered += answered_in_window[i];
    applied += applied_in_window[i];
  }
  const double pushes_per_s = static_cast<double>(answered) / wall;
  const double model_updates_per_s = static_cast<double>(applied) / o.shards / wall;  // refused pushes are none
  std::printf("\nshard  RSS@%.0fs   min      max      dev    pushes     answered   applied(workers)  applied(shard)  agree\n",
              settle);
  for (std::uint32_t i = 0; i < o.shards; ++i) {
    const ShardSummary& s = summary[i];
    std::printf("%-5u  %6.1f   %6.1f   %6.1f   %4.1f%%  %-10llu %-10llu %-17llu %-15llu %s\n", i, s.rss_ref,
                s.rss_min, s.rss_max, s.deviation_pct, static_cast<unsigned long long>(s.sent),
                static_cast<unsigned long long>(s.replies), static_cast<unsigned long long>(s.applied),
                static_cast<unsigned long long>(s.stats->updates_applied), s.agree ? "yes" : "NO");
  }
  std::printf("(RSS in MiB over [%.0f s, %.0f s]; dev: the largest distance from RSS@%.0fs)\n", settle, wall, settle);
  std::printf("%.0f pushes answered/s over %.0f s (a push is one shard's slice: %.0f whole-model updates "
              "applied/s); load average %s at the start, %s at the end\n",
              pushes_per_s, wall, model_updates_per_s, load_start.c_str(), load_end.c_str());
  for (std::uint32_t i = 0; i < o.shards; ++i)
    std::printf("shard %u: %.2f s of CPU, %.0f us per update applied (start-up included)\n", i, summary[i].cpu_s,
                1e6 * summary[i].cpu_s / static_cast<double>(std::max<std::uint64_t>(1, summary[i].stats->updates_applied)));
  for (const auto& line : shard_lines) std::printf("  %s\n", line.c_str());
  const bool ok = rss_ok && counters_ok && problems.empty();
  std::printf("%s\n", ok ? "ok: RSS stayed within the tolerance and every applied push was counted once by its shard"
                         : "FAILED");
  std::fflush(stdout);

  if (!o.json.empty()) {
    nlohmann::json j = {{"workers", o.workers}, {"shards", o.shards}, {"keys", o.keys}, {"window", o.window},
                        {"seconds", wall}, {"settle_s", settle}, {"rss_tolerance_pct", o.rss_tolerance},
                        {"load_average_start", load_start}, {"load_average_end", load_end},
                        {"pushes_per_s", pushes_per_s}, {"model_updates_per_s", model_updates_per_s},
                        {"rss_ok", rss_ok},
                        {"counters_agree", counters_ok}, {"ok", ok}, {"problems", problems}};
    for (std::uint32_t i = 0; i < o.shards; ++i) {
      const ShardSummary& s = summary[i];
      j["per_shard"].push_back({{"shard", i}, {"rss_settled_mib", s.rss_ref}, {"rss_min_mib", s.rss_min},
                                {"rss_max_mib", s.rss_max}, {"rss_deviation_pct", s.deviation_pct},
                                {"pushes_sent", s.sent}, {"replies", s.replies},
                                {"replies_in_window", answered_in_window[i]},
                                {"applied_in_window", applied_in_window[i]}, {"applied_replies", s.applied},
                                {"other_replies", s.other}, {"updates_applied", s.stats->updates_applied},
                                {"rejected", s.stats->rejected}, {"duplicate_requests", s.stats->duplicate_requests},
                                {"cpu_s", s.cpu_s}, {"agree", s.agree}});
    }
    j["shard_log"] = shard_lines;
    for (const auto& sm : samples) j["rss_samples"].push_back({{"t", sm.t}, {"rss_mib", sm.rss}});
    std::ofstream out(o.json);
    out << j.dump(1) << "\n";
    if (!out) return fail("could not write " + o.json);
    json_written = true;
  }
  if (!ok) {
    std::string all;
    for (const auto& p : problems) all += (all.empty() ? "" : "; ") + p;
    return fail(all);
  }
  return kExitOk;
}

}  // namespace

LoadBench add_load_bench(CLI::App* bench) {
  auto o = std::make_shared<LoadOptions>();
  auto* load = bench->add_subcommand(
      "load", "simulated workers push to real shard processes as fast as they can: RSS stays flat, counters agree");
  load->add_option("--workers", o->workers, "simulated workers, each a thread with a connection per shard, 1 to 1024 (default 32)")
      ->type_name("N")
      ->check(quietly(CLI::Range(1, 1024)));
  load->add_option("--shards", o->shards, "shard processes, 1 to 16 (default 2)")
      ->type_name("N")
      ->check(quietly(CLI::Range(1, 16)));
  load->add_option("--seconds", o->seconds, "how long the workers push, above 0, at most a week, 604800 (default 300)")
      ->type_name("S")
      ->check(positive(true, 604800));
  load->add_option("--keys", o->keys, "floats in the model, split over the shards, 1 to 67108864 (default 100000)")
      ->type_name("N")
      ->check(quietly(CLI::Range(std::uint64_t{1}, std::uint64_t{64} << 20)));
  load->add_option("--window", o->window,
                   "pushes each worker keeps in flight per shard (default 16); 0: as many as ZeroMQ takes")
      ->type_name("N");
  load->add_option("--optimizer", o->optimizer, "the shards' optimizer (default sgd)")->type_name("NAME");
  load->add_option("--policy", o->policy, "the shards' consistency policy (default async; bsp and ssp:S hold reads)")
      ->type_name("NAME");
  load->add_option("--rss-tolerance", o->rss_tolerance,
                   "percent a shard's RSS may move from its value at --settle, 0 or more (default 10)")
      ->type_name("PCT")
      ->check(positive(false));
  load->add_option("--settle", o->settle, "seconds before the RSS reference is taken (default 60, or a third of "
                                          "--seconds when that is shorter)")
      ->type_name("S")
      ->check(positive(false));
  load->add_option("--rss-abort", o->rss_abort_mib, "end the run when a shard's RSS passes this many MiB, above 0 (default 4096)")
      ->type_name("MIB")
      ->check(positive());
  load->add_option("--json", o->json, "also write the figures and every RSS sample to FILE")->type_name("FILE");
  return {[load] { return load->parsed(); }, [o] { return run_load(*o); }};
}

}  // namespace asgd::cli
