// RunJob: set up a training session (session.h), run its step loop (step_loop.h), then write the
// final HF-layout outputs and return the summary. EstimateJob lives with the planner.
#include "traind/engine/trainer.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "core/safetensors.h"
#include "models/hf_config.h"
#include "train/checkpoint.h"
#include "train/log_history.h"
#include "train/session.h"
#include "train/step_loop.h"

namespace traind::engine {
namespace {

namespace fs = std::filesystem;

// The summary of a finished session, in the CLI contract's names.
RunSummary Summarize(const TrainingSession& s, double last_eval) {
  const DevicePlan& dp = s.device_plan();
  const Progress& progress = s.progress();
  const int64_t step = progress.state.global_step;
  RunSummary r;
  r.global_step = step;
  r.train_loss = step > 0 ? progress.state.train_loss_sum / static_cast<double>(step) : 0.0;
  r.eval_loss = last_eval;
  r.eval_accuracy = progress.last_eval_accuracy;
  r.train_runtime =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - progress.start).count();
  const double steps_run = static_cast<double>(step - progress.first_step);
  const int64_t accum = dp.accum * s.parallel().world;  // data parallel: the world's throughput
  r.train_samples_per_second =
      r.train_runtime > 0 ? steps_run * static_cast<double>(dp.B * accum) / r.train_runtime : 0.0;
  r.train_tokens_per_second =
      r.train_runtime > 0 ? steps_run * static_cast<double>(dp.B * dp.T * accum) / r.train_runtime
                          : 0.0;
  r.peak_memory_bytes = s.objects().arena->peak_bytes();
  r.plan = dp.plan;
  r.output_dir = s.spec().output_dir;
  return r;
}

// Writes output_dir's final config.json, model.safetensors and trainer_state.json (with HF's final
// summary entry in its log_history).
Status WriteFinalOutputs(TrainingSession* s, const RunSummary& summary) {
  if (!s->writes_outputs()) return Status::Ok();  // data parallel: rank 0 writes output_dir
  const JobSpec& spec = s->spec();
  const DevicePlan& dp = s->device_plan();
  Model* model = s->objects().model.get();
  Progress& progress = s->progress();
  const fs::path out(spec.output_dir);
  const int64_t accum = dp.accum * s->parallel().world;
  LogHistory history(&progress.state.log_history, dp.B * accum, progress.windows_per_epoch);
  LogHistory::Final f;
  f.step = summary.global_step;
  f.total_flos = Model::TrainingFlops(dp.config, dp.B, dp.T) * static_cast<double>(accum) *
                 static_cast<double>(summary.global_step);
  f.train_loss = summary.train_loss;
  f.train_runtime = summary.train_runtime;
  f.train_samples_per_second = summary.train_samples_per_second;
  f.train_tokens_per_second = summary.train_tokens_per_second;
  const nlohmann::json final_entry = history.FinalEntry(f);
  const bool lora = model->lora();
  if (lora) {  // HF PEFT's layout; with peft.merge also the merged full model
    TRAIND_RETURN_IF_ERROR(WriteSafetensors((out / kAdapterModelFile).string(),
                                            model->ExportAdapters()));
    TRAIND_RETURN_IF_ERROR(WriteFileAtomic((out / kAdapterConfigFile).string(),
                                           AdapterConfigJson(spec, *model)));
  }
  if (lora && spec.training.peft->merge && model->merge_needs_base()) {
    // The frozen base is on the device only in the compute type: the fp32 base from its origin.
    const std::optional<std::string>& from = spec.model.init_from;
    std::optional<SafetensorsFile> file;
    if (from.has_value()) {
      Result<SafetensorsFile> read = ReadHfWeights(*from);
      if (!read.ok()) {
        return Status::FailedPrecondition("the merged model needs the fp32 base again from model.init_from " +
                                          *from + ": " + read.status().message());
      }
      file = std::move(*read);
    }
    const Status st = model->LoadMergeBase(file ? &*file : nullptr, static_cast<uint64_t>(spec.training.seed));
    if (!st.ok()) {
      return Status(st.code(), (from ? "model.init_from " + *from : std::string("the seeded init")) + ": " +
                                   st.message());
    }
  }
  if (lora && spec.training.peft->merge && spec.model.quantization_config.has_value()) {
    s->Message("peft.merge with model.quantization_config: the merged model is the 4-bit base "
               "dequantized to " + dp.plan.precision + " plus the adapters, so it keeps the base's " +
               spec.model.quantization_config->bnb_4bit_quant_type +
               " rounding (16 levels a block of 64; the full-precision base plus " +
               kAdapterModelFile + " merges without it)");
  }
  if (!lora || spec.training.peft->merge) {
    // A 4-bit base merges as PEFT's merge_and_unload does: every tensor in the compute dtype
    // (bf16 / fp16 jobs; fp32 stays F32), config.json's torch_dtype naming it.
    const bool q16 = lora && spec.model.quantization_config.has_value() &&
                     (spec.training.bf16 || spec.training.fp16);
    std::string config = WriteHfConfigJson(model->config());
    if (q16) {
      nlohmann::ordered_json j = nlohmann::ordered_json::parse(config);
      j["torch_dtype"] = spec.training.bf16 ? "bfloat16" : "float16";
      config = j.dump(2) + "\n";
    }
    TRAIND_RETURN_IF_ERROR(WriteFileAtomic((out / kConfigFile).string(), config));
    // Streamed: a few MiB of host memory, not a copy of the model (bench/offload_rss_bench).
    SafetensorsStream stream =
        lora ? model->StreamMerged(kHfExportPieceBytes) : model->StreamHf(kHfExportPieceBytes);
    if (q16) stream = CastSafetensorsStream(std::move(stream), spec.training.bf16 ? "BF16" : "F16");
    TRAIND_RETURN_IF_ERROR(WriteSafetensorsStream((out / kModelFile).string(), stream));
  }
  if (spec.data.chat_template.has_value()) {
    // The chat template the job rendered its data with, beside the model (as transformers'
    // save_pretrained writes chat_template.jinja), for trainctl generate --chat.
    std::ifstream in(*spec.data.chat_template, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    if (in) TRAIND_RETURN_IF_ERROR(WriteFileAtomic((out / "chat_template.jinja").string(), text.str()));
  }
  return WriteFileAtomic(
      (out / kTrainerStateFile).string(),
      TrainerStateJson(spec, progress.state, progress.windows_per_epoch, &final_entry));
}

}  // namespace

Result<RunSummary> RunJob(const JobSpec& spec, const RunOptions& options,
                          const RunCallbacks& callbacks) {
  TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<TrainingSession> session,
                          SetUpSession(spec, options, callbacks));
  // train_runtime is the training loop's wall time, as HF's Trainer measures it (its start_time is
  // taken after the model, the optimizer and a checkpoint are loaded, just before the first epoch;
  // speed_metrics is called after the loop): the set-up above (device, plan, data, model, restore)
  // is not in it, the steps, evaluations and checkpoints inside the loop are.
  session->progress().start = std::chrono::steady_clock::now();
  double last_eval = 0.0;
  TRAIND_RETURN_IF_ERROR(RunStepLoop(session.get(), &last_eval));
  const RunSummary summary = Summarize(*session, last_eval);
  TRAIND_RETURN_IF_ERROR(WriteFinalOutputs(session.get(), summary));
  return summary;
}

}  // namespace traind::engine
