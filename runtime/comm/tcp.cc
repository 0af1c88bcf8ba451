#include "runtime/comm/tcp.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

namespace tessera::tcp {
namespace {

int RemainingMs(Clock::time_point deadline) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return ms.count() < 0 ? 0 : static_cast<int>(ms.count());
}

// connect() that gives up at `deadline` (a host that drops SYNs would
// otherwise block for the kernel's two minutes of retries).
bool ConnectBy(int fd, const sockaddr* addr, socklen_t len, Clock::time_point deadline) {
  const int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  int rc = connect(fd, addr, len);
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, std::max(RemainingMs(deadline), 1)) == 1) {
      int err = 0;
      socklen_t l = sizeof(err);
      rc = getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l) == 0 && err == 0 ? 0 : -1;
    }
  }
  fcntl(fd, F_SETFL, flags);
  return rc == 0;
}

}  // namespace

Socket::~Socket() {
  if (fd_ >= 0) close(fd_);
}

Status WaitFor(int fd, short events, Clock::time_point deadline, const std::string& what) {
  while (true) {
    pollfd p{fd, events, 0};
    const int r = poll(&p, 1, RemainingMs(deadline));
    if (r > 0) return Status::Ok();
    if (r == 0) return DeadlineExceededError(what + ": timed out");
    if (errno != EINTR) return IOError(what + ": " + std::strerror(errno));
  }
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

Result<Socket> Listen(int port, const std::string& what) {
  Socket listener(socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const bool v6 = listener.fd() >= 0;
  if (!v6) listener = Socket(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (listener.fd() < 0) return IOError(what + ": socket: " + std::strerror(errno));
  int one = 1, zero = 0;
  setsockopt(listener.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  int rc;
  if (v6) {
    setsockopt(listener.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_addr = in6addr_any;
    addr.sin6_port = htons(static_cast<uint16_t>(port));
    rc = bind(listener.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } else {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    rc = bind(listener.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  }
  if (rc != 0 || listen(listener.fd(), 128) != 0) {
    return IOError(what + ": cannot listen on port " + std::to_string(port) + ": " +
                   std::strerror(errno));
  }
  return listener;
}

Result<int> BoundPort(const Socket& listener) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(listener.fd(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return IOError(std::string("getsockname: ") + std::strerror(errno));
  }
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

Result<Socket> Connect(const std::string& host, int port, Clock::time_point deadline,
                       const std::string& what) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int e = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); e != 0) {
    return InvalidArgumentError(what + ": cannot resolve host '" + host + "': " + gai_strerror(e));
  }
  Socket conn;
  while (true) {
    for (addrinfo* a = found; a != nullptr && conn.fd() < 0; a = a->ai_next) {
      Socket s(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
      if (s.fd() >= 0 && ConnectBy(s.fd(), a->ai_addr, a->ai_addrlen, deadline))
        conn = std::move(s);
    }
    if (conn.fd() >= 0) break;
    if (Clock::now() >= deadline) {
      freeaddrinfo(found);
      return DeadlineExceededError(what + ": nothing accepted a connection on " + host + ":" +
                                   service);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  freeaddrinfo(found);
  int one = 1;
  setsockopt(conn.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return conn;
}

Result<std::string> LocalAddressToward(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int e = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); e != 0) {
    return InvalidArgumentError("cannot resolve host '" + host + "': " + gai_strerror(e));
  }
  std::string out;
  for (addrinfo* a = found; a != nullptr && out.empty(); a = a->ai_next) {
    // A datagram socket's connect sends nothing: it only picks the route.
    Socket s(socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (s.fd() < 0 || connect(s.fd(), a->ai_addr, a->ai_addrlen) != 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (getsockname(s.fd(), reinterpret_cast<sockaddr*>(&local), &len) != 0) continue;
    char text[INET6_ADDRSTRLEN] = {};
    const void* addr =
        local.ss_family == AF_INET6
            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
            : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
    if (inet_ntop(local.ss_family, addr, text, sizeof(text)) != nullptr) out = text;
  }
  freeaddrinfo(found);
  if (out.empty()) return IOError("no route to '" + host + "'");
  return out;
}

Result<std::string> NonLoopbackAddress() {
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) return IOError(std::string("getifaddrs: ") + std::strerror(errno));
  std::string out;
  for (ifaddrs* i = all; i != nullptr && out.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char text[INET_ADDRSTRLEN] = {};
    if (inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text,
                  sizeof(text)) != nullptr) {
      out = text;
    }
  }
  freeifaddrs(all);
  if (out.empty()) return NotFoundError("no network interface but loopback is up");
  return out;
}

bool IsLoopback(const std::string& address) {
  return address.rfind("127.", 0) == 0 || address == "::1" || address == "localhost";
}

}  // namespace tessera::tcp
