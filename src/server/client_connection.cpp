#include "server/client_connection.h"

#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>

namespace kiln::server {
namespace {

// Numeric host and port of a socket address (cpp-httplib formats them the same way).
bool host_and_port(const sockaddr_storage& addr, socklen_t len, std::string& host, int& port) {
  if (addr.ss_family == AF_INET) port = ntohs(reinterpret_cast<const sockaddr_in&>(addr).sin_port);
  else if (addr.ss_family == AF_INET6) port = ntohs(reinterpret_cast<const sockaddr_in6&>(addr).sin6_port);
  else return false;
  char buf[NI_MAXHOST];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, buf, sizeof(buf), nullptr, 0, NI_NUMERICHOST) != 0)
    return false;
  host = buf;
  return true;
}

bool matches(int fd, const std::string& local_addr, int local_port, const std::string& remote_addr, int remote_port) {
  struct stat st{};
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  std::string host;
  int port = -1;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 || !host_and_port(addr, len, host, port) ||
      port != local_port || host != local_addr)
    return false;
  len = sizeof(addr);
  return getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0 && host_and_port(addr, len, host, port) &&
         port == remote_port && host == remote_addr;
}

}  // namespace

ClientConnection ClientConnection::find(const std::string& local_addr, int local_port, const std::string& remote_addr,
                                        int remote_port) {
  if (local_port < 0 || remote_port < 0) return ClientConnection();
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return ClientConnection();
  int found = -1;
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    if (matches(int(fd), local_addr, local_port, remote_addr, remote_port)) {
      found = int(fd);
      break;
    }
  }
  closedir(dir);
  return ClientConnection(found);
}

bool ClientConnection::gone() const {
  if (fd_ < 0) return false;
  pollfd p{.fd = fd_, .events = POLLIN | POLLRDHUP, .revents = 0};
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace kiln::server
