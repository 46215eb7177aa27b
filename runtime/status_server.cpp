#include "runtime/status_server.hpp"

#include "base/log.hpp"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <array>
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

struct Content {
  std::shared_ptr<const LiveStatus> status;
  std::string page;
};

http::response<http::string_body> respond(const Content& content, const http::request<http::string_body>& req) {
  http::response<http::string_body> res{http::status::ok, req.version()};
  res.set(http::field::server, "asgd");
  res.set(http::field::cache_control, "no-store");
  res.keep_alive(false);
  const std::string target(req.target());
  const std::string path = target.substr(0, target.find('?'));
  auto plain = [&](http::status code, const std::string& text) {
    res.result(code);
    res.set(http::field::content_type, "text/plain; charset=utf-8");
    res.body() = text + "\n";
  };
  if (req.method() != http::verb::get && req.method() != http::verb::head) {
    plain(http::status::method_not_allowed, "only GET and HEAD are served");
    res.set(http::field::allow, "GET, HEAD");
  } else if (path == "/metrics") {
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
    plain(http::status::not_found, "not found: " + path + " (try /, /status, /history or /metrics)");
  }
  res.prepare_payload();
  if (req.method() == http::verb::head) res.body().clear();
  return res;
}

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<const Content> content)
      : stream_(std::move(socket)), content_(std::move(content)) {
    parser_.body_limit(kMaxRequestBytes);
    parser_.header_limit(kMaxRequestBytes);
  }

  void run() {
    stream_.expires_after(kRequestTimeout);
    http::async_read(stream_, buffer_, parser_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
      self->on_read(ec);
    });
  }

 private:
  void on_read(beast::error_code ec) {
    if (ec == http::error::header_limit || ec == http::error::body_limit) {
      // Too large: said, so that a client does not take it for a crash.
      const bool header = ec == http::error::header_limit;
      response_ = {header ? http::status::request_header_fields_too_large : http::status::payload_too_large, 11};
      response_.set(http::field::server, "asgd");
      response_.set(http::field::content_type, "text/plain; charset=utf-8");
      response_.keep_alive(false);
      response_.body() = std::string(header ? "request headers" : "request body") + " over " +
                         std::to_string(kMaxRequestBytes / 1024) + " KiB\n";
      response_.prepare_payload();
      stream_.expires_after(kRequestTimeout);
      http::async_write(stream_, response_,
                        [self = shared_from_this()](beast::error_code, std::size_t) { self->drain_and_close(); });
      return;
    } else if (ec) {
      close();  // timed out or not HTTP: nothing to answer
      return;
    } else {
      response_ = respond(*content_, parser_.get());
    }
    stream_.expires_after(kRequestTimeout);
    http::async_write(stream_, response_, [self = shared_from_this()](beast::error_code, std::size_t) { self->close(); });
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
  std::array<char, 4096> scratch_{};
  std::size_t drained_ = 0;
};

}  // namespace

struct StatusServer::Impl {
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  std::shared_ptr<const Content> content;
  std::thread thread;

  void accept() {
    acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (!ec) std::make_shared<Session>(std::move(socket), content)->run();
      accept();
    });
  }
};

StatusServer::StatusServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

bool StatusServer::is_address(const std::string& address) {
  beast::error_code ec;
  (void)asio::ip::make_address(address, ec);
  return !ec;
}

Result<std::unique_ptr<StatusServer>> StatusServer::start(const std::string& address, std::uint16_t port,
                                                         std::shared_ptr<const LiveStatus> status,
                                                         std::string page_html) {
  auto impl = std::make_unique<Impl>();
  impl->content = std::make_shared<Content>(Content{std::move(status), std::move(page_html)});
  const std::string where = address + ":" + std::to_string(port);
  beast::error_code ec;
  const auto ip = asio::ip::make_address(address, ec);
  if (ec) return Status::InvalidArgument("--status-address " + address + ": not an IP address");
  const tcp::endpoint endpoint(ip, port);
  if (impl->acceptor.open(endpoint.protocol(), ec); ec)
    return Status::IOError("status server on " + where + ": " + ec.message());
  impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (impl->acceptor.bind(endpoint, ec); ec)
    return Status::InvalidArgument("--status-port " + std::to_string(port) + ": cannot listen on " + where + ": " +
                                   ec.message());
  if (impl->acceptor.listen(asio::socket_base::max_listen_connections, ec); ec)
    return Status::IOError("status server on " + where + ": " + ec.message());
  impl->accept();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->io.run(); });
  std::unique_ptr<StatusServer> server(new StatusServer(std::move(impl)));
  logger().info("status: http://{}:{}/ (also /status and /metrics)", address, server->port());
  return server;
}

StatusServer::~StatusServer() {
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

std::uint16_t StatusServer::port() const {
  beast::error_code ec;
  return impl_->acceptor.local_endpoint(ec).port();
}

}  // namespace asgd
