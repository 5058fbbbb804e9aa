// Checkpoint I/O for the trainer: HF-layout files plus optimizer state and trainer_extra.json,
// written into a temporary folder and renamed into place.
#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "models/hf_config.h"
#include "models/layout.h"
#include "core/safetensors.h"

namespace traind::engine {
namespace fs = std::filesystem;
namespace {

constexpr const char* kExtraFormat = "traind-trainer-extra-v1";
constexpr const char* kCheckpointPrefix = "checkpoint-";

// Parses the <step> of "checkpoint-<step>" (digits only), or -1.
int64_t StepOfName(const std::string& name) {
  const std::string prefix = kCheckpointPrefix;
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return -1;
  const std::string digits = name.substr(prefix.size());
  if (digits.size() > 18) return -1;
  for (char c : digits) {
    if (c < '0' || c > '9') return -1;
  }
  return std::stoll(digits);
}

void FsyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

Result<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::DataLoss("checkpoint file " + path + " is missing or unreadable");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Result<nlohmann::json> ReadJson(const std::string& path) {
  TRAIND_ASSIGN_OR_RETURN(std::string text, ReadText(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::DataLoss(path + " is not a JSON object");
  return j;
}

std::string ExtraJson(const TrainerState& s) {
  nlohmann::json j;
  j["format"] = kExtraFormat;
  j["global_step"] = s.global_step;
  j["lr_scheduler_step"] = s.global_step;
  // fp16 steps skipped by the loss scaler run no optimizer step.
  j["optimizer_step"] = s.global_step - (s.loss_scaler ? s.loss_scaler->skipped_steps : 0);
  j["loader"] = {{"epoch", s.loader.epoch}, {"next_window", s.loader.next_window}};
  // The batch order is a pure function of (seed, epoch): the loader position is the whole RNG state.
  j["rng"] = "batch order derives from (training.seed, epoch); no other random state";
  j["window_loss_sum"] = s.window_loss_sum;
  j["window_steps"] = s.window_steps;
  j["train_loss_sum"] = s.train_loss_sum;
  j["micro_batch"] = s.micro_batch;
  j["gradient_accumulation_steps"] = s.gradient_accumulation_steps;
  if (s.loss_scaler.has_value()) {  // fp16 runs only (additive; older readers ignore it)
    j["loss_scaler"] = {{"scale", s.loss_scaler->scale},
                        {"growth_tracker", s.loss_scaler->growth_tracker},
                        {"skipped_steps", s.loss_scaler->skipped_steps}};
    j["window_skipped"] = s.window_skipped;
  }
  return j.dump(2) + "\n";
}

}  // namespace

std::string CheckpointDir(const std::string& output_dir, int64_t step) {
  return (fs::path(output_dir) / (kCheckpointPrefix + std::to_string(step))).string();
}

std::string TrainerStateJson(const JobSpec& spec, const TrainerState& state,
                             int64_t windows_per_epoch, const nlohmann::json* final_entry) {
  const TrainingSpec& t = spec.training;
  nlohmann::json j;
  j["best_metric"] = nullptr;
  j["best_model_checkpoint"] = nullptr;
  const double samples = static_cast<double>(state.global_step * state.micro_batch *
                                             state.gradient_accumulation_steps);
  j["epoch"] = windows_per_epoch > 0 ? samples / static_cast<double>(windows_per_epoch) : 0.0;
  j["eval_steps"] = t.eval_steps;
  j["global_step"] = state.global_step;
  j["is_hyper_param_search"] = false;
  j["is_local_process_zero"] = true;
  j["is_world_process_zero"] = true;
  j["log_history"] = state.log_history;
  if (final_entry != nullptr) j["log_history"].push_back(*final_entry);
  j["logging_steps"] = t.logging_steps;
  j["max_steps"] = t.max_steps;
  j["save_steps"] = t.save_steps;
  j["train_batch_size"] = state.micro_batch;
  j["gradient_accumulation_steps"] = state.gradient_accumulation_steps;
  j["trial_name"] = nullptr;
  j["trial_params"] = nullptr;
  return j.dump(2) + "\n";
}

std::string AdapterConfigJson(const JobSpec& spec, const Model& model) {
  const PeftSpec p = spec.training.peft.value_or(PeftSpec{});
  nlohmann::json j;
  j["alpha_pattern"] = nlohmann::json::object();
  j["auto_mapping"] = nullptr;
  j["base_model_name_or_path"] =
      spec.model.init_from ? nlohmann::json(*spec.model.init_from) : nlohmann::json(nullptr);
  j["bias"] = "none";
  j["fan_in_fan_out"] = FamilyOf(model.config().arch).lora_fan_in_fan_out;
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  j["layer_replication"] = nullptr;
  j["layers_pattern"] = nullptr;
  j["layers_to_transform"] = nullptr;
  j["loftq_config"] = nlohmann::json::object();
  j["lora_alpha"] = p.lora_alpha;
  j["lora_dropout"] = p.lora_dropout;
  j["megatron_config"] = nullptr;
  j["megatron_core"] = "megatron.core";
  j["modules_to_save"] = nullptr;
  j["peft_type"] = "LORA";
  j["r"] = p.r;
  j["rank_pattern"] = nlohmann::json::object();
  j["revision"] = nullptr;
  j["target_modules"] = model.lora_targets();
  j["task_type"] = "CAUSAL_LM";
  j["use_dora"] = false;
  j["use_rslora"] = false;
  return j.dump(2) + "\n";
}

Result<std::string> SaveCheckpoint(const std::string& output_dir, const JobSpec& spec,
                                   Model* model, const Optimizer& optimizer,
                                   const TrainerState& state, int64_t windows_per_epoch) {
  const std::string final_dir = CheckpointDir(output_dir, state.global_step);
  const std::string tmp_dir = final_dir + ".tmp";
  std::error_code ec;
  fs::remove_all(tmp_dir, ec);
  fs::create_directories(tmp_dir, ec);
  if (ec) return Status::Internal("cannot create " + tmp_dir + ": " + ec.message());
  const fs::path tmp(tmp_dir);
  TRAIND_RETURN_IF_ERROR(
      WriteFileAtomic((tmp / kConfigFile).string(), WriteHfConfigJson(model->config())));
  if (model->lora()) {  // only the adapters: the frozen base comes from init_from or the seed
    TRAIND_RETURN_IF_ERROR(
        WriteSafetensors((tmp / kAdapterModelFile).string(), model->ExportAdapters()));
    TRAIND_RETURN_IF_ERROR(
        WriteFileAtomic((tmp / kAdapterConfigFile).string(), AdapterConfigJson(spec, *model)));
  } else {
    TRAIND_RETURN_IF_ERROR(WriteSafetensorsStream((tmp / kModelFile).string(),
                                                  model->StreamHf(kHfExportPieceBytes)));
  }
  TRAIND_RETURN_IF_ERROR(optimizer.WriteState((tmp / kOptimizerFile).string()));
  TRAIND_RETURN_IF_ERROR(WriteFileAtomic((tmp / kTrainerStateFile).string(),
                                         TrainerStateJson(spec, state, windows_per_epoch, nullptr)));
  TRAIND_RETURN_IF_ERROR(WriteFileAtomic((tmp / kTrainerExtraFile).string(), ExtraJson(state)));
  FsyncDir(tmp_dir);
  // Replace an existing folder of the same step: move it aside first (rename() cannot replace a
  // non-empty directory), then drop it once the new one is in place.
  const std::string old_dir = final_dir + ".old";
  const bool had_old = fs::exists(final_dir, ec);
  if (had_old) {
    fs::remove_all(old_dir, ec);
    fs::rename(final_dir, old_dir, ec);
    if (ec) return Status::Internal("cannot move aside " + final_dir + ": " + ec.message());
  }
  fs::rename(tmp_dir, final_dir, ec);
  if (ec) return Status::Internal("cannot rename " + tmp_dir + " to " + final_dir + ": " + ec.message());
  FsyncDir(output_dir);
  if (had_old) fs::remove_all(old_dir, ec);
  return final_dir;
}

int64_t FindLatestCheckpoint(const std::string& output_dir) {
  std::error_code ec;
  int64_t best = -1;
  for (fs::directory_iterator it(output_dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_directory(ec)) continue;
    const int64_t step = StepOfName(it->path().filename().string());
    if (step <= best) continue;
    bool complete = true;
    for (const char* f : {kConfigFile, kTrainerStateFile, kOptimizerFile, kTrainerExtraFile}) {
      if (!fs::is_regular_file(it->path() / f, ec)) complete = false;
    }
    // The weights: the full model, or (LoRA) the adapters.
    if (!fs::is_regular_file(it->path() / kModelFile, ec) &&
        !fs::is_regular_file(it->path() / kAdapterModelFile, ec)) {
      complete = false;
    }
    if (complete) best = step;
  }
  return best;
}

Status LoadCheckpoint(const std::string& dir, Model* model, Optimizer* optimizer,
                      TrainerState* state) {
  const fs::path d(dir);
  TRAIND_ASSIGN_OR_RETURN(ModelConfig config, ReadHfConfig((d / kConfigFile).string()));
  // The checkpoint must be of this model: compare through the canonical config.json text.
  if (WriteHfConfigJson(config) != WriteHfConfigJson(model->config())) {
    return Status::InvalidArgument("checkpoint " + dir +
                                   ": its config.json does not match the job's model config");
  }
  if (model->lora()) {
    if (!fs::is_regular_file(d / kAdapterModelFile)) {
      return Status::InvalidArgument("checkpoint " + dir + " holds no " + kAdapterModelFile +
                                     ": it is not of a LoRA job (training.peft)");
    }
    TRAIND_ASSIGN_OR_RETURN(SafetensorsFile adapters,
                            ReadSafetensors((d / kAdapterModelFile).string()));
    TRAIND_RETURN_IF_ERROR(model->LoadAdapters(adapters));
  } else {
    if (!fs::is_regular_file(d / kModelFile)) {
      return Status::InvalidArgument("checkpoint " + dir + " holds no " + kModelFile +
                                     " (a LoRA checkpoint?): set training.peft to resume it");
    }
    TRAIND_ASSIGN_OR_RETURN(SafetensorsFile weights, ReadSafetensors((d / kModelFile).string()));
    TRAIND_RETURN_IF_ERROR(model->LoadHf(weights));
  }
  // Offloaded optimizers stream the file into their store (never the whole state in RAM).
  TRAIND_RETURN_IF_ERROR(optimizer->ReadState((d / kOptimizerFile).string()));

  const std::string extra_path = (d / kTrainerExtraFile).string();
  const std::string state_path = (d / kTrainerStateFile).string();
  TRAIND_ASSIGN_OR_RETURN(nlohmann::json extra, ReadJson(extra_path));
  TRAIND_ASSIGN_OR_RETURN(nlohmann::json hf_state, ReadJson(state_path));
  try {
    if (extra.at("format").get<std::string>() != kExtraFormat) {
      return Status::DataLoss(extra_path + ": format is not " + std::string(kExtraFormat));
    }
    TrainerState s;
    s.global_step = extra.at("global_step").get<int64_t>();
    s.loader.epoch = extra.at("loader").at("epoch").get<int64_t>();
    s.loader.next_window = extra.at("loader").at("next_window").get<int64_t>();
    s.window_loss_sum = extra.at("window_loss_sum").get<double>();
    s.window_steps = extra.at("window_steps").get<int64_t>();
    s.train_loss_sum = extra.at("train_loss_sum").get<double>();
    s.micro_batch = extra.at("micro_batch").get<int64_t>();
    s.gradient_accumulation_steps = extra.at("gradient_accumulation_steps").get<int64_t>();
    if (extra.contains("loss_scaler")) {  // absent: bf16/fp32 or an older checkpoint
      const nlohmann::json& ls = extra.at("loss_scaler");
      LossScalerState scaler;
      scaler.scale = ls.at("scale").get<double>();
      scaler.growth_tracker = ls.at("growth_tracker").get<int64_t>();
      scaler.skipped_steps = ls.at("skipped_steps").get<int64_t>();
      if (!LossScaler::IsValid(scaler)) {
        return Status::DataLoss(extra_path + ": loss_scaler holds an invalid scale or counter");
      }
      s.loss_scaler = scaler;
    }
    s.window_skipped = extra.value("window_skipped", int64_t{0});
    if (s.window_skipped < 0) return Status::DataLoss(extra_path + ": window_skipped < 0");
    s.log_history = hf_state.at("log_history");
    if (!s.log_history.is_array()) return Status::DataLoss(state_path + ": log_history is not a list");
    // AdamW's count = global_step - skipped fp16 steps (no "loss_scaler": bf16/fp32, no skips).
    const int64_t opt_step = optimizer->step();
    const bool optimizer_ok =
        opt_step == s.global_step - (s.loss_scaler ? s.loss_scaler->skipped_steps : 0);
    if (hf_state.at("global_step").get<int64_t>() != s.global_step || !optimizer_ok ||
        s.global_step < 0 || s.loader.epoch < 0 || s.loader.next_window < 0) {
      return Status::DataLoss("checkpoint " + dir + ": step counters of its files disagree");
    }
    *state = std::move(s);
  } catch (const nlohmann::json::exception& e) {
    return Status::DataLoss("checkpoint " + dir + ": bad trainer_extra.json or trainer_state.json (" +
                            e.what() + ")");
  }
  return Status::Ok();
}

Status RemoveCheckpoints(const std::string& output_dir) {
  std::error_code ec;
  std::vector<fs::path> doomed;
  for (fs::directory_iterator it(output_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(kCheckpointPrefix, 0) == 0 && it->is_directory(ec)) doomed.push_back(it->path());
  }
  for (const fs::path& p : doomed) {
    fs::remove_all(p, ec);
    if (ec) return Status::Internal("cannot remove " + p.string() + ": " + ec.message());
  }
  return Status::Ok();
}

}  // namespace traind::engine
