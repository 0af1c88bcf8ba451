#include "runtime/comm/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "runtime/comm/tcp.h"

namespace tessera {
namespace {

using tcp::Clock;
using tcp::RecvAll;
using tcp::SendAll;
using tcp::Socket;
using tcp::WaitFor;
constexpr uint32_t kMagic = 0x56525354;  // "TSRV"
constexpr uint32_t kMaxBlob = 64 << 10;

Status SendBlob(int fd, std::string_view blob, Clock::time_point deadline,
                const std::string& what) {
  const uint32_t len = htonl(static_cast<uint32_t>(blob.size()));
  RETURN_IF_ERROR(SendAll(fd, &len, 4, deadline, what));
  return SendAll(fd, blob.data(), blob.size(), deadline, what);
}

Result<std::string> RecvBlob(int fd, Clock::time_point deadline, const std::string& what) {
  uint32_t len = 0;
  RETURN_IF_ERROR(RecvAll(fd, &len, 4, deadline, what));
  len = ntohl(len);
  if (len > kMaxBlob) return DataLossError(what + ": blob of " + std::to_string(len) + " bytes");
  std::string blob(len, '\0');
  RETURN_IF_ERROR(RecvAll(fd, blob.data(), len, deadline, what));
  return blob;
}

// The header a rank sends: magic, rank, world size.
struct Hello {
  uint32_t magic, rank, world_size;
};

Result<std::vector<std::string>> Serve(const RankTable& t, std::string_view blob,
                                       Clock::time_point deadline) {
  const std::string where = "rendezvous on port " + std::to_string(t.master_port) + " (rank 0)";
  ASSIGN_OR_RETURN(Socket listener, tcp::Listen(t.master_port, where));
  std::vector<std::string> blobs(t.world_size);
  std::vector<Socket> peers(t.world_size);
  std::vector<bool> arrived(t.world_size, false);
  blobs[0] = std::string(blob);
  arrived[0] = true;
  for (int remaining = t.world_size - 1; remaining > 0;) {
    Status s = WaitFor(listener.fd(), POLLIN, deadline, where);
    if (!s.ok()) {
      std::string missing;
      for (int r = 0; r < t.world_size; ++r) {
        if (!arrived[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      return DeadlineExceededError(where + ": rank(s) " + missing + " did not connect");
    }
    Socket conn(accept(listener.fd(), nullptr, nullptr));
    if (conn.fd() < 0) continue;
    Hello h{};
    if (!RecvAll(conn.fd(), &h, sizeof(h), deadline, where).ok() || ntohl(h.magic) != kMagic) {
      continue;  // not one of ours: ignore it
    }
    const uint32_t rank = ntohl(h.rank), size = ntohl(h.world_size);
    if (size != static_cast<uint32_t>(t.world_size)) {
      return InvalidArgumentError(where + ": rank " + std::to_string(rank) + " has world size " +
                                  std::to_string(size) + ", rank 0 has " +
                                  std::to_string(t.world_size));
    }
    if (rank == 0 || rank >= size || arrived[rank]) {
      return InvalidArgumentError(where + ": rank " + std::to_string(rank) +
                                  (rank >= size ? " is out of range" : " connected twice"));
    }
    ASSIGN_OR_RETURN(blobs[rank], RecvBlob(conn.fd(), deadline, where));
    arrived[rank] = true;
    peers[rank] = std::move(conn);
    --remaining;
  }
  for (int r = 1; r < t.world_size; ++r) {
    for (const std::string& b : blobs) {
      RETURN_IF_ERROR(
          SendBlob(peers[r].fd(), b, deadline, where + " to rank " + std::to_string(r)));
    }
  }
  return blobs;
}

Result<std::vector<std::string>> Join(const RankTable& t, std::string_view blob,
                                      Clock::time_point deadline) {
  const std::string where = "rendezvous with " + t.master_host + ":" +
                            std::to_string(t.master_port) + " (rank " + std::to_string(t.rank) +
                            ")";
  Result<Socket> connected = tcp::Connect(t.master_host, t.master_port, deadline, where);
  if (!connected.ok()) {
    if (connected.status().code() != StatusCode::kDeadlineExceeded) return connected.status();
    return DeadlineExceededError(where + ": rank 0 never accepted a connection");
  }
  Socket conn = std::move(*connected);
  const Hello h{htonl(kMagic), htonl(static_cast<uint32_t>(t.rank)),
                htonl(static_cast<uint32_t>(t.world_size))};
  RETURN_IF_ERROR(SendAll(conn.fd(), &h, sizeof(h), deadline, where));
  RETURN_IF_ERROR(SendBlob(conn.fd(), blob, deadline, where));
  std::vector<std::string> blobs(t.world_size);
  for (std::string& b : blobs) {
    ASSIGN_OR_RETURN(b, RecvBlob(conn.fd(), deadline, where + ": waiting for the other ranks"));
  }
  return blobs;
}

}  // namespace

Result<std::vector<std::string>> RendezvousAllGather(const RankTable& table, std::string_view blob,
                                                     std::chrono::milliseconds timeout) {
  if (blob.size() > kMaxBlob) {
    return InvalidArgumentError("rendezvous blob of " + std::to_string(blob.size()) +
                                " bytes exceeds 64 KiB");
  }
  if (table.world_size == 1) return std::vector<std::string>{std::string(blob)};
  if (table.master_port <= 0 || (table.rank != 0 && table.master_host.empty())) {
    return InvalidArgumentError("rendezvous needs TESSERA_MASTER=host:port");
  }
  const auto deadline = Clock::now() + timeout;
  return table.rank == 0 ? Serve(table, blob, deadline) : Join(table, blob, deadline);
}

}  // namespace tessera
