// Model's static entry points: config validation, Create, PlanBytes and TrainingFlops.
#include "models/model.h"

#include <string>

#include "models/decoder.h"
#include "models/layout.h"

namespace traind::engine {
namespace {

Status Positive(const char* field, int64_t v) {
  if (v >= 1) return Status::Ok();
  return Status::InvalidArgument(std::string("model.config.") + field + ": must be >= 1, got " +
                                 std::to_string(v));
}

Status ValidateConfig(const ModelConfig& c, const ModelOptions& o) {
  if (c.arch != "gpt2" && c.arch != "llama") {
    return Status::InvalidArgument("model.config.arch: unknown architecture '" + c.arch +
                                   "' (supported: gpt2, llama)");
  }
  const bool llama = c.arch == "llama";
  TRAIND_RETURN_IF_ERROR(Positive("vocab_size", c.vocab_size));
  if (c.vocab_size > (int64_t{1} << 31) - 64) {
    return Status::InvalidArgument("model.config.vocab_size: " + std::to_string(c.vocab_size) +
                                   " does not fit int32 token ids");
  }
  const char* f_c = llama ? "hidden_size" : "n_embd";
  const char* f_l = llama ? "num_hidden_layers" : "n_layer";
  const char* f_h = llama ? "num_attention_heads" : "n_head";
  const char* f_p = llama ? "max_position_embeddings" : "n_positions";
  TRAIND_RETURN_IF_ERROR(Positive(f_c, c.channels()));
  TRAIND_RETURN_IF_ERROR(Positive(f_l, c.num_layers()));
  TRAIND_RETURN_IF_ERROR(Positive(f_h, c.num_heads()));
  TRAIND_RETURN_IF_ERROR(Positive(f_p, c.max_positions()));
  if (c.channels() % c.num_heads() != 0) {
    return Status::InvalidArgument(std::string("model.config.") + f_c + ": " +
                                   std::to_string(c.channels()) + " is not divisible by " + f_h +
                                   " = " + std::to_string(c.num_heads()));
  }
  if (llama) {
    TRAIND_RETURN_IF_ERROR(Positive("intermediate_size", c.intermediate_size));
    TRAIND_RETURN_IF_ERROR(Positive("num_key_value_heads", c.num_key_value_heads));
    if (c.num_attention_heads % c.num_key_value_heads != 0) {
      return Status::InvalidArgument(
          "model.config.num_key_value_heads: " + std::to_string(c.num_key_value_heads) +
          " must divide num_attention_heads = " + std::to_string(c.num_attention_heads));
    }
    if ((c.hidden_size / c.num_attention_heads) % 2 != 0) {
      return Status::InvalidArgument("model.config.hidden_size: the head size " +
                                     std::to_string(c.hidden_size / c.num_attention_heads) +
                                     " must be even for rotary embeddings");
    }
    if (!(c.rope_theta > 0)) {
      return Status::InvalidArgument("model.config.rope_theta: must be > 0");
    }
    if (!(c.rms_norm_eps > 0)) {
      return Status::InvalidArgument("model.config.rms_norm_eps: must be > 0");
    }
  } else if (!(c.layer_norm_epsilon > 0)) {
    return Status::InvalidArgument("model.config.layer_norm_epsilon: must be > 0");
  }
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
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Model>> Model::Create(const ModelConfig& config, const ModelOptions& options,
                                             DeviceArena* arena) {
  TRAIND_RETURN_IF_ERROR(ValidateConfig(config, options));
  TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<DecoderModel> m,
                          DecoderModel::Make(config, options, arena));
  return std::unique_ptr<Model>(std::move(m));
}

MemoryBytes Model::PlanBytes(const ModelConfig& config, const ModelOptions& options) {
  if (!ValidateConfig(config, options).ok()) return MemoryBytes{};
  const ArchDims d = MakeArchDims(config);
  const ParamTable table = BuildParams(d);
  BufferPlanner planner;
  ModelBuffers bufs;
  PlanBuffers(d, options, table.total, &planner, &bufs);
  return planner.bytes();
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
    if (info.offset == table.wpe) continue;
    if (!d.tied && info.offset == table.wte) continue;
    double n = 1;
    for (int64_t s : info.hf_shape) n *= static_cast<double>(s);
    p += n;
  }
  const double tokens = static_cast<double>(B) * static_cast<double>(T);
  return (6.0 * p +
          12.0 * static_cast<double>(d.L) * static_cast<double>(T) * static_cast<double>(d.C)) *
         tokens;
}

}  // namespace traind::engine
