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

// A pre-quantized init_from (a folder transformers saved from a bitsandbytes 4-bit model): the
// quantization_config of its config.json (`src`, read from `path`) as a spec; nullopt when it has
// none. FAILED_PRECONDITION naming the file and key for one that is not bitsandbytes' 4 bits in
// uint8 storage.
Result<std::optional<QuantizationSpec>> CheckpointQuantization(const nlohmann::json& src,
                                                               const std::string& path);
// The spec against a pre-quantized init_from: model.quantization_config must be set and agree
// with the file's bnb_4bit_quant_type and bnb_4bit_use_double_quant (FAILED_PRECONDITION naming
// the field and the file, as other config.json disagreements are). OK when the file has none.
Status CheckCheckpointQuantization(const JobSpec& spec, const nlohmann::json& src,
                                   const std::string& path);
// At parse time, before ReconcileQuantization: a spec without model.quantization_config whose
// init_from config.json has one takes the file's (the compute dtype the training precision's when
// training.bf16 / fp16 is set, else the file's); INVALID_ARGUMENT without training.peft. A folder
// or config.json that cannot be read is left to ValidateJobInputs.
Status ApplyCheckpointQuantization(JobSpec* spec);

// The compute dtype's name in HF's spelling for a training precision.
const char* ComputeDtypeName(const TrainingSpec& t);

// {"load_in_4bit": true, "bnb_4bit_quant_type": ..., ...} as the spec would write it.
nlohmann::ordered_json QuantizationConfigJson(const QuantizationSpec& q);

}  // namespace traind::engine
