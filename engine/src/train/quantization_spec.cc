#include "train/quantization_spec.h"

#include "train/spec_reader.h"

namespace traind::engine {
namespace {

using spec::SpecReader;
constexpr const char* kPath = "model.quantization_config";

}  // namespace

Status ParseQuantizationConfig(const YAML::Node& node, std::optional<QuantizationSpec>* out) {
  out->reset();
  if (!node || node.IsNull()) return Status::Ok();
  TRAIND_ASSIGN_OR_RETURN(SpecReader r, SpecReader::Open(node, kPath));
  // HF BitsAndBytesConfig's names for 4 bits; quant_method as transformers writes it.
  TRAIND_RETURN_IF_ERROR(r.CheckKeys({"quant_method", "load_in_4bit", "load_in_8bit",
                                      "bnb_4bit_quant_type", "bnb_4bit_use_double_quant",
                                      "bnb_4bit_compute_dtype"}));
  QuantizationSpec q;
  if (r.Has("quant_method")) {
    std::string method;
    TRAIND_RETURN_IF_ERROR(r.String("quant_method", &method));
    if (method != "bitsandbytes") {
      return r.Error("quant_method", "only bitsandbytes (4-bit) is built, got '" + method + "'");
    }
  }
  bool in8 = false;
  TRAIND_RETURN_IF_ERROR(r.Bool("load_in_8bit", &in8));
  if (in8) return r.Error("load_in_8bit", "an 8-bit base is not built: use load_in_4bit: true");
  TRAIND_RETURN_IF_ERROR(r.Bool("load_in_4bit", &q.load_in_4bit));
  if (!q.load_in_4bit) {
    return r.Error("load_in_4bit", "must be true (a 4-bit base is the one built; for no "
                                   "quantization set model.quantization_config: null)");
  }
  TRAIND_RETURN_IF_ERROR(r.Enum("bnb_4bit_quant_type", &q.bnb_4bit_quant_type, {"nf4", "fp4"}));
  TRAIND_RETURN_IF_ERROR(r.Bool("bnb_4bit_use_double_quant", &q.bnb_4bit_use_double_quant));
  if (r.Has("bnb_4bit_compute_dtype") && !r.Child("bnb_4bit_compute_dtype").IsNull()) {
    TRAIND_RETURN_IF_ERROR(r.Enum("bnb_4bit_compute_dtype", &q.bnb_4bit_compute_dtype,
                                  {"bfloat16", "float16", "float32"}));
  }
  *out = q;
  return Status::Ok();
}

const char* ComputeDtypeName(const TrainingSpec& t) {
  return t.bf16 ? "bfloat16" : t.fp16 ? "float16" : "float32";
}

Status ReconcileQuantization(JobSpec* spec) {
  if (!spec->model.quantization_config.has_value()) return Status::Ok();
  QuantizationSpec& q = *spec->model.quantization_config;
  TrainingSpec& t = spec->training;
  if (!t.peft.has_value()) {
    return Status::InvalidArgument(
        std::string(kPath) + ": needs training.peft (QLoRA: the 4-bit base is frozen and only "
        "LoRA adapters train on it); set training.peft or model.quantization_config: null");
  }
  if (t.sample_every > 0) {
    return Status::InvalidArgument(
        std::string(kPath) + ": training.sample_every is not built on a 4-bit base (generation "
        "reads the base's weights whole); set sample_every: 0 or model.quantization_config: null");
  }
  if (q.bnb_4bit_compute_dtype.empty()) {
    q.bnb_4bit_compute_dtype = ComputeDtypeName(t);
    return Status::Ok();
  }
  const std::string given = ComputeDtypeName(t);
  if (given == q.bnb_4bit_compute_dtype) return Status::Ok();
  if (!t.bf16 && !t.fp16) {  // training gave no 16-bit precision: the compute dtype sets it
    t.bf16 = q.bnb_4bit_compute_dtype == "bfloat16";
    t.fp16 = q.bnb_4bit_compute_dtype == "float16";
    return Status::Ok();
  }
  return Status::InvalidArgument(std::string(kPath) + ".bnb_4bit_compute_dtype: " +
                                 q.bnb_4bit_compute_dtype + " disagrees with training." +
                                 (t.bf16 ? "bf16" : "fp16") + ": true (" + given +
                                 "); make them agree, or leave one of them out");
}

nlohmann::ordered_json QuantizationConfigJson(const QuantizationSpec& q) {
  nlohmann::ordered_json j;
  j["load_in_4bit"] = q.load_in_4bit;
  j["bnb_4bit_quant_type"] = q.bnb_4bit_quant_type;
  j["bnb_4bit_use_double_quant"] = q.bnb_4bit_use_double_quant;
  if (!q.bnb_4bit_compute_dtype.empty()) j["bnb_4bit_compute_dtype"] = q.bnb_4bit_compute_dtype;
  return j;
}

}  // namespace traind::engine
