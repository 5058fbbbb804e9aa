#include "nccl_api.h"

#include <dlfcn.h>

#include <string>
#include <type_traits>

namespace traind::comm {
namespace {

Result<const NcclApi*> Load() {
  std::string tried;
  void* lib = nullptr;
  for (const char* name : {"libnccl.so.2", TRAIND_NCCL_LIBRARY_PATH}) {
    lib = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) break;
    const char* err = ::dlerror();
    tried += std::string(tried.empty() ? "" : "; ") + (err != nullptr ? err : name);
  }
  if (lib == nullptr) {
    return Status::FailedPrecondition("nccl: cannot load NCCL (" + tried + ")");
  }
  static NcclApi api;
  std::string missing;
  auto get = [&](auto* slot, const char* symbol) {
    void* p = ::dlsym(lib, symbol);
    if (p == nullptr) missing += std::string(missing.empty() ? "" : ", ") + symbol;
    *slot = reinterpret_cast<std::remove_pointer_t<decltype(slot)>>(p);
  };
  get(&api.GetUniqueId, "ncclGetUniqueId");
  get(&api.GetLastError, "ncclGetLastError");
  get(&api.GetErrorString, "ncclGetErrorString");
  get(&api.CommInitRankConfig, "ncclCommInitRankConfig");
  get(&api.CommGetAsyncError, "ncclCommGetAsyncError");
  get(&api.CommAbort, "ncclCommAbort");
  get(&api.CommDestroy, "ncclCommDestroy");
  get(&api.CommFinalize, "ncclCommFinalize");
  get(&api.AllReduce, "ncclAllReduce");
  get(&api.ReduceScatter, "ncclReduceScatter");
  get(&api.AllGather, "ncclAllGather");
  get(&api.Broadcast, "ncclBroadcast");
  get(&api.Reduce, "ncclReduce");
  get(&api.GroupStart, "ncclGroupStart");
  get(&api.GroupEnd, "ncclGroupEnd");
  if (!missing.empty()) {
    return Status::FailedPrecondition("nccl: the loaded NCCL lacks " + missing +
                                      " (NCCL 2.19 or later is needed)");
  }
  return &api;
}

}  // namespace

Result<const NcclApi*> LoadNccl() {
  static const Result<const NcclApi*> loaded = Load();
  return loaded;
}

}  // namespace traind::comm
