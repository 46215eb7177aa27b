#include "messaging/collective_links.hpp"

#include <spdlog/fmt/fmt.h>

#include <cstring>

#include "base/log.hpp"
#include "messaging/zmq_curve.hpp"

namespace asgd::messaging {

using collective_wire::Header;
using collective_wire::Kind;

CollectiveLinks::CollectiveLinks(std::size_t max_values, std::optional<CurveOptions> curve, std::string name)
    : max_values_(max_values), curve_(std::move(curve)), name_(std::move(name)) {}

Status CollectiveLinks::bind(const std::string& where) {
  try {
    pull_.set(zmq::sockopt::linger, 0);
    if (curve_) {  // the gatekeeper before anyone can connect; one connection from each other rank
      set_curve_server(pull_, curve_);
      guard_ = Gatekeeper::start(context_, pull_, name_, curve_, kMaxCollectiveRanks - 1,
                                 sizeof(Header) + max_values_ * sizeof(float));
    }
    pull_.bind(where);
    endpoint_ = pull_.get(zmq::sockopt::last_endpoint);
    if (curve_) endpoint_ = with_server_key(endpoint_, curve_->public_key);
    const std::string wake_at = "inproc://asgd-collective-" + std::to_string(reinterpret_cast<std::uintptr_t>(this));
    wake_rx_.bind(wake_at);
    wake_tx_.connect(wake_at);
  } catch (const zmq::error_t& e) {
    return Status::IOError(fmt::format("the workers' collective cannot listen at {}: {}", where, e.what()));
  }
  return {};
}

Status CollectiveLinks::connect(Rank rank, const std::vector<std::string>& endpoints) {
  const auto ranks = static_cast<Rank>(endpoints.size());
  std::vector<CurveTarget> peers(ranks);
  for (Rank r = 0; r < ranks; ++r) {
    if (r == rank) continue;
    auto p = curve_target(fmt::format("worker {}'s collective at", r), endpoints[r], curve_);
    if (!p) return p.status();
    peers[r] = std::move(*p);
  }
  rank_ = rank;
  n_ = ranks;
  stuck_.assign(ranks, false);
  try {
    for (Rank r = 0; r < n_; ++r) {
      push_.emplace_back(context_, zmq::socket_type::push);
      watches_.emplace_back();
      if (r == rank_) continue;
      // Lingers: a process exiting after its last round still delivers its last chunks (bounded).
      push_.back().set(zmq::sockopt::linger, 2000);
      push_.back().set(zmq::sockopt::sndtimeo, static_cast<int>(kSendWait.count()));
      set_curve_client(push_.back(), peers[r], curve_);
      if (peers[r].key && !peers[r].endpoint.starts_with("inproc:"))  // inproc has no handshake
        watches_.back() = std::make_unique<RefusalWatch>(context_, push_.back(), std::to_string(r));
      push_.back().connect(peers[r].endpoint);
    }
  } catch (const zmq::error_t& e) {
    return Status::IOError(fmt::format("collective rank {}: cannot connect to the others: {}", rank_, e.what()));
  }
  return {};
}

bool CollectiveLinks::send(Rank to, Header h, std::span<const float> values, Owner owner) {
  h.from = static_cast<std::uint16_t>(rank_);
  h.count = values.size();
  auto bytes = std::as_bytes(values);
  if (half_ && h.kind == Kind::chunk && fits_half(values)) {  // else this one as float32 (fits_half)
    h.coding = 1;
    halves_.resize(values.size());
    to_half(values, halves_);
    bytes = std::as_bytes(std::span<const std::uint16_t>(halves_));
    owner = {};
  }
  h.crc = collective_wire::crc32c(bytes);
  try {
    // Only the first part can find the queue full: ZeroMQ counts whole
    // messages against its high-water mark, so the rest of one it took goes too.
    if (!push_[to].send(zmq::buffer(&h, sizeof h), stuck_[to] ? zmq::send_flags::sndmore | zmq::send_flags::dontwait
                                                              : zmq::send_flags::sndmore)) {
      if (!stuck_[to])
        logger().warn("worker {}'s collective: worker {} has taken none of its messages for {} ms (its queue is full): "
                      "this message and the next ones to it are dropped until it takes one again; the step waits "
                      "for it until its timeout names it",
                      rank_, to, kSendWait.count());
      stuck_[to] = true;
      ++unsent_;
      return false;
    }
    if (stuck_[to]) logger().info("worker {}'s collective: worker {} takes its messages again", rank_, to);
    stuck_[to] = false;
    zmq::message_t body = owner ? zmq::message_t(const_cast<std::byte*>(bytes.data()), bytes.size(), release_owner,
                                                 new Owner(std::move(owner)))
                                : zmq::message_t(bytes.data(), bytes.size());
    (void)push_[to].send(body, zmq::send_flags::none);
  } catch (const zmq::error_t& e) {
    logger().warn("collective rank {}: a message to rank {} was not sent: {}", rank_, to, e.what());
    ++unsent_;
    return false;
  }
  return true;
}

void CollectiveLinks::release_owner(void*, void* hint) { delete static_cast<Owner*>(hint); }

bool CollectiveLinks::wait(std::chrono::milliseconds timeout) {
  std::vector<zmq::pollitem_t> items{{static_cast<void*>(pull_), 0, ZMQ_POLLIN, 0},
                                     {static_cast<void*>(wake_rx_), 0, ZMQ_POLLIN, 0}};
  for (auto& w : watches_)
    if (w && w->watching()) items.push_back({nullptr, w->fd(), ZMQ_POLLIN, 0});
  zmq::poll(items.data(), items.size(), timeout);
  if (items.size() > 2) note_refusals();
  if (items[1].revents & ZMQ_POLLIN) {
    zmq::message_t ping;
    while (wake_rx_.recv(ping, zmq::recv_flags::dontwait)) {
    }
  }
  return items[0].revents & ZMQ_POLLIN;
}

void CollectiveLinks::note_refusals() {
  for (Rank r = 0; r < watches_.size(); ++r) {
    if (!watches_[r]) continue;
    const std::optional<int> status = watches_[r]->take();
    if (!status) continue;
    const std::string why = refusal_reason(fmt::format("worker {}'s collective", r), "worker",
                                           fmt::format("worker {}'s --auth-keys folder", r), *status, curve_);
    logger().debug("worker {}'s collective: {}", rank_, why);
    std::lock_guard lock(refused_mu_);
    if (refused_.empty()) refused_ = why;
  }
}

std::string CollectiveLinks::refused() const {
  std::lock_guard lock(refused_mu_);
  return refused_;
}

std::optional<CollectiveLinks::Message> CollectiveLinks::receive() {
  for (;;) {
    held_.clear();
    zmq::message_t part;
    if (!pull_.recv(part, zmq::recv_flags::dontwait)) return std::nullopt;
    held_.push_back(std::move(part));
    while (held_.back().more() && held_.size() < 3) {
      zmq::message_t next;
      (void)pull_.recv(next, zmq::recv_flags::none);
      held_.push_back(std::move(next));
    }
    Header h;
    const bool shaped = held_.size() == 2 && !held_[1].more() && held_[0].size() == sizeof h;
    if (shaped) std::memcpy(&h, held_[0].data(), sizeof h);
    const std::span<const std::byte> body =
        shaped ? std::span<const std::byte>(static_cast<const std::byte*>(held_[1].data()), held_[1].size())
               : std::span<const std::byte>();
    if (!shaped || !collective_wire::well_formed(h, body, n_, rank_, max_values_)) {
      if (rejected_++ == 0) logger().warn("collective rank {}: dropped a malformed message; further ones are counted", rank_);
      continue;
    }
    return Message{h, collective_wire::read_values(h, body, scratch_)};
  }
}

void CollectiveLinks::wake() {
  std::lock_guard lock(wake_mu_);
  try {
    zmq::message_t ping(1);
    (void)wake_tx_.send(ping, zmq::send_flags::dontwait);
  } catch (const zmq::error_t&) {
  }
}

}  // namespace asgd::messaging
