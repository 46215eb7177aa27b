#pragma once
// A shard actor served over a bridge, as a shard process serves it: for
// tests that talk to a shard through the messaging layer.

#include <caf/all.hpp>

#include <atomic>
#include <memory>

#include "actors/parameter_shard.hpp"
#include "messaging/bridge.hpp"

namespace asgd_test {

struct ServedShard {
  caf::actor shard;
  caf::actor server;  ///< the shard_server in front of it
  std::shared_ptr<asgd::messaging::Bridge> bridge;

  /// `size` parameters, all 100, sgd at lr 1 with no momentum, `workers`
  /// workers under `policy`; the bridge binds `options.listen` (a free
  /// local tcp port when empty). The server and the shard run on the
  /// bridge's I/O thread, as in a shard process, unless `on_caf_threads`.
  /// Errors as ShardCore::make, Bridge::start.
  static asgd::Result<ServedShard> start(caf::actor_system& sys, std::size_t size,
                                         asgd::messaging::BridgeOptions options, asgd::PolicyConfig policy = {},
                                         std::uint32_t workers = 1, bool on_caf_threads = false) {
    using namespace asgd;
    ShardSetup ss;
    ss.range = {0, size};
    ss.initial.assign(size, 100.0f);
    ss.optimizer = {"sgd", 1.0f, 0.0f, 0.0f};
    ss.policy = std::move(policy);
    ss.workers = workers;
    auto core = ShardCore::make(std::move(ss));
    if (!core) return core.status();
    ServedShard s;
    s.shard = sys.spawn(parameter_shard, std::make_shared<ShardCore>(std::move(core).value()));
    if (options.listen.empty()) options.listen = "tcp://127.0.0.1:0";
    // The server needs the bridge, so the handler learns of it only after
    // start(): through an atomic, as the I/O thread reads it (a request
    // before that is dropped; nobody knows the endpoint yet).
    auto serving = std::make_shared<std::unique_ptr<messaging::ShardServer>>();
    auto published = std::make_shared<std::atomic<messaging::ShardServer*>>(nullptr);
    auto bridge = messaging::Bridge::start(std::move(options), [serving, published](messaging::Inbound&& in) {
      if (messaging::ShardServer* on = published->load()) on->post(std::move(in));
    });
    if (!bridge) {
      caf::anon_send_exit(s.shard, caf::exit_reason::user_shutdown);
      return bridge.status();
    }
    s.bridge = *bridge;
    *serving = std::make_unique<messaging::ShardServer>(sys, s.bridge, s.shard, on_caf_threads);
    s.server = (*serving)->actor();
    published->store(serving->get());
    s.serving_ = serving;
    return s;
  }

  /// Stops the bridge, then the actors.
  void stop() {
    if (bridge) bridge->stop();
    if (serving_) serving_->reset();  // the I/O thread, its one user, has stopped
    for (auto& a : {server, shard})
      if (a) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }

 private:
  std::shared_ptr<std::unique_ptr<asgd::messaging::ShardServer>> serving_;
};

}  // namespace asgd_test
