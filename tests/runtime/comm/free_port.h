// A loopback TCP port nothing listens on now (the kernel's pick), for tests
// that start their own rendezvous.
#ifndef TESSERA_TESTS_COMM_FREE_PORT_H_
#define TESSERA_TESTS_COMM_FREE_PORT_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace tessera::testing {

inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_COMM_FREE_PORT_H_
