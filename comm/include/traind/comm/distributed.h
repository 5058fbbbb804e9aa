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

struct DistributedOptions {
  int world_size = 1;
  int rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29400;
  // Prepended to every rendezvous key: the job and the attempt ("traind/<job>/<attempt>/"), so a
  // restarted attempt never meets a stale one's keys.
  std::string prefix = "traind/job/0/";
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
};

// The spec's `distributed:` block completed from the environment (WORLD_SIZE, RANK, MASTER_ADDR,
// MASTER_PORT as torchrun / PyTorchJob set them; TRAIND_DIST_TIMEOUT_S for the rendezvous timeout,
// TRAIND_DIST_COLLECTIVE_TIMEOUT_S for collectives, TRAIND_DIST_ATTEMPT for the key prefix's
// attempt, GLOO_SOCKET_IFNAME for the interface). Errors name the field
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

}  // namespace traind::comm
