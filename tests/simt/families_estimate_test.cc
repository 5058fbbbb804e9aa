// `trainctl estimate` (EstimateJobWithAdvice) of the 7-8B shapes people fine-tune, one row per
// family and technique, on a GPU-like device (simt: the CUDA backend's plan, no CPU packed
// weight copies, offload updating on the host) against a 1 TiB budget so every plan is the
// requested one: bf16, seq 2048,
// micro-batch 1, gradient checkpointing; full fine-tuning with AdamW, with offload cpu and nvme,
// LoRA (r 16 on every projection) and QLoRA (the same on an NF4 base, double quantization).
// Prints the table docs/estimates.md shows, and checks what
// must hold between its rows: LoRA and offload cost less than the full fine-tune, the frozen base
// costs about its bf16 bytes, a bigger vocabulary costs more.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "traind/engine/devices.h"
#include "traind/engine/job_spec.h"
#include "traind/engine/trainer.h"

namespace traind::engine {
namespace {

struct Shape {
  const char* name;
  ModelConfig config;
};

ModelConfig Llama8B() {  // Llama-3.1-8B
  ModelConfig c;
  c.arch = Arch::kLlama;
  c.vocab_size = 128256;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_hidden_layers = 32;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.max_position_embeddings = 131072;
  c.rope_theta = 500000.0;
  c.rope_scaling.rope_type = "llama3";
  c.rope_scaling.factor = 8.0;
  return c;
}

std::vector<Shape> Shapes() {
  ModelConfig mistral = Llama8B();  // Mistral-7B-v0.3
  mistral.arch = Arch::kMistral;
  mistral.vocab_size = 32768;
  mistral.rope_scaling = ModelConfig::RopeScaling{};
  mistral.rope_theta = 1e6;
  mistral.sliding_window = 0;
  ModelConfig qwen = Llama8B();  // Qwen2.5-7B
  qwen.arch = Arch::kQwen2;
  qwen.vocab_size = 152064;
  qwen.hidden_size = 3584;
  qwen.intermediate_size = 18944;
  qwen.num_hidden_layers = 28;
  qwen.num_attention_heads = 28;
  qwen.num_key_value_heads = 4;
  qwen.rope_scaling = ModelConfig::RopeScaling{};
  qwen.max_position_embeddings = 32768;
  ModelConfig qwen3 = Llama8B();  // Qwen3-8B: q_norm / k_norm, head_dim 128, untied
  qwen3.arch = Arch::kQwen3;
  qwen3.vocab_size = 151936;
  qwen3.intermediate_size = 12288;
  qwen3.num_hidden_layers = 36;
  qwen3.head_dim = 128;
  qwen3.rope_scaling = ModelConfig::RopeScaling{};
  qwen3.rope_theta = 1e6;
  qwen3.max_position_embeddings = 40960;
  ModelConfig gemma = Llama8B();  // Gemma-7B: 256K vocabulary (tied), head_dim 256, GeGLU
  gemma.arch = Arch::kGemma;
  gemma.vocab_size = 256000;
  gemma.hidden_size = 3072;
  gemma.intermediate_size = 24576;
  gemma.num_hidden_layers = 28;
  gemma.num_attention_heads = 16;
  gemma.num_key_value_heads = 16;
  gemma.head_dim = 256;
  gemma.rope_scaling = ModelConfig::RopeScaling{};
  gemma.rope_theta = 10000.0;
  gemma.max_position_embeddings = 8192;
  gemma.tie_word_embeddings = true;
  return {{"Llama-3.1-8B", Llama8B()}, {"Mistral-7B-v0.3", mistral}, {"Qwen2.5-7B", qwen},
          {"Qwen3-8B", qwen3},         {"Gemma-7B", gemma}};
}

JobSpec Job(const ModelConfig& c, const std::string& technique) {
  JobSpec s;
  s.model.config = c;
  s.data.seq_len = 2048;
  s.training.bf16 = true;
  s.training.per_device_train_batch_size = 1;
  s.training.gradient_checkpointing = true;
  if (technique == "offload cpu" || technique == "offload nvme") {
    s.training.offload = technique.substr(8);
    s.training.offload_dir = "/tmp/offload";
  }
  if (technique == "lora" || technique == "qlora") {
    PeftSpec p;
    p.r = 16;
    p.lora_alpha = 32;
    p.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    s.training.peft = p;
  }
  if (technique == "qlora") {  // NF4 with double quantization, as QLoRA's paper
    QuantizationSpec q;
    q.load_in_4bit = true;
    q.bnb_4bit_quant_type = "nf4";
    q.bnb_4bit_use_double_quant = true;
    q.bnb_4bit_compute_dtype = "bfloat16";
    s.model.quantization_config = q;
  }
  return s;
}

double GiB(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024 * 1024); }

TEST(FamiliesEstimate, SevenToEightBillionShapes) {
  RegisterGpuBackends();
  DeviceOptions device;
  device.device = "simt";
  device.memory_budget_bytes = int64_t{1} << 40;
  std::printf("| model | technique | weights | gradients | optimizer | activations | temporary |"
              " total (GiB) | offloaded (GiB) |\n|---|---|---|---|---|---|---|---|---|\n");
  for (const Shape& shape : Shapes()) {
    double full = 0, lora_weights = 0;
    for (const std::string technique : {"full", "offload cpu", "offload nvme", "lora", "qlora"}) {
      SCOPED_TRACE(std::string(shape.name) + " " + technique);
      Result<MemoryPlan> p = EstimateJobWithAdvice(Job(shape.config, technique), device);
      ASSERT_TRUE(p.ok()) << p.status().ToString();
      ASSERT_TRUE(p->fits) << p->reason;
      const MemoryBytes& b = p->bytes;
      std::printf("| %s | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", shape.name,
                  technique.c_str(), GiB(b.weights), GiB(b.gradients), GiB(b.optimizer),
                  GiB(b.activations), GiB(b.temporary), GiB(b.total()),
                  GiB(p->offload_state_bytes + p->offload_master_bytes));
      const double base16 = 2.0 * static_cast<double>(p->total_params - p->trainable_params);
      if (technique == "full") {
        full = GiB(b.total());
        // AdamW in fp32 master weights: at least 16 bytes a parameter on the device.
        EXPECT_GT(static_cast<double>(b.total()), 16.0 * static_cast<double>(p->total_params));
      } else {
        EXPECT_LT(GiB(b.total()), full) << "must cost less than the full fine-tune";
      }
      if (technique == "lora") {
        // The frozen base in bf16 only, but for the tensors the step reads in fp32: the norms
        // and the embedding table of the lookup (Llama 3's 128K vocabulary: 2 GiB of 17): at
        // most 1.2x its bf16 bytes, far below the full fine-tune.
        EXPECT_LE(static_cast<double>(b.weights), 1.2 * base16);
        EXPECT_LT(GiB(b.total()), full / 3);
        lora_weights = GiB(b.weights);
      }
      if (technique == "qlora") {
        // The blocks' weights in about 0.53 byte instead of 2; the embeddings and the lm head
        // stay 16-bit (a tied table keeps its fp32 lookup copy): well under half of LoRA's weights.
        EXPECT_GT(p->quantized_base_bytes, 0);
        EXPECT_LT(GiB(b.weights), 0.5 * lora_weights);
      }
    }
  }
}

}  // namespace
}  // namespace traind::engine
