// The rendezvous every communicator starts with (Gloo and NCCL alike; torchrun's TCPStore role):
// rank 0 hosts the key/value store on master_addr:master_port, every rank connects to it (retrying
// until the rendezvous timeout), claims its rank under the attempt's prefix (never the job's: ranks
// meet at the address alone, as torchrun's do) and waits for all the others; a rank that never
// comes is named ("rank 1 never joined"), and so are ranks that disagree on the world size or on
// their specs (spec_agreement.h), a second process claiming a rank, and a process that comes to a
// world already running there. What a communicator then exchanges through the store (Gloo's
// addresses, NCCL's unique id) is its own. Private to comm/.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "tcp_store.h"
#include "traind/comm/distributed.h"
#include "traind/engine/status.h"

namespace traind::comm {

// The state a restartable world (`traind run --max-restarts`, RestartableWorld in distributed.h)
// keeps across its attempts: rank 0's store, which holds the round counter and outlives every
// attempt's communicator, and the round this process last joined (docs/distributed.md, "Restarts
// of `traind run` ranks").
struct RestartRounds {
  int max_restarts = 0;
  std::unique_ptr<TcpStoreServer> server;  // rank 0 only, started by its first join
  int64_t round = -1;       // the round this process last joined; -1 before its first
  bool assembled = false;   // the last JoinRendezvous saw every rank join its round
};

struct Rendezvous {
  std::unique_ptr<TcpStoreServer> server;  // rank 0 only; must outlive every rank's use of it
  std::unique_ptr<TcpStoreClient> store;   // this rank's connection, keys under options.prefix
  std::string where;                       // "master_addr:master_port"
  std::string me;                          // "rank R of W", for messages
  std::chrono::steady_clock::time_point deadline;  // start + rendezvous_timeout
};

// INVALID_ARGUMENT for a bad rank / world size, a rank taken twice, or ranks that disagree on the
// world size or on options.agreement (each claim carries its rank's; every rank compares each
// joined rank's with rank 0's, and the first to find a disagreement publishes it under
// `<prefix>failed` so every rank fails with it; rank 0 keeps the store up until each joined rank
// has read it, 2 s at most); FAILED_PRECONDITION when the world at this address has already
// assembled (rank 0 sets `traind/assembled`, outside every prefix, once every rank has claimed;
// not in a restartable world, which restarted ranks rejoin); UNAVAILABLE naming the missing
// ranks (or rank 0, the store's host) when the world does not assemble within
// options.rendezvous_timeout.
//
// With options.rounds (a restartable world) the ranks meet in rounds: the store's counter
// `<prefix>round` is raised (atomically, to the max) to the round after the one this process last
// joined (0 for a new process), and the rank claims `<prefix>round-<n>/join/<rank>` in the
// counter's value n. A claim already taken means an earlier process of this rank joined round n,
// so that round lost it: the counter goes to n + 1 (unless this process's agreement disagrees
// with round n's rank 0's: then INVALID_ARGUMENT, and the round is left alone). While waiting, a counter raised past n (a
// survivor of round n, or a newer rank 0's store) moves the rank to the newer round. Once every
// rank has claimed round n, the store's keys are under `<prefix>round-<n>/` (rv.server stays null:
// rank 0's store lives in options.rounds, across rounds), rounds->round = n and
// rounds->assembled = true. FAILED_PRECONDITION when the round would pass rounds->max_restarts.
Result<Rendezvous> JoinRendezvous(const DistributedOptions& options);

// Polls the store until `key` is set, then returns its value. UNAVAILABLE naming `who` (the rank
// that should have set it) when it is not there by r.deadline, or when the store goes away.
Result<std::string> WaitForKey(Rendezvous& r, const std::string& key, const std::string& who);

// "1.5": seconds for messages.
std::string Seconds(std::chrono::milliseconds ms);

}  // namespace traind::comm
