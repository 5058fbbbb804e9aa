// FreePort: a loopback TCP port for a test's rendezvous store, shared by the tests/comm tests.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace traind::comm_test {

// A port the kernel just handed out (bound to port 0, then closed): free unless another process
// takes it in the moment between, unlike a fixed or pid-derived one under ctest -j. 29400 when no
// socket can be bound.
inline int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return 29400;
  }
  const int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

}  // namespace traind::comm_test
