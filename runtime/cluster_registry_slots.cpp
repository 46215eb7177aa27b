// The registry's view of its slots (runtime/cluster_registry_state.hpp):
// what is missing, who is known, and what a shard announces.
#include <spdlog/fmt/fmt.h>

#include "base/log.hpp"
#include "runtime/cluster_registry_state.hpp"
#include "runtime/launcher.hpp"

namespace asgd::cluster_detail {

using messaging::Role;

// A shard on another host than the coordinator that announces a loopback
// address, or any that announces 0.0.0.0 (it listens on every interface):
// processes on other hosts cannot dial it, and would wait out
// --rpc-timeout. (Under a launcher the rank says so itself.)
void warn_if_unreachable(const Registration& reg, std::size_t slot) {
  if (reg.role != Role::shard) return;
  const auto split = split_tcp_endpoint(reg.endpoint);
  if (!split) return;
  const std::string& host = split->first;
  const bool any = host == "0.0.0.0" || host == "*";
  if (!any && !(host.starts_with("127.") && reg.host != host_name())) return;
  logger().warn("shard {} on {} announces {}, which {}: give its --listen the address (or name) of its host",
                slot, reg.host, reg.endpoint,
                any ? "processes on other hosts cannot dial (it listens on every interface but names none)"
                    : "is a loopback address on another host than the coordinator's (" + host_name() +
                          "): processes elsewhere cannot reach it");
}

// "shard 1, worker 0 (rank 3 under a launcher)": the slots nobody took.
std::string missing_slots(const RegistryState& st) {
  std::string out;
  const auto& hosts = st.setup.rank_hosts;
  auto add = [&](const char* role, std::size_t i, std::size_t rank) {
    const std::string on = rank < hosts.size() ? ", on " + hosts[rank] : "";
    out += (out.empty() ? "" : ", ") + fmt::format("{} {} (rank {} under a launcher{})", role, i, rank, on);
  };
  for (std::size_t i = 0; i < st.shards.size(); ++i)
    if (!st.shards[i]) add("shard", i, rank_of_slot(st, Role::shard, i));
  for (std::size_t i = 0; i < st.workers.size(); ++i)
    if (!st.workers[i]) add("worker", i, rank_of_slot(st, Role::worker, i));
  return out;
}

std::size_t rank_of_slot(const RegistryState& st, Role role, std::size_t slot) {
  return 1 + slot + (role == Role::shard ? 0 : st.shards.size());
}

// Whether `peer` is a process this registry took in: a slot's, a
// newcomer's, or a shard's it placed and waits for.
bool known(const RegistryState& st, const PeerId& peer) {
  for (const Slots* group : {&st.shards, &st.workers})
    for (const auto& m : *group)
      if (m && m->peer == peer) return true;
  for (const Newcomer& n : st.newcomers)
    if (n.member.peer == peer) return true;
  return st.unready.contains(peer);
}

}  // namespace asgd::cluster_detail
