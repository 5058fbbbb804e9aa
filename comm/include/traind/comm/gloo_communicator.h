// comm/: engine::Communicator over Gloo (Debian's libgloo-dev, TCP transport) for data-parallel
// runs on the CPU backend, and the rendezvous that sets it up. The engine never includes Gloo: it
// sees only traind/engine/communicator.h; the job runner (worker/, `traind run`) opens a
// communicator here and passes it in RunOptions.
//
// Rendezvous (torchrun's TCPStore role): rank 0 hosts a small key/value store on
// master_addr:master_port; every rank connects to it (retrying until the rendezvous timeout), claims
// its rank under the job/attempt prefix (a second process claiming the same rank is refused), and
// waits for all the others; a rank that never comes is named in the error ("rank 1 never joined").
// Then Gloo's full mesh is connected through the same store and the ranks meet at a barrier.
//
// Collectives: fp32 sums through gloo::allreduce (ring; every rank receives the same bits);
// bf16/f16 buffers are widened to fp32, summed in fp32 and rounded back (round to nearest even);
// ReduceScatterSum is an all-reduce of the whole input (not bandwidth-optimal yet); AllGather,
// Broadcast and Barrier are Gloo's. A collective that does not finish within the collective
// timeout, or whose peer went away, returns DEADLINE_EXCEEDED / UNAVAILABLE with Gloo's message
// (which names the peer's address) and this rank.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "traind/engine/communicator.h"
#include "traind/engine/job_spec.h"
#include "traind/engine/status.h"

namespace traind::comm {

struct GlooOptions {
  int world_size = 1;
  int rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29400;
  // Prepended to every rendezvous key: the job and the attempt ("traind/<job>/<attempt>/"), so a
  // restarted attempt never meets a stale one's keys.
  std::string prefix = "traind/job/0/";
  // How long a rank waits for the store (rank 0) and for every other rank to join.
  std::chrono::milliseconds rendezvous_timeout{60000};
  // How long one collective may take before it fails (a dead or hung peer).
  std::chrono::milliseconds collective_timeout{600000};
  // The address the other ranks reach this rank's Gloo device at: empty = 127.0.0.1 when
  // master_addr is a loopback address, else this host's name. `iface` (GLOO_SOCKET_IFNAME) wins.
  std::string hostname;
  std::string iface;
};

// Rendezvous and a connected Gloo context. UNAVAILABLE naming the missing ranks (or rank 0, the
// store's host) when the world does not assemble within rendezvous_timeout; INVALID_ARGUMENT for
// a bad rank / world size, a rank taken twice, or ranks that disagree on the world size.
Result<std::unique_ptr<engine::Communicator>> OpenGlooCommunicator(const GlooOptions& options);

// The spec's `distributed:` block completed from the environment (WORLD_SIZE, RANK, MASTER_ADDR,
// MASTER_PORT as torchrun / PyTorchJob set them; TRAIND_DIST_TIMEOUT_S for the rendezvous timeout,
// TRAIND_DIST_COLLECTIVE_TIMEOUT_S for collectives, TRAIND_DIST_ATTEMPT for the key prefix's
// attempt, GLOO_SOCKET_IFNAME for the interface). Errors name the field
// ("distributed.rank: not set and RANK is not in the environment").
using GetEnv = std::function<const char*(const char*)>;
Result<GlooOptions> ResolveDistributed(const engine::JobSpec& spec, const GetEnv& getenv);

// RunOptions::open_communicator for the job runner: ResolveDistributed with the process's
// environment, then OpenGlooCommunicator; null for a world of one.
Result<std::unique_ptr<engine::Communicator>> OpenCommunicatorForJob(const engine::JobSpec& spec);

}  // namespace traind::comm
