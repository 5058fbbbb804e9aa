// Model's static entry points: config validation, Create, PlanBytes and TrainingFlops.
#include "models/model.h"

#include <string>

#include "models/decoder.h"
#include "models/encoder.h"
#include "models/hf_config.h"
#include "models/layout.h"
#include "models/lora.h"

namespace traind::engine {
namespace {

// The options half of the validation (the config half is ValidateModelConfig, the one validator
// of model configs, shared with the job-spec parser and init_from's config.json).
Status ValidateConfig(const ModelConfig& c, const ModelOptions& o) {
  TRAIND_RETURN_IF_ERROR(ValidateModelConfig(c, "model.config."));
  const char* f_p = c.max_positions_key();
  if (o.micro_batch < 1) {
    return Status::InvalidArgument("training.per_device_train_batch_size: must be >= 1, got " +
                                   std::to_string(o.micro_batch));
  }
  if (o.seq_len < 1 || o.seq_len > c.max_positions()) {
    return Status::InvalidArgument("data.seq_len: " + std::to_string(o.seq_len) +
                                   " must be in [1, " + f_p + " = " +
                                   std::to_string(c.max_positions()) + "]");
  }
  if (o.gradient_checkpointing && o.checkpoint_every < 1) {
    return Status::InvalidArgument("training.gradient_checkpointing_every: must be >= 1, got " +
                                   std::to_string(o.checkpoint_every));
  }
  if (o.compute_type != DType::kF32 && o.compute_type != DType::kBF16 &&
      o.compute_type != DType::kF16) {
    return Status::InvalidArgument("compute type " +
                                   std::to_string(static_cast<int>(o.compute_type)) +
                                   " is not one of f32, bf16, f16");
  }
  if (FamilyOf(c.arch).lora_modules.empty() && o.lora.enabled()) {
    return Status::Unimplemented("training.peft: LoRA is not built for " +
                                 std::string(ArchName(c.arch)) + " yet (gpt2, llama, mistral, qwen2)");
  }
  if (o.master_weights_off_device && !c.encoder() && o.compute_type == DType::kF32) {
    return Status::InvalidArgument(
        "master weights off the device need a 16-bit compute type (training.bf16 or fp16)");
  }
  if (o.quant4.enabled && !o.lora.enabled()) {
    return Status::InvalidArgument(
        "model.quantization_config: a 4-bit base is frozen, so it needs training.peft (QLoRA)");
  }
  return ValidateLora(c.arch, o.lora, o.compute_type);
}

}  // namespace

Result<std::unique_ptr<Model>> Model::Create(const ModelConfig& config, const ModelOptions& options,
                                             DeviceArena* arena) {
  TRAIND_RETURN_IF_ERROR(ValidateConfig(config, options));
  if (config.encoder()) {
    TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<EncoderModel> m,
                            EncoderModel::Make(config, options, arena));
    return std::unique_ptr<Model>(std::move(m));
  }
  TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<DecoderModel> m,
                          DecoderModel::Make(config, options, arena));
  return std::unique_ptr<Model>(std::move(m));
}

namespace {
// A model's stream only copies device memory and converts it; it has no error to report.
SafetensorsFile Collected(const SafetensorsStream& stream) {
  Result<SafetensorsFile> f = CollectSafetensorsStream(stream);
  return f.ok() ? std::move(f).value() : SafetensorsFile{};
}
}  // namespace

SafetensorsFile Model::ExportHf() { return Collected(StreamHf(kHfExportPieceBytes)); }

SafetensorsFile Model::ExportMerged() { return Collected(StreamMerged(kHfExportPieceBytes)); }

Status Model::LoadHfFrom(const HfWeightsReader& reader) {
  SafetensorsFile file;
  for (const std::string& name : reader.names()) {
    TRAIND_ASSIGN_OR_RETURN(HostTensor t, reader.ReadTensor(name));
    file.tensors.emplace(name, std::move(t));
  }
  return LoadHf(file);
}

std::vector<ParamInfo> Model::ParamsOf(const ModelConfig& config) {
  if (!ValidateModelConfig(config, "model.config.").ok()) return {};
  return BuildParams(MakeArchDims(config)).infos;
}

std::vector<Op> Model::RequiredOps(const ModelConfig& config) {
  const FamilyFeatures f = FamilyOf(config.arch).features;
  std::vector<Op> ops = {Op::kGemm, Op::kLinearForward, Op::kEmbeddingForward,
                         Op::kEmbeddingBackward, Op::kAdd, Op::kCast, Op::kAttentionForward,
                         Op::kAttentionBackward, Op::kAttentionForward16,
                         Op::kAttentionBackward16, Op::kSoftmaxCrossEntropy, Op::kAccumulateSum,
                         Op::kAccumulateSumSquares, Op::kAdamWFromScalars,
                         Op::kAdamWRunsFromScalars, Op::kDropout};
  if (f.bias) ops.insert(ops.end(), {Op::kAddBias, Op::kBiasBackward, Op::kBiasBackwardRounded});
  switch (f.norm) {
    case FamilyFeatures::Norm::kRmsNorm:
    case FamilyFeatures::Norm::kRmsNormPlusOne:  // held as 1 + w: the same ops
      ops.insert(ops.end(),
                 {Op::kRmsNormForward, Op::kRmsNormForwardRounded, Op::kRmsNormBackward});
      break;
    case FamilyFeatures::Norm::kLayerNorm:
      ops.insert(ops.end(),
                 {Op::kLayerNormForward, Op::kLayerNormForwardRounded, Op::kLayerNormBackward});
      break;
  }
  if (!config.encoder() && !f.moe) ops.push_back(Op::kResidualNormForward);  // decoder ln2
  if (f.qk_norm) ops.insert(ops.end(), {Op::kHeadRmsNormForward, Op::kHeadRmsNormBackward});
  if (f.embed_scale) ops.push_back(Op::kScale);
  if (f.positions == FamilyFeatures::Positions::kRotary) ops.push_back(Op::kRope);
  switch (f.mlp) {
    case FamilyFeatures::Mlp::kSwiGlu:
      ops.insert(ops.end(), {Op::kSwiGluForward, Op::kSwiGluBackward, Op::kSwiGluForwardRounded,
                             Op::kSwiGluBackwardRounded});
      break;
    case FamilyFeatures::Mlp::kGeluErf:
      ops.insert(ops.end(), {Op::kGeluErfForward, Op::kGeluErfBackward});
      break;
    case FamilyFeatures::Mlp::kGeGluTanh:
      ops.insert(ops.end(), {Op::kGeGluForward, Op::kGeGluBackward});
      break;
    case FamilyFeatures::Mlp::kGeluTanh:
      ops.insert(ops.end(), {Op::kGeluForward, Op::kGeluBackward, Op::kLinearForwardRoundedAct,
                             Op::kGeluBackwardBias});
      break;
  }
  if (f.moe) ops.insert(ops.end(), {Op::kScaleRows, Op::kRowDot});
  if (config.encoder() && config.head == "sequence_classification") {
    ops.insert(ops.end(), {Op::kTanhForward, Op::kTanhBackward});
  }
  return ops;
}

MemoryBytes Model::PlanBytes(const ModelConfig& config, const ModelOptions& options) {
  if (!ValidateConfig(config, options).ok()) return MemoryBytes{};
  const ArchDims d = MakeArchDims(config);
  const ParamTable table = BuildParams(d);
  BufferPlanner planner;
  if (config.encoder()) {
    EncoderBuffers bufs;
    PlanEncoderBuffers(d, options, table.total, &planner, &bufs);
    return planner.bytes();
  }
  ModelBuffers bufs;
  const LoraTable lora = BuildLoraTable(d, table, options.lora);
  PlanBuffers(d, options, table.total, Fp32WeightElems(table, options), &planner, &bufs, lora.total,
              lora.per_layer, lora.max_in);
  return planner.bytes();
}

std::vector<ParamInfo> Model::TrainableParamsOf(const ModelConfig& config,
                                                const ModelOptions& options) {
  if (!ValidateConfig(config, options).ok()) return {};
  const ArchDims d = MakeArchDims(config);
  ParamTable table = BuildParams(d);
  if (!options.lora.enabled()) return std::move(table.infos);
  return BuildLoraTable(d, table, options.lora).infos;
}

// FLOPs = (6 * P + 12 * L * T * C) * B * T, the standard (PaLM appendix B) count:
//   6 * P per token for the forward (2) and backward (4) of every matmul, with P the parameters
//   that take part in matmuls: all real (unpadded) parameters except the learned position table
//   (a lookup); the token table counts once, as the lm_head matmul (tied or not, the input
//   lookup itself is free, so an untied embed_tokens is excluded too);
//   12 * L * T * C per token for the attention scores and the weighted sum (QK^T and AV, forward
//   and backward), without halving for causality.
double Model::TrainingFlops(const ModelConfig& config, int64_t B, int64_t T) {
  const ArchDims d = MakeArchDims(config);
  const ParamTable table = BuildParams(d);
  double p = 0;
  for (size_t i = 0; i < table.infos.size(); ++i) {
    const ParamInfo& info = table.infos[i];
    if (info.offset == table.wpe || info.offset == table.tte) continue;
    // The token table is a matmul only as the (tied) lm-head / MLM decoder.
    if ((!d.tied || table.lm_head < 0) && info.offset == table.wte) continue;
    // bert's pooler and classifier run on one row per sequence, not per token.
    if (info.offset == table.pool_w || info.offset == table.cls_w) continue;
    double n = 1;
    for (int64_t s : info.hf_shape) n *= static_cast<double>(s);
    // mixtral: a token runs K of the E experts (the active parameters).
    if (d.moe() && info.hf_name.find(".experts.") != std::string::npos) {
      n *= static_cast<double>(d.K) / static_cast<double>(d.E);
    }
    p += n;
  }
  const double tokens = static_cast<double>(B) * static_cast<double>(T);
  return (6.0 * p +
          12.0 * static_cast<double>(d.L) * static_cast<double>(T) * static_cast<double>(d.C)) *
         tokens;
}

}  // namespace traind::engine
