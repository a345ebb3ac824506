// ClientConnection: whether the client of a request is still connected, for replies that
// write nothing until the end (non-streaming generation), where a failed write cannot tell.
//
// cpp-httplib 0.11 (Debian's) gives a handler no socket, but serves each connection on
// one worker thread and closes its socket only after the last request on it, so the
// socket whose two ends match the request's addresses is the request's, and stays so
// while the handler runs.
#pragma once

#include <string>

namespace kiln::server {

class ClientConnection {
 public:
  // The open socket of the process whose local and peer addresses are these (as
  // cpp-httplib reports them: numeric host, port); not found: a connection never gone.
  static ClientConnection find(const std::string& local_addr, int local_port, const std::string& remote_addr,
                               int remote_port);
  explicit ClientConnection(int fd = -1) : fd_(fd) {}

  bool found() const { return fd_ >= 0; }
  // The peer closed or reset the connection (a client that only shut down its sending
  // side counts as gone too, as in uvicorn and node). Bytes waiting to be read (a
  // pipelined request) are not a hang-up. Never blocks.
  bool gone() const;

 private:
  int fd_;
};

}  // namespace kiln::server
