// comm/: what every data-parallel communicator shares: the options of a run's rendezvous (resolved
// from the spec's `distributed:` block and the environment) and the job runner's entry point,
// which picks the communicator for the job's device: Gloo on cpu, NCCL on cuda:N (when this build
// has it). The rendezvous itself (rank 0's store, claiming ranks, waiting for the world) is one
// piece that both communicators start with (comm/src/rendezvous.h).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "traind/engine/communicator.h"
#include "traind/engine/job_spec.h"
#include "traind/engine/status.h"

namespace traind::comm {

struct RestartRounds;  // comm/src/rendezvous.h

struct DistributedOptions {
  int world_size = 1;
  int rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29400;
  // Prepended to every rendezvous key: the attempt ("traind/<attempt>/"), so a restarted attempt
  // never meets a stale one's keys. Not the job: ranks meet at master_addr:master_port alone, as
  // torchrun's do (JOBSPEC.md "Batching semantics"), whatever their specs' name and output_dir.
  std::string prefix = "traind/0/";
  // What this rank's claim carries for the others to check (comm/src/spec_agreement.h: its job's
  // name and the spec fields every rank must share; OpenCommunicatorForJob fills it). Every rank
  // compares each joined rank's with rank 0's and fails naming the first field that disagrees.
  // Empty: nothing published or checked (communicators opened without a spec).
  std::string agreement;
  // How long a rank waits for the store (rank 0) and for every other rank to join; for NCCL also
  // for the communicator's initialisation (ncclCommInitRank) once the unique id is shared.
  std::chrono::milliseconds rendezvous_timeout{60000};
  // How long one collective may take before it fails (a dead or hung peer).
  std::chrono::milliseconds collective_timeout{600000};
  // Gloo only: the address the other ranks reach this rank's Gloo device at: empty = 127.0.0.1
  // when master_addr is a loopback address, else this host's name. `iface` (GLOO_SOCKET_IFNAME)
  // wins. NCCL picks its own interface (NCCL_SOCKET_IFNAME).
  std::string hostname;
  std::string iface;
  // A restartable world's rounds (RestartableWorld below; not owned); null: one attempt, the
  // rendezvous of today (a rank claimed twice is refused).
  RestartRounds* rounds = nullptr;
};

// The spec's `distributed:` block completed from the environment (WORLD_SIZE, RANK, MASTER_ADDR,
// MASTER_PORT as torchrun / PyTorchJob set them; TRAIND_DIST_TIMEOUT_S for the rendezvous timeout,
// TRAIND_DIST_COLLECTIVE_TIMEOUT_S for collectives, TRAIND_DIST_ATTEMPT for the key prefix's
// attempt, GLOO_SOCKET_IFNAME for the interface). `agreement` stays empty. Errors name the field
// ("distributed.rank: not set and RANK is not in the environment").
using GetEnv = std::function<const char*(const char*)>;
Result<DistributedOptions> ResolveDistributed(const engine::JobSpec& spec, const GetEnv& getenv);

// Whether this build has the NCCL communicator (built with the CUDA backend).
bool NcclBuilt();

// RunOptions::open_communicator for the job runner: ResolveDistributed with the process's
// environment, then the communicator for `device` (DeviceOptions::device): Gloo on "cpu", NCCL on
// "cuda:N" ("auto" as it resolves). Null for a world of one. A cuda device this machine cannot
// open fails with the engine's own device error (engine::QueryDevice), before any rendezvous;
// UNIMPLEMENTED on cuda when NCCL is not built and on "simt" (the emulator's kernels run on the
// CPU, NCCL cannot reach its buffers, and Gloo is not wired to it).
Result<std::unique_ptr<engine::Communicator>> OpenCommunicatorForJob(const engine::JobSpec& spec,
                                                                     const std::string& device);

// `traind run --max-restarts N` (docs/distributed.md, "Restarts of `traind run` ranks"): the
// world of one rank's process across its attempts, as torchrun's elastic agent restarts a world.
// Each attempt's communicator joins the next round of the rendezvous (its keys under
// `<prefix>round-<n>/`); the round is agreed through a counter in rank 0's store, which a
// surviving rank 0 keeps across attempts and which the survivors raise again in a restarted rank
// 0's new store, so a process restarted from scratch (same RANK, same arguments: Kubernetes'
// OnFailure restart) joins the survivors' round, and a process of an older round never meets a
// newer one. Round n is the world's n-th restart. Not thread-safe: one attempt at a time.
class RestartableWorld {
 public:
  explicit RestartableWorld(int max_restarts);
  ~RestartableWorld();
  RestartableWorld(const RestartableWorld&) = delete;
  RestartableWorld& operator=(const RestartableWorld&) = delete;

  // RunOptions::open_communicator for one attempt: OpenCommunicatorForJob, joining the next round.
  Result<std::unique_ptr<engine::Communicator>> Open(const engine::JobSpec& spec,
                                                     const std::string& device);
  // After an attempt failed with `failure`: OK when the world restarts (a distributed failure,
  // UNAVAILABLE, after this attempt's world had assembled: a peer went away, a collective timed
  // out; and round + 1 <= max_restarts), so the caller runs the next attempt resumed from
  // output_dir's newest checkpoint. Otherwise the status to end with: `failure` itself when it is
  // not a distributed failure (a bad spec, a NaN, a full disk) or when the rendezvous itself failed
  // (a rank that never came is named there); with the restarts used up, UNAVAILABLE saying how
  // many attempts of the world failed and why the last did.
  Status AfterFailure(const Status& failure) const;
  // The round this process last joined (-1 before its first attempt's rendezvous).
  int64_t round() const;
  int max_restarts() const;

 private:
  std::unique_ptr<RestartRounds> rounds_;
};

}  // namespace traind::comm
