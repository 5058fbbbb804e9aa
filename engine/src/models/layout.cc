// Model layout: dimensions, the parameter table helper and the buffer plan (see layout.h).
#include "models/layout.h"

#include <algorithm>
#include <set>

namespace traind::engine {
namespace {

constexpr int64_t kAlign = 64;  // bytes; every sub-buffer starts on a 64-byte boundary
int64_t AlignUp(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

const char* CategoryName(int c) {
  static const char* kNames[] = {"weights", "gradients", "optimizer", "activations", "temporary"};
  return kNames[c];
}

// The families: GPT-2 (LayerNorm, learned positions, GELU-tanh MLP, biases) and LLaMA (RMSNorm,
// rotary positions, SwiGLU MLP, no biases), both causal and pre-LN; BERT (LayerNorm, learned
// positions, GELU-erf MLP, biases), bidirectional with a padding mask and post-LN.
const ModelFamily kFamilies[] = {
    {"gpt2",
     {FamilyFeatures::Norm::kLayerNorm, FamilyFeatures::Positions::kLearned,
      FamilyFeatures::Mlp::kGeluTanh, /*bias=*/true, /*causal=*/true, /*pre_ln=*/true},
     Gpt2Params},
    {"llama",
     {FamilyFeatures::Norm::kRmsNorm, FamilyFeatures::Positions::kRotary,
      FamilyFeatures::Mlp::kSwiGlu, /*bias=*/false, /*causal=*/true, /*pre_ln=*/true},
     LlamaParams},
    // Mistral: llama's blocks with sliding-window attention (config sliding_window).
    {"mistral",
     {FamilyFeatures::Norm::kRmsNorm, FamilyFeatures::Positions::kRotary,
      FamilyFeatures::Mlp::kSwiGlu, /*bias=*/false, /*causal=*/true, /*pre_ln=*/true},
     LlamaParams},
    // Qwen2 / Qwen2.5: llama's blocks with q/k/v biases (none on o_proj).
    {"qwen2",
     {FamilyFeatures::Norm::kRmsNorm, FamilyFeatures::Positions::kRotary,
      FamilyFeatures::Mlp::kSwiGlu, /*bias=*/false, /*causal=*/true, /*pre_ln=*/true,
      /*moe=*/false, /*qkv_bias=*/true},
     LlamaParams},
    {"bert",
     {FamilyFeatures::Norm::kLayerNorm, FamilyFeatures::Positions::kLearned,
      FamilyFeatures::Mlp::kGeluErf, /*bias=*/true, /*causal=*/false, /*pre_ln=*/false},
     BertParams},
    {"mixtral",
     {FamilyFeatures::Norm::kRmsNorm, FamilyFeatures::Positions::kRotary,
      FamilyFeatures::Mlp::kSwiGlu, /*bias=*/false, /*causal=*/true, /*pre_ln=*/true,
      /*moe=*/true},
     LlamaParams},
};

}  // namespace

const ModelFamily* FindFamily(const std::string& arch) {
  for (const ModelFamily& f : kFamilies) {
    if (arch == f.arch) return &f;
  }
  return nullptr;
}

std::string KnownFamilies() {
  std::string s;
  for (const ModelFamily& f : kFamilies) s += (s.empty() ? "" : ", ") + std::string(f.arch);
  return s;
}

ArchDims MakeArchDims(const ModelConfig& config) {
  ArchDims d;
  d.family = FindFamily(config.arch);
  d.V = config.vocab_size;
  d.Vp = AlignUp(config.vocab_size, 64);
  d.C = config.channels();
  d.L = config.num_layers();
  d.NH = config.num_heads();
  d.NKV = config.num_kv_heads();
  d.HS = config.head_size();
  d.H = config.arch == "gpt2" ? 4 * config.n_embd : config.intermediate_size;
  d.max_T = config.max_positions();
  d.eps = static_cast<float>(d.rms_norm()             ? config.rms_norm_eps
                             : config.arch == "bert" ? config.layer_norm_eps
                                                     : config.layer_norm_epsilon);
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
  if (!o.master_weights_off_device || o.compute_type == DType::kF32) return table.total;
  int64_t n = 0;
  for (const Fp32ResidentTensor& t : Fp32ResidentTensors(table)) n += t.numel;
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
  if (mixed) p->Add(MC::kWeights, num_params, t, &b->params16);
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
  // Residual stream: kept block inputs, k-1 working residuals (checkpointing), the final residual.
  b->res_store.assign(static_cast<size_t>(cl.residuals()), nullptr);
  for (float*& r : b->res_store) p->Add(MC::kActivations, N * C, &r);
  b->block_store.assign(static_cast<size_t>(n_sets), BlockActs{});
  for (BlockActs& a : b->block_store) {
    p->Add(MC::kActivations, N * C, t, &a.ln1);
    if (!d.rms_norm()) p->Add(MC::kActivations, N, &a.ln1_mean);
    p->Add(MC::kActivations, N, &a.ln1_rstd);
    p->Add(MC::kActivations, N * d.qkv_width(), &a.qkv);
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

  if (lora) {
    p->Add(MC::kActivations, n_sets * lora_per_layer * N * o.lora.r, &b->lora_u_store);
    p->Add(MC::kTemporary, N * o.lora.r, &b->lora_du);
    p->Add(MC::kTemporary, 2 * C, &b->norm_discard);
    if (mixed || o.lora.dropout > 0) p->Add(MC::kTemporary, N * lora_max_in, &b->lora_xs);
    if (o.lora.dropout > 0) p->Add(MC::kActivations, 1, &b->dropout_key);
  }
  p->Add(MC::kTemporary, N * C, &b->dres);
  p->Add(MC::kTemporary, N * d.wide(), &b->tmp_c);  // also the attention output (NH*HS wide)
  const int64_t mlp_rows = d.moe() ? d.moe_rows(N) : N;
  p->Add(MC::kTemporary, std::max(N * d.qkv_width(), mlp_rows * d.up_width()), &b->scratch_big);
  if (d.swiglu()) p->Add(MC::kTemporary, mlp_rows * d.H, &b->scratch_a);
  if (d.moe()) {
    p->Add(MC::kTemporary, mlp_rows * C, &b->moe_rows_a);
    p->Add(MC::kTemporary, mlp_rows * C, &b->moe_rows_b);
    p->Add(MC::kTemporary, N * d.E, &b->router_dlogits);
    p->Add(MC::kTemporary, mlp_rows, &b->row_dweight);
    p->Add(MC::kTemporary, 1, &b->aux_loss);
  }
  if (mixed) {
    // Every gradient entering a GEMM fits whole (N rows of C, qkv_width or up_width), and so do
    // N*C floats (2*N*C 16-bit elements). The logits gradient (N,Vp) goes through in chunks of at
    // least min(N, 512) rows: fewer rows make the lm_head weight-gradient GEMM (K = rows) slow
    // (see README.md, mixed precision), all N rows would cost N*Vp*2 bytes.
    constexpr int64_t kMinLogitRows = 512;
    b->scratch16_elems = std::max({2 * N * d.wide(), N * d.qkv_width(), mlp_rows * d.up_width(),
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
