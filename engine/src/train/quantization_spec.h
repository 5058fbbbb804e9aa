// model.quantization_config (JOBSPEC.md; QuantizationSpec in job_spec.h): parsing, its agreement
// with training's precision, and its JSON form.
#pragma once

#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>

#include "traind/engine/job_spec.h"
#include "traind/engine/status.h"

namespace traind::engine {

// model.quantization_config from `node` (null or absent: *out reset). Errors name the key
// ("model.quantization_config.bnb_4bit_quant_type: expected nf4 or fp4, got 'int4'").
Status ParseQuantizationConfig(const YAML::Node& node, std::optional<QuantizationSpec>* out);

// After training is parsed: a quantization_config needs training.peft; bnb_4bit_compute_dtype
// must agree with training.bf16 / fp16, or sets them when neither is true (bfloat16 -> bf16,
// float16 -> fp16); when absent it becomes the training precision's name.
Status ReconcileQuantization(JobSpec* spec);

// The compute dtype's name in HF's spelling for a training precision.
const char* ComputeDtypeName(const TrainingSpec& t);

// {"load_in_4bit": true, "bnb_4bit_quant_type": ..., ...} as the spec would write it.
nlohmann::ordered_json QuantizationConfigJson(const QuantizationSpec& q);

}  // namespace traind::engine
