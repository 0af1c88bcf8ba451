// Internal to runtime/comm: blocking TCP sockets with deadlines, for the
// bootstrap paths (the rendezvous, the key-value store). Every wait takes a
// deadline; errors say what was being done (`what`).
#ifndef TESSERA_RUNTIME_COMM_TCP_H_
#define TESSERA_RUNTIME_COMM_TCP_H_

#include <chrono>
#include <cstddef>
#include <string>
#include <utility>

#include "core/status.h"

namespace tessera::tcp {

using Clock = std::chrono::steady_clock;

// An owned file descriptor.
class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket();
  int fd() const { return fd_; }
  // Gives up ownership: the caller closes the descriptor.
  int Release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

Status WaitFor(int fd, short events, Clock::time_point deadline, const std::string& what);
Status SendAll(int fd, const void* data, size_t n, Clock::time_point deadline,
               const std::string& what);
Status RecvAll(int fd, void* data, size_t n, Clock::time_point deadline, const std::string& what);

// A listening socket on `port` of every address, IPv6 and IPv4 (port 0:
// any free port; BoundPort tells which).
Result<Socket> Listen(int port, const std::string& what);
Result<int> BoundPort(const Socket& listener);
// Connects to host:port, retrying until `deadline` (the peer may not
// listen yet).
Result<Socket> Connect(const std::string& host, int port, Clock::time_point deadline,
                       const std::string& what);
// The local address (numeric) this host uses to reach host:port: the
// interface a peer there can reach us on.
Result<std::string> LocalAddressToward(const std::string& host, int port);
// The first IPv4 address of an up interface that is not loopback.
Result<std::string> NonLoopbackAddress();
// "127.x.y.z", "::1" or "localhost".
bool IsLoopback(const std::string& address);

}  // namespace tessera::tcp

#endif  // TESSERA_RUNTIME_COMM_TCP_H_
