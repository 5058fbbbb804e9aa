// DecoderModel: the one Model implementation for the decoder-only families (gpt2, llama). The
// families differ only in their parameter table (gpt2.cc, llama.cc) and a few flags in ArchDims
// (norm kind, biases, RoPE vs learned positions, GELU vs SwiGLU); the step code is shared.
#pragma once

#include <functional>
#include <unordered_map>

#include <memory>
#include <vector>

#include "models/layout.h"
#include "models/lora.h"
#include "models/model.h"
#include "models/quantized_base.h"
#include "nn/linear.h"
#include "nn/lora.h"

namespace traind::engine {

// HF tensors (by name, converting dtype, Conv1D transposes and the padded vocabulary) into `host`
// (table.total floats, laid out as `table`); the errors of Model::LoadHf. `arch` for messages.
// `missing_heads` not null: a task-head tensor (ParamExtra::task_head) missing from the file is
// not an error; its table index is appended (the caller initialises it).
// `host` null: each tensor is converted into one reused buffer and handed to `each(index,
// values)` instead (a tensor's fp32 copy at a time, not the model's).
Status HfToFlat(Arch arch, const ParamTable& table, const SafetensorsFile& file,
                float* host, std::vector<size_t>* missing_heads = nullptr,
                const std::function<void(size_t, const float*)>& each = nullptr);
// Where HfToFlat reads the checkpoint's tensors: a file in memory, or an open folder
// (HfWeightsReader: one tensor read at a time). `find`: the tensor's dtype and shape, false when
// absent; `read`: its values widened to fp32 (in the file's layout).
struct HfTensorSource {
  std::function<bool(const std::string& name, std::string* dtype, std::vector<int64_t>* shape)> find;
  std::function<Result<std::vector<float>>(const std::string& name)> read;
  // Bytes [offset, offset + bytes) of its raw data; and where it is (a file, for messages).
  std::function<Status(const std::string& name, uint64_t offset, void* dst, size_t bytes)> read_bytes;
  std::function<std::string(const std::string& name)> where;
};
HfTensorSource TensorSourceOf(const SafetensorsFile& file);
HfTensorSource TensorSourceOf(const HfWeightsReader& reader);
// HfToFlat from a source; `skip(index)` true: the caller loads that tensor itself.
Status HfToFlat(Arch arch, const ParamTable& table, const HfTensorSource& source, float* host,
                std::vector<size_t>* missing_heads,
                const std::function<void(size_t, const float*)>& each,
                const std::function<bool(size_t)>& skip = nullptr);
// bitsandbytes' 4-bit serialization of a weight `name` ("<module>.weight"): the packed uint8
// tensor `name`, and `name` + each of these suffixes (Linear4bit's state dict, QuantState.as_dict
// packed). The JSON tensor's suffix ends in the quant type (bitsandbytes__nf4 / bitsandbytes__fp4).
constexpr const char* kBnbQuantStatePrefix = ".quant_state.bitsandbytes__";
// LoRA's merge for a streamed export: the adapters on the host (trainable buffer layout) and
// which adapters fold into which table tensor.
struct LoraMerge {
  int64_t r = 0;
  float scale = 0.0f;
  std::vector<float> host;                                  // lora.total floats
  std::vector<std::vector<const LoraAdapterEntry*>> by_tensor;  // per table index
};
// Where StreamFlatToHf reads the flat fp32 weights (laid out as the table) from: `device`
// (table.total floats on the backend), or else `master` (the master weights' store, host reads).
struct FlatWeightsSource {
  const float* device = nullptr;
  const MasterWeightsStore* master = nullptr;
  const float* host = nullptr;  // or host memory (table.total floats)
  // or a reader of [offset, offset + n) (whole engine rows of one tensor)
  std::function<Status(int64_t offset, float* out, int64_t n)> read = nullptr;
};
// The weights of `source` under HF names and layouts, F32, as Model::StreamHf describes: each
// tensor copied in pieces of at most piece_bytes (a transposed tensor: the file's rows [c0, c1)
// from one strided copy of columns [c0, c1) of every engine row, Backend::CopyDeviceToHost2D),
// with `merge` (may be null) folded in per piece. `table`, `be`, the source and `merge` must
// outlive the stream.
SafetensorsStream StreamFlatToHf(Backend* be, const ParamTable* table, FlatWeightsSource source,
                                 size_t piece_bytes, std::shared_ptr<const LoraMerge> merge);
// The init of every tensor (ParamExtra::init) from `seed` into `host` (table.total floats):
// N(0, 0.02) weights, N(0, 0.02/sqrt(2L)) residual projections, zeros, ones; padded vocabulary
// rows zero. The same numbers on every platform.
void InitFlatParams(const ArchDims& d, const ParamTable& table, uint64_t seed, float* host);
// The same values, tensor by tensor in table order, handed to write(flat offset, values, count)
// from a host buffer of at most 4 MiB (every element of every tensor, padded rows as zeros).
void InitFlatParamsTo(const ArchDims& d, const ParamTable& table, uint64_t seed,
                      const std::function<void(int64_t, const float*, int64_t)>& write);

class DecoderModel : public Model, private MasterWeightsSink {
 public:
  // Plans and allocates every buffer from `arena`; the config must already be validated.
  static Result<std::unique_ptr<DecoderModel>> Make(const ModelConfig& config,
                                                    const ModelOptions& options,
                                                    DeviceArena* arena);

  ~DecoderModel() override;

  const ModelConfig& config() const override { return config_; }
  const ModelOptions& options() const override { return options_; }
  const std::vector<ParamInfo>& params() const override { return table_.infos; }
  int64_t num_params() const override { return table_.total; }
  float* param_data() override { return bufs_.params; }
  const std::vector<ParamInfo>& trainable_params() const override {
    return lora() ? lora_.infos : table_.infos;
  }
  int64_t num_trainable() const override { return lora() ? lora_.total : table_.total; }
  float* trainable_data() override { return lora() ? bufs_.lora_params : bufs_.params; }
  bool lora() const override { return lora_.r > 0; }
  uint64_t* dropout_key() override { return bufs_.dropout_key; }
  float* grad_data() override { return bufs_.grads; }
  int32_t* inputs() override { return bufs_.inputs; }
  int32_t* targets() override { return bufs_.targets; }
  int32_t* attention_mask() override { return bufs_.rows; }  // ModelOptions::example_rows

  void InitRandom(uint64_t seed) override;
  Status LoadHf(const SafetensorsFile& file) override;
  Status LoadHfFrom(const HfWeightsReader& reader) override;
  // QLoRA: the 4-bit store copied to the host, part after part (packed codes; fp32 absmax, or
  // absmax codes, nested absmax and offsets with double quantization), for tests comparing two
  // loads; empty without a 4-bit base.
  std::vector<uint8_t> Quant4StoreBytes() const;
  SafetensorsStream StreamHf(size_t piece_bytes) override;
  void InitAdapters(uint64_t seed) override;
  SafetensorsFile ExportAdapters() override;
  Status LoadAdapters(const SafetensorsFile& file) override;
  SafetensorsStream StreamMerged(size_t piece_bytes) override;
  std::vector<std::string> lora_targets() const override { return lora_.targets; }
  const float* logits() const override { return bufs_.logits; }
  int64_t logits_stride() const override { return d_.Vp; }
  void ParamsChanged() override;
  void ZeroGrad() override;
  double Forward(bool for_backward, float grad_scale) override;
  void ForwardOnDevice(const float* grad_scale, const float* loss_weight,
                       double* loss_sum) override;
  void Backward() override;
  std::vector<int64_t> TakeExpertTokens() override;
  bool capturable() const override { return !d_.moe(); }
  // LoRA's frozen base has no master weights to update: nothing to refresh.
  MasterWeightsSink* master_weights_sink() override { return master_off_ && !lora() ? this : nullptr; }
  bool merge_needs_base() const override { return master_off_ && lora() && !quant_; }
  KvWeights InferenceWeights() override;
  Status LoadMergeBase(const SafetensorsFile* file, uint64_t seed) override;
  void SetMasterWeightsStore(MasterWeightsStore* store) override { master_store_ = store; }
  // mixtral: the last forward's load-balancing loss (HF load_balancing_loss_func over every
  // layer's router logits), before router_aux_loss_coef.
  double aux_loss() const { return aux_; }

 private:
  DecoderModel(const ModelConfig& config, const ModelOptions& options, DeviceArena* arena);
  // A tensor read in fp32 (its offset in the table): in the flat buffer, or with master weights
  // off the device in the packed one.
  float* P(int64_t offset) const {
    if (offset < 0) return nullptr;
    return bufs_.params + (master_off_ ? packed_.at(offset) : Dense(offset));
  }
  // QLoRA: a tensor kept in the compute type is stored at this offset of the compacted weight
  // buffers (the table offset less the 4-bit elements before it); the offset itself otherwise.
  int64_t Dense(int64_t offset) const { return quant_ ? offset - q_.QuantizedBefore(offset) : offset; }
  // QLoRA: the 4-bit tensor of slot s on the device; layer l's weights into the scratch.
  Quant4View QView(const Quant4Slot& s) const;
  void DequantizeLayer(int64_t l);
  // QLoRA: the base's values [offset, offset + n) (within one tensor) from the host: quantized
  // into the 4-bit store (pieces of a tensor in order, each a multiple of 64 elements but the
  // last), or into the compute-type copies.
  void WriteBase(int64_t offset, const float* v, int64_t n);
  // QLoRA: table tensor i (a 4-bit slot) from the checkpoint's bitsandbytes state
  // (kBnbQuantStatePrefix), checked against the job's quantization and the tensor's shape, copied
  // into the 4-bit store without widening.
  Status LoadQuantState(const HfTensorSource& src, size_t i, const Quant4Slot& s);
  // The load behind LoadHf and LoadHfFrom (4-bit slots the checkpoint holds pre-quantized load
  // through LoadQuantState).
  Status LoadFrom(const HfTensorSource& source);
  // QLoRA: whole engine rows [offset, offset + n) of one tensor read back in fp32, a 4-bit
  // tensor dequantized (the exports' base).
  Status ReadBase(int64_t offset, float* out, int64_t n);
  // Master weights off the device: the flat fp32 weights staged in the gradient buffer (free
  // until the first backward) -> the 16-bit copy and the packed fp32 tensors; the gradients
  // zeroed again.
  void PublishStaged();
  // LoRA with master weights off the device: the frozen base's elements [offset, offset + n)
  // from host fp32 -> the 16-bit copy (cast on the host) and the packed fp32 tensors.
  void PublishFromHost(int64_t offset, const float* host, int64_t n);
  // The first resident tensor that ends after `offset` (resident_ is in table order).
  std::vector<Fp32ResidentTensor>::const_iterator FirstResidentEndingAfter(int64_t offset) const;
  void MasterUpdated(int64_t offset, const float* device, int64_t n) override;
  ComputeCopy ComputeCopyOf(int64_t offset, int64_t n) override;
  // A base parameter's gradient; null for a frozen base (LoRA).
  float* G(int64_t offset) const {
    return offset < 0 || lora() ? nullptr : bufs_.grads + offset;
  }
  // A norm's weight/bias gradient: with LoRA into the discard scratch (frozen).
  float* GNorm(int64_t offset, int64_t which) const {
    if (offset < 0) return nullptr;
    return lora() ? bufs_.norm_discard + which * d_.C : bufs_.grads + offset;
  }
  // Layer l's adapters at `site` (inactive without any).
  nn::LoraSite Site(int64_t l, LoraSiteKind site) const;
  // A norm's weight as the norm ops read it: P(offset), or gemma's 1 + w row of it
  // (bufs_.norm_plus_one, refreshed by every forward from norm_rows_).
  const float* NormW(int64_t offset) const {
    if (bufs_.norm_plus_one == nullptr || offset < 0) return P(offset);
    for (const auto& [o, row] : norm_rows_) {
      if (o == offset) return bufs_.norm_plus_one + row * d_.C;
    }
    return nullptr;
  }
  // gemma: (table offset of a norm weight, its row in bufs_.norm_plus_one).
  std::vector<std::pair<int64_t, int64_t>> norm_rows_;
  // A GEMM weight in the compute type: the 16-bit copy, or the fp32 master weights.
  const void* W(int64_t offset) const;
  // Norm output -> `dst` (a GEMM input in the compute type). 16-bit: rounded as it is normalised,
  // or, with keep_fp32 (the experts read it), through tmp_c, which keeps the fp32 output.
  void NormInto(void* dst, float* mean, float* rstd, const float* inp, int64_t w, int64_t b,
                bool keep_fp32 = false);
  // Embeddings, blocks and the final norm (bufs_.lnf).
  void ForwardToFinalNorm();
  // The lm-head and the softmax cross-entropy over bufs_.logits_rows rows at a time: losses (N),
  // and with for_backward each chunk's dlogits (scaled by grad_scale, times *device_scale when
  // not null) through the lm-head backward into tmp_c (d lnf) and the lm-head weight gradient.
  void LmHeadAndLoss(bool for_backward, float grad_scale, const float* device_scale);
  // recompute: the block's second forward under checkpointing; atty and lse are kept from the
  // first, so only RoPE (q and k rotated in qkv for the backward) runs, not attention.
  void BlockForward(int64_t l, bool recompute = false);
  // Whether a block's forward ends with its residual add fused with the next norm (the next
  // block's ln1, or the final norm): every block but the mixture-of-experts ones.
  bool FusesNextNorm() const { return !d_.moe(); }
  void BlockBackward(int64_t l);  // bufs_.dres: d(block output) in, d(block input) out
  // mixtral's MLP (HF MixtralSparseMoeBlock), dropless: the router's softmax, top-K and
  // renormalised weights are computed on the host from the (N,E) router logits (read back once
  // per block), the N*K (token, expert) rows grouped by expert into static (R = N*K)-row buffers;
  // per expert one up GEMM and one down GEMM over its rows; the weighted outputs scatter-added
  // into `out` (N,C). ln2_f32: the block's fp32 norm output.
  void MoeForward(int64_t l, const float* ln2_f32, float* out);
  // dln2 (N,C) = d(norm output) from dout (N,C): through the experts, the gather and the router
  // (its softmax, the top-K renormalisation and the load-balancing loss's gradient, on the host).
  void MoeBackward(int64_t l, float* dln2, const float* dout);
  // After every block's forward: the load-balancing loss from every layer's routing.
  void MoeAuxLoss();

  ModelConfig config_;
  ModelOptions options_;
  ArchDims d_;
  ParamTable table_;
  Backend* be_;
  ModelBuffers bufs_;
  LoraTable lora_;
  std::vector<nn::LoraAdapter> lora_ops_;  // lora_.adapters with device pointers
  int64_t N_;
  bool mixed_ = false;           // compute type is 16-bit
  bool weights16_stale_ = true;  // params16 must be refreshed before the next Forward
  // ModelOptions::pack_weights: each packed copy (PackedWeights; bf16 both layouts, fp32 the
  // forward's) and whether the weights may have changed since they were made (Forward packs them
  // again before its first GEMM). bf16: every writer of params16 calls WeightsChanging first. fp32:
  // the weights are param_data(), which the optimizer, data parallel's broadcast and checkpoint
  // restores write without telling the model, so the copies live only from a forward to the end
  // of its backward (or of an eval forward): packed at every forward, forgotten after.
  struct GemmPack {
    const void* b;
    bool trans_b;
    int64_t K, N, ldb;
    void* storage;
    int64_t bytes;
  };
  std::vector<GemmPack> gemm_packs_;
  bool packs_stale_ = true;
  // Before the weights change (or a pointer into them is handed out to write): the backend drops
  // the packed copies, so no GEMM reads a stale one, and the next Forward packs them again.
  void WeightsChanging();
  void PackWeights();
  // ModelOptions::master_weights_off_device honoured: the packed fp32 tensors (and their table
  // offset -> packed offset), the store of the master weights.
  bool master_off_ = false;
  std::vector<Fp32ResidentTensor> resident_;
  std::unordered_map<int64_t, int64_t> packed_;
  MasterWeightsStore* master_store_ = nullptr;
  std::vector<uint16_t> host16_;    // PublishFromHost's 16-bit piece
  uint64_t base16_hash_ = 0;        // FNV-1a of the 16-bit base PublishFromHost loaded
  std::vector<float> merge_base_;   // LoadMergeBase's fp32 base (LoRA, master weights off)
  // QLoRA (ModelOptions::quant4): the 4-bit store's layout, each tensor's double-quantization
  // offset (host; the view takes it by value) and the host pieces of the tensor being quantized.
  bool quant_ = false;
  bool lookup16_ = false;  // LookupReads16Bit: the token lookup reads the 16-bit table
  Quant4Layout q_;
  std::vector<float> q_offsets_;
  std::vector<uint8_t> q_codes_host_;
  std::vector<float> q_absmax_host_;
  nn::GemmPrecision gp_;         // compute type + scratch16, for the backward GEMMs
  bool ready_for_backward_ = false;
  bool training_ = false;  // the current forward is for backward: LoRA dropout on
  std::vector<int32_t> host_targets_;
  std::vector<float> host_losses_;
  // mixtral, per layer (host): the routing of the last forward.
  struct MoeRoute {
    std::vector<float> probs;         // (N,E) softmax of the router logits
    std::vector<int32_t> experts;     // (N,K) the chosen experts, best first
    std::vector<int64_t> offsets;     // (E+1) first row of each expert's group
    std::vector<int32_t> row_of;      // (N,K) the grouped row of (token, slot)
  };
  std::vector<MoeRoute> routes_;
  std::vector<int64_t> expert_tokens_;  // (L*E) counted by training forwards until taken
  bool count_routes_ = false;           // this forward counts (not eval, not a recomputation)
  double aux_ = 0.0;                    // load-balancing loss of the last forward
  std::vector<double> aux_fraction_;    // (E) F_e: fraction of the (token, slot) choices per expert
  double aux_grad_ = 0.0;  // d(step loss)/d(aux) for this micro-batch's backward
};

}  // namespace traind::engine
