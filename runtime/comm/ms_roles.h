// MindSpore's parameter-server environment as Tessera's rank table: the
// processes of a job started the MindSpore way (set_ps_context) carry
//   MS_ROLE        MS_SCHED, MS_PSERVER or MS_WORKER
//   MS_SERVER_NUM  servers S;  MS_WORKER_NUM  workers W
//   MS_SCHED_HOST, MS_SCHED_PORT   where the scheduler listens
// and no rank. The scheduler serves a key-value store (kv_store.h) there;
// every server and worker registers with it and is numbered in arrival
// order (servers 0 .. S-1, workers S .. S+W-1, Tessera's roles), rank 0
// publishes its rendezvous address, and each process then runs as a rank
// of a Gloo job of S + W ranks with TESSERA_PS_SERVERS = S. Processes may
// start in any order; the scheduler names the roles that did not come.
// The scheduler's job ends once every process has its rank (liveness is
// the launcher's: tessera-run's heartbeats and restarts).
#ifndef TESSERA_RUNTIME_COMM_MS_ROLES_H_
#define TESSERA_RUNTIME_COMM_MS_ROLES_H_

#include <chrono>
#include <string>

#include "core/status.h"

namespace tessera {

struct MsRoles {
  std::string role;  // "MS_SCHED", "MS_PSERVER" or "MS_WORKER"
  int servers = 0, workers = 0;
  std::string sched_host;
  int sched_port = 0;
};

// The variables above; NotFound when MS_ROLE is unset, InvalidArgument
// naming the variable that is missing or malformed.
Result<MsRoles> MsRolesFromEnv();

// The scheduler (MS_ROLE=MS_SCHED): serves the store until every server
// and worker has its rank and rank 0's address; DeadlineExceeded naming
// the roles still missing after `timeout`. Returns the ranks as text
// ("ranks 0-1: MS_PSERVER, ranks 2-5: MS_WORKER").
Result<std::string> RunMsScheduler(const MsRoles& roles, std::chrono::milliseconds timeout);

// A server or worker: registers with the scheduler, learns its rank and
// rank 0's rendezvous address, and exports the rank table (TESSERA_RANK,
// TESSERA_WORLD_SIZE, TESSERA_MASTER) and TESSERA_PS_SERVERS. Errors name
// the scheduler's address, or the role with more processes than its
// count. Returns the rank.
Result<int> JoinMsRoles(const MsRoles& roles, std::chrono::milliseconds timeout);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_COMM_MS_ROLES_H_
