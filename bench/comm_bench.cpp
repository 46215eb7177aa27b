// asgd bench comm: push-and-pull round trips of N float parameters between
// this process (a worker) and --shards shard processes (default 2, each
// owning a contiguous slice of the N, as a job's shards do) over tcp
// loopback, through the whole stack (bridge, wire format, ZeroMQ, the shard
// actor and its optimizer); and, in the same run, raw ZeroMQ moving the same
// total bytes between two processes (a DEALER and an echoing ROUTER). Prints
// GB/s for both, their ratio, and small-message latency (one float, one
// shard). Runs alternate (raw, ours, raw, ...) and medians are reported.
// With --auth both run over CurveZMQ (authenticated and encrypted, as
// `--auth-keys` makes a job): the cost of encryption is the difference to
// a run without it.

#include <signal.h>
#include <spawn.h>
#include "base/log.hpp"
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.hpp>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <limits>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "actors/parameter_shard.hpp"
#include "base/process.hpp"
#include "messaging/bridge.hpp"
#include "messaging/curve_auth.hpp"
#include "runtime/job_internal.hpp"
#include "tools/asgd/commands.hpp"

extern char** environ;

namespace asgd::cli {

namespace {

using Clock = std::chrono::steady_clock;
using namespace messaging;

struct CommOptions {
  std::vector<std::string> sizes = {"1M", "4M", "16M"};
  int repeats = 5;            // alternating measurements per size
  int round_trips = 10;       // per measurement (scaled up for small sizes)
  int shards = 2;             // shard processes the parameters are split over
  std::string compress = "none";
  bool json = false;
  bool auth = false;          // CurveZMQ on every connection
  std::uint32_t busy_poll_us = 0;  // ours: bridges and actor threads poll this long before sleeping
  // comm-server only
  std::string mode = "raw";
  std::uint64_t size = 0;
  std::string auth_keys;      // the folder of the bench's keys (with --auth)
  pid_t parent = 0;           // the bench comm that started it: it ends with it
};

// The bench's CURVE options: one keypair, written by run_comm to a scratch
// folder its servers read (as separate processes do with --auth-keys).
std::optional<CurveOptions> bench_curve(const std::string& dir) {
  if (dir.empty()) return std::nullopt;
  auto o = load_auth_keys({dir, "", ""});
  if (!o) {
    print_error("bench: " + o.status().message());
    std::exit(kExitFailure);
  }
  return *o;
}

}  // namespace

Result<std::uint64_t> parse_float_count(const std::string& s) {
  if (s.empty()) return Status::InvalidArgument("empty size");
  std::uint64_t mult = 1;
  std::string digits = s;
  if (s.back() == 'M' || s.back() == 'm') mult = 1u << 20, digits.pop_back();
  else if (s.back() == 'K' || s.back() == 'k') mult = 1u << 10, digits.pop_back();
  std::uint64_t n = 0;
  auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (ec != std::errc() || p != digits.data() + digits.size())
    return Status::InvalidArgument("size '" + s + "': expected a number of floats like 4M, 512K or 1000");
  // A measurement holds several buffers of the size, on each side: 1 GiB
  // each is already more than a parameter server's messages are.
  constexpr std::uint64_t kMostFloats = std::uint64_t{256} << 20;
  if (n == 0) return Status::InvalidArgument("size '" + s + "': at least 1 float");
  if (n > kMostFloats / mult)
    return Status::InvalidArgument("size '" + s + "': at most 256M floats (1 GiB each way)");
  return n * mult;
}

std::string float_count_text(std::uint64_t floats) {
  if (floats % (1u << 20) == 0) return std::to_string(floats >> 20) + "M";
  if (floats % (1u << 10) == 0) return std::to_string(floats >> 10) + "K";
  return std::to_string(floats);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t half = v.size() / 2;
  return v.size() % 2 ? v[half] : (v[half - 1] + v[half]) / 2;
}

namespace {

// Seconds to copy `bytes` once within this process: a round trip through
// shared memory copies at least the push into a slot and the reply out of
// one, so two of these bound it.
double memcpy_once(std::vector<float>& from, std::vector<float>& to, std::size_t bytes, int trips) {
  std::memcpy(to.data(), from.data(), bytes);  // warm up: both buffers resident
  const auto t0 = Clock::now();
  for (int i = 0; i < trips; ++i) {
    std::memcpy(to.data(), from.data(), bytes);
    std::swap(from, to);
  }
  return std::chrono::duration<double>(Clock::now() - t0).count() / trips;
}

// ---------------------------------------------------------------------------
// The server processes.

// SIGTERM may be delivered to any thread (ZeroMQ's too), so a lock-free
// atomic rather than a volatile sig_atomic_t.
std::atomic<bool> g_stop{false};
static_assert(std::atomic<bool>::is_always_lock_free);
extern "C" void on_term(int) { g_stop.store(true, std::memory_order_relaxed); }

int serve_raw(const CommOptions& o) {
  zmq::context_t ctx;
  zmq::socket_t router(ctx, zmq::socket_type::router);
  if (auto curve = bench_curve(o.auth_keys)) {
    // Encrypted; with no ZAP handler libzmq admits any client that knows our key.
    router.set(zmq::sockopt::curve_server, true);
    router.set(zmq::sockopt::curve_secretkey, zmq::buffer(curve->secret_key));
  }
  router.bind("tcp://127.0.0.1:0");
  std::printf("listening on %s\n", router.get(zmq::sockopt::last_endpoint).c_str());
  std::fflush(stdout);
  try {
    while (!g_stop.load(std::memory_order_relaxed)) {
      zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(100));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      zmq::message_t id, payload;
      if (!router.recv(id) || !router.recv(payload)) continue;
      router.send(id, zmq::send_flags::sndmore);
      router.send(payload, zmq::send_flags::none);  // echo the same bytes, no copy
    }
  } catch (const zmq::error_t& e) {
    if (e.num() != EINTR) {  // SIGTERM during poll is how we are told to stop
      print_error(std::string("bench raw server: ") + e.what());
      return kExitFailure;
    }
  }
  return 0;
}

int serve_shard(const CommOptions& o) {
  caf::actor_system_config cfg;
  cfg.add_message_types<caf::id_block::asgd>();
  cfg.set("scheduler.max-threads", std::size_t{1});
  sleep_when_idle(cfg, std::chrono::microseconds(o.busy_poll_us));  // as a job's processes do
  caf::actor_system system{cfg};
  ShardSetup ss;
  ss.range = {0, o.size};
  ss.initial.assign(o.size, 0.5f);
  ss.optimizer = {"sgd", 1e-6f, 0.0f, 0.0f};  // a real update, small enough to stay finite
  ss.workers = 1;
  auto core = ShardCore::make(std::move(ss));
  if (!core) {
    print_error(core.status().to_string());
    return kExitFailure;
  }
  auto shard = system.spawn(parameter_shard, std::make_shared<ShardCore>(std::move(core).value()));
  auto server = std::make_shared<std::unique_ptr<ShardServer>>();  // as a shard process runs its server
  BridgeOptions bo;
  bo.listen = "tcp://127.0.0.1:0";
  bo.name = "bench shard";
  bo.coding = o.compress == "fp16" ? TensorCoding::float16 : TensorCoding::float32;
  bo.curve = bench_curve(o.auth_keys);
  bo.busy_poll = std::chrono::microseconds(o.busy_poll_us);
  auto ready = std::make_shared<std::atomic<bool>>(false);
  auto bridge = Bridge::start(bo, [server, ready](Inbound&& in) {
    if (ready->load()) (*server)->post(std::move(in));
  });
  if (!bridge) {
    print_error(bridge.status().to_string());
    return kExitFailure;
  }
  *server = std::make_unique<ShardServer>(system, *bridge, shard);
  ready->store(true);
  std::printf("listening on %s\n", (*bridge)->endpoint().c_str());
  std::fflush(stdout);
  while (!g_stop.load(std::memory_order_relaxed)) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ready->store(false);
  (*bridge)->stop();
  caf::anon_send_exit((*server)->actor(), caf::exit_reason::user_shutdown);
  server->reset();  // the I/O thread is done with it
  caf::anon_send_exit(shard, caf::exit_reason::user_shutdown);
  return 0;
}

struct Server {
  pid_t pid = -1;
  std::string endpoint;
  ~Server() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      int st = 0;
      waitpid(pid, &st, 0);
    }
  }
};

// Starts `asgd-bench comm-server ...` and reads the endpoint it prints.
Result<std::unique_ptr<Server>> start_server(const std::vector<std::string>& args) {
  int fds[2];
  if (pipe(fds) != 0) return Status::IOError("pipe failed");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  std::vector<std::string> a = {own_program_path(), "comm-server", "--parent", std::to_string(getpid())};
  a.insert(a.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : a) argv.push_back(s.data());
  argv.push_back(nullptr);
  auto srv = std::make_unique<Server>();
  const int rc = posix_spawn(&srv->pid, "/proc/self/exe", &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    srv->pid = -1;
    return Status::IOError("starting a bench server failed");
  }
  std::string line;
  char c;
  while (read(fds[0], &c, 1) == 1 && c != '\n') line += c;
  close(fds[0]);
  const std::string tag = "listening on ";
  if (line.rfind(tag, 0) != 0) return Status::Internal("the bench server said '" + line + "'");
  srv->endpoint = line.substr(tag.size());
  return srv;
}

// ---------------------------------------------------------------------------
// The two measurements.

// Seconds per round trip through raw ZeroMQ: `slices[i]` floats of
// `buffer` each way through dealers[i] (to echo process i), all sent at
// once, as ours pushes to every shard at once.
double raw_round_trip(std::vector<zmq::socket_t>& dealers, std::vector<float>& buffer,
                      const std::vector<std::size_t>& slices, int trips) {
  auto once = [&] {
    std::size_t at = 0;
    for (std::size_t i = 0; i < dealers.size(); ++i) {
      zmq::message_t out(buffer.data() + at, slices[i] * sizeof(float), [](void*, void*) {}, nullptr);  // not copied
      dealers[i].send(out, zmq::send_flags::none);
      at += slices[i];
    }
    for (std::size_t i = 0; i < dealers.size(); ++i) {
      zmq::message_t back;
      (void)dealers[i].recv(back);
      if (back.size() != slices[i] * sizeof(float)) throw std::runtime_error("raw echo returned the wrong size");
    }
  };
  once();  // warm up
  const auto t0 = Clock::now();
  for (int i = 0; i < trips; ++i) once();
  return std::chrono::duration<double>(Clock::now() - t0).count() / trips;
}

// Seconds per push-and-pull round trip through the whole stack: an
// event-based actor pushes its slice of N gradients to each remote shard at
// once and, when every shard has answered with its slice of the
// parameters, starts the next round, `trips` times in a row. `sizes[i]` is
// shard i's slice.
double ours_round_trip(caf::actor_system& system, const std::vector<caf::actor>& shards,
                       const std::vector<std::size_t>& sizes, int trips) {
  auto done = std::make_shared<std::promise<double>>();
  auto fut = done->get_future();
  system.spawn(
      [shards, sizes, trips, done](caf::event_based_actor* self, int) -> caf::behavior {
        struct Loop {
          int left;
          std::size_t waiting = 0;             // replies of this round still to come
          Clock::time_point t0;
          std::vector<std::vector<float>> buffers;  // per shard: (sizes[i],), the push's payload
        };
        auto loop = std::make_shared<Loop>(Loop{trips + 1, 0, {}, {}});
        for (std::size_t size : sizes) loop->buffers.emplace_back(size, 0.001f);
        // The pending replies' handlers hold the step; the step itself
        // holds only a weak reference, so nothing is left holding it (and
        // through it the stand-ins for the shards) once the last reply came.
        auto step = std::make_shared<std::function<void()>>();
        *step = [self, shards, loop, again = std::weak_ptr(step), done, trips] {
          const auto next = again.lock();  // this step, for the handlers below
          if (loop->left == trips) loop->t0 = Clock::now();  // after one warm-up trip
          if (loop->left-- == 0) {
            done->set_value(std::chrono::duration<double>(Clock::now() - loop->t0).count() / trips);
            self->quit();
            return;
          }
          loop->waiting = shards.size();
          for (std::size_t i = 0; i < shards.size(); ++i) {
            PushRequest req{0, 0, 0, 1, true, std::move(loop->buffers[i])};
            self->request(shards[i], caf::infinite, push_atom::value, std::move(req))
                .then(
                    [loop, next, i](ShardReply& r) {
                      loop->buffers[i] = std::move(r.params);  // reused as the next push's payload
                      if (--loop->waiting == 0) (*next)();
                    },
                    [done, self](caf::error&) {
                      done->set_value(-1.0);
                      self->quit();
                    });
          }
        };
        (*step)();
        return {[](int) {}};
      },
      0);
  if (fut.wait_for(std::chrono::minutes(2)) != std::future_status::ready) return -1.0;
  return fut.get();
}

int run_comm(const CommOptions& o) {
  logger().set_level(spdlog::level::warn);
  std::vector<std::uint64_t> sizes;
  for (const auto& s : o.sizes) {
    auto n = parse_float_count(s);
    if (!n) {
      print_error("--sizes: " + n.status().message());
      return kExitUsage;
    }
    sizes.push_back(*n);
  }
  if (o.compress != "none" && o.compress != "fp16") {
    print_error("--compress " + o.compress + ": expected none or fp16");
    return kExitUsage;
  }
  const bool fp16 = o.compress == "fp16";
  // With --auth: one keypair in a scratch folder, for this process and its servers.
  std::string key_dir;
  std::vector<std::string> auth_args;
  struct RemoveDir {
    std::string path;
    ~RemoveDir() {
      std::error_code ec;
      if (!path.empty()) std::filesystem::remove_all(path, ec);
    }
  } remove_keys;
  if (o.auth) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "asgd_bench_keys_XXXXXX").string();
    auto keys = new_curve_keypair();
    if (::mkdtemp(tmpl.data()) == nullptr || !keys || !write_key_files(tmpl, "bench", *keys, false).ok()) {
      print_error("bench comm --auth: could not make a keypair in " + tmpl);
      return kExitFailure;
    }
    key_dir = remove_keys.path = tmpl;
    auth_args = {"--auth-keys", key_dir};
  }
  const std::optional<CurveOptions> curve = bench_curve(key_dir);
  auto with_auth = [&](std::vector<std::string> args) {
    args.insert(args.end(), auth_args.begin(), auth_args.end());
    return args;
  };
  zmq::context_t ctx;

  caf::actor_system_config cfg;
  cfg.add_message_types<caf::id_block::asgd>();
  cfg.set("scheduler.max-threads", std::size_t{1});
  sleep_when_idle(cfg, std::chrono::microseconds(o.busy_poll_us));  // as a job's processes do
  caf::actor_system system{cfg};
  // Ours twice: over tcp (this bridge refuses the servers' offers of shared
  // memory, so both directions stay on the wire) and through shared memory
  // (with --auth there is none: CURVE turns it off).
  BridgeOptions bo;
  bo.name = "bench worker";
  bo.coding = fp16 ? TensorCoding::float16 : TensorCoding::float32;
  bo.curve = curve;
  bo.shared_memory = false;
  bo.busy_poll = std::chrono::microseconds(o.busy_poll_us);
  auto bridge = Bridge::start(bo, nullptr);
  bo.name = "bench worker (shared memory)";
  bo.shared_memory = true;
  auto shm_bridge = Bridge::start(bo, nullptr);
  if (!bridge || !shm_bridge) {
    print_error((!bridge ? bridge.status() : shm_bridge.status()).to_string());
    return kExitFailure;
  }
  const bool with_shm = !curve;

  nlohmann::json results = nlohmann::json::array();
  if (!o.json)
    std::printf("%-6s %10s %10s %10s %7s %10s %11s %7s %12s %10s\n", "floats", "bytes/dir", "raw GB/s", "ours GB/s",
                "ratio", "shm GB/s", "memcpy GB/s", "of it", "wire MB/dir", "update ms");
  // Ours with `shards` shard processes, shard i owning a contiguous slice
  // of the n parameters; raw with as many echo processes, echo i moving
  // that slice (one echo moving all n was slower, and flattered ours).
  struct Seconds {
    double raw, ours, shm, copy;  // per round trip; shm 0 without it
    double update;                // the slowest shard's update of its slice per push (its optimizer_s)
  };
  auto measure_size = [&](std::uint64_t n, int trips, std::size_t shards) -> std::optional<Seconds> {
    std::vector<std::unique_ptr<Server>> servers;
    std::vector<caf::actor> remote, remote_shm;
    std::vector<std::size_t> slices;
    std::vector<zmq::socket_t> dealers;
    for (std::size_t i = 0; i < shards; ++i) {
      const std::size_t slice = n / shards + (i < n % shards ? 1 : 0);
      auto echo = start_server(with_auth({"--mode", "raw"}));
      if (!echo) {
        print_error(echo.status().to_string());
        return std::nullopt;
      }
      zmq::socket_t& dealer = dealers.emplace_back(ctx, zmq::socket_type::dealer);
      if (curve) {
        dealer.set(zmq::sockopt::curve_serverkey, zmq::buffer(curve->public_key));
        dealer.set(zmq::sockopt::curve_publickey, zmq::buffer(curve->public_key));
        dealer.set(zmq::sockopt::curve_secretkey, zmq::buffer(curve->secret_key));
      }
      dealer.connect((*echo)->endpoint);
      servers.push_back(std::move(echo).value());
      auto server =
          start_server(with_auth({"--mode", "shard", "--size", std::to_string(slice), "--compress", o.compress,
                                  "--busy-poll-us", std::to_string(o.busy_poll_us)}));
      if (!server) {
        print_error(server.status().to_string());
        return std::nullopt;
      }
      // The server as shard i, seen through `through`: false when it cannot be reached.
      const auto stand_in = [&](const std::shared_ptr<Bridge>& through, std::vector<caf::actor>& into) {
        auto peer = through->connect((*server)->endpoint);
        if (!peer) print_error(peer.status().to_string());
        else into.push_back(system.spawn(remote_shard, through, *peer, static_cast<std::uint32_t>(i)));
        return peer.ok();
      };
      if (!stand_in(*bridge, remote) || !stand_in(*shm_bridge, remote_shm)) return std::nullopt;
      slices.push_back(slice);
      servers.push_back(std::move(server).value());
    }
    std::vector<float> raw_buffer(n, 0.001f), copy_buffer(n, 0.0f);
    std::vector<double> raw_s, ours_s, shm_s, copy_s;
    for (int r = 0; r < o.repeats; ++r) {
      raw_s.push_back(raw_round_trip(dealers, raw_buffer, slices, trips));
      const double t = ours_round_trip(system, remote, slices, trips);
      const double t_shm = with_shm ? ours_round_trip(system, remote_shm, slices, trips) : 0.0;
      if (t < 0 || t_shm < 0) {
        print_error("no reply from a bench shard");
        return std::nullopt;
      }
      ours_s.push_back(t);
      shm_s.push_back(t_shm);
      copy_s.push_back(2.0 * memcpy_once(raw_buffer, copy_buffer, n * sizeof(float), trips));
    }
    // The work raw's echo does not do: each shard folds a push into its
    // slice and checksums the reply in that pass (its optimizer_s), the
    // shards in parallel, so a round trip waits for the slowest.
    double update = 0.0;
    caf::scoped_actor self{system};
    for (auto& shard : remote)
      self->request(shard, std::chrono::seconds(10), stats_atom::value)
          .receive(
              [&](const ShardStats& st) {
                if (st.updates_applied > 0)
                  update = std::max(update, st.optimizer_s / static_cast<double>(st.updates_applied));
              },
              [&](const caf::error& e) { print_error("bench comm: no stats from a shard: " + to_string(e)); });
    for (auto& shard : remote) caf::anon_send_exit(shard, caf::exit_reason::user_shutdown);
    for (auto& shard : remote_shm) caf::anon_send_exit(shard, caf::exit_reason::user_shutdown);
    return Seconds{median(raw_s), median(ours_s), median(shm_s), median(copy_s), update};
  };
  for (std::uint64_t n : sizes) {
    const std::size_t bytes = n * sizeof(float);
    const int trips = std::max<int>(o.round_trips, static_cast<int>((64u << 20) / bytes));  // at least 64 MiB per measurement
    auto m = measure_size(n, std::min(trips, 1000), std::min<std::size_t>(o.shards, n));
    if (!m) return kExitFailure;
    const auto gbs = [&](double s) { return s > 0 ? 2.0 * static_cast<double>(bytes) / s / 1e9 : 0.0; };
    const double raw_gbs = gbs(m->raw), ours_gbs = gbs(m->ours), shm_gbs = gbs(m->shm), copy_gbs = gbs(m->copy);
    const double wire_mb = static_cast<double>(fp16 ? bytes / 2 : bytes) / 1e6;
    results.push_back({{"floats", n}, {"bytes_per_direction", bytes}, {"raw_gb_per_s", raw_gbs},
                       {"ours_gb_per_s", ours_gbs}, {"ratio", ours_gbs / raw_gbs},
                       {"shm_gb_per_s", with_shm ? nlohmann::json(shm_gbs) : nlohmann::json()},
                       {"memcpy_gb_per_s", copy_gbs},
                       {"shm_to_memcpy", with_shm ? nlohmann::json(shm_gbs / copy_gbs) : nlohmann::json()},
                       {"wire_mb_per_direction", wire_mb}, {"raw_round_trip_s", m->raw},
                       {"ours_round_trip_s", m->ours}, {"shard_update_s", m->update}});
    // Without shared memory (--auth) its columns say "-", as the JSON's null.
    const std::string shm_text = with_shm ? fmt::format("{:10.2f}", shm_gbs) : fmt::format("{:>10}", "-");
    const std::string of_text = with_shm ? fmt::format("{:7.2f}", shm_gbs / copy_gbs) : fmt::format("{:>7}", "-");
    if (!o.json)
      std::printf("%-6s %10zu %10.2f %10.2f %7.2f %s %11.2f %s %12.1f %10.2f\n",
                  float_count_text(n).c_str(), bytes, raw_gbs, ours_gbs,
                  ours_gbs / raw_gbs, shm_text.c_str(), copy_gbs, of_text.c_str(), wire_mb, m->update * 1e3);
  }
  // Small messages: one float each way, many round trips.
  auto small = measure_size(1, 2000, 1);
  if (!small) return kExitFailure;
  const double raw_us = small->raw * 1e6, ours_us = small->ours * 1e6, shm_us = small->shm * 1e6;
  if (o.json) {
    nlohmann::json j = {{"compress", o.compress}, {"auth", o.auth}, {"repeats", o.repeats}, {"shards", o.shards},
                        {"busy_poll_us", o.busy_poll_us},
                        {"sizes", results},
                        {"small_round_trip_us",
                         {{"raw", raw_us}, {"ours", ours_us},
                          {"shm", with_shm ? nlohmann::json(shm_us) : nlohmann::json()}}}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("small-message round trip (1 float): raw %.1f us, ours %.1f us, %.2fx (medians of %d runs of 2000)\n",
                raw_us, ours_us, raw_us > 0 ? ours_us / raw_us : 0.0, o.repeats);
    if (with_shm)
      std::printf("small-message round trip through shared memory (its ring): %.1f us, %.2fx raw's over tcp\n",
                  shm_us, raw_us > 0 ? shm_us / raw_us : 0.0);
    std::printf("ratio = ours/raw throughput in parameter bytes (push + pull); compress %s; ours over %d shard "
                "process(es), each owning a slice of the parameters (fewer for sizes below %d floats, one a "
                "float); raw through as many echo processes, one a slice; %s; ours %s\n",
                o.compress.c_str(), o.shards, o.shards,
                o.auth ? "both authenticated and encrypted (CurveZMQ)" : "both plain tcp (no --auth)",
                o.busy_poll_us ? ("polling " + std::to_string(o.busy_poll_us) + " us before sleeping").c_str()
                               : "sleeping when idle (no --busy-poll-us)");
    std::printf("shm = ours through shared memory (%s); memcpy = copying the bytes once each way in one process, "
                "the least a round trip through shared memory costs; of it = shm/memcpy\n",
                with_shm ? "--shared-memory on" : "none with --auth");
    std::printf("update ms = the slowest shard's time folding one push into its slice, the reply's checksum in "
                "that pass (its optimizer_s per update, tcp and shm runs together): work in ours' round trip that "
                "raw's echo does not do\n");
  }
  (*bridge)->stop();
  (*shm_bridge)->stop();
  return kExitOk;
}

}  // namespace

CommBench add_comm_bench(CLI::App* bench) {
  auto o = std::make_shared<CommOptions>();
  auto* comm = bench->add_subcommand("comm", "push+pull round trips to a shard process vs raw ZeroMQ, over tcp loopback");
  add_list_option(comm, "--sizes", o->sizes, "parameter counts, comma-separated (default 1M,4M,16M)");
  comm->add_option("--repeats", o->repeats, "alternating measurements per size, at least 1 (default 5)")
      ->type_name("N")
      ->check(positive());
  comm->add_option("--compress", o->compress, "none | fp16 (default none)")->type_name("NAME");
  comm->add_option("--shards", o->shards, "shard processes the parameters are split over, 1 to 16 (default 2)")
      ->type_name("N")
      ->check(quietly(CLI::Range(1, 16)));
  comm->add_flag("--json", o->json, "print one JSON object instead of a table");
  comm->add_flag("--auth", o->auth, "both over CurveZMQ, as with --auth-keys (authenticated and encrypted)");
  comm->add_option("--busy-poll-us", o->busy_poll_us,
                   "ours: bridges and actor threads poll N microseconds before sleeping, as asgd cluster "
                   "--busy-poll-us (default 0)")
      ->type_name("N")
      ->check(quietly(CLI::Range(0u, 1'000'000u)));
  auto* server = bench->add_subcommand("comm-server", "")->group("");  // hidden: started by bench comm
  server->add_option("--mode", o->mode)->required();
  server->add_option("--size", o->size);
  server->add_option("--compress", o->compress);
  server->add_option("--auth-keys", o->auth_keys);
  server->add_option("--busy-poll-us", o->busy_poll_us);
  server->add_option("--parent", o->parent);
  return {[comm, server] { return comm->parsed() || server->parsed(); },
          [o, comm]() -> int {
            if (comm->parsed()) return run_comm(*o);
            std::signal(SIGTERM, on_term);
            end_with_parent(o->parent);  // not left serving when bench comm is killed or interrupted
            if (o->mode != "raw" && o->mode != "shard") {
              print_error("bench comm-server --mode " + o->mode + ": raw or shard");
              return kExitUsage;
            }
            return o->mode == "raw" ? serve_raw(*o) : serve_shard(*o);
          }};
}

}  // namespace asgd::cli
