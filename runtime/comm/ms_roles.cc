#include "runtime/comm/ms_roles.h"

#include <cstdlib>
#include <thread>

#include "runtime/comm/kv_store.h"
#include "runtime/comm/launch.h"
#include "runtime/comm/tcp.h"

namespace tessera {
namespace {

Result<int> PositiveEnv(const char* name) {
  ASSIGN_OR_RETURN(int64_t n, EnvInt(name, 1, 1 << 20));
  if (n < 0) return InvalidArgumentError(std::string("MS_ROLE is set but ") + name + " is not");
  return static_cast<int>(n);
}

std::string Ranks(int first, int n, const char* role) {
  if (n == 0) return "";
  return (n == 1 ? "rank " + std::to_string(first)
                 : "ranks " + std::to_string(first) + "-" + std::to_string(first + n - 1)) +
         ": " + role;
}

}  // namespace

Result<MsRoles> MsRolesFromEnv() {
  const char* role = std::getenv("MS_ROLE");
  if (role == nullptr || *role == '\0') return NotFoundError("MS_ROLE is not set");
  MsRoles r;
  r.role = role;
  if (r.role != "MS_SCHED" && r.role != "MS_PSERVER" && r.role != "MS_WORKER") {
    return InvalidArgumentError("MS_ROLE='" + r.role +
                                "': expected MS_SCHED, MS_PSERVER or MS_WORKER");
  }
  ASSIGN_OR_RETURN(r.servers, PositiveEnv("MS_SERVER_NUM"));
  ASSIGN_OR_RETURN(r.workers, PositiveEnv("MS_WORKER_NUM"));
  ASSIGN_OR_RETURN(r.sched_port, PositiveEnv("MS_SCHED_PORT"));
  const char* host = std::getenv("MS_SCHED_HOST");
  if (host == nullptr || *host == '\0') {
    return InvalidArgumentError("MS_ROLE is set but MS_SCHED_HOST is not");
  }
  r.sched_host = host;
  return r;
}

Result<std::string> RunMsScheduler(const MsRoles& roles, std::chrono::milliseconds timeout) {
  ASSIGN_OR_RETURN(std::unique_ptr<KvServer> server, KvServer::Start(roles.sched_port));
  ASSIGN_OR_RETURN(std::unique_ptr<KvClient> store,
                   KvClient::Connect("127.0.0.1", server->port(), timeout));
  // Every process has its rank and rank 0's address once all said ready.
  const int n = roles.servers + roles.workers;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    ASSIGN_OR_RETURN(const int64_t ready, store->Add("ms/ready", 0));
    if (ready >= n) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ASSIGN_OR_RETURN(const int64_t s, store->Add("ms/MS_PSERVER", 0));
      ASSIGN_OR_RETURN(const int64_t w, store->Add("ms/MS_WORKER", 0));
      return DeadlineExceededError("MS_SCHED at port " + std::to_string(roles.sched_port) + ": " +
                                   std::to_string(std::min<int64_t>(s, roles.servers)) + " of " +
                                   std::to_string(roles.servers) + " MS_PSERVER and " +
                                   std::to_string(std::min<int64_t>(w, roles.workers)) + " of " +
                                   std::to_string(roles.workers) +
                                   " MS_WORKER processes came within " +
                                   std::to_string(timeout.count() / 1000) + " s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::string table = Ranks(0, roles.servers, "MS_PSERVER");
  table += ", " + Ranks(roles.servers, roles.workers, "MS_WORKER");
  return table;
}

Result<int> JoinMsRoles(const MsRoles& roles, std::chrono::milliseconds timeout) {
  if (roles.role == "MS_SCHED") return InvalidArgumentError("JoinMsRoles on the scheduler");
  Result<std::unique_ptr<KvClient>> connected =
      KvClient::Connect(roles.sched_host, roles.sched_port, timeout);
  if (!connected.ok()) {
    return Status(connected.status().code(), roles.role + ": no MS_SCHED at " + roles.sched_host +
                                                 ":" + std::to_string(roles.sched_port) + ": " +
                                                 connected.status().message());
  }
  KvClient& store = **connected;
  const bool server = roles.role == "MS_PSERVER";
  const int count = server ? roles.servers : roles.workers;
  ASSIGN_OR_RETURN(const int64_t arrived, store.Add("ms/" + roles.role, 1));
  if (arrived > count) {
    return InvalidArgumentError(
        "more " + roles.role + " processes than " + (server ? "MS_SERVER_NUM=" : "MS_WORKER_NUM=") +
        std::to_string(count) + " (this one is number " + std::to_string(arrived) + ")");
  }
  const int rank = static_cast<int>(arrived - 1) + (server ? 0 : roles.servers);
  const int world = roles.servers + roles.workers;
  if (rank == 0) {
    // A free port for the rendezvous rank 0 serves, on the address the
    // scheduler's host reaches this one by.
    ASSIGN_OR_RETURN(tcp::Socket probe, tcp::Listen(0, "the rendezvous port"));
    ASSIGN_OR_RETURN(const int port, tcp::BoundPort(probe));
    ASSIGN_OR_RETURN(const std::string address,
                     tcp::LocalAddressToward(roles.sched_host, roles.sched_port));
    RETURN_IF_ERROR(store.Set("ms/master", address + ":" + std::to_string(port)));
  }
  ASSIGN_OR_RETURN(const std::string master, store.Get("ms/master", timeout));
  ExportRankTable(rank, world, master);
  setenv(kEnvPsServers, std::to_string(roles.servers).c_str(), 1);
  RETURN_IF_ERROR(store.Add("ms/ready", 1).status());
  return rank;
}

}  // namespace tessera
