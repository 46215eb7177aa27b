// An HTTP service that embeds the runtime: it trains a model on request,
// reports progress, and classifies images with the latest trained model.
// One thread runs Boost.Asio's event loop and owns all the service's state;
// training runs on the runtime's threads, whose callbacks post back to it.
//
// Usage: example_service PORT [WORK_DIR] [--idle-timeout SECONDS]
//   PORT 0: the system picks one. A connection that sends nothing for
//   SECONDS (default 30), or takes longer than that over one request, is
//   closed: idle and slow clients cannot hold the service's sockets.
//
//   POST /train    {"model": "mlp", "epochs": 1, "data_dir": "...", ...}
//                  starts a job (409 while one runs, 400 for bad settings;
//                  one its data refuses, a batch larger than a worker's
//                  share, is accepted and then fails: see GET /status)
//   GET  /status   {"state": "idle|training|done|failed", "epochs_done": N, ...}
//   POST /predict  {"pixels": [[784 values in 0..1], ...]}
//                  -> {"classes": [...], "model_version": N}
//
// The first line on stdout is "listening on 127.0.0.1:PORT". SIGINT or
// SIGTERM stop the running job and the server; the exit status is then 0.

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unistd.h>
#include <vector>

#include "asgd/asgd.hpp"

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using json = nlohmann::json;
using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

namespace {

constexpr std::size_t kMaxBody = 8u << 20;  // 8 MiB: ~1,000 images as JSON

Response reply(http::status status, const json& body) {
  Response r{status, 11};
  r.set(http::field::content_type, "application/json");
  // Paths and names come from clients: bytes that are not UTF-8 become U+FFFD
  // instead of an exception on the event loop.
  r.body() = body.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  r.prepare_payload();
  return r;
}

Response error(http::status status, const std::string& message) { return reply(status, {{"error", message}}); }

// /train accepts these JobConfig fields; the service owns the others
// (checkpoint_dir, metrics_out), since they name files on its machine.
using Setter = std::function<std::optional<std::string>(asgd::JobConfig&, const json&)>;

Setter text(std::string asgd::JobConfig::*field) {
  return [field](asgd::JobConfig& c, const json& v) -> std::optional<std::string> {
    if (!v.is_string()) return "must be a string";
    c.*field = v.get<std::string>();
    return std::nullopt;
  };
}

// A field's number type: T, or for an optional field (unset: the runtime's
// default) the T inside.
template <class T>
struct NumberOf {
  using type = T;
};
template <class T>
struct NumberOf<std::optional<T>> {
  using type = T;
};

template <class T>
Setter count(T asgd::JobConfig::*field) {
  using N = typename NumberOf<T>::type;
  return [field](asgd::JobConfig& c, const json& v) -> std::optional<std::string> {
    if (!v.is_number_unsigned() || v.get<std::uint64_t>() > std::numeric_limits<N>::max())
      return "must be a non-negative integer";
    c.*field = v.get<N>();
    return std::nullopt;
  };
}

// Works for a plain number field and for one whose unset value means
// "the runtime's default" (std::optional<double>).
template <class T>
Setter real(T asgd::JobConfig::*field) {
  return [field](asgd::JobConfig& c, const json& v) -> std::optional<std::string> {
    if (!v.is_number()) return "must be a number";
    c.*field = v.get<double>();
    return std::nullopt;
  };
}

const std::map<std::string, Setter>& settings() {
  using C = asgd::JobConfig;
  static const std::map<std::string, Setter> table = {
      {"dataset", text(&C::dataset)},   {"data_dir", text(&C::data_dir)},     {"model", text(&C::model)},
      {"policy", text(&C::policy)},     {"optimizer", text(&C::optimizer)},   {"lr_schedule", text(&C::lr_schedule)},
      {"workers", count(&C::workers)},  {"shards", count(&C::shards)},        {"epochs", count(&C::epochs)},
      {"batch", count(&C::batch)},      {"threads", count(&C::threads)},      {"seed", count(&C::seed)},
      {"validation_size", count(&C::validation_size)}, {"lr", real(&C::lr)}, {"momentum", real(&C::momentum)},
      {"weight_decay", real(&C::weight_decay)}};
  return table;
}

class Service {
 public:
  Service(asio::io_context& io, std::filesystem::path work_dir) : io_(io), work_dir_(std::move(work_dir)) {}

  // Called on the event loop's thread only.
  Response handle(const Request& req) {
    const std::string path(req.target().substr(0, req.target().find('?')));
    auto route = [&](http::verb verb, auto handler) -> Response {
      if (req.method() != verb) {
        Response r = error(http::status::method_not_allowed, "use " + std::string(http::to_string(verb)) + " " + path);
        r.set(http::field::allow, http::to_string(verb));
        return r;
      }
      return handler();
    };
    if (path == "/train") return route(http::verb::post, [&] { return train(req.body()); });
    if (path == "/status") return route(http::verb::get, [&] { return status(); });
    if (path == "/predict") return route(http::verb::post, [&] { return predict(req.body()); });
    return error(http::status::not_found, "no such path: " + path + " (try /train, /status, /predict)");
  }

  void stop() {
    runtime_.stop();  // cancels the job and joins its threads
    poll_.cancel();
  }

 private:
  Response train(const std::string& body) {
    if (state_ == "training") return error(http::status::conflict, "a job is already running");
    const json settings_json = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (settings_json.is_discarded()) return error(http::status::bad_request, "the body is not valid JSON");
    if (!settings_json.is_object()) return error(http::status::bad_request, "the body must be a JSON object");
    asgd::JobConfig config;
    for (const auto& [key, value] : settings_json.items()) {
      const auto it = settings().find(key);
      if (it == settings().end()) return error(http::status::bad_request, "unknown setting '" + key + "'");
      if (auto why = it->second(config, value)) return error(http::status::bad_request, key + " " + *why);
    }
    // The one setting a client gets wrong most, checked before the job
    // starts (it would fail a moment later, once accepted).
    if (std::error_code ec; !config.data_dir.empty() && !std::filesystem::is_directory(config.data_dir, ec))
      return error(http::status::bad_request, "data_dir " + config.data_dir + " is not a folder here");
    config.checkpoint_dir = (work_dir_ / ("job-" + std::to_string(job_id_ + 1))).string();

    asgd::JobCallbacks callbacks;
    const std::uint64_t id = job_id_ + 1;
    callbacks.on_epoch = [this, id](const asgd::EpochMetrics& m) {
      asio::post(io_, [this, id, m] {
        if (id == job_id_) last_epoch_ = m;
      });
    };
    auto handle = runtime_.submit(config, std::move(callbacks));
    if (!handle) {
      const auto code = handle.status().code() == asgd::StatusCode::invalid_argument
                            ? http::status::bad_request
                            : http::status::service_unavailable;
      return error(code, handle.status().message());
    }
    job_id_ = id;
    job_.emplace(*handle);
    config_ = config;
    state_ = "training";
    last_epoch_.reset();
    summary_.reset();
    error_.clear();
    watch();
    return reply(http::status::accepted, {{"state", state_}, {"job", job_id_}, {"epochs", config.epochs}});
  }

  // JobHandle has no completion callback: check on it from the event loop.
  void watch() {
    poll_.expires_after(std::chrono::milliseconds(100));
    poll_.async_wait([this](beast::error_code ec) {
      if (ec) return;
      if (!job_->done()) return watch();
      const auto& result = job_->wait();
      if (!result) {
        state_ = "failed";
        error_ = result.status().to_string();
        return;
      }
      summary_ = *result;
      auto predictor = asgd::Predictor::from_checkpoint(config_.checkpoint_dir);
      if (!predictor) {
        state_ = "failed";
        error_ = "cannot load the trained model: " + predictor.status().to_string();
        return;
      }
      predictor_.emplace(std::move(predictor).value());
      ++model_version_;
      state_ = "done";
      // The model served before is replaced: its folder goes (a service
      // that trains job after job kept every one, 2.8 MB each for the mlp).
      // A failed job's folder stays, for whoever looks into why.
      if (!served_dir_.empty() && served_dir_ != config_.checkpoint_dir) {
        std::error_code removed;
        std::filesystem::remove_all(served_dir_, removed);
      }
      served_dir_ = config_.checkpoint_dir;
    });
  }

  Response status() const {
    json s = {{"state", state_}, {"job", job_id_}, {"model_version", model_version_}};
    if (job_id_ > 0) {
      s["epochs"] = config_.epochs;
      s["epochs_done"] = last_epoch_ ? last_epoch_->epoch : 0;
    }
    if (last_epoch_)
      s["last_epoch"] = {{"epoch", last_epoch_->epoch},
                         {"train_loss", last_epoch_->train_loss},
                         {"val_accuracy", last_epoch_->val_accuracy},
                         {"samples_per_s", last_epoch_->samples_per_s},
                         {"wall_s", last_epoch_->wall_s}};
    if (state_ == "done" && summary_) {
      s["final_test_accuracy"] = summary_->final_test_accuracy;
      s["train_s"] = summary_->train_s;
    }
    if (state_ == "failed") s["error"] = error_;
    return reply(http::status::ok, s);
  }

  // Classifies on the event loop's thread, the Predictor's only user.
  Response predict(const std::string& body) {
    if (!predictor_) return error(http::status::service_unavailable, "no trained model yet: POST /train first");
    const json req = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (req.is_discarded()) return error(http::status::bad_request, "the body is not valid JSON");
    if (!req.is_object() || !req.contains("pixels") || !req["pixels"].is_array())
      return error(http::status::bad_request, "expected {\"pixels\": [[...], ...]}");
    const std::size_t per_sample = predictor_->sample_size();
    std::vector<float> samples;
    for (const json& row : req["pixels"]) {
      if (!row.is_array() || row.size() != per_sample)
        return error(http::status::bad_request, "each image must be an array of " + std::to_string(per_sample) +
                                                    " pixel values");
      for (const json& v : row) {
        if (!v.is_number() || v.get<double>() < 0.0 || v.get<double>() > 1.0)
          return error(http::status::bad_request, "pixel values must be numbers in [0, 1]");
        samples.push_back(v.get<float>());
      }
    }
    auto classes = predictor_->predict(samples);
    if (!classes) return error(http::status::bad_request, classes.status().message());
    return reply(http::status::ok, {{"classes", *classes}, {"model_version", model_version_},
                                    {"model", predictor_->model()}});
  }

  asio::io_context& io_;
  std::filesystem::path work_dir_;   // checkpoints: WORK_DIR/job-N/model.ckpt
  std::string served_dir_;           // the checkpoint folder of the model served now
  asio::steady_timer poll_{io_};
  std::string state_ = "idle";       // idle | training | done | failed
  std::uint64_t job_id_ = 0;         // the latest job's; 0 before the first
  std::optional<asgd::JobHandle> job_;
  asgd::JobConfig config_;
  std::optional<asgd::EpochMetrics> last_epoch_;
  std::optional<asgd::JobSummary> summary_;
  std::string error_;
  std::optional<asgd::Predictor> predictor_;
  std::uint64_t model_version_ = 0;  // +1 per trained model loaded
  asgd::Runtime runtime_;            // last: its jobs' callbacks use the members above
};

// One connection: read a request, answer it, repeat while the client keeps
// the connection alive. Each request, and the wait for it, has `idle` to
// arrive; each answer as long to leave.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, Service& service, std::chrono::seconds idle)
      : socket_(std::move(socket)), deadline_(socket_.get_executor()), service_(service), idle_(idle) {}

  void read() {
    parser_.emplace();
    parser_->body_limit(kMaxBody);
    arm();
    http::async_read_header(socket_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec) {
        self->deadline_.cancel();
        return self->on_read(ec);
      }
      self->read_body();
    });
  }

 private:
  // A client that asks before it sends a body (curl does past 1 MiB) is
  // told to go on at once: it waited a second for it before.
  void read_body() {
    auto body = [self = shared_from_this()] {
      http::async_read(self->socket_, self->buffer_, *self->parser_, [self](beast::error_code ec, std::size_t) {
        self->deadline_.cancel();
        self->on_read(ec);
      });
    };
    if (!beast::iequals(parser_->get()[http::field::expect], "100-continue")) return body();
    static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    asio::async_write(socket_, asio::buffer(kContinue), [self = shared_from_this(), body](beast::error_code ec, std::size_t) {
      if (ec) {
        self->deadline_.cancel();
        return self->close();
      }
      body();
    });
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::body_limit) {
      response_ = error(http::status::payload_too_large, "the body is larger than 8 MiB");
      response_.keep_alive(false);
    } else if (ec && ec.category() == http::make_error_code(http::error::bad_target).category() &&
               ec != http::error::end_of_stream && ec != http::error::partial_message) {
      response_ = error(http::status::bad_request, "not an HTTP/1.1 request this service reads: " + ec.message());
      response_.keep_alive(false);
    } else if (ec) {
      return close();  // end of stream, a connection cut mid-request or the idle timeout: nothing to answer
    } else {
      const Request req = parser_->release();
      response_ = service_.handle(req);
      response_.keep_alive(req.keep_alive());
    }
    arm();
    http::async_write(socket_, response_, [self = shared_from_this()](beast::error_code wec, std::size_t) {
      self->deadline_.cancel();
      if (wec || !self->response_.keep_alive()) return self->close();
      self->read();
    });
  }

  // The next read or write has `idle_` to finish; past it the connection is
  // closed, which ends the operation (a timer of our own: Beast's
  // tcp_stream timeouts report through an error category UBSan rejects).
  void arm() {
    deadline_.expires_after(idle_);
    deadline_.async_wait([weak = weak_from_this()](beast::error_code ec) {
      if (ec) return;  // cancelled: the operation finished in time
      if (auto self = weak.lock()) self->close();
    });
  }

  // Closing frees the descriptor now (a client that never reads or closes
  // cannot hold it).
  void close() {
    beast::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    deadline_.cancel();
  }

  tcp::socket socket_;
  asio::steady_timer deadline_;
  Service& service_;
  std::chrono::seconds idle_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Response response_;
};

// Accepts connections until the acceptor is closed. Out of descriptors
// (EMFILE, ENFILE) or memory, it says so once and tries again every 100 ms,
// as sessions time out and give theirs back; other failures of one
// connection (ECONNABORTED) do not stop it either.
struct Acceptor {
  tcp::acceptor& acceptor;
  Service& service;
  std::chrono::seconds idle;
  asio::steady_timer retry{acceptor.get_executor()};
  bool starved = false;

  void accept() {
    acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;  // shutting down
      if (ec == asio::error::no_descriptors || ec == asio::error::no_memory || ec == asio::error::no_buffer_space ||
          ec.value() == ENFILE) {
        if (!starved) std::fprintf(stderr, "example_service: cannot accept (%s); trying again\n", ec.message().c_str());
        starved = true;
        retry.expires_after(std::chrono::milliseconds(100));
        retry.async_wait([this](beast::error_code wec) {
          if (!wec) accept();
        });
        return;
      }
      if (!ec) {
        starved = false;
        std::make_shared<Session>(std::move(socket), service, idle)->read();
      }
      accept();
    });
  }
};

}  // namespace

// The idle timeout's seconds, 1 to 86400 (at most a day: seconds past
// that overflowed the timer's nanoseconds); 0 for anything else.
static long idle_seconds(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const long s = std::strtol(text.c_str(), &end, 10);
  return !text.empty() && *end == '\0' && errno == 0 && s >= 1 && s <= 86400 ? s : 0;
}

struct Arguments {
  unsigned short port = 0;
  std::string work_dir;  // empty: a temporary folder
  long idle_s = 30;
};

// PORT [WORK_DIR] with the flags anywhere, as --idle-timeout S or
// --idle-timeout=S; any other argument that starts with '-' is a mistake
// (a mistyped flag became the work folder), not a path (give ./-name for
// one that starts so). An exit code when there is nothing to serve.
static std::optional<int> parse_arguments(int argc, char** argv, Arguments& out) {
  const auto usage = [&](std::FILE* to) {
    std::fprintf(to, "usage: %s PORT [WORK_DIR] [--idle-timeout SECONDS]   (PORT 0: pick a free one; "
                     "SECONDS 1 to 86400, default 30)\n", argv[0]);
  };
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      usage(stdout);
      return 0;
    }
    if (arg == "--idle-timeout" || arg.starts_with("--idle-timeout=")) {
      const bool joined = arg != "--idle-timeout";
      if (!joined && i + 1 == argc) {
        std::fprintf(stderr, "--idle-timeout needs a value\n");
        usage(stderr);
        return 2;
      }
      const std::string value = joined ? arg.substr(arg.find('=') + 1) : argv[++i];
      if ((out.idle_s = idle_seconds(value)) == 0) {
        std::fprintf(stderr, "--idle-timeout %s: expected whole seconds from 1 to 86400\n", value.c_str());
        return 2;
      }
      continue;
    }
    if (arg.size() > 1 && arg[0] == '-' && !std::isdigit(static_cast<unsigned char>(arg[1]))) {  // (-1: a bad PORT)
      std::fprintf(stderr, "unknown flag %s\n", arg.c_str());
      usage(stderr);
      return 2;
    }
    args.push_back(arg);
  }
  char* end = nullptr;
  const unsigned long port = !args.empty() ? std::strtoul(args[0].c_str(), &end, 10) : 0;
  if (args.empty() || args.size() > 2 || args[0].empty() || *end != '\0' || port > 65535) {
    usage(stderr);
    return 2;
  }
  out.port = static_cast<unsigned short>(port);
  if (args.size() == 2) out.work_dir = args[1];
  return std::nullopt;
}

int main(int argc, char** argv) {
  Arguments a;
  if (auto code = parse_arguments(argc, argv, a)) return *code;
  const unsigned short port = a.port;
  const long idle_s = a.idle_s;
  asio::io_context io;
  tcp::acceptor acceptor(io);
  try {
    acceptor = tcp::acceptor(io, {asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)});
  } catch (const boost::system::system_error& e) {
    std::fprintf(stderr, "cannot listen on 127.0.0.1:%u: %s\n", static_cast<unsigned>(port), e.code().message().c_str());
    return 1;
  }
  // Checkpoints go to WORK_DIR, or to a fresh temporary folder removed at
  // exit (made once the port is ours: a port in use left one behind).
  std::filesystem::path work_dir;
  bool temporary = false;
  if (!a.work_dir.empty()) {
    work_dir = a.work_dir;
  } else {
    std::string pattern = (std::filesystem::temp_directory_path() / "asgd-service-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::perror("cannot create a temporary folder");
      return 1;
    }
    work_dir = pattern;
    temporary = true;
  }

  Service service(io, work_dir);
  std::printf("listening on 127.0.0.1:%u\n", acceptor.local_endpoint().port());
  std::fflush(stdout);

  Acceptor accepting{acceptor, service, std::chrono::seconds(idle_s)};
  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](beast::error_code ec, int) {
    if (ec) return;
    beast::error_code ignored;
    acceptor.close(ignored);
    accepting.retry.cancel();
    service.stop();
    io.stop();  // open connections are dropped, not drained
  });
  accepting.accept();
  io.run();
  // Shutting down: a second Ctrl-C (timeout(1) sends two) must not kill the
  // process half-way through it, as it did once signal_set was gone (it
  // puts the default action back when it lets a signal go).
  beast::error_code unregistered;
  signals.clear(unregistered);
  std::signal(SIGINT, SIG_IGN);
  std::signal(SIGTERM, SIG_IGN);

  if (temporary) {
    std::error_code ignored;
    std::filesystem::remove_all(work_dir, ignored);
  }
  return 0;
}
