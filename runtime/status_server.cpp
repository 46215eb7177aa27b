#include "runtime/status_server.hpp"

#include "base/log.hpp"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <array>
#include <cctype>
#include <optional>
#include <string_view>
#include <chrono>
#include <thread>

#include "base/json_text.hpp"

namespace asgd {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

constexpr auto kRequestTimeout = std::chrono::seconds(10);
constexpr std::size_t kMaxRequestBytes = 16 * 1024;
// Connections served at once. Past it the server stops accepting, and the
// rest wait in the kernel's queue: a client that opens thousands and sends
// nothing took a descriptor each, until the job could not open its own
// checkpoint files ("Too many open files", the job failed).
constexpr std::size_t kMaxSessions = 32;
// After a failed accept (no descriptors left, say): a pause before the
// next, which was tried at once, for ever, at a whole CPU.
constexpr auto kAcceptRetry = std::chrono::milliseconds(200);

struct Content {
  std::shared_ptr<const LiveStatus> status;
  std::string page;
  bool loopback = true;  ///< bound to a loopback address: only loopback names in Host
};

// A request to a loopback server must name it by a loopback name or
// address: a page from another site that has its name resolve to
// 127.0.0.1 (DNS rebinding) sends its own in Host. No Host (HTTP/1.0) is
// a local client's.
bool host_allowed(const Content& content, std::string_view given) {
  if (!content.loopback || given.empty()) return true;
  std::string host(given.starts_with('[') ? given.substr(0, given.find(']') + 1)  // [::1]:8080
                                          : given.substr(0, given.find(':')));
  for (char& c : host) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));  // names are caseless
  if (host.ends_with('.')) host.pop_back();  // "localhost." is localhost, fully qualified
  if (host == "localhost" || host == "[::1]" || host.ends_with(".localhost")) return true;
  beast::error_code ec;
  const auto ip = asio::ip::make_address(host, ec);
  return !ec && ip.is_loopback();
}

void common_headers(http::response<http::string_body>& res) {
  res.set(http::field::server, "asgd");
  res.set(http::field::cache_control, "no-store");
  res.set("X-Content-Type-Options", "nosniff");
  res.keep_alive(false);
}

http::response<http::string_body> plain_answer(http::status code, unsigned version, const std::string& text) {
  http::response<http::string_body> res{code, version};
  common_headers(res);
  res.set(http::field::content_type, "text/plain; charset=utf-8");
  res.body() = text + "\n";
  res.prepare_payload();
  return res;
}

// What is refused from the header alone: another method (answered before
// its body, which a client sending "Expect: 100-continue" waits to send),
// or a Host this server is not.
std::optional<http::response<http::string_body>> refused(const Content& content,
                                                         const http::request<http::string_body>& req) {
  if (req.method() != http::verb::get && req.method() != http::verb::head) {
    auto res = plain_answer(http::status::method_not_allowed, req.version(), "only GET and HEAD are served");
    res.set(http::field::allow, "GET, HEAD");
    return res;
  }
  const auto given = req[http::field::host];
  const std::string host(given.data(), given.size());
  if (!host_allowed(content, host))
    return plain_answer(http::status::forbidden, req.version(),
                        "Host " + host +
                            " is not this server's: it serves loopback names only (localhost, 127.0.0.1, [::1])");
  return std::nullopt;
}

http::response<http::string_body> respond(const Content& content, const http::request<http::string_body>& req) {
  http::response<http::string_body> res{http::status::ok, req.version()};
  common_headers(res);
  const std::string target(req.target());
  const std::string path = target.substr(0, target.find('?'));
  if (path == "/metrics") {
    res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
    res.body() = to_prometheus(content.status->get());
  } else if (path == "/status") {
    res.set(http::field::content_type, "application/json");
    res.body() = json_text(to_json(content.status->get()));
  } else if (path == "/history") {
    res.set(http::field::content_type, "application/json");
    res.body() = json_text(to_json(content.status->history()));
  } else if (path == "/" || path == "/index.html") {
    res.set(http::field::content_type, "text/html; charset=utf-8");
    res.body() = content.page;
  } else {
    res = plain_answer(http::status::not_found, req.version(),
                       "not found: " + path + " (try /, /status, /history or /metrics)");
  }
  res.prepare_payload();
  if (req.method() == http::verb::head) res.body().clear();
  return res;
}

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<const Content> content, std::shared_ptr<void> slot)
      : stream_(std::move(socket)), content_(std::move(content)), slot_(std::move(slot)) {
    parser_.body_limit(kMaxRequestBytes);
    parser_.header_limit(kMaxRequestBytes);
  }

  void run() {
    stream_.expires_after(kRequestTimeout);
    http::async_read_header(stream_, buffer_, parser_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
      self->on_header(ec);
    });
  }

 private:
  void on_header(beast::error_code ec) {
    if (ec) return on_read(ec);
    if (auto no = refused(*content_, parser_.get())) return answer_unread(std::move(*no));
    if (parser_.is_done()) return on_read(ec);
    http::async_read(stream_, buffer_, parser_, [self = shared_from_this()](beast::error_code e, std::size_t) {
      self->on_read(e);
    });
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::header_limit || ec == http::error::body_limit) {
      // Too large: said, so that a client does not take it for a crash.
      const bool header = ec == http::error::header_limit;
      return answer_unread(plain_answer(
          header ? http::status::request_header_fields_too_large : http::status::payload_too_large, 11,
          std::string(header ? "request headers" : "request body") + " over " +
              std::to_string(kMaxRequestBytes / 1024) + " KiB"));
    }
    if (ec && ec.category() == http::make_error_code(http::error::bad_method).category() &&
        ec != http::error::end_of_stream && ec != http::error::partial_message)
      return answer_unread(plain_answer(http::status::bad_request, 11, "not an HTTP/1.x request: " + ec.message()));
    if (ec) return close();  // timed out, or closed before a whole request: no one to answer
    response_ = respond(*content_, parser_.get());
    stream_.expires_after(kRequestTimeout);
    http::async_write(stream_, response_, [self = shared_from_this()](beast::error_code, std::size_t) { self->close(); });
  }

  // An answer to a request not read whole.
  void answer_unread(http::response<http::string_body> res) {
    response_ = std::move(res);
    stream_.expires_after(kRequestTimeout);
    http::async_write(stream_, response_,
                      [self = shared_from_this()](beast::error_code, std::size_t) { self->drain_and_close(); });
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.close();
  }

  // After answering a request it did not read whole: the rest is read and
  // dropped (up to 1 MiB, a second at most) before closing, since closing
  // with unread bytes resets the connection, and the client may lose the
  // answer.
  void drain_and_close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.expires_after(std::chrono::seconds(1));
    stream_.async_read_some(asio::buffer(scratch_), [self = shared_from_this()](beast::error_code ec, std::size_t n) {
      self->drained_ += n;
      if (ec || self->drained_ > (std::size_t{1} << 20)) {
        self->stream_.close();
        return;
      }
      self->drain_and_close();
    });
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  http::request_parser<http::string_body> parser_;
  http::response<http::string_body> response_;
  std::shared_ptr<const Content> content_;
  std::shared_ptr<void> slot_;  ///< one of kMaxSessions, given back when the session ends
  std::array<char, 4096> scratch_{};
  std::size_t drained_ = 0;
};

// "127.0.0.1:8080", "[::1]:8080".
std::string host_port(const std::string& address, std::uint16_t port) {
  const bool v6 = address.find(':') != std::string::npos;
  return (v6 ? "[" + address + "]" : address) + ":" + std::to_string(port);
}

Status bind_to(tcp::acceptor& acceptor, const std::string& address, std::uint16_t port) {
  const std::string where = host_port(address, port);
  beast::error_code ec;
  const auto ip = asio::ip::make_address(address, ec);
  if (ec) return Status::InvalidArgument("--status-address " + address + ": not an IP address");
  const tcp::endpoint endpoint(ip, port);
  if (acceptor.open(endpoint.protocol(), ec); ec)
    return Status::IOError("status server on " + where + ": " + ec.message());
  acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (acceptor.bind(endpoint, ec); ec)
    return Status::InvalidArgument("--status-port " + std::to_string(port) + ": cannot listen on " + where + ": " +
                                   ec.message());
  if (acceptor.listen(asio::socket_base::max_listen_connections, ec); ec)
    return Status::IOError("status server on " + where + ": " + ec.message());
  return {};
}

}  // namespace

// Every member is touched from the server's one thread only, but for the
// destructor, which stops that thread first.
struct StatusServer::Impl {
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  asio::steady_timer retry{io};
  std::shared_ptr<const Content> content;
  std::thread thread;
  // Sessions open now; whether an accept is pending. Shared with the
  // sessions' slots, which may be destroyed with the io_context, after the
  // acceptor: `stopped` then keeps them from accepting again.
  struct Gate {
    std::size_t open = 0;
    bool accepting = false;
    bool stopped = false;
    bool warned = false;
  };
  std::shared_ptr<Gate> gate = std::make_shared<Gate>();

  void accept() {
    if (gate->stopped || gate->accepting || gate->open >= kMaxSessions) return;
    gate->accepting = true;
    acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
      gate->accepting = false;
      if (ec == asio::error::operation_aborted || gate->stopped) return;
      if (ec) return pause(ec);
      ++gate->open;
      std::shared_ptr<void> slot(nullptr, [this, g = gate](void*) {
        --g->open;
        if (!g->stopped) accept();
      });
      std::make_shared<Session>(std::move(socket), content, std::move(slot))->run();
      accept();
    });
  }

  void pause(beast::error_code ec) {
    if (!gate->warned)
      logger().warn("status server: cannot accept a connection ({}); trying again every {} ms", ec.message(),
                    kAcceptRetry.count());
    gate->warned = true;
    retry.expires_after(kAcceptRetry);
    retry.async_wait([this](beast::error_code e) {
      if (!e) accept();
    });
  }
};

StatusServer::StatusServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

bool StatusServer::is_address(const std::string& address) {
  beast::error_code ec;
  (void)asio::ip::make_address(address, ec);
  return !ec;
}

Status StatusServer::can_listen(const std::string& address, std::uint16_t port) {
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  return bind_to(acceptor, address, port);
}

Result<std::unique_ptr<StatusServer>> StatusServer::start(const std::string& address, std::uint16_t port,
                                                         std::shared_ptr<const LiveStatus> status,
                                                         std::string page_html) {
  auto impl = std::make_unique<Impl>();
  if (Status s = bind_to(impl->acceptor, address, port); !s.ok()) return s;
  beast::error_code ec;
  const bool loopback = asio::ip::make_address(address, ec).is_loopback();
  impl->content = std::make_shared<Content>(Content{std::move(status), std::move(page_html), loopback});
  impl->accept();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->io.run(); });
  std::unique_ptr<StatusServer> server(new StatusServer(std::move(impl)));
  logger().info("status: http://{}/ (also /status and /metrics)", host_port(address, server->port()));
  return server;
}

StatusServer::~StatusServer() {
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->gate->stopped = true;  // the sessions the io_context still holds go with it
}

std::uint16_t StatusServer::port() const {
  beast::error_code ec;
  return impl_->acceptor.local_endpoint(ec).port();
}

}  // namespace asgd
