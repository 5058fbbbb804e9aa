#include "train/quantization_spec.h"

#include <filesystem>
#include <fstream>
#include <sstream>

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

Result<std::optional<QuantizationSpec>> CheckpointQuantization(const nlohmann::json& src,
                                                               const std::string& path) {
  if (!src.is_object() || !src.contains("quantization_config") || src["quantization_config"].is_null()) {
    return std::optional<QuantizationSpec>();
  }
  const nlohmann::json& j = src["quantization_config"];
  const std::string where = path + ": quantization_config";
  auto fail = [&](const std::string& key, const std::string& what) {
    return Status::FailedPrecondition(where + (key.empty() ? "" : "." + key) + ": " + what);
  };
  if (!j.is_object()) return fail("", "not a JSON object");
  auto text = [&](const char* key, std::string* out) -> Status {
    if (!j.contains(key) || j[key].is_null()) return Status::Ok();
    if (!j[key].is_string()) return fail(key, "expected a string, got " + j[key].dump());
    *out = j[key].get<std::string>();
    return Status::Ok();
  };
  auto flag = [&](const char* key, bool* out) -> Status {
    if (!j.contains(key) || j[key].is_null()) return Status::Ok();
    if (!j[key].is_boolean()) return fail(key, "expected true or false, got " + j[key].dump());
    *out = j[key].get<bool>();
    return Status::Ok();
  };
  std::string method = "bitsandbytes";
  TRAIND_RETURN_IF_ERROR(text("quant_method", &method));
  if (method != "bitsandbytes") {
    return fail("quant_method", "'" + method + "': only bitsandbytes' 4-bit checkpoints load (use the "
                                "full-precision model otherwise)");
  }
  bool in4 = false, in8 = false;
  TRAIND_RETURN_IF_ERROR(flag("load_in_4bit", &in4));
  TRAIND_RETURN_IF_ERROR(flag("_load_in_4bit", &in4));
  TRAIND_RETURN_IF_ERROR(flag("load_in_8bit", &in8));
  if (in8 || !in4) {
    return fail(in8 ? "load_in_8bit" : "load_in_4bit",
                "an 8-bit checkpoint is not built; only load_in_4bit checkpoints load");
  }
  QuantizationSpec q;
  q.load_in_4bit = true;
  TRAIND_RETURN_IF_ERROR(text("bnb_4bit_quant_type", &q.bnb_4bit_quant_type));
  if (q.bnb_4bit_quant_type != "nf4" && q.bnb_4bit_quant_type != "fp4") {
    return fail("bnb_4bit_quant_type", "expected nf4 or fp4, got '" + q.bnb_4bit_quant_type + "'");
  }
  TRAIND_RETURN_IF_ERROR(flag("bnb_4bit_use_double_quant", &q.bnb_4bit_use_double_quant));
  TRAIND_RETURN_IF_ERROR(text("bnb_4bit_compute_dtype", &q.bnb_4bit_compute_dtype));
  if (!q.bnb_4bit_compute_dtype.empty() && q.bnb_4bit_compute_dtype != "bfloat16" &&
      q.bnb_4bit_compute_dtype != "float16" && q.bnb_4bit_compute_dtype != "float32") {
    return fail("bnb_4bit_compute_dtype",
                "expected bfloat16, float16 or float32, got '" + q.bnb_4bit_compute_dtype + "'");
  }
  std::string storage = "uint8";
  TRAIND_RETURN_IF_ERROR(text("bnb_4bit_quant_storage", &storage));
  if (storage != "uint8") {
    return fail("bnb_4bit_quant_storage", "'" + storage + "': only uint8 storage (the default) loads");
  }
  // The modules the checkpoint kept unquantized: a block weight among them is full precision in the
  // file and is quantized at load like any other (the 4-bit base holds every block linear weight).
  if (j.contains("llm_int8_skip_modules") && !j["llm_int8_skip_modules"].is_null()) {
    const nlohmann::json& m = j["llm_int8_skip_modules"];
    bool ok = m.is_array();
    for (const auto& e : m) ok = ok && e.is_string();
    if (!ok) return fail("llm_int8_skip_modules", "expected null or a list of module names, got " + m.dump());
  }
  return std::optional<QuantizationSpec>(q);
}

Status CheckCheckpointQuantization(const JobSpec& spec, const nlohmann::json& src,
                                   const std::string& path) {
  TRAIND_ASSIGN_OR_RETURN(std::optional<QuantizationSpec> file, CheckpointQuantization(src, path));
  if (!file.has_value()) return Status::Ok();
  const std::optional<QuantizationSpec>& mine = spec.model.quantization_config;
  if (!mine.has_value()) {
    return Status::FailedPrecondition(
        "model.init_from: " + path + " has quantization_config (a bitsandbytes 4-bit checkpoint) but "
        "model.quantization_config is null: it loads only as a 4-bit base under training.peft (QLoRA); "
        "leave model.quantization_config out of the spec to take the file's");
  }
  auto differs = [&](const std::string& key, const std::string& a, const std::string& f) {
    return Status::FailedPrecondition(std::string(kPath) + "." + key + ": " + a + " disagrees with " +
                                      path + " (" + f + "); remove model.quantization_config from the "
                                      "spec (the checkpoint's applies) or make it agree");
  };
  if (mine->bnb_4bit_quant_type != file->bnb_4bit_quant_type) {
    return differs("bnb_4bit_quant_type", mine->bnb_4bit_quant_type, file->bnb_4bit_quant_type);
  }
  if (mine->bnb_4bit_use_double_quant != file->bnb_4bit_use_double_quant) {
    return differs("bnb_4bit_use_double_quant", mine->bnb_4bit_use_double_quant ? "true" : "false",
                   file->bnb_4bit_use_double_quant ? "true" : "false");
  }
  return Status::Ok();
}

Status ApplyCheckpointQuantization(JobSpec* spec) {
  if (!spec->model.init_from.has_value() || spec->model.quantization_config.has_value()) {
    return Status::Ok();
  }
  const std::string path = (std::filesystem::path(*spec->model.init_from) / "config.json").string();
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Ok();  // ValidateJobInputs names a missing folder or file
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json src = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  Result<std::optional<QuantizationSpec>> file = CheckpointQuantization(src, path);
  if (!file.ok() || !file->has_value()) return Status::Ok();  // errors: ResolveModelConfig's
  const TrainingSpec& t = spec->training;
  if (!t.peft.has_value()) {
    return Status::InvalidArgument(
        "model.init_from: " + path + " is a bitsandbytes 4-bit checkpoint (quantization_config): "
        "its base is frozen, so it trains only with training.peft (QLoRA); set training.peft or "
        "use a full-precision model");
  }
  QuantizationSpec q = **file;
  if (t.bf16 || t.fp16) q.bnb_4bit_compute_dtype = ComputeDtypeName(t);
  spec->model.quantization_config = q;
  return Status::Ok();
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
