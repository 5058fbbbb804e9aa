// StoreOptions checks.
#include "options.h"

#include <string>

namespace traind::offload {

Status ValidateOptions(const StoreOptions& o) {
  auto bad = [](const char* field, uint64_t v, const char* range) {
    return Status::InvalidArgument(std::string("offload option ") + field + " = " + std::to_string(v) +
                                   ": must be " + range);
  };
  if (o.max_chunk_bytes == 0 || o.max_chunk_bytes > (size_t{1} << 31))
    return bad("max_chunk_bytes", o.max_chunk_bytes, "1 .. 2 GiB");
  if (o.max_pending_write_bytes == 0) return bad("max_pending_write_bytes", 0, ">= 1");
  if (o.read_threads < 1 || o.read_threads > 64) return bad("read_threads", o.read_threads, "1 .. 64");
  if (o.write_threads < 0 || o.write_threads > 64)
    return bad("write_threads", o.write_threads, "0 (the store's default) .. 64");
  if (o.write_buffer_bytes < (size_t{1} << 20)) return bad("write_buffer_bytes", o.write_buffer_bytes, ">= 1 MiB");
  if (o.max_write_buffers < 2 || o.max_write_buffers > 16) return bad("max_write_buffers", o.max_write_buffers, "2 .. 16");
  if (o.blob_file_bytes < (uint64_t{1} << 20)) return bad("blob_file_bytes", o.blob_file_bytes, ">= 1 MiB");
  if (o.max_background_jobs < 1 || o.max_background_jobs > 64)
    return bad("max_background_jobs", o.max_background_jobs, "1 .. 64");
  return Status::Ok();
}

}  // namespace traind::offload
