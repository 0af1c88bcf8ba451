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

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kMagic = 0x56525354;  // "TSRV"
constexpr uint32_t kMaxBlob = 64 << 10;

class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

int RemainingMs(Clock::time_point deadline) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return ms.count() < 0 ? 0 : static_cast<int>(ms.count());
}

Status WaitFor(int fd, short events, Clock::time_point deadline, const std::string& what) {
  pollfd p{fd, events, 0};
  const int r = poll(&p, 1, RemainingMs(deadline));
  if (r > 0) return Status::Ok();
  if (r == 0) return DeadlineExceededError(what + ": timed out");
  return IOError(what + ": " + std::strerror(errno));
}

Status SendAll(int fd, const void* data, size_t n, Clock::time_point deadline,
               const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    RETURN_IF_ERROR(WaitFor(fd, POLLOUT, deadline, what));
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return IOError(what + ": " + std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

Status RecvAll(int fd, void* data, size_t n, Clock::time_point deadline, const std::string& what) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    RETURN_IF_ERROR(WaitFor(fd, POLLIN, deadline, what));
    const ssize_t r = recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return IOError(what + ": connection closed");
    if (r < 0) return IOError(what + ": " + std::strerror(errno));
    p += r;
    n -= static_cast<size_t>(r);
  }
  return Status::Ok();
}

Status SendBlob(int fd, std::string_view blob, Clock::time_point deadline, const std::string& what) {
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
  Socket listener(socket(AF_INET6, SOCK_STREAM, 0));
  bool v6 = listener.fd() >= 0;
  if (!v6) listener = Socket(socket(AF_INET, SOCK_STREAM, 0));
  if (listener.fd() < 0) return IOError(where + ": socket: " + std::strerror(errno));
  int one = 1, zero = 0;
  setsockopt(listener.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  int rc;
  if (v6) {
    setsockopt(listener.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_addr = in6addr_any;
    addr.sin6_port = htons(static_cast<uint16_t>(t.master_port));
    rc = bind(listener.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } else {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(t.master_port));
    rc = bind(listener.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  }
  if (rc != 0 || listen(listener.fd(), 128) != 0) {
    return IOError(where + ": cannot listen: " + std::strerror(errno));
  }
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
      RETURN_IF_ERROR(SendBlob(peers[r].fd(), b, deadline, where + " to rank " + std::to_string(r)));
    }
  }
  return blobs;
}

Result<std::vector<std::string>> Join(const RankTable& t, std::string_view blob,
                                      Clock::time_point deadline) {
  const std::string where = "rendezvous with " + t.master_host + ":" +
                            std::to_string(t.master_port) + " (rank " + std::to_string(t.rank) + ")";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(t.master_port);
  if (const int e = getaddrinfo(t.master_host.c_str(), port.c_str(), &hints, &found); e != 0) {
    return InvalidArgumentError(where + ": cannot resolve host: " + gai_strerror(e));
  }
  Socket conn;
  while (conn.fd() < 0) {  // rank 0 may not listen yet: retry until the deadline
    for (addrinfo* a = found; a != nullptr && conn.fd() < 0; a = a->ai_next) {
      Socket s(socket(a->ai_family, a->ai_socktype, a->ai_protocol));
      if (s.fd() >= 0 && connect(s.fd(), a->ai_addr, a->ai_addrlen) == 0) conn = std::move(s);
    }
    if (conn.fd() >= 0) break;
    if (Clock::now() >= deadline) {
      freeaddrinfo(found);
      return DeadlineExceededError(where + ": rank 0 never accepted a connection");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  freeaddrinfo(found);
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

Result<std::vector<std::string>> RendezvousAllGather(const RankTable& table,
                                                     std::string_view blob,
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
