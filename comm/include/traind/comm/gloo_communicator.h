// comm/: engine::Communicator over Gloo (Debian's libgloo-dev, TCP transport) for data-parallel
// runs on the CPU backend (host buffers). The engine never includes Gloo: it
// sees only traind/engine/communicator.h; the job runner (worker/, `traind run`) opens a
// communicator here and passes it in RunOptions.
//
// Rendezvous: comm's shared one (traind/comm/distributed.h, the same as NCCL's): rank 0 hosts a
// small key/value store on master_addr:master_port; every rank connects to it (retrying until the
// rendezvous timeout), claims its rank under the job/attempt prefix (a second process claiming the
// same rank is refused), and waits for all the others; a rank that never comes is named in the
// error ("rank 1 never joined"). Then Gloo's full mesh is connected through the same store and the
// ranks meet at a barrier.
//
// Collectives: fp32 sums through gloo::allreduce (ring; every rank receives the same bits);
// bf16/f16 buffers are widened to fp32, summed in fp32 and rounded back (round to nearest even);
// ReduceScatterSum and ReduceScatterSumInPlace (a count per rank) are a ring on Gloo's transport
// (each rank sends every range but its own once; a range's sum is added from the rank after its
// owner round to the owner, in fp32); AllGatherInPlace (a count per rank) is the matching ring;
// AllGather,
// Broadcast and Barrier are Gloo's. A collective that does not finish within the collective
// timeout, or whose peer went away, returns DEADLINE_EXCEEDED / UNAVAILABLE with Gloo's message
// (which names the peer's address) and this rank.
#pragma once

#include <memory>

#include "traind/comm/distributed.h"
#include "traind/engine/communicator.h"
#include "traind/engine/status.h"

namespace traind::comm {

// The rendezvous options, hostname/iface included (Gloo's device address).
using GlooOptions = DistributedOptions;

// Rendezvous and a connected Gloo context. UNAVAILABLE naming the missing ranks (or rank 0, the
// store's host) when the world does not assemble within rendezvous_timeout; INVALID_ARGUMENT for
// a bad rank / world size, a rank taken twice, or ranks that disagree on the world size.
Result<std::unique_ptr<engine::Communicator>> OpenGlooCommunicator(const GlooOptions& options);

}  // namespace traind::comm
