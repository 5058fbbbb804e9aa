// JoinRendezvous and WaitForKey: see rendezvous.h.
#include "rendezvous.h"

#include <cstdio>
#include <thread>
#include <vector>

namespace traind::comm {

using Clock = std::chrono::steady_clock;

std::string Seconds(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(ms.count()) / 1000.0);
  return buf;
}

Result<Rendezvous> JoinRendezvous(const DistributedOptions& o) {
  if (o.world_size < 1) {
    return Status::InvalidArgument("distributed.world_size: must be >= 1, got " +
                                   std::to_string(o.world_size));
  }
  if (o.rank < 0 || o.rank >= o.world_size) {
    return Status::InvalidArgument("distributed.rank: must be in [0, " +
                                   std::to_string(o.world_size) + "), got " + std::to_string(o.rank));
  }
  RestartRounds* rounds = o.rounds;
  Rendezvous rv;
  rv.where = o.master_addr + ":" + std::to_string(o.master_port);
  rv.me = "rank " + std::to_string(o.rank) + " of " + std::to_string(o.world_size);
  const std::string& where = rv.where;
  const std::string& me = rv.me;
  if (rounds != nullptr) rounds->assembled = false;
  if (o.rank == 0) {
    if (rounds == nullptr) {
      TRAIND_ASSIGN_OR_RETURN(rv.server, TcpStoreServer::Start(o.master_addr, o.master_port));
    } else if (rounds->server == nullptr) {  // kept across rounds: it holds the round counter
      TRAIND_ASSIGN_OR_RETURN(rounds->server, TcpStoreServer::Start(o.master_addr, o.master_port));
    }
  }
  rv.deadline = Clock::now() + o.rendezvous_timeout;
  TRAIND_ASSIGN_OR_RETURN(
      rv.store,
      TcpStoreClient::Connect(o.master_addr, o.master_port, o.prefix, o.rendezvous_timeout,
                              me + " waited for rank 0, which hosts the rendezvous store; rank 0 "
                                   "never came (is it running, with this master_addr/master_port?)"));
  TcpStoreClient* store = rv.store.get();
  // The round (a restartable world): the one after this process's last, or the newest asked for.
  int64_t round = -1;
  std::string keys;  // what the claims are under: "" or "round-<n>/"
  if (rounds != nullptr) {
    TRAIND_RETURN_IF_ERROR(store->RaiseTo("round", rounds->round + 1, &round));
  }
  std::vector<int> missing;
  auto missing_names = [&]() {
    std::string names;
    for (size_t i = 0; i < missing.size(); ++i) {
      names += (i ? (i + 1 == missing.size() ? " and " : ", ") : "") + std::to_string(missing[i]);
    }
    return (missing.size() == 1 ? "rank " : "ranks ") + names + " never joined";
  };
  // A restartable world whose rank 0 died during the rendezvous: its restarted process hosts a
  // new store; reconnect within the deadline and carry the round into it. OK: start the round
  // over (claim again); else the error to return.
  auto reconnect = [&](const Status& lost) -> Status {
    if (rounds == nullptr || o.rank == 0 || Clock::now() >= rv.deadline) return lost;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(rv.deadline - Clock::now());
    auto again = TcpStoreClient::Connect(o.master_addr, o.master_port, o.prefix, left,
                                         me + " lost rank 0's store and waited for it to come back");
    if (!again.ok()) {
      return Status::Unavailable("rendezvous at " + where + " (" + o.prefix + keys + "): " +
                                 (missing.empty() ? std::string("waiting for the others")
                                                  : missing_names()) +
                                 " when rank 0's store closed (" + lost.message() +
                                 "), and none came back within the rendezvous timeout: " +
                                 again.status().message());
    }
    rv.store = std::move(*again);
    store = rv.store.get();
    return store->RaiseTo("round", round, &round);
  };
  for (bool joined = false; !joined;) {
    if (rounds != nullptr) {
      keys = "round-" + std::to_string(round) + "/";
      if (round > rounds->max_restarts) {
        return Status::FailedPrecondition(
            "rendezvous at " + where + " (" + o.prefix + "): the world is at round " +
            std::to_string(round) + ", past --max-restarts " + std::to_string(rounds->max_restarts) +
            ": it has restarted as often as it may, so " + me +
            " does not rejoin it; start the job again with --resume to continue from the newest "
            "checkpoint");
      }
    }
    // Claim this rank, then wait for everyone.
    bool taken = false;
    if (Status st = store->SetIfAbsent(keys + "join/" + std::to_string(o.rank),
                                       std::to_string(o.world_size), &taken);
        !st.ok()) {
      TRAIND_RETURN_IF_ERROR(reconnect(st));
      continue;
    }
    if (taken && rounds != nullptr) {
      // An earlier process of this rank joined this round and is gone (this one was restarted):
      // the round lost a rank, so the world goes on in the next one.
      if (Status st = store->RaiseTo("round", round + 1, &round); !st.ok()) {
        TRAIND_RETURN_IF_ERROR(reconnect(st));
      }
      continue;
    }
    if (taken) {
      return Status::InvalidArgument("distributed.rank: rank " + std::to_string(o.rank) +
                                     " has already joined this run (" + o.prefix + ") at " + where +
                                     ": two processes were given the same RANK");
    }
    missing.clear();
    for (bool again = false; !again;) {
      std::vector<int> now;
      for (int r = 0; r < o.world_size && !again; ++r) {
        std::string v;
        bool found = false;
        const Status got = store->TryGet(keys + "join/" + std::to_string(r), &v, &found);
        if (!got.ok() && rounds != nullptr) {
          TRAIND_RETURN_IF_ERROR(reconnect(got));
          again = true;
        } else if (!got.ok()) {  // rank 0 gave up (its own timeout) and closed the store
          return Status::Unavailable(
              "rendezvous at " + where + " (" + o.prefix + keys + "): " +
              (missing.empty() ? std::string("the store closed") : missing_names()) +
              "; rank 0 stopped waiting and closed the store (this is " + me + "): " +
              got.message());
        } else if (!found) {
          now.push_back(r);
        } else if (v != std::to_string(o.world_size)) {
          return Status::InvalidArgument("distributed.world_size: rank " + std::to_string(r) +
                                         " joined with world_size " + v + ", this " + me +
                                         " has " + std::to_string(o.world_size));
        }
      }
      if (again) break;  // claim again in the new store
      missing = std::move(now);
      if (missing.empty()) {
        joined = true;
        break;
      }
      if (rounds != nullptr) {  // a newer round asked for: this one will never assemble
        int64_t newest = round;
        if (Status st = store->RaiseTo("round", round, &newest); !st.ok()) {
          TRAIND_RETURN_IF_ERROR(reconnect(st));
          break;
        }
        if (newest > round) {
          round = newest;
          break;
        }
      }
      if (Clock::now() >= rv.deadline) {
        return Status::Unavailable(
            "rendezvous at " + where + " (" + o.prefix + keys + "): " + missing_names() +
            " within " + Seconds(o.rendezvous_timeout) + " s (" +
            std::to_string(o.world_size - static_cast<int>(missing.size())) + " of " +
            std::to_string(o.world_size) + " ranks came; this is " + me + ")");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  if (rounds != nullptr) {
    rounds->round = round;
    rounds->assembled = true;
    store->set_prefix(o.prefix + keys);  // the communicator's own keys: this round's
  }
  return rv;
}

Result<std::string> WaitForKey(Rendezvous& r, const std::string& key, const std::string& who) {
  for (;;) {
    std::string v;
    bool found = false;
    const Status got = r.store->TryGet(key, &v, &found);
    if (!got.ok()) {
      return Status::Unavailable("rendezvous at " + r.where + ": " + r.me + " waited for " + who +
                                 " to publish '" + key + "', and the store went away: " +
                                 got.message());
    }
    if (found) return v;
    if (Clock::now() >= r.deadline) {
      return Status::Unavailable("rendezvous at " + r.where + ": " + who + " did not publish '" +
                                 key + "' within the rendezvous timeout (this is " + r.me + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace traind::comm
