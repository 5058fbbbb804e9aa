// The environment variables the engine reads, every one of them, read in one place
// (ReadEngineEnvironment; no other file of engine/ calls getenv, scripts/check_layers.py checks).
// RunJob reads them once per run into its step loop's options; the backends and the data readers
// read them where they start (a backend's construction, a tokenizer's library, the token cache's
// directory), each through this function.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace traind::engine {

struct EngineEnvironment {
  // TRAIND_DIST_BUCKET_MB: data parallel's gradient buckets in MiB, as written (unset or empty:
  // nullopt; the step loop parses it: a number from 0 to 1048576, 0 = one collective after
  // backward, default 4).
  std::optional<std::string> dist_bucket_mb;
  // TRAIND_CUDA_GRAPHS=0: no CUDA graph capture (the escape hatch for a device where capture
  // misbehaves; docs/simt.md). Any other value, or unset: as DeviceOptions::cuda_graphs says.
  bool cuda_graphs_off = false;
  // TRAIND_CPU_GEMM=openblas: the CPU backend's GEMMs on OpenBLAS instead of oneDNN.
  bool cpu_gemm_openblas = false;
  // TRAIND_CUBLASLT_EPILOGUES=0: the CUDA backend adds the bias and GELU in separate kernels
  // instead of cuBLASLt's fused epilogues.
  bool cublaslt_epilogues_off = false;
  // TRAIND_CUDNN_SDPA=1 (or on, true): 16-bit attention forward may take cuDNN's fused SDPA, after
  // its self-check per shape (backend/cuda/cudnn_sdpa.h); unset or any other value: traind's own.
  bool cudnn_sdpa_on = false;
  // TRAIND_SENTENCEPIECE_SHIM: the sentencepiece shim library to load first (empty: none).
  std::string sentencepiece_shim;
  // The token cache's directory: TRAIND_TOKEN_CACHE_DIR, else $XDG_CACHE_HOME/traind/tokens, else
  // $HOME/.cache/traind/tokens; empty when none is set (no cache).
  std::string token_cache_dir;
  // The simt emulator's knobs (nullopt: unset or empty): TRAIND_SIMT_SEED (its scheduling seed),
  // TRAIND_SIMT_WORKERS (its worker threads), TRAIND_SIMT_STACK_KB (each fiber's stack).
  std::optional<uint64_t> simt_seed, simt_workers, simt_stack_kb;
};

// Reads every variable above through `getenv` (the process's by default; a test passes its own).
EngineEnvironment ReadEngineEnvironment(const char* (*getenv)(const char*) = nullptr);

}  // namespace traind::engine
