// The rendezvous key/value store of a data-parallel run (torchrun's TCPStore role): rank 0 hosts a
// TcpStoreServer on master_addr:master_port; every rank (rank 0 included) talks to it through a
// TcpStoreClient (rendezvous.h builds the rendezvous on it; Gloo sees it through an adapter in
// gloo_communicator.cc, NCCL's unique id travels through it). Keys are prefixed by the client (job
// and attempt), so a restarted attempt never reads a stale one's keys. No Gloo or CUDA types here.
// Private to comm/.
//
// Wire format (one request, one reply, over one TCP connection per client):
//   request: op (1 byte: 'S' set, 'G' get, 'X' set if absent, 'M' raise a decimal integer to at
//            least the value: the restart rounds' counter), key length (u32 LE), key,
//            value length (u32 LE), value
//   reply:   status (1 byte: 0 ok / found, 1 not found / already there), length (u32 LE), value
// A get that is not found returns at once; waiting is the client's polling loop (its deadline is
// the caller's timeout).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "traind/engine/status.h"

namespace traind::comm {

class TcpStoreServer {
 public:
  // Listens on addr:port (addr "" or "0.0.0.0": every interface). UNAVAILABLE when the port is
  // taken or the address is not this machine's.
  static Result<std::unique_ptr<TcpStoreServer>> Start(const std::string& addr, int port);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  int port() const { return port_; }

 private:
  TcpStoreServer() = default;
  void Loop();

  int listen_fd_ = -1;
  int port_ = 0;
  int wake_[2] = {-1, -1};  // a pipe: the destructor's stop signal
  std::thread thread_;
  std::map<std::string, std::vector<char>> data_;
};

class TcpStoreClient {
 public:
  // Connects to the server, retrying until `timeout` (the server may not be up yet). UNAVAILABLE
  // with `who_hosts` in the message when it never answers.
  static Result<std::unique_ptr<TcpStoreClient>> Connect(
      const std::string& addr, int port, const std::string& prefix,
      std::chrono::milliseconds timeout, const std::string& who_hosts);
  ~TcpStoreClient();
  TcpStoreClient(const TcpStoreClient&) = delete;
  TcpStoreClient& operator=(const TcpStoreClient&) = delete;

  const std::string& prefix() const { return prefix_; }
  // Later requests use `prefix` (a restartable world moves to its round's keys once joined).
  void set_prefix(const std::string& prefix) { prefix_ = prefix; }
  const std::string& where() const { return where_; }  // "addr:port"
  std::chrono::milliseconds timeout() const { return timeout_; }  // Connect's timeout

  Status Set(const std::string& key, const std::string& value);
  // false in *found when absent (no waiting).
  Status TryGet(const std::string& key, std::string* value, bool* found);
  // Atomically sets `key` to max(its integer value, `value`) (absent counts as lower than any);
  // *now is the value after the request.
  Status RaiseTo(const std::string& key, int64_t value, int64_t* now);
  // Sets unless present; *existed tells which.
  Status SetIfAbsent(const std::string& key, const std::string& value, bool* existed);

 private:
  TcpStoreClient() = default;
  Status Request(char op, const std::string& key, const std::string& value, uint8_t* status,
                         std::string* reply);

  int fd_ = -1;
  std::string prefix_;
  std::string where_;  // "addr:port"
  std::chrono::milliseconds timeout_{30000};
};

}  // namespace traind::comm
