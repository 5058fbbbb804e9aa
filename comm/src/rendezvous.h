// The rendezvous every communicator starts with (Gloo and NCCL alike; torchrun's TCPStore role):
// rank 0 hosts the key/value store on master_addr:master_port, every rank connects to it (retrying
// until the rendezvous timeout), claims its rank under the job/attempt prefix (a second process
// claiming the same rank is refused) and waits for all the others; a rank that never comes is
// named ("rank 1 never joined"), and so are ranks that disagree on the world size. What a
// communicator then exchanges through the store (Gloo's addresses, NCCL's unique id) is its own.
// Private to comm/.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "tcp_store.h"
#include "traind/comm/distributed.h"
#include "traind/engine/status.h"

namespace traind::comm {

struct Rendezvous {
  std::unique_ptr<TcpStoreServer> server;  // rank 0 only; must outlive every rank's use of it
  std::unique_ptr<TcpStoreClient> store;   // this rank's connection, keys under options.prefix
  std::string where;                       // "master_addr:master_port"
  std::string me;                          // "rank R of W", for messages
  std::chrono::steady_clock::time_point deadline;  // start + rendezvous_timeout
};

// INVALID_ARGUMENT for a bad rank / world size, a rank taken twice, or ranks that disagree on the
// world size; UNAVAILABLE naming the missing ranks (or rank 0, the store's host) when the world
// does not assemble within options.rendezvous_timeout.
Result<Rendezvous> JoinRendezvous(const DistributedOptions& options);

// Polls the store until `key` is set, then returns its value. UNAVAILABLE naming `who` (the rank
// that should have set it) when it is not there by r.deadline, or when the store goes away.
Result<std::string> WaitForKey(Rendezvous& r, const std::string& key, const std::string& who);

// "1.5": seconds for messages.
std::string Seconds(std::chrono::milliseconds ms);

}  // namespace traind::comm
