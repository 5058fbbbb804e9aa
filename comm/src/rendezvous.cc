// JoinRendezvous and WaitForKey: see rendezvous.h.
#include "rendezvous.h"

#include <algorithm>
#include <cstdio>
#include <thread>
#include <vector>

#include "spec_agreement.h"

namespace traind::comm {

using Clock = std::chrono::steady_clock;

namespace {

// A rank's claim `join/<rank>`: its world size, then (after a newline) its spec's agreement
// document (spec_agreement.h) when it has one.
struct Claim {
  std::string world;
  std::string agreement;
};

std::string EncodeClaim(const DistributedOptions& o) {
  std::string v = std::to_string(o.world_size);
  if (!o.agreement.empty()) v += "\n" + o.agreement;
  return v;
}

Claim DecodeClaim(const std::string& v) {
  const size_t nl = v.find('\n');
  if (nl == std::string::npos) return {v, ""};
  return {v.substr(0, nl), v.substr(nl + 1)};
}

// The key (outside every job's prefix) rank 0 sets once its world has assembled: "<world size>\n
// <job name>".
constexpr char kAssembled[] = "traind/assembled";

// " (job 'NAME')" for messages, or "" when the claim carries no name.
std::string JobOf(const Claim& c) {
  const std::string name = AgreementJobName(c.agreement);
  return name.empty() ? "" : " (job '" + name + "')";
}

}  // namespace

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
  const std::string my_name = AgreementJobName(o.agreement);  // "" without a spec
  if (rounds == nullptr) {
    // A world that has assembled at this address is running (rank 0 marks it, outside every
    // job's prefix): this process is another job's rank on the same master_addr:master_port, or
    // one too many of this job's.
    std::string mark;
    bool found = false;
    store->set_prefix("");
    TRAIND_RETURN_IF_ERROR(store->TryGet(kAssembled, &mark, &found));
    store->set_prefix(o.prefix);
    if (found) {
      const size_t nl = mark.find('\n');
      const std::string world = mark.substr(0, nl);
      const std::string name = nl == std::string::npos ? "" : mark.substr(nl + 1);
      return Status::FailedPrecondition(
          "rendezvous at " + where + ": a world of " + world + " ranks" +
          (name.empty() ? std::string() : " (job '" + name + "')") +
          " has already assembled there and is running; this process (" + me +
          (my_name.empty() ? "" : ", job '" + my_name + "'") +
          ") does not join a running world: another job is using this master_addr:master_port, "
          "so give this one its own distributed.master_port (MASTER_PORT)");
    }
  }
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
    if (Status st = store->SetIfAbsent(keys + "join/" + std::to_string(o.rank), EncodeClaim(o),
                                       &taken);
        !st.ok()) {
      TRAIND_RETURN_IF_ERROR(reconnect(st));
      continue;
    }
    if (taken && rounds != nullptr) {
      // An earlier process of this rank joined this round and is gone (this one was restarted):
      // the round lost a rank, so the world goes on in the next one. Unless this process's spec
      // is not the world's (another job on this address): then it joins no round.
      std::string first;
      bool has_first = false;
      if (Status st = store->TryGet(keys + "join/0", &first, &has_first); !st.ok()) {
        TRAIND_RETURN_IF_ERROR(reconnect(st));
        continue;
      }
      const Claim zero = DecodeClaim(first);
      if (has_first && !o.agreement.empty() && !zero.agreement.empty()) {
        if (std::string differ = FirstDisagreement(o.rank, o.agreement, zero.agreement);
            !differ.empty()) {
          return Status::InvalidArgument(differ + "; at " + where + ", this is " + me);
        }
      }
      if (Status st = store->RaiseTo("round", round + 1, &round); !st.ok()) {
        TRAIND_RETURN_IF_ERROR(reconnect(st));
      }
      continue;
    }
    if (taken) {
      std::string holder;
      bool found = false;
      TRAIND_RETURN_IF_ERROR(store->TryGet(keys + "join/" + std::to_string(o.rank), &holder, &found));
      return Status::InvalidArgument(
          "distributed.rank: rank " + std::to_string(o.rank) + " is already taken at " + where +
          " (" + o.prefix + ") by another process" + (found ? JobOf(DecodeClaim(holder)) : "") +
          "; this process" + (my_name.empty() ? "" : " (job '" + my_name + "')") +
          " does not join: two processes were given the same RANK, or another job is using this "
          "master_addr:master_port");
    }
    // A disagreement found while waiting (ranks that disagree on the world size or the spec):
    // published for every rank, so each fails with the one message rather than with "the store
    // closed"; rank 0 keeps its store up until each rank that joined has read it (2 s at most).
    auto refuse = [&](const std::string& why, bool publish = true) -> Status {
      if (publish) (void)store->Set(keys + "failed", why);
      (void)store->Set(keys + "failed-seen/" + std::to_string(o.rank), "1");
      const auto until = std::min(rv.deadline, Clock::now() + std::chrono::seconds(2));
      for (bool all = false; o.rank == 0 && !all && Clock::now() < until;) {
        all = true;
        for (int r = 1; r < o.world_size && all; ++r) {
          std::string v;
          bool joined = false, read = false;
          all = store->TryGet(keys + "join/" + std::to_string(r), &v, &joined).ok() &&
                (!joined ||
                 (store->TryGet(keys + "failed-seen/" + std::to_string(r), &v, &read).ok() &&
                  read));
        }
        if (!all) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      return Status::InvalidArgument(why + "; at " + where + ", this is " + me);
    };
    missing.clear();
    // The claims seen so far (each is read once: a claim never changes), and rank 0's agreement
    // document, which every other rank's is compared with.
    std::vector<char> seen(static_cast<size_t>(o.world_size), 0);
    std::string zero_agreement;
    for (bool again = false; !again;) {
      std::vector<int> now;
      {  // another rank found a disagreement: this one fails with its message
        std::string why;
        bool failed = false;
        if (store->TryGet(keys + "failed", &why, &failed).ok() && failed) {
          return refuse(why, /*publish=*/false);
        }
      }
      for (int r = 0; r < o.world_size && !again; ++r) {
        if (seen[static_cast<size_t>(r)]) continue;
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
        } else if (const Claim c = DecodeClaim(v); c.world != std::to_string(o.world_size)) {
          return refuse("distributed.world_size: rank " + std::to_string(r) +
                        " joined with world_size " + c.world + ", rank " +
                        std::to_string(o.rank) + " with " + std::to_string(o.world_size));
        } else if (o.agreement.empty()) {
          seen[static_cast<size_t>(r)] = 1;
        } else if (r == 0) {
          zero_agreement = c.agreement;
          seen[0] = 1;
        } else if (seen[0]) {  // rank 0's document is known: compare (else on a later pass)
          if (!zero_agreement.empty() && !c.agreement.empty()) {
            if (std::string differ = FirstDisagreement(r, c.agreement, zero_agreement);
                !differ.empty()) {
              return refuse(differ);
            }
          }
          seen[static_cast<size_t>(r)] = 1;
        }  // else: joined, compared on a later pass (rank 0 has not joined yet, so one follows)
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
  } else if (o.rank == 0) {
    // Whoever comes now finds a running world (checked above, before it claims anything): the
    // world size, then the job's name.
    store->set_prefix("");
    const Status marked = store->Set(kAssembled, std::to_string(o.world_size) + "\n" +
                                                     AgreementJobName(o.agreement));
    store->set_prefix(o.prefix);
    TRAIND_RETURN_IF_ERROR(marked);
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
