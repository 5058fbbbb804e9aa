// The planned layout of a decoder model: its dimensions, its parameter table (names, shapes, flat
// offsets, HF layout) and every device buffer by category. Create() and PlanBytes() both run
// PlanBuffers(), so the bytes the arena sees are the planned bytes by construction.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/arena.h"
#include "core/dtype.h"
#include "models/model.h"
#include "nn/attention.h"

namespace traind::engine {

struct ArchDims;
struct ParamTable;

// A model family as the features its blocks are built from (HF semantics), not an arch switch:
// the decoder, the buffer plan and the required ops read these, so a new family is a new row in
// the family table (layout.cc) plus its parameter table (its HF tensor names). docs/engine.md,
// "A new model family", lists the steps.
struct FamilyFeatures {
  // kRmsNormPlusOne: RMSNorm scaling by (1 + w), as Gemma.
  enum class Norm { kLayerNorm, kRmsNorm, kRmsNormPlusOne };
  enum class Positions { kLearned, kRotary };  // learned table (wpe) or rotary (q, k)
  // Activation (and gating) of the MLP; kGeGluTanh: Gemma's gated tanh-GELU.
  enum class Mlp { kGeluTanh, kSwiGlu, kGeluErf, kGeGluTanh };
  Norm norm = Norm::kLayerNorm;
  Positions positions = Positions::kLearned;
  Mlp mlp = Mlp::kGeluTanh;
  bool bias = true;    // linear layers and norms carry biases
  bool causal = true;  // causal self-attention (false: bidirectional, with a padding mask)
  bool pre_ln = true;  // norm before each sub-block (false: after the residual add, as BERT)
  bool moe = false;    // the MLP is a sparse mixture of SwiGLU experts with a softmax top-k router
  // Bias-free families whose q/k/v projections carry biases all the same (qwen2); llama's
  // config.json attention_bias adds them (and o_proj's) per model (HfConfig::attention_bias_key).
  bool qkv_bias = false;
  bool qk_norm = false;      // RMSNorm over each head of q and of k before RoPE (qwen3)
  bool embed_scale = false;  // embeddings multiplied by sqrt(hidden_size) (gemma)
};

// How a family's HF config.json is named and read (hf_config.cc, job_spec.cc).
struct HfConfigRow {
  // The key set: gpt2's (n_embd, n_layer, ...), bert's, or llama's (hidden_size, ...).
  enum class Names { kGpt2, kBert, kLlama };
  Names names = Names::kLlama;
  // architectures[0] of a written config.json (bert: by head, see WriteHfConfigJson); the
  // class names a read config.json may give (a head class of bert picks model.head).
  const char* causal_lm_class = nullptr;
  // The defaults of the HF config class (GPT2Config, LlamaConfig, ...) over ModelConfig's.
  void (*defaults)(ModelConfig* c) = nullptr;
  // llama-like keys beyond llama's: head_dim and rope_scaling are every llama-like family's.
  bool attention_bias_key = false;  // attention_bias (llama)
  bool sliding_window_key = false;  // sliding_window (mistral, mixtral; qwen2's is refused)
  bool experts_keys = false;        // num_local_experts, ... (mixtral)
  bool kv_heads_default_heads = false;  // num_key_value_heads defaults to num_attention_heads
  bool always_tied = false;         // the head is the embedding whatever tie_word_embeddings
  // The llama-like writer: hidden_act (the one value read), constant keys written as they are
  // (a JSON object), and use_sliding_window (qwen2: only false is read).
  const char* hidden_act = "silu";
  const char* written_constants = "{}";
  bool use_sliding_window_key = false;
};

// One model family: everything that differs between families, in one row (layout.cc's
// kFamilies, in Arch order). A family is one row here plus its parameter table and the test
// cases tests/engine/family_cases_test.cc asks for.
struct ModelFamily {
  Arch arch;
  const char* model_type;  // model.arch and HF model_type (ArchName)
  bool built;              // false: model.arch refuses it as "not supported yet"
  FamilyFeatures features;
  ParamTable (*params)(const ArchDims& d);  // names, shapes, HF layout, init of every tensor
  HfConfigRow hf;
  // LoRA: the module names an adapter may target (HF/PEFT names; empty: LoRA is not built for
  // the family) and PEFT's default target_modules for it.
  std::vector<std::string> lora_modules;
  std::vector<std::string> lora_default_targets;
  bool generation;  // trainctl generate / sampling (KV-cache decoder)
  // PEFT's fan_in_fan_out: the adapted modules are HF Conv1D, (in, out) in the file (gpt2).
  bool lora_fan_in_fan_out = false;
};
// The row of `arch`.
const ModelFamily& FamilyOf(Arch arch);
// "gpt2, llama, ...": the built families, for messages.
std::string KnownFamilies();

// Letters as in backend.h. H is the MLP hidden size (4C for gpt2, intermediate_size for llama).
struct ArchDims {
  const ModelFamily* family = nullptr;
  const FamilyFeatures& f() const { return family->features; }
  // RMSNorm ops (kRmsNormPlusOne too: they read 1 + w, ModelBuffers::norm_plus_one).
  bool rms_norm() const { return f().norm != FamilyFeatures::Norm::kLayerNorm; }
  bool norm_plus_one() const { return f().norm == FamilyFeatures::Norm::kRmsNormPlusOne; }
  bool rotary() const { return f().positions == FamilyFeatures::Positions::kRotary; }
  bool swiglu() const { return f().mlp == FamilyFeatures::Mlp::kSwiGlu; }
  bool geglu() const { return f().mlp == FamilyFeatures::Mlp::kGeGluTanh; }
  bool gated() const { return swiglu() || geglu(); }  // [gate | up]: an up width of 2H
  bool qk_norm() const { return f().qk_norm; }
  bool gelu_erf() const { return f().mlp == FamilyFeatures::Mlp::kGeluErf; }
  int64_t V = 0, Vp = 0, C = 0, L = 0, NH = 0, NKV = 0, HS = 0, H = 0, max_T = 0;
  // bert: token types, the head ("sequence_classification" | "masked_lm") and its labels.
  int64_t type_vocab = 0;
  std::string head;
  int64_t num_labels = 0;
  // mixtral: E experts, K of them per token; the load-balancing loss's coefficient (0: off).
  bool moe() const { return f().moe; }
  int64_t E = 0, K = 0;
  double aux_coef = 0.0;
  float eps = 1e-5f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;  // HF rope_scaling, as the Rope op takes it
  int64_t window = 0;        // sliding-window attention (mistral); 0: none
  // Attention biases of the llama-like families: q/k/v (qwen2; llama with attention_bias) and
  // o_proj (llama with attention_bias). gpt2 and bert have all biases (FamilyFeatures::bias).
  bool qkv_bias = false, proj_bias = false;
  bool tied = true;
  int64_t qkv_width() const { return (NH + 2 * NKV) * HS; }
  // The attention output's width NH*HS: C unless head_dim says otherwise (Llama 3.2 / Qwen3 /
  // Gemma shapes); the buffers that hold it or its gradient are at least this wide.
  int64_t attn_width() const { return NH * HS; }
  int64_t wide() const { return attn_width() > C ? attn_width() : C; }
  int64_t up_width() const { return gated() ? 2 * H : H; }
  int64_t moe_rows(int64_t N) const { return N * K; }  // expert rows of N tokens: static
};
// gemma's embedding scale: sqrt(hidden_size) in fp32 (HF rounds it to the hidden states' dtype,
// fp32 here: the residual stream's); 1 for the other families.
inline float EmbedScale(const ArchDims& d) {
  return d.f().embed_scale ? static_cast<float>(std::sqrt(static_cast<double>(d.C))) : 1.0f;
}
// The attention of a block of `d` over B sequences of T tokens: heads, head size, RoPE (with its
// scaling) for rotary families, the sliding window; causal as the family is (the caller sets the
// key mask and the operand type).
nn::AttentionShape AttentionShapeOf(const ArchDims& d, int64_t B, int64_t T);

// Vp: the vocabulary rounded up to a multiple of 64 for the logits GEMM.
// Rows per lm-head + cross-entropy chunk: options.logits_chunk_rows when > 0 (at most N), else
// enough rows for about kLogitsChunkBytes of logits but at least min(N, 512) (fewer rows make
// the lm-head weight-gradient GEMM, whose K is the rows, slow).
inline constexpr int64_t kLogitsChunkBytes = 64ll << 20;
ArchDims MakeArchDims(const ModelConfig& config);
int64_t LogitsChunkRows(const ArchDims& d, const ModelOptions& options);

// The weight matrices ModelOptions::pack_weights packs, each as its linear layer's (in, out): W is
// (out, in). bf16: per block (not mixture-of-experts ones) qkv, proj, up and down, then the lm
// head. fp32: the lm head alone, when it runs in more than one chunk of rows (oneDNN's fp32 matmul
// on a packed B beat its sgemm by 10% there, 234 -> 208 ms a step on the small gpt2, while the
// blocks' gains were about what packing them every forward costs); none with pack_weights off, in
// fp16, or where the CPU backend does not pack the compute type (CpuPacksGemmB: bf16 on a CPU
// without bf16 arithmetic widens to fp32 instead; OpenBLAS).
struct PackedWeight {
  enum Kind { kQkv, kProj, kUp, kDown, kLmHead };
  Kind kind;
  int64_t layer;  // -1: the lm head
  int64_t in, out;
};
std::vector<PackedWeight> PackedWeights(const ArchDims& d, const ModelOptions& o);
// The storage planned for one packed copy of a (K x N) GEMM operand of `type`: oneDNN's blocked
// layouts, bf16 BA16a64b2a (K rounded up to 32, N to 64, two bytes each) and fp32 BA16a64b (K to
// 16, N to 64, four bytes); the CPU backend's own size is checked against it and a copy that does
// not fit is not made.
int64_t PackedCopyBytes(int64_t K, int64_t N, DType type);
// The copies of every PackedWeights: bf16 both layouts (forward: K = in, N = out; input
// gradient: K = out, N = in); fp32 the forward's only (oneDNN's sgemm reads a plain B in the
// input gradient as fast as the matmul reads a packed one).
bool PacksInputGradientLayout(DType type);
int64_t PackedWeightBytes(const ArchDims& d, const ModelOptions& o);
// bf16 with pack_weights (and CpuPacksGemmB) and at least kMinPackedActivationRows rows (N =
// micro_batch * seq_len):
// the room for one linear layer's input (N rows of the widest input: C, the attention output or
// the MLP's hidden width) packed as the B of its weight gradient (nn::GemmPrecision::pack); the lm
// head's chunks and the blocks reuse it. 0 otherwise, and with LoRA (the frozen base has no
// weight gradients; the adapters' own GEMMs are fp32). Mixture-of-experts products (more rows)
// are not packed. The row floor: the small configs' steps (2048 rows) gained 1.4% (gpt2) and 6%
// (llama) from it, the tiny one's (1024 rows) nothing measurable (bench/README.md).
constexpr int64_t kMinPackedActivationRows = 2048;
int64_t PackedActivationBytes(const ArchDims& d, const ModelOptions& o);

enum class InitKind { kNormal, kNormalResidual, kZeros, kOnes };

// What ParamInfo does not say: how a tensor maps to its HF file form and how it is initialised.
struct ParamExtra {
  bool transposed = false;  // HF Conv1D (gpt2): the file holds our (OC,C) weight as (C,OC)
  bool vocab_rows = false;  // (Vp, C) in the engine, only the first V rows exist in HF files
  InitKind init = InitKind::kNormal;
  // A task head's tensor (bert's pooler/classifier or MLM head): a checkpoint without it (a
  // pretrained base) loads, and the tensor starts from its init, as transformers does.
  bool task_head = false;
};

// Flat element offsets of one block's tensors; -1 = absent (no biases in llama). Fused tensors
// are contiguous HF tensors: llama q,k,v_proj rows form qkv_w, gate_proj then up_proj form up_w.
struct LayerParams {
  int64_t ln1_w = -1, ln1_b = -1, qkv_w = -1, qkv_b = -1, proj_w = -1, proj_b = -1;
  int64_t ln2_w = -1, ln2_b = -1, up_w = -1, up_b = -1, down_w = -1, down_b = -1;
  // mixtral: the router (E, C) and each expert's fused [w1 | w3] (2H, C) and w2 (C, H).
  int64_t router_w = -1;
  std::vector<int64_t> expert_up, expert_down;
  // qwen3: the per-head RMSNorm weights of q and k (HS each).
  int64_t q_norm = -1, k_norm = -1;
  // The tensors stored behind a fused GEMM weight's first one and read only as part of it
  // (llama: k_proj and v_proj after q_proj = qkv_w, up_proj after gate_proj = up_w; mixtral: each
  // expert's w3 after its w1).
  std::vector<int64_t> fused_parts;
};

struct ParamTable {
  std::vector<ParamInfo> infos;
  std::vector<ParamExtra> extras;
  std::vector<LayerParams> layers;
  int64_t wte = -1, wpe = -1, lnf_w = -1, lnf_b = -1;
  int64_t lm_head = -1;  // == wte when tied
  // bert (-1 elsewhere): token-type table, the embeddings' LayerNorm, the pooler and classifier
  // (sequence_classification), the MLM transform, its LayerNorm and the decoder's bias (Vp,
  // masked_lm; the decoder weight is wte).
  int64_t tte = -1, emb_ln_w = -1, emb_ln_b = -1;
  int64_t pool_w = -1, pool_b = -1, cls_w = -1, cls_b = -1;
  int64_t mlm_w = -1, mlm_b = -1, mlm_ln_w = -1, mlm_ln_b = -1, mlm_bias = -1;
  int64_t total = 0;     // elements in the flat buffer

  // Appends a tensor at the end of the flat buffer and returns its offset.
  int64_t Add(std::string hf_name, std::vector<int64_t> shape, std::vector<int64_t> hf_shape,
              ParamExtra extra, bool weight_decay);
};

// ModelOptions::master_weights_off_device: the tensors that keep an fp32 copy on the device,
// those the step reads in fp32 (embeddings, norms, biases; every tensor but the GEMM weights,
// which it reads in the compute type), packed in table order into ModelBuffers::params.
struct Fp32ResidentTensor {
  int64_t offset = 0;  // in the flat buffer (the table's offset)
  int64_t numel = 0;
  int64_t packed = 0;  // in the packed fp32 buffer
};
std::vector<Fp32ResidentTensor> Fp32ResidentTensors(const ParamTable& table);
// The fp32 weight elements on the device: the whole table, or with master weights off the device
// (and a 16-bit compute type) the packed resident tensors.
int64_t Fp32WeightElems(const ParamTable& table, const ModelOptions& o);

ParamTable Gpt2Params(const ArchDims& d);   // models/gpt2.cc
ParamTable LlamaParams(const ArchDims& d);  // models/llama.cc (llama and mixtral)
ParamTable BertParams(const ArchDims& d);   // models/bert.cc
inline ParamTable BuildParams(const ArchDims& d) { return d.family->params(d); }

// One block's saved activations (N = B*T rows). Unused fields stay null for an arch.
// The four GEMM inputs (ln1, atty, ln2, a) and attention's qkv are stored in the compute type
// (fp32, bf16 or f16: ModelOptions::compute_type); everything else is fp32 whatever the compute
// type.
struct BlockActs {
  void* ln1 = nullptr;        // (N,C) compute type
  float* ln1_mean = nullptr;  // (N) layernorm only
  float* ln1_rstd = nullptr;  // (N)
  void* qkv = nullptr;        // (N, qkv_width) compute type: q and k after RoPE
  // qwen3: q and k before their per-head norm (N, (NH+NKV)*HS) and each head's rstd (N*(NH+NKV)).
  float* qk_saved = nullptr;
  float* qk_rstd = nullptr;
  void* atty = nullptr;       // (N,C) compute type: attention output before the projection
  float* lse = nullptr;       // (B,NH,T)  atty and lse: every block its own (ModelBuffers)
  float* res2 = nullptr;      // (N,C) residual after attention
  void* ln2 = nullptr;        // (N,C) compute type
  float* ln2_mean = nullptr;  // (N)
  float* ln2_rstd = nullptr;  // (N)
  float* h = nullptr;         // (N, up_width) MLP pre-activation
  void* a = nullptr;          // (N,H) compute type: MLP activation
  // mixtral (R = N*K expert rows, grouped by expert; h and a above then hold R rows):
  float* probs = nullptr;        // (N,E) router softmax
  int32_t* row_token = nullptr;  // (R) the token of each expert row
  float* row_weight = nullptr;   // (R) its renormalised routing weight
  void* xg = nullptr;            // (R,C) compute type: the gathered expert inputs
  float* yg = nullptr;           // (R,C) the experts' outputs before weighting
};

// Every device buffer of the model. With gradient checkpointing every k, only the inputs of blocks
// 0, k, 2k, ... and the final residual are kept (res_store[0..nck) and back()); k working block
// sets (block_store) and k-1 working residuals are reused by every segment and recomputed in
// backward. Without it every block owns its own.
struct ModelBuffers {
  float* params = nullptr;       // weights: num_params fp32 (the master weights); with master
                                 // weights off the device the packed Fp32ResidentTensors only
  void* params16 = nullptr;      // weights: num_params in a 16-bit compute type, else null
  void* packed_weights = nullptr;  // weights: PackedWeightBytes (ModelOptions::pack_weights)
  void* packed_activation = nullptr;  // temporary: PackedActivationBytes, else null
  float* grads = nullptr;        // gradients: num_params
  int32_t* inputs = nullptr;     // (N)
  int32_t* targets = nullptr;    // (N)
  int32_t* positions = nullptr;  // (N) n % T, gpt2 only
  int32_t* rows = nullptr;       // (2N) ModelOptions::example_rows: doc_start, then positions
  std::vector<float*> res_store;
  std::vector<BlockActs> block_store;
  // Every block's attention output and lse, also with checkpointing (L each, 2 N C + 4 B NH T
  // bytes per block in bf16): the recomputed forward then skips attention (see BlockForward).
  std::vector<void*> atty_store;
  std::vector<float*> lse_store;
  void* lnf = nullptr;  // (N,C) compute type
  float* lnf_mean = nullptr;
  float* lnf_rstd = nullptr;
  float* logits = nullptr;  // (logits_rows, Vp): one chunk's logits, then its dlogits in place
  int64_t logits_rows = 0;
  float* losses = nullptr;  // (N)
  // temporaries (live within one block's forward or backward)
  float* dres = nullptr;         // (N,C) gradient of the residual stream
  float* tmp_c = nullptr;        // (N,C) projection outputs / gradients into norms
  float* scratch_big = nullptr;  // (N, max(qkv_width, up_width)): dqkv, MLP dh (and GELU da)
  float* scratch_a = nullptr;    // (N,H) SwiGLU da (llama only; mixtral (R,H))
  // mixtral: (R,C) two row scratches, the router's (N,E) logits gradient and (R) weight gradient.
  float* moe_rows_a = nullptr;
  float* moe_rows_b = nullptr;
  float* router_dlogits = nullptr;
  float* row_dweight = nullptr;
  float* aux_loss = nullptr;     // (1) the step's load-balancing term, for the device loss sum
  // 16-bit compute types only: `scratch16_elems` elements of the compute type. Holds the rounded
  // copy of a gradient entering a GEMM (nn::GemmPrecision; the logits gradient in chunks of at
  // least min(N, 512) rows), and, reused in BlockBackward, the attention output's gradient
  // rounded for the attention backward.
  void* scratch16 = nullptr;
  int64_t scratch16_elems = 0;
  // LoRA only (else null): the adapters (weights) and their gradients (`grads` then holds only
  // those: the frozen base has none); per block set, `lora_per_layer` (N, r) adapter
  // activations x A^T (lora_u_store, (N*r) floats each, set-major); the backward's (N, r)
  // scratch; and a 2*C scratch that the frozen norms' weight gradients are written to and
  // dropped from (the norm kernels always produce them; no GEMM).
  // With a 16-bit compute type or lora_dropout > 0 also lora_xs, the adapters' fp32 input scratch
  // (N, widest adapter input: x widened, or dropout(x), nn/lora.h), and with dropout the device
  // dropout key (one uint64, the micro-batch's: Model::dropout_key()).
  float* lora_params = nullptr;
  float* lora_u_store = nullptr;
  float* lora_du = nullptr;
  float* norm_discard = nullptr;
  float* lora_xs = nullptr;
  uint64_t* dropout_key = nullptr;
  // gemma (FamilyFeatures::Norm::kRmsNormPlusOne), else null: the norms' 1 + w in fp32, as HF
  // computes it, (2L+1, C) (block l's ln1 and ln2 at rows 2l and 2l+1, the final norm last),
  // recomputed from the weights at every forward (Add with `ones`, C constant ones); the norm
  // ops read it, their weight gradients go to w's (d(1 + w)/dw = 1).
  float* norm_plus_one = nullptr;
  float* ones = nullptr;
  // QLoRA (ModelOptions::quant4), else null: the 4-bit base (weights; every quantized tensor's
  // packed codes, then its fp32 absmax, or with double quantization its uint8 absmax codes, fp32
  // nested absmax and offset, and the 256-entry nested code table), and the scratch a block's
  // weights are dequantized into (temporary; the largest block's, in the compute type).
  uint8_t* q_codes = nullptr;
  float* q_absmax = nullptr;
  uint8_t* q_qabsmax = nullptr;
  float* q_nested = nullptr;
  float* q_offsets = nullptr;
  float* q_code = nullptr;
  void* q_scratch = nullptr;

  // Views: res[l] is block l's input (res[L] the final residual), blocks[l] its activations.
  std::vector<float*> res;
  std::vector<BlockActs> blocks;
};

// Gradient checkpointing's buffer layout, shared by every model: with checkpointing every k
// blocks, the inputs of blocks 0, k, 2k, ... are kept (n_kept), k-1 working residuals and k
// working activation sets are reused by every segment; without it every block owns its input and
// its activation set (k = 1 for the residuals, L sets).
struct CheckpointLayout {
  int64_t k = 1;        // blocks per segment (1 without checkpointing)
  int64_t n_kept = 0;   // kept block inputs
  int64_t n_sets = 0;   // activation sets
  int64_t residuals() const { return n_kept + (k - 1) + 1; }  // + the final residual
  // The residual store slot of block l's input (l == L: the final residual).
  int64_t ResidualSlot(int64_t l, int64_t L) const {
    if (l == L) return residuals() - 1;
    return l % k == 0 ? l / k : n_kept + (l % k) - 1;
  }
  int64_t SetOf(int64_t l) const { return n_sets == 0 ? 0 : l % n_sets; }
};
CheckpointLayout MakeCheckpointLayout(const ArchDims& d, const ModelOptions& o);
// Backward over the blocks, last first, segment by segment: with checkpointing each segment but
// the last (still in the working sets from the forward) is recomputed by `forward(l)` first;
// `backward(l)` then runs its blocks from the last down.
void BackwardBySegments(int64_t L, const ModelOptions& o, const std::function<void(int64_t)>& forward,
                        const std::function<void(int64_t)>& backward);

// Packs buffers into one allocation per category (sub-buffers start 64-byte aligned).
class BufferPlanner {
 public:
  template <typename T>
  void Add(MemoryCategory c, int64_t count, T** slot) {
    AddRaw(c, count * static_cast<int64_t>(sizeof(T)), reinterpret_cast<void**>(slot));
  }
  // `count` elements of `type`.
  void Add(MemoryCategory c, int64_t count, DType type, void** slot) {
    AddRaw(c, count * static_cast<int64_t>(DTypeSize(type)), slot);
  }
  MemoryBytes bytes() const;
  // One Allocate per non-empty category, then fills every slot.
  Status Allocate(DeviceArena* arena);

 private:
  void AddRaw(MemoryCategory c, int64_t bytes, void** slot);
  struct Entry {
    int category;
    int64_t offset;
    void** slot;
  };
  std::array<int64_t, 5> size_{};
  std::vector<Entry> entries_;
};

// Plans all buffers of the model into `planner`, with slots in `bufs` (sized here). Call
// ResolveViews after allocation.
// `lora_trainable` > 0: a LoRA model with that many adapter floats and `lora_per_layer` adapters
// per block (gradients are then planned for the adapters only), the widest of them reading
// `lora_max_in` inputs.
// `fp32_weights`: the elements of `params` (num_params, or Fp32WeightElems with master weights
// off the device).
void PlanBuffers(const ArchDims& d, const ModelOptions& o, int64_t num_params, int64_t fp32_weights,
                 BufferPlanner* planner, ModelBuffers* bufs, int64_t lora_trainable = 0,
                 int64_t lora_per_layer = 0, int64_t lora_max_in = 0);
void ResolveViews(const ArchDims& d, const ModelOptions& o, ModelBuffers* bufs);

}  // namespace traind::engine
