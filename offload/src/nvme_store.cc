// MakeNvmeStore (offload.h): which persistent store `offload: nvme` opens.
#include "traind/offload/offload.h"

namespace traind::offload {

Result<std::unique_ptr<engine::OptimizerStateStore>> MakeNvmeStore(const std::string& dir,
                                                                   const std::string& kind,
                                                                   const StoreOptions& options) {
  if (kind.empty() || kind == "valuelog") return MakeValueLogStore(dir, options);
  if (kind == "rocksdb") return MakeRocksDbStore(dir, options);
  return Status::InvalidArgument("offload store kind '" + kind +
                                 "' (TRAIND_OFFLOAD_STORE): valuelog (the default) or rocksdb");
}

}  // namespace traind::offload
