// KvDecoder: token-by-token inference of a decoder model (gpt2, llama, mixtral) with a key/value cache, for
// generation. Each Step() runs the blocks over ONE new token: its q, k, v rows, RoPE at its
// position, its k|v row appended to the layer's cache, attention of the new query against the
// cached rows (Backend::AttentionDecode), then the MLP and, at the end, the logits of the next
// token. No full re-run per token: a step costs ~2 * (parameters) FLOPs plus attention over the
// cache. Activations in fp32 on every backend; the weights are read from a flat fp32 buffer laid
// out as the family's parameter table (Model::param_data(), or weights loaded with HfToFlat), or
// through KvWeights: the GEMM weights in a 16-bit type (a model whose fp32 master weights are off
// the device: its compute copy; each GEMM's input is rounded to that type first, as training's
// forward does) and the embeddings, norms and biases in fp32.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend/arena.h"
#include "backend/backend.h"
#include "models/kv_weights.h"
#include "models/layout.h"
#include "traind/engine/job_spec.h"
#include "traind/engine/plan.h"
#include "traind/engine/status.h"

namespace traind::engine {

class KvDecoder {
 public:
  // `params`: device memory of the parameter table of `config` (fp32), kept alive by the caller.
  // Allocates the cache for `max_len` positions (<= the config's max positions) and the per-token
  // buffers from `arena` (RESOURCE_EXHAUSTED when they do not fit). INVALID_ARGUMENT for a config
  // that is not a causal pre-norm decoder or max_len out of range.
  static Result<std::unique_ptr<KvDecoder>> Create(const ModelConfig& config, const float* params,
                                                   int64_t max_len, DeviceArena* arena);
  // The same with the weights where `weights` says (kept alive by the caller).
  static Result<std::unique_ptr<KvDecoder>> Create(const ModelConfig& config, KvWeights weights,
                                                   int64_t max_len, DeviceArena* arena);
  // The bytes Create() allocates for `max_len` positions: the cache as activations, the per-token
  // buffers as temporary (with 16-bit GEMM weights also the rounded GEMM input and the MLP's fp32
  // activation).
  static MemoryBytes PlanBytes(const ModelConfig& config, int64_t max_len, DType gemm_type = DType::kF32);

  // Appends `token` at position length() and writes the next token's logits (vocab_size floats,
  // host memory) into *logits. FAILED_PRECONDITION when the cache is full; the backend's error
  // when an op failed.
  Status Step(int32_t token, std::vector<float>* logits);
  // Forgets the cached tokens (the next Step is position 0).
  void Reset() { length_ = 0; }
  int64_t length() const { return length_; }
  int64_t max_len() const { return max_len_; }
  int64_t vocab_size() const { return d_.V; }

 private:
  KvDecoder(const ModelConfig& config, KvWeights weights, int64_t max_len, Backend* be);
  const float* P(int64_t offset) const { return offset < 0 ? nullptr : w_.fp32(offset); }
  const void* W(int64_t offset) const { return offset < 0 ? nullptr : w_.gemm(offset); }
  // A GEMM's input `x` (n floats) in the weights' type: x itself, or rounded into in16_.
  const void* In(const float* x, int64_t n);
  // A norm's weight: P(offset), or gemma's 1 + w computed into plus_one_ (valid until the next).
  const float* NormW(int64_t offset);
  // mixtral: ln_ through the router (its logits read back) and the chosen experts into tmp_.
  Status MoeStep(const LayerParams& lp);

  ArchDims d_;
  ParamTable table_;
  KvWeights w_;
  int64_t max_len_;
  Backend* be_;
  int64_t length_ = 0;
  // Device buffers: the caches (L, max_len, 2*NKV*HS) rows [k | v], and one token's activations.
  float* cache_ = nullptr;
  float *x_ = nullptr, *ln_ = nullptr, *mean_ = nullptr, *rstd_ = nullptr, *qkv_ = nullptr;
  float *att_ = nullptr, *tmp_ = nullptr, *h_ = nullptr, *a_ = nullptr, *logits_ = nullptr;
  float *router_ = nullptr, *expert_out_ = nullptr;  // mixtral only
  void* in16_ = nullptr;       // 16-bit GEMM weights: the rounded GEMM input
  float* plus_one_ = nullptr;  // gemma: one norm's 1 + w, then C ones
  float* act_ = nullptr;       // and the MLP's fp32 activation before rounding
  int32_t* ids_ = nullptr;  // {token, position}
};

}  // namespace traind::engine
