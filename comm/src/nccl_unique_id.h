// The NCCL unique id's trip through the shared rendezvous store: the part of OpenNcclCommunicator
// between the rendezvous and ncclCommInitRank, which needs no GPU (ncclGetUniqueId only opens
// NCCL's bootstrap socket). Private to comm/ (tests/comm calls it with threads as ranks).
#pragma once

#include <string>

#include "rendezvous.h"
#include "traind/engine/status.h"

namespace traind::comm {

// Rank 0: ncclGetUniqueId, published under <prefix>nccl/unique_id; every other rank waits for it
// (until rv.deadline, naming rank 0). Returns the id's bytes (NCCL_UNIQUE_ID_BYTES of them) on
// every rank. INTERNAL with NCCL's message when rank 0 cannot create one; INVALID_ARGUMENT when
// the published value has the wrong size (another NCCL version on rank 0).
Result<std::string> ShareNcclUniqueId(Rendezvous& rv, int rank);

}  // namespace traind::comm
