// A TEMPORARY stand-in for the engine's job API (ParseJobSpec, ValidateJobInputs, JobSpecToJson,
// EstimateJob, RunJob), linked ONLY into test builds of traind while engine/ does not define them
// yet. It parses specs strictly and "trains" deterministically (no kernels), writing checkpoints.
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "traind/engine/job_spec.h"
#include "traind/engine/trainer.h"

namespace traind::engine {
namespace {
namespace fs = std::filesystem;

Status Bad(const std::string& path, const std::string& what) {
  return Status::InvalidArgument(path + ": " + what);
}

std::string Resolve(const std::string& base, const std::string& p) {
  if (p.empty() || base.empty() || fs::path(p).is_absolute()) return p;
  return (fs::path(base) / p).lexically_normal().string();
}

template <typename T>
Status Get(const YAML::Node& n, const std::string& path, T* out) {
  try {
    *out = n.as<T>();
  } catch (const std::exception&) {
    return Bad(path, "wrong type");
  }
  return Status::Ok();
}

Status CheckKeys(const YAML::Node& n, const std::string& path, const std::set<std::string>& keys) {
  if (!n.IsMap()) return Bad(path.empty() ? "spec" : path, "must be a mapping");
  for (const auto& kv : n) {
    const std::string k = kv.first.as<std::string>();
    if (!keys.count(k)) return Bad(path.empty() ? k : path + "." + k, "unknown field");
  }
  return Status::Ok();
}
}  // namespace

Result<JobSpec> ParseJobSpec(std::string_view text, const std::string& base_dir) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("spec: not valid YAML: ") + e.what());
  }
  TRAIND_RETURN_IF_ERROR(CheckKeys(root, "", {"name", "model", "data", "training", "output_dir"}));
  JobSpec s;
  if (root["name"]) TRAIND_RETURN_IF_ERROR(Get(root["name"], "name", &s.name));
  if (root["output_dir"]) TRAIND_RETURN_IF_ERROR(Get(root["output_dir"], "output_dir", &s.output_dir));
  const YAML::Node m = root["model"];
  if (m) {
    TRAIND_RETURN_IF_ERROR(CheckKeys(m, "model", {"arch", "config", "init_from"}));
    if (m["arch"]) TRAIND_RETURN_IF_ERROR(Get(m["arch"], "model.arch", &s.model.config.arch));
    if (s.model.config.arch != "gpt2" && s.model.config.arch != "llama")
      return Bad("model.arch", "must be gpt2 or llama, got " + s.model.config.arch);
    const YAML::Node c = m["config"];
    if (c && !c.IsNull()) {
      TRAIND_RETURN_IF_ERROR(CheckKeys(c, "model.config",
          {"vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "layer_norm_epsilon"}));
      auto& mc = s.model.config;
      for (auto [k, p] : std::initializer_list<std::pair<const char*, int64_t*>>{
               {"vocab_size", &mc.vocab_size}, {"n_positions", &mc.n_positions},
               {"n_embd", &mc.n_embd}, {"n_layer", &mc.n_layer}, {"n_head", &mc.n_head}}) {
        if (c[k]) TRAIND_RETURN_IF_ERROR(Get(c[k], std::string("model.config.") + k, p));
        if (*p <= 0) return Bad(std::string("model.config.") + k, "must be positive");
      }
    }
    if (m["init_from"] && !m["init_from"].IsNull()) return Bad("model.init_from", "not supported by the stand-in");
  }
  const YAML::Node d = root["data"];
  if (!d) return Bad("data.train_file", "required");
  TRAIND_RETURN_IF_ERROR(CheckKeys(d, "data", {"train_file", "format", "token_dtype", "tokenizer",
                                               "seq_len", "validation_split", "shuffle"}));
  if (!d["train_file"]) return Bad("data.train_file", "required");
  TRAIND_RETURN_IF_ERROR(Get(d["train_file"], "data.train_file", &s.data.train_file));
  if (d["seq_len"]) TRAIND_RETURN_IF_ERROR(Get(d["seq_len"], "data.seq_len", &s.data.seq_len));
  if (s.data.seq_len <= 0) return Bad("data.seq_len", "must be positive");
  if (d["shuffle"]) TRAIND_RETURN_IF_ERROR(Get(d["shuffle"], "data.shuffle", &s.data.shuffle));
  if (d["validation_split"])
    TRAIND_RETURN_IF_ERROR(Get(d["validation_split"], "data.validation_split", &s.data.validation_split));
  const YAML::Node t = root["training"];
  if (t) {
    TRAIND_RETURN_IF_ERROR(CheckKeys(t, "training",
        {"max_steps", "per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate",
         "lr_scheduler_type", "warmup_steps", "weight_decay", "seed", "logging_steps",
         "eval_steps", "save_steps", "max_grad_norm", "optim"}));
    auto& tr = s.training;
    for (auto [k, p] : std::initializer_list<std::pair<const char*, int64_t*>>{
             {"max_steps", &tr.max_steps}, {"gradient_accumulation_steps", &tr.gradient_accumulation_steps},
             {"warmup_steps", &tr.warmup_steps}, {"seed", &tr.seed}, {"logging_steps", &tr.logging_steps},
             {"eval_steps", &tr.eval_steps}, {"save_steps", &tr.save_steps}}) {
      if (t[k]) TRAIND_RETURN_IF_ERROR(Get(t[k], std::string("training.") + k, p));
      if (*p < 0) return Bad(std::string("training.") + k, "must not be negative");
    }
    if (t["per_device_train_batch_size"]) {
      if (t["per_device_train_batch_size"].as<std::string>() == "auto") {
        tr.per_device_train_batch_size = 0;
      } else {
        TRAIND_RETURN_IF_ERROR(Get(t["per_device_train_batch_size"], "training.per_device_train_batch_size",
                                   &tr.per_device_train_batch_size));
        if (tr.per_device_train_batch_size <= 0)
          return Bad("training.per_device_train_batch_size", "must be positive or \"auto\"");
      }
    }
    if (t["learning_rate"]) TRAIND_RETURN_IF_ERROR(Get(t["learning_rate"], "training.learning_rate", &tr.learning_rate));
    if (t["optim"]) TRAIND_RETURN_IF_ERROR(Get(t["optim"], "training.optim", &tr.optim));
    if (tr.optim != "adamw") return Bad("training.optim", tr.optim + " is not supported yet");
  }
  s.data.train_file = Resolve(base_dir, s.data.train_file);
  s.output_dir = Resolve(base_dir, s.output_dir);
  return s;
}

Status ValidateJobInputs(const JobSpec& spec) {
  std::error_code ec;
  if (!fs::exists(spec.data.train_file, ec))
    return Status::NotFound("data.train_file: " + spec.data.train_file + " does not exist");
  return Status::Ok();
}

std::string JobSpecToJson(const JobSpec& s) {
  nlohmann::json j;
  j["name"] = s.name;
  j["output_dir"] = s.output_dir;
  j["model"]["arch"] = s.model.config.arch;
  j["model"]["config"] = {{"vocab_size", s.model.config.vocab_size}, {"n_positions", s.model.config.n_positions},
                          {"n_embd", s.model.config.n_embd}, {"n_layer", s.model.config.n_layer},
                          {"n_head", s.model.config.n_head}};
  j["data"] = {{"train_file", s.data.train_file}, {"seq_len", s.data.seq_len}, {"shuffle", s.data.shuffle},
               {"validation_split", s.data.validation_split}};
  const auto& t = s.training;
  j["training"] = {{"max_steps", t.max_steps}, {"gradient_accumulation_steps", t.gradient_accumulation_steps},
                   {"learning_rate", t.learning_rate}, {"seed", t.seed}, {"logging_steps", t.logging_steps},
                   {"eval_steps", t.eval_steps}, {"save_steps", t.save_steps}, {"warmup_steps", t.warmup_steps}};
  if (t.auto_batch()) j["training"]["per_device_train_batch_size"] = "auto";
  else j["training"]["per_device_train_batch_size"] = t.per_device_train_batch_size;
  return j.dump();
}

Result<MemoryPlan> EstimateJob(const JobSpec& spec, const DeviceOptions& device) {
  const auto& c = spec.model.config;
  const int64_t params = c.vocab_size * c.n_embd + c.n_positions * c.n_embd + 12 * c.n_layer * c.n_embd * c.n_embd;
  MemoryPlan p;
  p.micro_batch = spec.training.auto_batch() ? 8 : spec.training.per_device_train_batch_size;
  p.gradient_accumulation_steps = spec.training.gradient_accumulation_steps;
  p.bytes.weights = 4 * params;
  p.bytes.gradients = 4 * params;
  p.bytes.optimizer = 8 * params;
  p.bytes.activations = 4 * p.micro_batch * spec.data.seq_len * c.n_embd * c.n_layer * 16;
  p.bytes.temporary = 4 * p.micro_batch * spec.data.seq_len * c.vocab_size;
  p.budget_bytes = device.memory_budget_bytes;
  p.reason = "micro_batch " + std::to_string(p.micro_batch) + " as requested (stand-in planner)";
  if (p.budget_bytes > 0 && p.bytes.total() > p.budget_bytes)
    return Status::FailedPrecondition("needs " + std::to_string(p.bytes.total()) + " bytes, budget " +
                                      std::to_string(p.budget_bytes) +
                                      ": lower per_device_train_batch_size or the model size");
  return p;
}

Result<RunSummary> RunJob(const JobSpec& spec, const RunOptions& options, const RunCallbacks& cb) {
  auto plan = EstimateJob(spec, options.device);
  if (!plan.ok()) return plan.status();
  fs::create_directories(spec.output_dir);
  int64_t start = 0;
  double state = static_cast<double>(spec.training.seed);
  if (options.resume) {
    for (const auto& e : fs::directory_iterator(spec.output_dir)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("checkpoint-", 0) == 0 && fs::exists(e.path() / "state")) {
        int64_t s = std::stoll(n.substr(11));
        if (s > start) {
          start = s;
          std::ifstream(e.path() / "state") >> state;
        }
      }
    }
    if (cb.on_message && start > 0) cb.on_message("resumed from checkpoint-" + std::to_string(start));
  }
  if (cb.on_plan) cb.on_plan(*plan);
  const double delay = std::getenv("TRAIND_STANDIN_STEP_MS") ? std::atof(std::getenv("TRAIND_STANDIN_STEP_MS")) : 50;
  double loss_sum = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t step = start + 1; step <= spec.training.max_steps; ++step) {
    if (options.cancel && options.cancel->load()) return Status::Cancelled("cancelled at step " + std::to_string(step));
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(delay));
    state = std::fmod(state * 1.000123 + 0.5, 1000.0);
    StepReport r;
    r.step = step;
    r.max_steps = spec.training.max_steps;
    r.loss = 5.0 / (1.0 + 0.1 * step) + state * 1e-6;
    r.learning_rate = spec.training.learning_rate;
    r.grad_norm = 1.0;
    r.step_seconds = delay / 1000.0;
    r.tokens = plan->micro_batch * spec.data.seq_len;
    r.samples = plan->micro_batch;
    r.model_flops = 6.0 * 1e6 * static_cast<double>(r.tokens);
    r.memory_used_bytes = plan->bytes.total();
    r.memory_peak_bytes = plan->bytes.total();
    loss_sum += r.loss;
    if (cb.on_step) cb.on_step(r);
    if (spec.training.logging_steps > 0 && step % spec.training.logging_steps == 0 && cb.on_log)
      cb.on_log({step, r.loss, r.learning_rate, 1.0, r.tokens / r.step_seconds, r.samples / r.step_seconds});
    const bool last = step == spec.training.max_steps;
    if ((spec.training.save_steps > 0 && step % spec.training.save_steps == 0) || last) {
      const fs::path dir = fs::path(spec.output_dir) / ("checkpoint-" + std::to_string(step));
      fs::create_directories(dir);
      std::ofstream(dir / "state") << std::setprecision(17) << state;
      if (cb.on_checkpoint) cb.on_checkpoint(step, dir.string());
    }
  }
  std::ofstream(fs::path(spec.output_dir) / "model.safetensors") << std::setprecision(17) << state;
  std::ofstream(fs::path(spec.output_dir) / "config.json") << "{}";
  RunSummary sum;
  sum.global_step = spec.training.max_steps;
  sum.train_loss = 5.0 / (1.0 + 0.1 * spec.training.max_steps) + state * 1e-6;
  sum.eval_loss = sum.train_loss + 0.1;
  if (cb.on_eval) cb.on_eval({sum.global_step, sum.eval_loss});
  sum.train_runtime = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  sum.train_samples_per_second = plan->micro_batch * 1000.0 / delay;
  sum.train_tokens_per_second = sum.train_samples_per_second * spec.data.seq_len;
  sum.peak_memory_bytes = plan->bytes.total();
  sum.plan = *plan;
  sum.output_dir = spec.output_dir;
  (void)loss_sum;
  return sum;
}

}  // namespace traind::engine
