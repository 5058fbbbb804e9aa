// NCCL's entry points, loaded at run time (dlopen) instead of linked, so that only a process that
// opens a NCCL communicator (a job runner on cuda:N) ever loads it and the daemon never does.
// Linked, libnccl.so.2 (218 MB) added 12 KiB of static TLS to every thread of every traind process;
// the daemon's /metrics threads (Debian's civetweb gives its workers 100 KiB stacks, from which
// glibc takes all static TLS) then crashed on a scrape during a job. /metrics is served by
// cpp-httplib now (server/metrics.h), which fixes that whatever is loaded; NCCL stays unlinked.
#pragma once

#include <nccl.h>

#include "traind/engine/status.h"

namespace traind::comm {

struct NcclApi {
  decltype(&::ncclGetUniqueId) GetUniqueId;
  decltype(&::ncclGetLastError) GetLastError;
  decltype(&::ncclGetErrorString) GetErrorString;
  decltype(&::ncclCommInitRankConfig) CommInitRankConfig;
  decltype(&::ncclCommGetAsyncError) CommGetAsyncError;
  decltype(&::ncclCommAbort) CommAbort;
  decltype(&::ncclCommDestroy) CommDestroy;
  decltype(&::ncclCommFinalize) CommFinalize;
  decltype(&::ncclAllReduce) AllReduce;
  decltype(&::ncclReduceScatter) ReduceScatter;
  decltype(&::ncclAllGather) AllGather;
  decltype(&::ncclBroadcast) Broadcast;
  decltype(&::ncclReduce) Reduce;
  decltype(&::ncclGroupStart) GroupStart;
  decltype(&::ncclGroupEnd) GroupEnd;
};

// The table, loaded once (thread-safe): libnccl.so.2 from the loader's path, else the library
// CMake found (TRAIND_NCCL_LIBRARY_PATH). FAILED_PRECONDITION naming the library and dlerror()
// when it or a symbol cannot be loaded.
Result<const NcclApi*> LoadNccl();

}  // namespace traind::comm
