#pragma once
// Drives a ShardCore message by message, the way the shard actor does, and
// keeps the replies it owes apart from the ones it gave: deterministic, no
// threads, no actor system.

#include <map>
#include <optional>

#include "actors/parameter_shard.hpp"

namespace asgd_test {

struct ShardDriver {
  explicit ShardDriver(asgd::ShardCore c) : core(std::move(c)) {}

  asgd::ShardCore core;
  asgd::ShardCore::Ticket next_ticket = 0;
  std::map<asgd::ShardCore::Ticket, asgd::ShardReply> answered;  // replies given, by ticket

  /// Sends a push; returns its ticket. Its reply, if due now, is in `answered`.
  asgd::ShardCore::Ticket push(asgd::PushRequest r) {
    const auto t = next_ticket++;
    std::vector<asgd::ShardCore::Answer> out;
    core.push(std::move(r), t, {}, out);
    take(out);
    return t;
  }
  asgd::ShardCore::Ticket pull(asgd::PullRequest r) {
    const auto t = next_ticket++;
    std::vector<asgd::ShardCore::Answer> out;
    core.pull(r, t, {}, out);
    take(out);
    return t;
  }
  void leave(asgd::WorkerId w) {
    std::vector<asgd::ShardCore::Answer> out;
    core.leave(w, {}, out);
    take(out);
  }
  bool answered_now(asgd::ShardCore::Ticket t) const { return answered.count(t) > 0; }
  const asgd::ShardReply& reply(asgd::ShardCore::Ticket t) const { return answered.at(t); }

  /// Pushes and expects the reply at once.
  asgd::ShardReply push_now(asgd::PushRequest r) {
    const auto t = push(std::move(r));
    if (!answered_now(t)) throw std::runtime_error("the push's reply was held");
    return answered.at(t);
  }

 private:
  void take(std::vector<asgd::ShardCore::Answer>& out) {
    for (auto& a : out) answered.emplace(a.ticket, std::move(a.reply));
  }
};

}  // namespace asgd_test
