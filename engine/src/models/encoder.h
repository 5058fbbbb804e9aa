// EncoderModel: the Model of the bert family (HF BertForSequenceClassification /
// BertForMaskedLM semantics): word + position + token-type embeddings and their LayerNorm,
// post-LN blocks (x1 = LN(x + attn(x)), y = LN(x1 + mlp(x1))) with bidirectional attention under
// the padding mask (attention_mask()), exact GELU, and one task head:
//   sequence_classification: pooled = tanh(W_p h[b, 0] + b_p); logits = W_c pooled + b_c;
//                            cross-entropy over num_labels against targets()[0..B)
//   masked_lm: u = LN(gelu(W_t h + b_t)); logits = u wte^T + bias (decoder tied to the word
//              embeddings), cross-entropy over the vocabulary at targets != -1, in row chunks as
//              the decoder's lm-head (the (B*T, vocab) logits are never whole).
// Token types are all 0 (single-segment inputs). Dropout is not applied (traind writes 0.0 into
// the config.json it exports). The word embeddings' padding row gets no gradient from the
// lookup (nn.Embedding(padding_idx=pad_token_id)), only from the tied MLM decoder.
// Memory is planned exactly as the decoder's (PlanEncoderBuffers; plan == arena), with the same
// gradient checkpointing scheme (block inputs of every k-th block kept, segments recomputed).
// The task head runs in fp32 (its GEMMs on the master weights) except the MLM decoder GEMM, which
// uses the compute type as the decoder's lm-head does.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/layout.h"
#include "models/model.h"
#include "nn/linear.h"

namespace traind::engine {

// One encoder block's saved activations (N = B*T rows). 16-bit compute types only: x16 and x1_16
// (the block input and x1 rounded for their GEMMs); in fp32 they are null and the GEMMs read the
// fp32 tensors. qkv and atty are in the compute type.
struct EncoderBlockActs {
  void* x16 = nullptr;      // (N,C) compute type: block input for the qkv GEMM
  void* qkv = nullptr;      // (N,3C) compute type
  void* atty = nullptr;     // (N,C) compute type: attention output
  float* lse = nullptr;     // (B,NH,T)
  float* r1 = nullptr;      // (N,C) x + attention projection (LN1 input)
  float* ln1_mean = nullptr, *ln1_rstd = nullptr;  // (N)
  float* x1 = nullptr;      // (N,C) LN1 output
  void* x1_16 = nullptr;    // (N,C) compute type
  float* h = nullptr;       // (N,H) MLP pre-activation
  void* a = nullptr;        // (N,H) compute type: GELU(h)
  float* r2 = nullptr;      // (N,C) x1 + MLP output (LN2 input)
  float* ln2_mean = nullptr, *ln2_rstd = nullptr;  // (N)
};

struct EncoderBuffers {
  float* params = nullptr;
  void* params16 = nullptr;
  float* grads = nullptr;
  int32_t* inputs = nullptr;     // (N)
  int32_t* targets = nullptr;    // (N)
  int32_t* mask = nullptr;       // (N) attention mask
  int32_t* positions = nullptr;  // (N) n % T
  float* emb = nullptr;          // (N,C) word + position + token type (embedding LN input)
  float* emb_mean = nullptr, *emb_rstd = nullptr;
  std::vector<float*> res_store;  // block inputs (as the decoder's) and the final hidden state
  std::vector<EncoderBlockActs> block_store;
  // Every block's attention output and lse, also with checkpointing (the recompute skips
  // attention; as the decoder's ModelBuffers).
  std::vector<void*> atty_store;
  std::vector<float*> lse_store;
  // Heads. sequence_classification: pooled (B,C) = tanh(...), logits (B, num_labels).
  float* pooled = nullptr;
  // masked_lm: t (N,C) dense output, g (N,C) GELU(t), u (N,C) compute type = LN(g), its stats.
  float* mlm_t = nullptr, *mlm_g = nullptr, *mlm_mean = nullptr, *mlm_rstd = nullptr;
  void* mlm_u = nullptr;
  float* logits = nullptr;  // (logits_rows, logits_width)
  int64_t logits_rows = 0, logits_width = 0;
  float* losses = nullptr;  // (N)
  // temporaries
  float* dres = nullptr;         // (N,C)
  float* tmp_c = nullptr;        // (N,C)
  float* tmp_d = nullptr;        // (N,C)
  float* scratch_big = nullptr;  // (N, max(3C, H))
  float* pad_row = nullptr;      // (C) the word embeddings' padding-row gradient, kept aside
  void* scratch16 = nullptr;
  int64_t scratch16_elems = 0;
  void* packed_activation = nullptr;  // temporary: PackedActivationBytes (layout.h), else null

  std::vector<float*> res;
  std::vector<EncoderBlockActs> blocks;
};

void PlanEncoderBuffers(const ArchDims& d, const ModelOptions& o, int64_t num_params,
                        BufferPlanner* planner, EncoderBuffers* bufs);

class EncoderModel : public Model {
 public:
  // Plans and allocates every buffer from `arena`; the config must already be validated.
  static Result<std::unique_ptr<EncoderModel>> Make(const ModelConfig& config,
                                                    const ModelOptions& options,
                                                    DeviceArena* arena);

  const ModelConfig& config() const override { return config_; }
  const ModelOptions& options() const override { return options_; }
  const std::vector<ParamInfo>& params() const override { return table_.infos; }
  int64_t num_params() const override { return table_.total; }
  float* param_data() override { return bufs_.params; }
  const std::vector<ParamInfo>& trainable_params() const override { return table_.infos; }
  int64_t num_trainable() const override { return table_.total; }
  float* trainable_data() override { return bufs_.params; }
  bool lora() const override { return false; }
  float* grad_data() override { return bufs_.grads; }
  int32_t* inputs() override { return bufs_.inputs; }
  int32_t* targets() override { return bufs_.targets; }
  int32_t* attention_mask() override { return bufs_.mask; }
  int64_t CorrectPredictions() override;

  void InitRandom(uint64_t seed) override;
  // Task-head tensors missing from the file (a pretrained base, or the other head) start from
  // their init (seeded by kHeadInitSeed), as transformers does; NewlyInitialized() names them.
  Status LoadHf(const SafetensorsFile& file) override;
  SafetensorsStream StreamHf(size_t piece_bytes) override;
  std::vector<std::string> NewlyInitialized() const override { return newly_initialized_; }
  static constexpr uint64_t kHeadInitSeed = 0x68656164ull;
  // LoRA is not built for bert (the config validator refuses it).
  void InitAdapters(uint64_t) override {}
  SafetensorsFile ExportAdapters() override { return SafetensorsFile{}; }
  Status LoadAdapters(const SafetensorsFile&) override {
    return Status::Unimplemented("LoRA adapters are not built for bert");
  }
  SafetensorsStream StreamMerged(size_t piece_bytes) override { return StreamHf(piece_bytes); }
  std::vector<std::string> lora_targets() const override { return {}; }
  const float* logits() const override { return bufs_.logits; }
  int64_t logits_stride() const override { return bufs_.logits_width; }
  void ParamsChanged() override;
  void ZeroGrad() override;
  double Forward(bool for_backward, float grad_scale) override;
  void ForwardOnDevice(const float* grad_scale, const float* loss_weight,
                       double* loss_sum) override;
  void Backward() override;

 private:
  EncoderModel(const ModelConfig& config, const ModelOptions& options, DeviceArena* arena);
  bool classifier() const { return d_.head == "sequence_classification"; }
  float* P(int64_t offset) const { return offset < 0 ? nullptr : bufs_.params + offset; }
  float* G(int64_t offset) const { return offset < 0 ? nullptr : bufs_.grads + offset; }
  const void* W(int64_t offset) const;
  // `src` fp32 (N,C) as a GEMM input in the compute type: `dst16` (16-bit) or src itself.
  const void* AsGemmInput(void* dst16, const float* src);
  void ForwardToHidden();  // embeddings and blocks: res[L]
  // recompute: the block's second forward under checkpointing; atty and lse are kept from the
  // first, so attention itself is not run again.
  void BlockForward(int64_t l, bool recompute = false);
  void BlockBackward(int64_t l);  // dres: d(block output) in, d(block input) out
  // The head's forward and loss; with for_backward, the head's gradients up to d(res[L]) (MLM:
  // d u into tmp_c, chunk by chunk; classification: dlogits in place).
  void HeadAndLoss(bool for_backward, float grad_scale, const float* device_scale);
  void HeadBackward();  // d(res[L]) into dres (=)

  ModelConfig config_;
  ModelOptions options_;
  ArchDims d_;
  ParamTable table_;
  Backend* be_;
  EncoderBuffers bufs_;
  int64_t B_, T_, N_;
  bool mixed_ = false;
  bool weights16_stale_ = true;
  nn::GemmPrecision gp_;
  bool ready_for_backward_ = false;
  std::vector<std::string> newly_initialized_;
  std::vector<int32_t> host_targets_;
  std::vector<float> host_losses_;
};

}  // namespace traind::engine
