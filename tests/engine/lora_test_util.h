// Helpers of the LoRA and QLoRA tests: the target sets that adapt every module, the peft: block,
// QLoRA's quantization_config, and adapters with a random B for gradient checks.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "model_test_util.h"
#include "traind/engine/job_spec.h"

namespace traind::engine::testing {

// Every module LoRA can adapt in gpt2 and in the llama family.
inline const std::vector<std::string> kGpt2All = {"c_attn", "c_proj", "c_fc"};
inline const std::vector<std::string> kLlamaAll = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                   "gate_proj", "up_proj", "down_proj"};

// training.peft: LoRA of rank `r` and `alpha` on `targets`; `merge` also writes the merged model.
inline PeftSpec LoraPeft(int64_t r, double alpha, const std::vector<std::string>& targets,
                         bool merge) {
  PeftSpec p;
  p.r = r;
  p.lora_alpha = alpha;
  p.target_modules = targets;
  p.merge = merge;
  return p;
}

// model.quantization_config as QLoRA's recipe: 4-bit NF4 with double quantization, bf16 compute.
inline QuantizationSpec Nf4DoubleQuantBf16() {
  QuantizationSpec q;
  q.load_in_4bit = true;
  q.bnb_4bit_quant_type = "nf4";
  q.bnb_4bit_use_double_quant = true;
  q.bnb_4bit_compute_dtype = "bfloat16";
  return q;
}

// Every lora_B of `t`'s model drawn from N(0, 0.05) (seeded): PEFT starts B at zero, which would
// make dA zero and a gradient check of A weak.
inline void RandomizeLoraB(TestModel& t, uint64_t seed) {
  Model& m = *t.model;
  std::vector<float> ad = ToHost(*t.backend, m.trainable_data(), m.num_trainable());
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> nd(0.0f, 0.05f);
  for (const ParamInfo& p : m.trainable_params()) {
    if (p.hf_name.find("lora_B") == std::string::npos) continue;
    for (int64_t i = 0; i < p.numel; ++i) ad[p.offset + i] = nd(rng);
  }
  t.backend->CopyHostToDevice(m.trainable_data(), ad.data(), ad.size() * sizeof(float));
  t.backend->Synchronize();
}

}  // namespace traind::engine::testing
