#include "runtime/launcher.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <initializer_list>
#include <optional>

extern char** environ;

namespace asgd {

namespace {

std::optional<std::string> get(const Environment& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

Result<std::uint32_t> number(const Environment& env, const std::string& name) {
  const auto text = get(env, name);
  if (!text) return Status::InvalidArgument(name + " is not set");
  std::uint32_t v = 0;
  const auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), v);
  if (ec != std::errc() || end != text->data() + text->size())
    return Status::InvalidArgument(name + "=" + *text + ": expected a whole number");
  return v;
}

// The first of `names` that is set, as a number; 0 when none is.
Result<std::uint32_t> optional_number(const Environment& env, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (get(env, n)) return number(env, n);
  return 0u;
}

// Fills rank, world size and local rank from the named variables.
Status read_ranks(const Environment& env, Launch& l, const char* rank, const char* size,
                  std::initializer_list<const char*> local) {
  auto r = number(env, rank);
  if (!r) return r.status();
  auto w = number(env, size);
  if (!w) return w.status();
  auto lr = optional_number(env, local);
  if (!lr) return lr.status();
  if (*w == 0 || *r >= *w)
    return Status::InvalidArgument(std::string(rank) + "=" + std::to_string(*r) + " is not below " + size + "=" +
                                   std::to_string(*w));
  l.rank = *r;
  l.world_size = *w;
  l.local_rank = *lr;
  l.from = std::string(rank) + ", " + size;
  return {};
}

std::string tcp(const std::string& host, std::uint32_t port) { return "tcp://" + host + ":" + std::to_string(port); }

Status read_slurm(const Environment& env, Launch& l, std::uint16_t port) {
  // A batch script has SLURM_PROCID=0 too, but no step: it is not one task
  // of several, and would wait for ranks that never come.
  const auto step = get(env, "SLURM_STEP_ID") ? get(env, "SLURM_STEP_ID") : get(env, "SLURM_STEPID");
  if (!step && get(env, "SLURM_PROCID"))
    return Status::InvalidArgument("SLURM_STEP_ID is not set: this is a batch script, not a task of an srun step; run "
                                   "srun asgd cluster ... (a rank per task), or give --launcher local (this "
                                   "node's processes)");
  if (Status s = read_ranks(env, l, "SLURM_PROCID", "SLURM_NTASKS", {"SLURM_LOCALID"}); !s.ok()) return s;
  // The step's nodes, where its tasks are (a step may run on part of the
  // job's allocation).
  const char* list = "SLURM_STEP_NODELIST";
  for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"})
    if (get(env, name)) {
      list = name;
      break;
    }
  const auto nodes = get(env, list);
  if (!nodes) return Status::InvalidArgument("SLURM_JOB_NODELIST is not set");
  auto hosts = expand_hostlist(*nodes);
  if (!hosts) return hosts.status();
  if (hosts->empty()) return Status::InvalidArgument(std::string(list) + "=" + *nodes + " names no host");
  l.hosts = std::move(hosts).value();
  l.job_id = get(env, "SLURM_JOB_ID").value_or("");
  if (port != 0) {
    l.port_from = "given with --port";
  } else {
    if (l.job_id.empty()) return Status::InvalidArgument("SLURM_JOB_ID is not set (or give --port)");
    // Two steps of one job at once each get a port of their own.
    port = port_for_job(l.job_id + "." + step.value_or(""));
    l.port_from = "derived from SLURM_JOB_ID=" + l.job_id + " and SLURM_STEP_ID=" + step.value_or("");
  }
  l.coordinator = tcp(l.hosts.front(), port);
  l.from += ", SLURM_LOCALID, " + std::string(list) + ", SLURM_JOB_ID, SLURM_STEP_ID";
  // Which host each rank is on, for messages about ranks that never came:
  // known for the block distribution only (Slurm's default).
  const auto per_node = get(env, "SLURM_STEP_TASKS_PER_NODE") ? get(env, "SLURM_STEP_TASKS_PER_NODE")
                                                              : get(env, "SLURM_TASKS_PER_NODE");
  const auto distribution = get(env, "SLURM_DISTRIBUTION").value_or("block");
  if (per_node && distribution.rfind("block", 0) == 0) {
    auto counts = parse_tasks_per_node(*per_node);
    if (counts && counts->size() <= l.hosts.size()) {
      for (std::size_t n = 0; n < counts->size(); ++n)
        for (std::uint32_t t = 0; t < (*counts)[n]; ++t) l.rank_hosts.push_back(l.hosts[n]);
      if (l.rank_hosts.size() != l.world_size) l.rank_hosts.clear();
    }
  }
  return {};
}

Status read_mpi(const Environment& env, Launch& l) {
  if (get(env, "OMPI_COMM_WORLD_RANK"))
    return read_ranks(env, l, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", {"OMPI_COMM_WORLD_LOCAL_RANK"});
  if (get(env, "PMIX_RANK")) {
    // PMIx gives the rank; the size comes from Open MPI's variable or PMI's.
    const char* size = get(env, "OMPI_COMM_WORLD_SIZE") ? "OMPI_COMM_WORLD_SIZE" : "PMI_SIZE";
    return read_ranks(env, l, "PMIX_RANK", size, {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"});
  }
  if (!get(env, "PMI_RANK"))
    return Status::InvalidArgument("none of OMPI_COMM_WORLD_RANK, PMIX_RANK and PMI_RANK is set (not under mpirun?)");
  return read_ranks(env, l, "PMI_RANK", "PMI_SIZE", {"MPI_LOCALRANKID", "PMI_LOCAL_RANK"});
}

Status read_torchrun(const Environment& env, Launch& l, std::uint16_t port) {
  if (Status s = read_ranks(env, l, "RANK", "WORLD_SIZE", {"LOCAL_RANK"}); !s.ok()) return s;
  const auto addr = get(env, "MASTER_ADDR");
  if (!addr) return Status::InvalidArgument("MASTER_ADDR is not set");
  auto master_port = number(env, "MASTER_PORT");
  if (!master_port) return master_port.status();
  if (*master_port < 1 || *master_port > 65535)
    return Status::InvalidArgument("MASTER_PORT=" + std::to_string(*master_port) + " is not a port (1 to 65535)");
  l.from += ", LOCAL_RANK, MASTER_ADDR, MASTER_PORT";
  // Under torchrun's static rendezvous (its default with --master-addr and
  // --master-port) its agent holds MASTER_PORT for its own store and tells
  // the workers so: rank 0 could never listen there.
  const std::string agent_store = get(env, "TORCHELASTIC_USE_AGENT_STORE").value_or("");
  std::string agent = agent_store;
  std::transform(agent.begin(), agent.end(), agent.begin(), [](unsigned char c) { return std::tolower(c); });
  if (port != 0) {
    l.port_from = "given with --port";
  } else if (agent == "true" || agent == "1") {
    const std::string master = *addr + ":" + std::to_string(*master_port);
    port = port_for_job("torchrun " + master + " " + get(env, "TORCHELASTIC_RUN_ID").value_or(""));
    l.port_from = "derived from MASTER_ADDR:MASTER_PORT=" + master +
                  " (torchrun's agent holds MASTER_PORT for its store: TORCHELASTIC_USE_AGENT_STORE=" + agent_store +
                  ")";
    l.from += ", TORCHELASTIC_USE_AGENT_STORE";
  } else {
    port = static_cast<std::uint16_t>(*master_port);
    l.port_from = "MASTER_PORT=" + std::to_string(*master_port);
  }
  l.coordinator = tcp(*addr, port);
  return {};
}

std::string run_id(const Environment& env, LauncherKind kind) {
  auto first = [&env](std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (auto v = get(env, n)) return std::string(n) + "=" + *v;
    return std::string();
  };
  switch (kind) {
    case LauncherKind::slurm: {
      const std::string job = first({"SLURM_JOB_ID"}), step = first({"SLURM_STEP_ID", "SLURM_STEPID"});
      return job.empty() || step.empty() ? job : job + " " + step;
    }
    case LauncherKind::mpi: return first({"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"});
    case LauncherKind::torchrun: {
      // "none" is torchrun's default, the same for every run: with it the
      // rank-0 endpoint (where MASTER_ADDR:MASTER_PORT met) tells runs apart.
      const std::string id = first({"TORCHELASTIC_RUN_ID"});
      if (!id.empty() && id != "TORCHELASTIC_RUN_ID=none") return id;
      const auto addr = get(env, "MASTER_ADDR"), port = get(env, "MASTER_PORT");
      return addr && port ? "MASTER_ADDR:MASTER_PORT=" + *addr + ":" + *port : id;
    }
    default: return {};
  }
}

LauncherKind detect_kind(const Environment& env) {
  if (get(env, "ASGD_RANK")) return LauncherKind::env;
  // mpirun inside a Slurm allocation: its ranks inherit SLURM_PROCID (of the
  // batch script, or of the step that started Open MPI's daemons).
  if (get(env, "OMPI_COMM_WORLD_RANK")) return LauncherKind::mpi;
  // MPICH's or Intel MPI's mpiexec inside a Slurm job starts its proxies
  // with srun, one a node, so its ranks inherit that step's SLURM_PROCID
  // (the node's index) and SLURM_NTASKS (the nodes): a PMI_SIZE that is
  // not SLURM_NTASKS is mpiexec's world. (srun --mpi=pmi2 sets PMI_RANK
  // and PMI_SIZE to Slurm's own; --mpi=pmix, PMIX_RANK without a size.)
  if (get(env, "PMI_RANK") && get(env, "PMI_SIZE") && get(env, "PMI_SIZE") != get(env, "SLURM_NTASKS"))
    return LauncherKind::mpi;
  if (get(env, "SLURM_PROCID")) return LauncherKind::slurm;
  if (get(env, "PMIX_RANK") || get(env, "PMI_RANK")) return LauncherKind::mpi;
  if (get(env, "JOB_COMPLETION_INDEX")) return LauncherKind::kubernetes;
  if (get(env, "RANK") && get(env, "WORLD_SIZE")) return LauncherKind::torchrun;
  return LauncherKind::local;
}

// "01-04" or "7" inside brackets, appended to `out` with `prefix`.
Status expand_range(const std::string& list, const std::string& prefix, const std::string& item,
                    std::vector<std::string>& out) {
  const auto dash = item.find('-');
  const std::string lo = item.substr(0, dash), hi = dash == std::string::npos ? lo : item.substr(dash + 1);
  std::uint64_t a = 0, b = 0;
  const auto bad = [&] { return Status::InvalidArgument("host list " + list + ": '" + item + "' is not N or N-M"); };
  if (lo.empty() || hi.empty()) return bad();
  if (std::from_chars(lo.data(), lo.data() + lo.size(), a).ptr != lo.data() + lo.size()) return bad();
  if (std::from_chars(hi.data(), hi.data() + hi.size(), b).ptr != hi.data() + hi.size()) return bad();
  if (b < a) return Status::InvalidArgument("host list " + list + ": the range " + item + " runs backwards");
  if (b - a > 100000) return Status::InvalidArgument("host list " + list + ": the range " + item + " is too long");
  for (std::uint64_t v = a; v <= b; ++v) {
    std::string n = std::to_string(v);
    if (n.size() < lo.size()) n.insert(0, lo.size() - n.size(), '0');  // "01-10": zero-padded to 2
    out.push_back(prefix + n);
  }
  return {};
}

// One host expression (no top-level comma): brackets expand left to right.
Status expand_one(const std::string& list, const std::string& expr, std::vector<std::string>& out) {
  const auto open = expr.find('[');
  if (open == std::string::npos) {
    if (expr.find(']') != std::string::npos)
      return Status::InvalidArgument("host list " + list + ": ']' without '['");
    out.push_back(expr);
    return {};
  }
  // As Slurm: after a bracket, only another bracketed part may follow.
  if (const auto last = expr.rfind(']'); last != std::string::npos && last + 1 < expr.size() &&
                                         expr.find('[', last) == std::string::npos)
    return Status::InvalidArgument("host list " + list + ": '" + expr.substr(last + 1) +
                                   "' after ']' (Slurm allows only another [...] there)");
  const auto close = expr.find(']', open);
  if (close == std::string::npos) return Status::InvalidArgument("host list " + list + ": '[' is not closed");
  const std::string prefix = expr.substr(0, open), inside = expr.substr(open + 1, close - open - 1);
  const std::string rest = expr.substr(close + 1);
  if (inside.empty()) return Status::InvalidArgument("host list " + list + ": empty brackets");
  std::vector<std::string> heads;
  for (std::size_t start = 0; start <= inside.size();) {
    const auto comma = inside.find(',', start);
    const std::string item = inside.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (Status s = expand_range(list, prefix, item, heads); !s.ok()) return s;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  for (const std::string& head : heads) {
    std::vector<std::string> tails;
    if (Status s = expand_one(list, rest, tails); !s.ok()) return s;
    for (const std::string& t : tails) out.push_back(head + t);
  }
  return {};
}

}  // namespace

std::string to_string(LauncherKind kind) {
  switch (kind) {
    case LauncherKind::local: return "local";
    case LauncherKind::env: return "env";
    case LauncherKind::slurm: return "slurm";
    case LauncherKind::mpi: return "mpi";
    case LauncherKind::kubernetes: return "kubernetes";
    case LauncherKind::torchrun: return "torchrun";
  }
  return "local";
}

Environment process_environment() {
  Environment env;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq) env.emplace(std::string(*e, static_cast<std::size_t>(eq - *e)), std::string(eq + 1));
  }
  return env;
}

Result<std::vector<std::string>> expand_hostlist(const std::string& list) {
  std::vector<std::string> out;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= list.size(); ++i) {
    const char c = i < list.size() ? list[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0) return Status::InvalidArgument("host list " + list + ": ']' without '['");
    if (c != ',' || depth > 0) continue;
    const std::string expr = list.substr(start, i - start);
    start = i + 1;
    if (expr.empty()) continue;  // "a,,b": as Slurm, nothing between the commas
    if (Status s = expand_one(list, expr, out); !s.ok()) return s;
  }
  if (depth != 0) return Status::InvalidArgument("host list " + list + ": '[' is not closed");
  return out;
}

Result<std::vector<std::uint32_t>> parse_tasks_per_node(const std::string& text) {
  std::vector<std::uint32_t> out;
  const auto bad = [&] { return Status::InvalidArgument("SLURM_TASKS_PER_NODE=" + text + ": expected N or N(xM), comma-separated"); };
  std::size_t at = 0;
  while (at < text.size()) {
    std::uint32_t tasks = 0, times = 1;
    auto [end, ec] = std::from_chars(text.data() + at, text.data() + text.size(), tasks);
    if (ec != std::errc()) return bad();
    at = static_cast<std::size_t>(end - text.data());
    if (text.compare(at, 2, "(x") == 0) {
      auto [e2, ec2] = std::from_chars(text.data() + at + 2, text.data() + text.size(), times);
      at = static_cast<std::size_t>(e2 - text.data());
      if (ec2 != std::errc() || at >= text.size() || text[at] != ')' || times > 100000) return bad();
      ++at;
    }
    out.insert(out.end(), times, tasks);
    if (at < text.size() && text[at++] != ',') return bad();
  }
  if (out.empty()) return bad();
  return out;
}

std::uint16_t port_for_job(const std::string& id) {
  std::uint32_t h = 2166136261u;  // FNV-1a: the same on every host and build
  for (unsigned char c : id) h = (h ^ c) * 16777619u;
  return static_cast<std::uint16_t>(10000 + h % 20000);  // below Linux's ephemeral ports (32768 on)
}

Result<Launch> detect_launch(const Environment& env, const std::string& wanted, std::uint16_t port) {
  Launch l;
  if (wanted == "auto") {
    l.kind = detect_kind(env);
  } else if (wanted == "local") {
    return l;
  } else {
    bool known = false;
    for (LauncherKind k : {LauncherKind::env, LauncherKind::slurm, LauncherKind::mpi, LauncherKind::kubernetes,
                           LauncherKind::torchrun})
      if (to_string(k) == wanted) {
        l.kind = k;
        known = true;
      }
    if (!known)
      return Status::InvalidArgument("--launcher " + wanted +
                                     ": expected auto, local, env, slurm, mpi, kubernetes or torchrun");
  }
  Status s;
  switch (l.kind) {
    case LauncherKind::local: return l;
    case LauncherKind::env: s = read_ranks(env, l, "ASGD_RANK", "ASGD_WORLD_SIZE", {"ASGD_LOCAL_RANK"}); break;
    case LauncherKind::slurm: s = read_slurm(env, l, port); break;
    case LauncherKind::mpi: s = read_mpi(env, l); break;
    case LauncherKind::kubernetes:
      s = read_ranks(env, l, "JOB_COMPLETION_INDEX", "ASGD_WORLD_SIZE", {"ASGD_LOCAL_RANK"});
      break;
    case LauncherKind::torchrun: s = read_torchrun(env, l, port); break;
  }
  if (!s.ok()) return Status::InvalidArgument("launcher " + to_string(l.kind) + ": " + s.message());
  l.run_id = run_id(env, l.kind);
  if (const auto c = get(env, "ASGD_COORDINATOR")) {
    // Checked here, so that every rank refuses a bad one alike (a worker
    // took port 99999 and waited out --join-timeout). A " curve:KEY"
    // suffix (--auth-keys) is the key's to check.
    if (auto split = split_tcp_endpoint(c->substr(0, c->find(' '))); !split)
      return Status::InvalidArgument("launcher " + to_string(l.kind) + ": ASGD_COORDINATOR " + split.status().message());
    l.coordinator = *c;
    l.from += ", ASGD_COORDINATOR";
    l.port_from = "from ASGD_COORDINATOR";
  }
  if (l.coordinator.empty() && (l.kind == LauncherKind::env || l.kind == LauncherKind::kubernetes))
    return Status::InvalidArgument("launcher " + to_string(l.kind) +
                                   ": ASGD_COORDINATOR is not set (tcp://HOST:PORT of rank 0)");
  return l;
}

Result<RoleOfRank> role_of_rank(const Launch& l, std::uint32_t shards, std::uint32_t workers) {
  const std::uint64_t needed = 1ull + shards + workers;
  if (l.world_size != needed) {
    auto count = [](std::uint64_t n, const char* what) { return std::to_string(n) + " " + what + (n == 1 ? "" : "s"); };
    std::string could = l.world_size > 1ull + shards
                            ? "with these ranks give --workers " + std::to_string(l.world_size - 1 - shards)
                            : "start at least " + std::to_string(shards + 2) + " ranks";
    if (l.world_size == 1)  // srun -n 1, srun --pty bash, mpirun -np 1
      could += ", or give --launcher local to start the job's processes on this node";
    return Status::InvalidArgument("launcher " + to_string(l.kind) + ": " + count(l.world_size, "rank") +
                                   ", but 1 coordinator, " + count(shards, "shard") + " and " +
                                   count(workers, "worker") + " take " + std::to_string(needed) + "; " + could);
  }
  if (l.rank == 0) return RoleOfRank{RankRole::coordinator, 0};
  if (l.rank <= shards) return RoleOfRank{RankRole::shard, l.rank - 1};
  return RoleOfRank{RankRole::worker, l.rank - 1 - shards};
}

Result<std::string> address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), "9", &hints, &found); rc != 0 || !found)
    return Status::NotFound("cannot resolve " + host + ": " + ::gai_strerror(rc));
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  Status failed;
  sockaddr_in local{};
  socklen_t len = sizeof local;
  if (fd < 0 || ::connect(fd, found->ai_addr, found->ai_addrlen) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0)
    failed = Status::Unavailable("no route to " + host + ": " + std::strerror(errno));
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  if (!failed.ok()) return failed;
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof text);
  return std::string(text);
}

Result<std::string> bindable_host(const std::string& host) {
  in_addr literal{};
  if (host == "*" || host.starts_with("[") || ::inet_pton(AF_INET, host.c_str(), &literal) == 1) return host;
  if (interface_address(host).ok()) return host;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0 || !found)
    return Status::InvalidArgument(host + " is no interface here and does not resolve (" + ::gai_strerror(rc) +
                                   "): give an address, an interface or a host name");
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr, text, sizeof text);
  ::freeaddrinfo(found);
  return std::string(text);
}

Result<std::string> interface_address(const std::string& name) {
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return Status::Unavailable(std::string("cannot list the interfaces: ") + std::strerror(errno));
  std::string found, names;
  for (ifaddrs* i = all; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    if (names.find(std::string(" ") + i->ifa_name + ",") == std::string::npos) names += std::string(" ") + i->ifa_name + ",";
    if (name != i->ifa_name || !found.empty()) continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text);
    found = text;
  }
  ::freeifaddrs(all);
  if (found.empty()) {
    if (!names.empty()) names.pop_back();
    return Status::NotFound("--interface " + name + ": no such interface with an IPv4 address (there are:" + names + ")");
  }
  return found;
}

Result<std::pair<std::string, std::uint16_t>> split_tcp_endpoint(const std::string& endpoint) {
  const std::string scheme = "tcp://";
  const auto colon = endpoint.rfind(':');
  std::uint32_t port = 0;
  if (endpoint.rfind(scheme, 0) != 0 || colon == std::string::npos || colon < scheme.size() + 1)
    return Status::InvalidArgument(endpoint + ": expected tcp://HOST:PORT");
  const std::string digits = endpoint.substr(colon + 1);
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
  if (ec != std::errc() || end != digits.data() + digits.size() || port == 0 || port > 65535)
    return Status::InvalidArgument(endpoint + ": expected tcp://HOST:PORT with a port from 1 to 65535");
  return std::pair<std::string, std::uint16_t>{endpoint.substr(scheme.size(), colon - scheme.size()),
                                               static_cast<std::uint16_t>(port)};
}

}  // namespace asgd
