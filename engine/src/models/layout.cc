// Model layout: dimensions, the parameter table helper and the buffer plan (see layout.h).
#include "models/layout.h"
#include "models/quantized_base.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ostream>
#include <set>

#include "models/hf_config.h"

namespace traind::engine {
namespace {

constexpr int64_t kAlign = 64;  // bytes; every sub-buffer starts on a 64-byte boundary
int64_t AlignUp(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

const char* CategoryName(int c) {
  static const char* kNames[] = {"weights", "gradients", "optimizer", "activations", "temporary"};
  return kNames[c];
}

using Norm = FamilyFeatures::Norm;
using Pos = FamilyFeatures::Positions;
using Mlp = FamilyFeatures::Mlp;
using Names = HfConfigRow::Names;

const std::vector<std::string> kGpt2Lora = {"c_attn", "c_proj", "c_fc"};
const std::vector<std::string> kLlamaLora = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                             "gate_proj", "up_proj", "down_proj"};

// The families, in Arch order. GPT-2 (LayerNorm, learned positions, GELU-tanh MLP, biases) and
// LLaMA (RMSNorm, rotary positions, SwiGLU MLP, no biases), both causal and pre-LN; BERT
// (LayerNorm, learned positions, GELU-erf MLP, biases), bidirectional with a padding mask and
// post-LN. Function-local: the rows hold vectors, and ParseArch may run during static init.
const std::vector<ModelFamily>& Families() {
  static const std::vector<ModelFamily> kFamilies = {
      {Arch::kGpt2, "gpt2", /*built=*/true,
       {Norm::kLayerNorm, Pos::kLearned, Mlp::kGeluTanh, /*bias=*/true, /*causal=*/true,
        /*pre_ln=*/true},
       Gpt2Params,
       {Names::kGpt2, "GPT2LMHeadModel", Gpt2ConfigDefaults, /*attention_bias_key=*/false,
        /*sliding_window_key=*/false, /*experts_keys=*/false, /*kv_heads_default_heads=*/true,
        /*always_tied=*/true},
       kGpt2Lora, {"c_attn"}, /*generation=*/true, /*lora_fan_in_fan_out=*/true},
      {Arch::kLlama, "llama", true,
       {Norm::kRmsNorm, Pos::kRotary, Mlp::kSwiGlu, /*bias=*/false, true, true},
       LlamaParams,
       {Names::kLlama, "LlamaForCausalLM", LlamaConfigDefaults, /*attention_bias_key=*/true,
        false, false, /*kv_heads_default_heads=*/true, false, "silu",
        R"({"mlp_bias": false, "pretraining_tp": 1})"},
       kLlamaLora, {"q_proj", "v_proj"}, true},
      // Mistral: llama's blocks with sliding-window attention (config sliding_window).
      {Arch::kMistral, "mistral", true,
       {Norm::kRmsNorm, Pos::kRotary, Mlp::kSwiGlu, false, true, true},
       LlamaParams,
       {Names::kLlama, "MistralForCausalLM", MistralConfigDefaults, false,
        /*sliding_window_key=*/true, false, /*kv_heads_default_heads=*/false, false},
       kLlamaLora, {"q_proj", "v_proj"}, true},
      // Qwen2 / Qwen2.5: llama's blocks with q/k/v biases (none on o_proj).
      {Arch::kQwen2, "qwen2", true,
       {Norm::kRmsNorm, Pos::kRotary, Mlp::kSwiGlu, false, true, true, /*moe=*/false,
        /*qkv_bias=*/true},
       LlamaParams,
       {Names::kLlama, "Qwen2ForCausalLM", Qwen2ConfigDefaults, false, false, false,
        /*kv_heads_default_heads=*/true, false, "silu",
        R"({"use_sliding_window": false, "sliding_window": null})",
        /*use_sliding_window_key=*/true},
       kLlamaLora, {"q_proj", "v_proj"}, true},
      // Qwen3: llama's blocks with an RMSNorm over each head of q and k before RoPE.
      {Arch::kQwen3, "qwen3", /*built=*/true,
       {Norm::kRmsNorm, Pos::kRotary, Mlp::kSwiGlu, false, true, true, false, false,
        /*qk_norm=*/true},
       LlamaParams,
       {Names::kLlama, "Qwen3ForCausalLM", Qwen3ConfigDefaults, /*attention_bias_key=*/true,
        false, false, /*kv_heads_default_heads=*/true, false, "silu",
        R"({"use_sliding_window": false, "sliding_window": null})",
        /*use_sliding_window_key=*/true},
       kLlamaLora, {"q_proj", "v_proj"}, true},
      // Gemma: embeddings scaled by sqrt(hidden_size), RMSNorm as x * (1 + w), GeGLU (tanh).
      {Arch::kGemma, "gemma", /*built=*/true,
       {Norm::kRmsNormPlusOne, Pos::kRotary, Mlp::kGeGluTanh, false, true, true, false, false,
        false, /*embed_scale=*/true},
       LlamaParams,
       {Names::kLlama, "GemmaForCausalLM", GemmaConfigDefaults, /*attention_bias_key=*/true,
        false, false, false, false, "gelu_pytorch_tanh",
        R"({"hidden_activation": "gelu_pytorch_tanh"})"},
       kLlamaLora, {"q_proj", "v_proj"}, true},
      {Arch::kBert, "bert", true,
       {Norm::kLayerNorm, Pos::kLearned, Mlp::kGeluErf, /*bias=*/true, /*causal=*/false,
        /*pre_ln=*/false},
       BertParams,
       {Names::kBert, nullptr, BertConfigDefaults, false, false, false, true,
        /*always_tied=*/true},
       {}, {}, /*generation=*/false},
      {Arch::kMixtral, "mixtral", true,
       {Norm::kRmsNorm, Pos::kRotary, Mlp::kSwiGlu, false, true, true, /*moe=*/true},
       LlamaParams,
       {Names::kLlama, "MixtralForCausalLM", MixtralConfigDefaults, false,
        /*sliding_window_key=*/true, /*experts_keys=*/true, false, false, "silu",
        R"({"router_jitter_noise": 0.0})"},
       {}, {}, true},
  };
  return kFamilies;
}

}  // namespace

const ModelFamily& FamilyOf(Arch arch) {
  const std::vector<ModelFamily>& rows = Families();
  const size_t i = static_cast<size_t>(arch);
  if (rows.size() != kNumArchs || i >= rows.size() || rows[i].arch != arch) {
    std::fprintf(stderr, "traind: the family table is not in Arch order (%d rows)\n",
                 static_cast<int>(rows.size()));
    std::abort();
  }
  return rows[i];
}

const char* ArchName(Arch arch) { return FamilyOf(arch).model_type; }

std::optional<Arch> ParseArch(std::string_view name) {
  for (const ModelFamily& f : Families()) {
    if (name == f.model_type) return f.arch;
  }
  return std::nullopt;
}

std::ostream& operator<<(std::ostream& os, Arch arch) { return os << ArchName(arch); }

std::string KnownFamilies() {
  std::string s;
  for (const ModelFamily& f : Families()) {
    if (f.built) s += (s.empty() ? "" : ", ") + std::string(f.model_type);
  }
  return s;
}

// ModelConfig's views, from the family's key names (job_spec.h).
namespace {
bool Gpt2Names(const ModelConfig& c) { return FamilyOf(c.arch).hf.names == Names::kGpt2; }
}  // namespace
bool ModelConfig::encoder() const { return !FamilyOf(arch).features.causal; }
int64_t ModelConfig::num_layers() const { return Gpt2Names(*this) ? n_layer : num_hidden_layers; }
int64_t ModelConfig::channels() const { return Gpt2Names(*this) ? n_embd : hidden_size; }
int64_t ModelConfig::num_heads() const { return Gpt2Names(*this) ? n_head : num_attention_heads; }
int64_t ModelConfig::head_size() const {
  const int64_t nh = num_heads();
  if (head_dim > 0 && FamilyOf(arch).hf.names == Names::kLlama) return head_dim;
  return nh > 0 ? channels() / nh : 0;
}
int64_t ModelConfig::num_kv_heads() const {
  switch (FamilyOf(arch).hf.names) {
    case Names::kGpt2: return n_head;
    case Names::kBert: return num_attention_heads;
    case Names::kLlama: return num_key_value_heads;
  }
  return num_key_value_heads;
}
int64_t ModelConfig::max_positions() const {
  return Gpt2Names(*this) ? n_positions : max_position_embeddings;
}
const char* ModelConfig::max_positions_key() const {
  return Gpt2Names(*this) ? "n_positions" : "max_position_embeddings";
}
int64_t ModelConfig::mlp_width() const { return Gpt2Names(*this) ? 4 * n_embd : intermediate_size; }
double ModelConfig::norm_eps() const {
  switch (FamilyOf(arch).hf.names) {
    case Names::kGpt2: return layer_norm_epsilon;
    case Names::kBert: return layer_norm_eps;
    case Names::kLlama: return rms_norm_eps;
  }
  return rms_norm_eps;
}
bool ModelConfig::tied_embeddings() const {
  return FamilyOf(arch).hf.always_tied || tie_word_embeddings;
}

ArchDims MakeArchDims(const ModelConfig& config) {
  ArchDims d;
  d.family = &FamilyOf(config.arch);
  d.V = config.vocab_size;
  d.Vp = AlignUp(config.vocab_size, 64);
  d.C = config.channels();
  d.L = config.num_layers();
  d.NH = config.num_heads();
  d.NKV = config.num_kv_heads();
  d.HS = config.head_size();
  d.H = config.mlp_width();
  d.max_T = config.max_positions();
  d.eps = static_cast<float>(config.norm_eps());
  if (d.moe()) {
    d.E = config.num_local_experts;
    d.K = config.num_experts_per_tok;
    d.aux_coef = config.output_router_logits ? config.router_aux_loss_coef : 0.0;
  }
  d.type_vocab = config.type_vocab_size;
  d.head = config.head;
  d.num_labels = config.num_labels;
  d.rope_theta = static_cast<float>(config.rope_theta);
  if (d.rotary()) {
    const ModelConfig::RopeScaling& rs = config.rope_scaling;
    d.rope_scaling.kind = rs.rope_type == "linear"   ? RopeScaling::kLinear
                          : rs.rope_type == "llama3" ? RopeScaling::kLlama3
                                                     : RopeScaling::kNone;
    d.rope_scaling.factor = static_cast<float>(rs.factor);
    d.rope_scaling.low_freq_factor = static_cast<float>(rs.low_freq_factor);
    d.rope_scaling.high_freq_factor = static_cast<float>(rs.high_freq_factor);
    d.rope_scaling.original_max_positions =
        static_cast<float>(rs.original_max_position_embeddings);
    d.window = config.sliding_window;
    d.qkv_bias = d.f().qkv_bias || config.attention_bias;
    d.proj_bias = config.attention_bias;
  }
  d.tied = config.tied_embeddings();
  return d;
}

nn::AttentionShape AttentionShapeOf(const ArchDims& d, int64_t B, int64_t T) {
  nn::AttentionShape s;
  s.B = B;
  s.T = T;
  s.NH = d.NH;
  s.NKV = d.NKV;
  s.HS = d.HS;
  s.rope = d.rotary();
  s.rope_theta = d.rope_theta;
  s.rope_scaling = d.rope_scaling;
  s.causal = d.f().causal;
  s.window = d.window;
  return s;
}

std::vector<Fp32ResidentTensor> Fp32ResidentTensors(const ParamTable& table) {
  std::set<int64_t> gemm_only;  // read only through DecoderModel::W (the compute type)
  for (const LayerParams& l : table.layers) {
    for (int64_t w : {l.qkv_w, l.proj_w, l.up_w, l.down_w, l.router_w}) gemm_only.insert(w);
    gemm_only.insert(l.expert_up.begin(), l.expert_up.end());
    gemm_only.insert(l.expert_down.begin(), l.expert_down.end());
    gemm_only.insert(l.fused_parts.begin(), l.fused_parts.end());
  }
  if (table.lm_head != table.wte) gemm_only.insert(table.lm_head);  // tied: also the lookup's
  std::vector<Fp32ResidentTensor> out;
  int64_t packed = 0;
  for (const ParamInfo& p : table.infos) {
    if (gemm_only.count(p.offset) != 0) continue;
    out.push_back({p.offset, p.numel, packed});
    packed += p.numel;
  }
  return out;
}

int64_t Fp32WeightElems(const ParamTable& table, const ModelOptions& o) {
  // QLoRA in fp32: the table without its 4-bit tensors; in 16 bits the resident tensors.
  if (o.quant4.enabled && o.compute_type == DType::kF32) {
    return table.total - MakeQuant4Layout(table).elements;
  }
  if ((!o.master_weights_off_device && !o.quant4.enabled) || o.compute_type == DType::kF32) {
    return table.total;
  }
  int64_t n = 0;
  for (const Fp32ResidentTensor& t : o.quant4.enabled ? QLoraResidentTensors(table, o)
                                                      : Fp32ResidentTensors(table)) {
    n += t.numel;
  }
  return n;
}

int64_t ParamTable::Add(std::string hf_name, std::vector<int64_t> shape,
                        std::vector<int64_t> hf_shape, ParamExtra extra, bool weight_decay) {
  ParamInfo info;
  info.hf_name = std::move(hf_name);
  info.numel = 1;
  for (int64_t s : shape) info.numel *= s;
  info.shape = std::move(shape);
  info.hf_shape = std::move(hf_shape);
  info.offset = total;
  info.weight_decay = weight_decay;
  total += info.numel;
  infos.push_back(std::move(info));
  extras.push_back(extra);
  return infos.back().offset;
}

void BufferPlanner::AddRaw(MemoryCategory c, int64_t bytes, void** slot) {
  // Each sub-buffer starts aligned; the category's total is not padded past its last buffer,
  // so a category holding one buffer (weights, gradients) is exactly that buffer's bytes.
  const int ci = static_cast<int>(c);
  const int64_t offset = AlignUp(size_[ci], kAlign);
  entries_.push_back({ci, offset, slot});
  size_[ci] = offset + bytes;
}

MemoryBytes BufferPlanner::bytes() const {
  MemoryBytes b;
  b.weights = size_[static_cast<int>(MemoryCategory::kWeights)];
  b.gradients = size_[static_cast<int>(MemoryCategory::kGradients)];
  b.optimizer = size_[static_cast<int>(MemoryCategory::kOptimizer)];
  b.activations = size_[static_cast<int>(MemoryCategory::kActivations)];
  b.temporary = size_[static_cast<int>(MemoryCategory::kTemporary)];
  return b;
}

Status BufferPlanner::Allocate(DeviceArena* arena) {
  std::array<char*, 5> base{};
  for (int c = 0; c < 5; ++c) {
    if (size_[c] == 0) continue;
    TRAIND_ASSIGN_OR_RETURN(void* p, arena->Allocate(static_cast<MemoryCategory>(c), size_[c],
                                                     std::string("model ") + CategoryName(c)));
    base[c] = static_cast<char*>(p);
  }
  for (const Entry& e : entries_) *e.slot = base[e.category] + e.offset;
  return Status::Ok();
}

CheckpointLayout MakeCheckpointLayout(const ArchDims& d, const ModelOptions& o) {
  CheckpointLayout c;
  const bool ckpt = o.gradient_checkpointing;
  c.k = ckpt ? std::min(o.checkpoint_every, d.L) : 1;
  c.n_kept = (d.L + c.k - 1) / c.k;
  c.n_sets = ckpt ? c.k : d.L;
  return c;
}

void BackwardBySegments(int64_t L, const ModelOptions& o, const std::function<void(int64_t)>& forward,
                        const std::function<void(int64_t)>& backward) {
  const bool ckpt = o.gradient_checkpointing;
  const int64_t k = ckpt ? std::min(o.checkpoint_every, L) : L;
  const int64_t n_seg = (L + k - 1) / k;
  for (int64_t s = n_seg - 1; s >= 0; --s) {
    const int64_t first = s * k;
    const int64_t last = std::min(L, first + k);  // exclusive
    if (ckpt && s != n_seg - 1) {
      for (int64_t l = first; l < last; ++l) forward(l);
    }
    for (int64_t l = last - 1; l >= first; --l) backward(l);
  }
}

int64_t LogitsChunkRows(const ArchDims& d, const ModelOptions& o) {
  const int64_t N = o.micro_batch * o.seq_len;
  if (o.logits_chunk_rows > 0) return std::min(N, o.logits_chunk_rows);
  constexpr int64_t kMinRows = 512;
  const int64_t by_bytes = kLogitsChunkBytes / (d.Vp * static_cast<int64_t>(sizeof(float)));
  return std::min(N, std::max(kMinRows, by_bytes));
}

std::vector<PackedWeight> PackedWeights(const ArchDims& d, const ModelOptions& o) {
  std::vector<PackedWeight> w;
  if (!o.pack_weights || !CpuPacksGemmB(o.compute_type)) return w;
  if (o.quant4.enabled) return w;  // QLoRA: the block weights exist only in the scratch
  if (o.compute_type == DType::kF32) {
    if (LogitsChunkRows(d, o) < o.micro_batch * o.seq_len) {
      w.push_back({PackedWeight::kLmHead, -1, d.C, d.Vp});
    }
    return w;
  }
  if (o.compute_type != DType::kBF16) return w;
  for (int64_t l = 0; l < d.L; ++l) {
    w.push_back({PackedWeight::kQkv, l, d.C, d.qkv_width()});
    w.push_back({PackedWeight::kProj, l, d.NH * d.HS, d.C});
    if (!d.moe()) {
      w.push_back({PackedWeight::kUp, l, d.C, d.up_width()});
      w.push_back({PackedWeight::kDown, l, d.H, d.C});
    }
  }
  w.push_back({PackedWeight::kLmHead, -1, d.C, d.Vp});
  return w;
}

int64_t PackedCopyBytes(int64_t K, int64_t N, DType type) {
  const int64_t kblock = type == DType::kBF16 ? 32 : 16;
  return (K + kblock - 1) / kblock * kblock * ((N + 63) / 64 * 64) *
         static_cast<int64_t>(DTypeSize(type));
}

bool PacksInputGradientLayout(DType type) { return type == DType::kBF16; }

int64_t PackedWeightBytes(const ArchDims& d, const ModelOptions& o) {
  const DType type = o.compute_type;
  int64_t bytes = 0;
  for (const PackedWeight& w : PackedWeights(d, o)) {
    bytes += PackedCopyBytes(w.in, w.out, type);
    if (PacksInputGradientLayout(type)) bytes += PackedCopyBytes(w.out, w.in, type);
  }
  return bytes;
}

int64_t PackedActivationBytes(const ArchDims& d, const ModelOptions& o) {
  const int64_t N = o.micro_batch * o.seq_len;
  if (!o.pack_weights || o.compute_type != DType::kBF16 || N < kMinPackedActivationRows) return 0;
  if (!CpuPacksGemmB(o.compute_type)) return 0;
  if (o.lora.enabled()) return 0;  // a frozen base has no weight-gradient GEMM
  const int64_t width = std::max({d.C, d.NH * d.HS, d.H});
  return PackedCopyBytes(N, width, o.compute_type);
}

// long function: the buffer plan, one buffer a line in the order the step uses them
void PlanBuffers(const ArchDims& d, const ModelOptions& o, int64_t num_params, int64_t fp32_weights,
                 BufferPlanner* p, ModelBuffers* b, int64_t lora_trainable, int64_t lora_per_layer,
                 int64_t lora_max_in) {
  using MC = MemoryCategory;
  const int64_t N = o.micro_batch * o.seq_len;
  const int64_t C = d.C;
  const CheckpointLayout cl = MakeCheckpointLayout(d, o);
  const int64_t n_sets = cl.n_sets;

  const DType t = o.compute_type;
  const bool mixed = t != DType::kF32;

  p->Add(MC::kWeights, fp32_weights, &b->params);
  // QLoRA: the 4-bit store of the blocks' linear weights; the 16-bit copy holds the rest.
  int64_t quantized = 0;
  if (o.quant4.enabled) {
    const Quant4Layout q = MakeQuant4Layout(BuildParams(d));
    if (!q.tensors.empty()) {
      quantized = q.elements;
      p->Add(MC::kWeights, q.code_bytes, &b->q_codes);
      if (o.quant4.double_quant) {
        p->Add(MC::kWeights, q.blocks, &b->q_qabsmax);
        p->Add(MC::kWeights, q.nested_blocks, &b->q_nested);
        p->Add(MC::kWeights, static_cast<int64_t>(q.tensors.size()), &b->q_offsets);
        p->Add(MC::kWeights, 256, &b->q_code);
      } else {
        p->Add(MC::kWeights, q.blocks, &b->q_absmax);
      }
      p->Add(MC::kTemporary, q.largest, t, &b->q_scratch);
    }
  }
  if (mixed) p->Add(MC::kWeights, num_params - quantized, t, &b->params16);
  if (const int64_t packed = PackedWeightBytes(d, o); packed > 0) {
    p->Add(MC::kWeights, packed / static_cast<int64_t>(DTypeSize(t)), t, &b->packed_weights);
  }
  const bool lora = lora_trainable > 0;
  if (lora) {
    p->Add(MC::kWeights, lora_trainable, &b->lora_params);
    p->Add(MC::kGradients, lora_trainable, &b->grads);
  } else {
    p->Add(MC::kGradients, num_params, &b->grads);
  }

  p->Add(MC::kActivations, N, &b->inputs);
  p->Add(MC::kActivations, N, &b->targets);
  if (!d.rotary()) p->Add(MC::kActivations, N, &b->positions);
  if (o.example_rows) p->Add(MC::kActivations, 2 * N, &b->rows);  // doc_start, positions
  // Residual stream: kept block inputs, k-1 working residuals (checkpointing), the final residual.
  b->res_store.assign(static_cast<size_t>(cl.residuals()), nullptr);
  for (float*& r : b->res_store) p->Add(MC::kActivations, N * C, &r);
  b->block_store.assign(static_cast<size_t>(n_sets), BlockActs{});
  for (BlockActs& a : b->block_store) {
    p->Add(MC::kActivations, N * C, t, &a.ln1);
    if (!d.rms_norm()) p->Add(MC::kActivations, N, &a.ln1_mean);
    p->Add(MC::kActivations, N, &a.ln1_rstd);
    p->Add(MC::kActivations, N * d.qkv_width(), t, &a.qkv);
    if (d.qk_norm()) {
      p->Add(MC::kActivations, N * (d.NH + d.NKV) * d.HS, &a.qk_saved);
      p->Add(MC::kActivations, N * (d.NH + d.NKV), &a.qk_rstd);
    }
    p->Add(MC::kActivations, N * C, &a.res2);
    p->Add(MC::kActivations, N * C, t, &a.ln2);
    if (!d.rms_norm()) p->Add(MC::kActivations, N, &a.ln2_mean);
    p->Add(MC::kActivations, N, &a.ln2_rstd);
    if (d.moe()) {
      const int64_t R = d.moe_rows(N);
      p->Add(MC::kActivations, N * d.E, &a.probs);
      p->Add(MC::kActivations, R, &a.row_token);
      p->Add(MC::kActivations, R, &a.row_weight);
      p->Add(MC::kActivations, R * C, t, &a.xg);
      p->Add(MC::kActivations, R * d.up_width(), &a.h);
      p->Add(MC::kActivations, R * d.H, t, &a.a);
      p->Add(MC::kActivations, R * C, &a.yg);
    } else {
      p->Add(MC::kActivations, N * d.up_width(), &a.h);
      p->Add(MC::kActivations, N * d.H, t, &a.a);
    }
  }
  b->atty_store.assign(static_cast<size_t>(d.L), nullptr);
  b->lse_store.assign(static_cast<size_t>(d.L), nullptr);
  for (int64_t l = 0; l < d.L; ++l) {
    p->Add(MC::kActivations, N * d.attn_width(), t, &b->atty_store[l]);
    p->Add(MC::kActivations, o.micro_batch * d.NH * o.seq_len, &b->lse_store[l]);
  }
  p->Add(MC::kActivations, N * C, t, &b->lnf);
  if (!d.rms_norm()) p->Add(MC::kActivations, N, &b->lnf_mean);
  p->Add(MC::kActivations, N, &b->lnf_rstd);
  b->logits_rows = LogitsChunkRows(d, o);
  p->Add(MC::kActivations, b->logits_rows * d.Vp, &b->logits);
  p->Add(MC::kActivations, N, &b->losses);
  if (d.norm_plus_one()) {  // gemma: the norms' 1 + w (read from forward through backward)
    p->Add(MC::kActivations, (2 * d.L + 1) * C, &b->norm_plus_one);
    p->Add(MC::kActivations, C, &b->ones);
  }

  if (lora) {
    p->Add(MC::kActivations, n_sets * lora_per_layer * N * o.lora.r, &b->lora_u_store);
    p->Add(MC::kTemporary, N * o.lora.r, &b->lora_du);
    p->Add(MC::kTemporary, 2 * std::max(C, d.HS), &b->norm_discard);  // qwen3: q/k_norm's HS
    if (mixed || o.lora.dropout > 0) p->Add(MC::kTemporary, N * lora_max_in, &b->lora_xs);
    if (o.lora.dropout > 0) p->Add(MC::kActivations, 1, &b->dropout_key);
  }
  p->Add(MC::kTemporary, N * C, &b->dres);
  p->Add(MC::kTemporary, N * d.wide(), &b->tmp_c);  // also the attention output (NH*HS wide)
  const int64_t mlp_rows = d.moe() ? d.moe_rows(N) : N;
  p->Add(MC::kTemporary, std::max(N * d.qkv_width(), mlp_rows * d.up_width()), &b->scratch_big);
  if (d.gated()) p->Add(MC::kTemporary, mlp_rows * d.H, &b->scratch_a);
  if (d.moe()) {
    p->Add(MC::kTemporary, mlp_rows * C, &b->moe_rows_a);
    p->Add(MC::kTemporary, mlp_rows * C, &b->moe_rows_b);
    p->Add(MC::kTemporary, N * d.E, &b->router_dlogits);
    p->Add(MC::kTemporary, mlp_rows, &b->row_dweight);
    p->Add(MC::kTemporary, 1, &b->aux_loss);
  }
  if (mixed) {
    // Every gradient entering a GEMM fits whole (N rows of C, qkv_width or up_width), and so
    // does the attention output's (N, attn_width). The logits gradient (N,Vp) goes through in
    // chunks of at least min(N, 512) rows: fewer rows make the lm_head weight-gradient GEMM
    // (K = rows) slow (see README.md, mixed precision), all N rows would cost N*Vp*2 bytes.
    constexpr int64_t kMinLogitRows = 512;
    b->scratch16_elems = std::max({N * d.wide(), N * d.qkv_width(), mlp_rows * d.up_width(),
                                   mlp_rows * C, std::min(N, kMinLogitRows) * d.Vp});
    p->Add(MC::kTemporary, b->scratch16_elems, t, &b->scratch16);
    if (const int64_t room = PackedActivationBytes(d, o); room > 0) {
      p->Add(MC::kTemporary, room / static_cast<int64_t>(DTypeSize(t)), t, &b->packed_activation);
    }
  } else {
    b->scratch16_elems = 0;
  }
}

void ResolveViews(const ArchDims& d, const ModelOptions& o, ModelBuffers* b) {
  const CheckpointLayout cl = MakeCheckpointLayout(d, o);
  b->res.assign(static_cast<size_t>(d.L + 1), nullptr);
  b->blocks.assign(static_cast<size_t>(d.L), BlockActs{});
  for (int64_t l = 0; l <= d.L; ++l) b->res[l] = b->res_store[cl.ResidualSlot(l, d.L)];
  for (int64_t l = 0; l < d.L; ++l) {
    b->blocks[l] = b->block_store[cl.SetOf(l)];
    b->blocks[l].atty = b->atty_store[l];
    b->blocks[l].lse = b->lse_store[l];
  }
}

}  // namespace traind::engine
