// ReadEngineEnvironment (environment.h): the engine's one reader of environment variables.
#include "core/environment.h"

#include <cstdlib>
#include <string>

namespace traind::engine {
namespace {

const char* ProcessEnv(const char* name) { return std::getenv(name); }

}  // namespace

EngineEnvironment ReadEngineEnvironment(const char* (*getenv)(const char*)) {
  if (getenv == nullptr) getenv = ProcessEnv;
  // The value of `name`, or nullptr when it is unset or empty.
  auto get = [getenv](const char* name) -> const char* {
    const char* v = getenv(name);
    return v != nullptr && *v != '\0' ? v : nullptr;
  };
  auto u64 = [&](const char* name) -> std::optional<uint64_t> {
    const char* v = get(name);
    if (v == nullptr) return std::nullopt;
    return std::strtoull(v, nullptr, 10);
  };
  EngineEnvironment e;
  if (const char* v = get("TRAIND_DIST_BUCKET_MB")) e.dist_bucket_mb = v;
  if (const char* v = getenv("TRAIND_CUDA_GRAPHS")) e.cuda_graphs_off = std::string(v) == "0";
  if (const char* v = getenv("TRAIND_CPU_GEMM")) e.cpu_gemm_openblas = std::string(v) == "openblas";
  if (const char* v = getenv("TRAIND_CUBLASLT_EPILOGUES")) {
    e.cublaslt_epilogues_off = std::string(v) == "0";
  }
  if (const char* v = get("TRAIND_CUDNN_SDPA")) {
    const std::string on(v);
    e.cudnn_sdpa_on = on == "1" || on == "on" || on == "true";
  }
  if (const char* v = get("TRAIND_SENTENCEPIECE_SHIM")) e.sentencepiece_shim = v;
  if (const char* d = get("TRAIND_TOKEN_CACHE_DIR")) {
    e.token_cache_dir = d;
  } else if (const char* x = get("XDG_CACHE_HOME")) {
    e.token_cache_dir = std::string(x) + "/traind/tokens";
  } else if (const char* h = get("HOME")) {
    e.token_cache_dir = std::string(h) + "/.cache/traind/tokens";
  }
  e.simt_seed = u64("TRAIND_SIMT_SEED");
  e.simt_workers = u64("TRAIND_SIMT_WORKERS");
  e.simt_stack_kb = u64("TRAIND_SIMT_STACK_KB");
  return e;
}

}  // namespace traind::engine
