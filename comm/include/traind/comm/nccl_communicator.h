// comm/: engine::Communicator over NCCL (from the CUDA toolkit) for data-parallel runs on the CUDA
// backend: buffers are device memory of cuda:N. Built only with the CUDA backend (traind_comm then
// compiles with TRAIND_HAVE_NCCL=1; comm::NcclBuilt() says so at run time). No CUDA or NCCL type
// appears here.
//
// Set-up: comm's shared rendezvous (traind/comm/distributed.h: rank 0's store, ranks claimed,
// "rank N never joined"), then rank 0 creates the NCCL unique id (ncclGetUniqueId) and publishes
// it in the same store under <prefix>nccl/unique_id; the others read it; every rank initialises
// its communicator with ncclCommInitRankConfig in non-blocking mode and polls
// ncclCommGetAsyncError until it is ready; ncclCommAbort + UNAVAILABLE "timed out" naming the rank
// when that takes longer than the rendezvous timeout (a peer died after the rendezvous). Then a
// barrier. (traind's Status has no DEADLINE_EXCEEDED: timeouts are UNAVAILABLE, as Gloo's are.)
//
// Collectives, synchronous like Gloo's: each is issued on the communicator's own stream and
// waited for before returning (the caller has made the inputs final: the trainer synchronizes its
// backend, the gradient buckets wait for their backend marker). Each call sets the device first,
// so any one thread at a time may call (the trainer's, or the buckets' communication thread). fp32 sums are
// ncclAllReduce / ncclReduceScatter (ncclSum on ncclFloat; ReduceScatterSumInPlace, a count per
// rank: one in-place ncclReduce per non-empty range, rooted at its owner, in one NCCL group;
// AllGatherInPlace likewise with ncclBroadcast);
// bf16/f16 buffers are widened to an fp32
// device scratch buffer by a small kernel, summed in fp32 and rounded back to nearest even;
// AllGather and Broadcast move bytes (ncclAllGather / ncclBroadcast on ncclUint8); Barrier is a
// one-float all-reduce. Host buffers (the trainer's small scalar gathers) are staged through a
// device buffer. While a collective runs, the stream and ncclCommGetAsyncError are polled; a peer
// that went away (NCCL's remote / system error) gives UNAVAILABLE "a peer went away", one that
// hangs past the collective timeout UNAVAILABLE "timed out after N s", each after ncclCommAbort,
// with ncclGetErrorString, NCCL's last error and this rank; other NCCL / CUDA failures INTERNAL. A communicator that failed once refuses every later call.
#pragma once

#include <memory>

#include "traind/comm/distributed.h"
#include "traind/engine/communicator.h"
#include "traind/engine/status.h"

namespace traind::comm {

// Rendezvous and an initialised NCCL communicator on CUDA device `cuda_device` (this process's
// device: the job's cuda:N). FAILED_PRECONDITION naming NCCL and the device, before any
// rendezvous, when this machine has no such CUDA device (no GPU, no driver); the rendezvous's
// errors as OpenGlooCommunicator's; UNAVAILABLE when NCCL's initialisation times out or a peer
// fails it, INTERNAL for NCCL's other errors.
Result<std::unique_ptr<engine::Communicator>> OpenNcclCommunicator(const DistributedOptions& options,
                                                                   int cuda_device);

}  // namespace traind::comm
