// Model: a transformer (decoder-only gpt2/llama, or the bert encoder) with explicit forward and backward,
// its parameters, gradients and activations in flat buffers planned up front.
// The trainer drives it: copy a batch into inputs()/targets(), ZeroGrad(), Forward(), Backward(),
// then an optimizer updates params() from grads().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/arena.h"
#include "core/master_weights.h"
#include "core/param_info.h"
#include "core/safetensors.h"
#include "models/kv_weights.h"
#include "traind/engine/job_spec.h"
#include "traind/engine/plan.h"
#include "traind/engine/status.h"

namespace traind::engine {

// LoRA (training.peft): r == 0 is full fine-tuning. With r >= 1 every base parameter is frozen
// (no gradient buffer, no optimizer state, no weight-gradient GEMM) and the trainable parameters
// are the adapters' A (r, in) and B (out, r) on `targets` (HF module names; empty: PEFT's
// default for the family). Any compute type: the adapters' weights, gradients and GEMMs are fp32
// (nn/lora.h). `dropout` (lora_dropout, PEFT semantics): inverted dropout on the adapters' input
// in training forwards only (Forward(true), ForwardOnDevice), its mask drawn from the device key
// dropout_key() (the step runner writes one per micro-batch).
struct LoraOptions {
  int64_t r = 0;
  double alpha = 8.0;
  double dropout = 0.0;  // [0, 1)
  std::vector<std::string> targets;
  bool enabled() const { return r > 0; }
};

// The host buffer size of a model file's streamed write (Model::StreamHf): two buffers of this
// are what saving a model adds to the process's memory.
inline constexpr size_t kHfExportPieceBytes = size_t{4} << 20;

struct ModelOptions {
  int64_t micro_batch = 8;   // B
  int64_t seq_len = 128;     // T (<= max positions)
  bool gradient_checkpointing = false;
  int64_t checkpoint_every = 1;  // with checkpointing: keep the input of every k-th block
  // Mixed precision policy. kF32: everything fp32. kBF16 / kF16: the fp32 master weights get a
  // 16-bit copy (refreshed after ParamsChanged) that the GEMMs read; GEMM inputs among the saved
  // activations (norm outputs, attention output, MLP activation) are stored in 16 bits; GEMMs
  // accumulate in fp32; norms, attention, softmax/cross-entropy, the residual stream, gradients
  // and the parameters' update stay fp32.
  DType compute_type = DType::kF32;
  LoraOptions lora;
  // Rows of the lm-head + cross-entropy per chunk: the (rows, padded vocab) logits buffer is all
  // that exists of the logits (forward, loss and its gradient run chunk by chunk, so the
  // (B*T, vocab) logits are never whole). 0: LogitsChunkRows' choice (layout.h); B*T or more: one
  // chunk (logits() then holds every row's logits after Forward(false)).
  int64_t logits_chunk_rows = 0;
  // The fp32 master weights in the optimizer's store instead of on the device (core/
  // master_weights.h; the job runner sets it for training.offload with bf16/fp16, no ZeRO-1, no
  // sample_every). Decoder families with a 16-bit compute type (Create refuses it otherwise); the
  // encoder keeps its weights on the device and ignores it. The device then holds the 16-bit
  // weights, fp32 copies of the tensors read in fp32 (Fp32ResidentTensors: embeddings, norms,
  // biases) and the gradients; weights come in and go out through the store
  // (SetMasterWeightsStore, before any are loaded or exported), the optimizer refreshes the compute
  // weights through master_weights_sink(). With LoRA the frozen base has no master weights to
  // update: it is held only that way (no store; the adapters stay fp32 on the device), and a
  // merged export gets the fp32 base again from its origin (LoadMergeBase).
  bool master_weights_off_device = false;
  // bf16 decoders: a packed copy of each block's and the lm head's weight matrix in both the
  // layouts the GEMMs read it in (forward: W^T; input gradient: W), made once per weight update
  // through Backend::PackGemmB, so the products do not repack W on every call. The copies are
  // planned (weights, PackedWeightBytes in layout.h). The job sets it on the cpu device, whose
  // oneDNN kernels read a blocked layout (PacksGemmWeights); elsewhere it would only cost memory.
  // bf16 with at least 2048 rows also plans a temporary room (PackedActivationBytes) for each
  // linear layer's input packed the same way just before its weight-gradient GEMM
  // (nn::GemmPrecision::pack); the encoder (bert) does only that, its weights stay plain.
  bool pack_weights = false;
  // QLoRA (model.quantization_config; decoders with LoRA only): the blocks' linear weights
  // (models/quantized_base.h) held in 4 bits as bitsandbytes stores them (backend/quant4.h),
  // quantized at load; each block's forward, recomputation and backward dequantizes its weights
  // into a planned per-layer scratch in the compute type before its GEMMs. No packed copies.
  struct Quant4 {
    bool enabled = false;
    Quant4Type type = Quant4Type::kNF4;
    bool double_quant = false;
  } quant4;
  // Decoder families with rows of examples (causal jsonl data, instruction_data.h; packed or one
  // a row): attention_mask() is then a device int32 (2*B*T): each token's doc_start (the first row
  // of its example in its sequence: Backend::AttentionForward's), then its position within its
  // example (RoPE and the learned positions read it). Create fills it as one sequence a row
  // (doc_start 0, position t). The encoders ignore it.
  bool example_rows = false;
};

class Model {
 public:
  virtual ~Model() = default;

  // Validates the config (INVALID_ARGUMENT naming the model.config field) and allocates every
  // buffer from `arena` (RESOURCE_EXHAUSTED when it does not fit). Parameters start at zero.
  static Result<std::unique_ptr<Model>> Create(const ModelConfig& config,
                                               const ModelOptions& options, DeviceArena* arena);
  // The bytes Create() will allocate, by category (optimizer stays 0: the optimizer plans that).
  static MemoryBytes PlanBytes(const ModelConfig& config, const ModelOptions& options);
  // The parameter table of `config` (empty when the config is invalid), without allocating.
  static std::vector<ParamInfo> ParamsOf(const ModelConfig& config);
  // The parameters the optimizer trains, as views into one flat buffer (offsets from 0): the
  // whole table, or with LoRA the adapters under PEFT's tensor names. Empty when invalid.
  static std::vector<ParamInfo> TrainableParamsOf(const ModelConfig& config,
                                                  const ModelOptions& options);
  // The backend ops a model of `config`'s family runs (a training step included), for
  // CheckSupports before anything is allocated.
  static std::vector<Op> RequiredOps(const ModelConfig& config);
  // Model FLOPs of one forward+backward over B*T tokens (6*N*tokens + attention), for MFU.
  static double TrainingFlops(const ModelConfig& config, int64_t B, int64_t T);

  virtual const ModelConfig& config() const = 0;
  virtual const ModelOptions& options() const = 0;
  virtual const std::vector<ParamInfo>& params() const = 0;
  virtual int64_t num_params() const = 0;
  // device, num_params() floats (with master weights off the device: the packed fp32 tensors)
  virtual float* param_data() = 0;
  // ModelOptions::master_weights_off_device honoured: what the optimizer refreshes the compute
  // weights through; else null.
  virtual MasterWeightsSink* master_weights_sink() { return nullptr; }
  // Where the master weights are read from and written to (master_weights_sink() != null).
  virtual void SetMasterWeightsStore(MasterWeightsStore* /*store*/) {}
  // The weights as a KvDecoder reads them for generation during training (train/sampler):
  // param_data(), or with the master weights off the device the 16-bit compute copy for the GEMM
  // weights and the packed fp32 tensors for the rest. Valid while the model lives.
  virtual KvWeights InferenceWeights() { return KvWeights::Flat(param_data()); }
  // What the optimizer updates: without LoRA the same as params()/param_data(); with LoRA the
  // adapters (PEFT names, offsets into trainable_data()).
  virtual const std::vector<ParamInfo>& trainable_params() const = 0;
  virtual int64_t num_trainable() const = 0;
  virtual float* trainable_data() = 0;  // device, num_trainable() floats
  virtual float* grad_data() = 0;       // device, num_trainable() floats
  virtual bool lora() const = 0;
  // Device uint64 from which the training forward's LoRA dropout masks are drawn (write it before
  // Forward(true) / ForwardOnDevice; the same value in a later step redraws the same masks); null
  // when the model has no dropout.
  virtual uint64_t* dropout_key() { return nullptr; }
  virtual int32_t* inputs() = 0;    // device, B*T
  virtual int32_t* targets() = 0;   // device, B*T (-1 = ignored position)
  // Encoder families (bert): device int32 (B*T), 1 = a real token, 0 = padding (keys at 0 are not
  // attended; every position is still computed, as HF does); write it with inputs()/targets().
  // Null for the causal families (no padding). The targets of a bert model: masked_lm, the
  // original token at masked positions and -1 elsewhere (loss = mean over them);
  // sequence_classification, targets()[b] for b < B is sequence b's label (-1: none) and
  // targets()[B..B*T) are -1 (loss = mean cross-entropy over the labelled sequences).
  // Decoders with ModelOptions::example_rows: doc_start then positions (2*B*T), as described
  // there.
  virtual int32_t* attention_mask() { return nullptr; }
  // After Forward(false), sequence classification only: how many labelled sequences of the
  // micro-batch have their label as the argmax of the classifier's logits (reads back B rows);
  // -1 for a model without a classification head.
  virtual int64_t CorrectPredictions() { return -1; }
  // After LoadHf: the HF names of the task-head tensors the file lacked and that start from their
  // init instead (a pretrained base loaded under a task head, as transformers warns); empty when
  // the file held every tensor.
  virtual std::vector<std::string> NewlyInitialized() const { return {}; }
  // Mixture-of-experts families (mixtral): the tokens routed to each expert by the training
  // forwards since the last call, layer-major (num_layers x num_local_experts; a token counts once
  // for each of its num_experts_per_tok experts), then reset. Empty for dense models.
  virtual std::vector<int64_t> TakeExpertTokens() { return {}; }
  // False when a training step reads device data back to the host mid-step (mixtral's routing:
  // the experts' row counts), so it cannot be captured as a graph.
  virtual bool capturable() const { return true; }

  // GPT-2 style init from `seed`: N(0, 0.02) for weights, zeros for biases, ones for norm weights,
  // residual output projections scaled by 1/sqrt(2*L).
  virtual void InitRandom(uint64_t seed) = 0;
  // Loads HF tensors by name (converting dtype and Conv1D transposes). INVALID_ARGUMENT for missing
  // tensors or shape mismatches, naming the tensor and both shapes. Unused extra tensors
  // (e.g. attn.bias buffers) are ignored.
  virtual Status LoadHf(const SafetensorsFile& file) = 0;
  // Decoders with a 4-bit base (ModelOptions::quant4): a block weight the checkpoint holds
  // pre-quantized by bitsandbytes (its quant_state companions) loads as its 4 bits, checked and
  // never widened (INVALID_ARGUMENT naming the tensor for a damaged or inconsistent state).
  // LoadHfFrom: the same from an open folder (HfWeightsReader), reading one tensor at a time, so
  // the host holds a tensor's bytes, not the file's. The default reads every tensor, then LoadHf.
  virtual Status LoadHfFrom(const HfWeightsReader& reader);
  // The parameters under HF names and layouts, F32 (tied lm_head omitted as HF does), as a stream:
  // names, dtypes and shapes up front, each tensor read from the device when the writer asks for
  // it, through two reused host buffers of at most `piece_bytes` (one for a transposed tensor's
  // slice of each engine row, one for the file's layout), so WriteSafetensorsStream writes the
  // model file with about 2 x piece_bytes of host memory whatever the model's size. The stream
  // reads the parameters as they are when it runs: use it while the model lives and before the
  // next step. ExportHf: the same tensors collected into memory (tests, small models).
  virtual SafetensorsStream StreamHf(size_t piece_bytes) = 0;
  SafetensorsFile ExportHf();
  // LoRA only. InitAdapters: A Kaiming-uniform (PEFT's default: bound 1/sqrt(in)) from `seed`,
  // B zeros. ExportAdapters / LoadAdapters: the adapters under PEFT's names
  // (base_model.model.<module>.lora_A.weight (r, in), .lora_B.weight (out, r)); LoadAdapters
  // gives INVALID_ARGUMENT naming a missing or misshapen tensor. ExportMerged: the full model in
  // HF layout with W + (alpha/r) B A folded in (as PEFT's merge_and_unload); StreamMerged: the
  // same as a stream like StreamHf's (the adapters, small, are copied to the host when it is made;
  // the merge runs piece by piece on the base weights). Without LoRA both are the plain export.
  virtual void InitAdapters(uint64_t seed) = 0;
  virtual SafetensorsFile ExportAdapters() = 0;
  virtual Status LoadAdapters(const SafetensorsFile& file) = 0;
  virtual SafetensorsStream StreamMerged(size_t piece_bytes) = 0;
  SafetensorsFile ExportMerged();
  // LoRA with master_weights_off_device keeps its frozen base on the device only in the compute
  // type, so StreamMerged needs the fp32 base again (merge_needs_base): LoadMergeBase takes it
  // from where the base came from (`file`: init_from's weights; null: the seeded init from
  // `seed`) into host memory (num_params() floats, held until the model goes; the set-up's
  // LoadHf holds as much). Other models need and do nothing.
  virtual bool merge_needs_base() const { return false; }
  virtual Status LoadMergeBase(const SafetensorsFile* /*file*/, uint64_t /*seed*/) { return Status::Ok(); }
  // The target modules in effect (the option's, or the family default); empty without LoRA.
  virtual std::vector<std::string> lora_targets() const = 0;
  // Device pointer to the last chunk's logits (padded vocab wide, rows of `logits_stride()`): all N
  // rows after Forward(false) when one chunk covers them (ModelOptions::logits_chunk_rows).
  virtual const float* logits() const = 0;
  virtual int64_t logits_stride() const = 0;

  // Call after writing param_data() other than through InitRandom / LoadHf (e.g. after an
  // optimizer step): with a 16-bit compute_type it issues the Cast that refreshes the model's
  // 16-bit copy of the weights (capturable in a graph). No effect in fp32.
  virtual void ParamsChanged() = 0;
  virtual void ZeroGrad() = 0;
  // Runs forward on inputs()/targets(); returns the mean loss over non-ignored positions.
  // When `for_backward`, keeps what Backward() needs; the lm-head's gradients (its weight's and
  // the final norm output's) are formed here, chunk by chunk with the loss.
  virtual double Forward(bool for_backward, float grad_scale) = 0;
  // Forward for a training step that reads nothing back to the host (capturable in a graph):
  // d(loss)/dlogits is scaled by *grad_scale and *loss_sum += *loss_weight * (sum of the
  // per-position losses), all three device pointers. The caller folds 1/(valid targets) into
  // both scalars. Then Backward() as after Forward(true, ...).
  virtual void ForwardOnDevice(const float* grad_scale, const float* loss_weight,
                               double* loss_sum) = 0;
  // Accumulates (+=) parameter gradients of grad_scale * mean loss into grad_data().
  virtual void Backward() = 0;

  // Backward() calls `fn(layer)` once the gradients of transformer block `layer` are final for the
  // micro-batch (after that block's backward, before the blocks below it; the embeddings' and the
  // final norm's are final only when Backward() returns). On backends whose ops run on the calling
  // thread (cpu) the gradients are then in memory; data parallel starts reducing them while
  // backward goes on (train/overlapped_allreduce.h). Empty: no calls.
  void SetOnBlockGradients(std::function<void(int64_t layer)> fn) { on_block_gradients_ = std::move(fn); }

 protected:
  std::function<void(int64_t layer)> on_block_gradients_;
};

}  // namespace traind::engine
