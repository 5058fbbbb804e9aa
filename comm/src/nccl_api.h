// NCCL's entry points, loaded at run time (dlopen) instead of linked. A process that has
// libnccl.so.2 loaded crashes in civetweb's worker threads (prometheus-cpp's exposer: the daemon's
// /metrics, "segfault at 308" in __pthread_disable_asynccancel, the thread's TCB overwritten) on
// the first scrape during a job, measured with NCCL 2.28.9 both linked and LD_PRELOADed; so only a
// process that opens a NCCL communicator (a job runner on cuda:N) ever loads it, and the daemon
// never does.
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
};

// The table, loaded once (thread-safe): libnccl.so.2 from the loader's path, else the library
// CMake found (TRAIND_NCCL_LIBRARY_PATH). FAILED_PRECONDITION naming the library and dlerror()
// when it or a symbol cannot be loaded.
Result<const NcclApi*> LoadNccl();

}  // namespace traind::comm
