// The LoRA adapter table of a decoder model: which Linear sites of each block carry adapters
// (HF PEFT target module names per family), their shapes, their flat offsets in the trainable
// buffer and their PEFT tensor names.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/param_info.h"
#include "models/layout.h"

namespace traind::engine {

// The four Linear sites of a decoder block.
enum class LoraSiteKind { kQkv = 0, kProj = 1, kUp = 2, kDown = 3 };

struct LoraAdapterEntry {
  int64_t layer = 0;
  LoraSiteKind site = LoraSiteKind::kQkv;
  int64_t in = 0, out = 0, col = 0;  // input width, output rows, first output column in the site
  int64_t a_off = 0, b_off = 0;      // flat offsets (trainable buffer) of A (r,in) and B (out,r)
  int64_t base_w = 0;                // flat offset (base buffer) of the site's fused weight
  int64_t base_in = 0;               // the fused weight's row length (= in)
};

struct LoraTable {
  int64_t r = 0;
  float scale = 0.0f;                      // alpha / r
  std::vector<std::string> targets;        // in effect
  std::vector<ParamInfo> infos;            // A then B per adapter, PEFT names
  std::vector<LoraAdapterEntry> adapters;  // layer-major, site order, then column order
  int64_t per_layer = 0;                   // adapters per block (the same for every block)
  int64_t total = 0;                       // floats in the trainable buffer
  int64_t max_in = 0;                      // the widest adapter input (the lora_xs scratch)
};

// PEFT's default target modules of a family (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING):
// the family row's lora_default_targets.
const std::vector<std::string>& DefaultLoraTargets(Arch arch);
// The module names a family's LoRA can target (the row's lora_modules; empty: not built).
const std::vector<std::string>& LoraModuleNames(Arch arch);
// INVALID_ARGUMENT naming training.peft.<field> for an unknown target module, lora_alpha <= 0 or
// lora_dropout outside [0, 1). Every compute type is supported.
Status ValidateLora(Arch arch, const LoraOptions& o, DType compute_type);
LoraTable BuildLoraTable(const ArchDims& d, const ParamTable& base, const LoraOptions& o);

}  // namespace traind::engine
