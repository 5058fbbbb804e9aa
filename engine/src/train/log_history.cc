// LogHistory: see log_history.h.
#include "train/log_history.h"

namespace traind::engine {

LogHistory::LogHistory(nlohmann::json* entries, int64_t samples_per_step, int64_t windows_per_epoch)
    : entries_(entries), samples_per_step_(samples_per_step), windows_per_epoch_(windows_per_epoch) {}

double LogHistory::Epoch(int64_t step) const {
  return static_cast<double>(step * samples_per_step_) / static_cast<double>(windows_per_epoch_);
}

void LogHistory::AddTrainWindow(int64_t step, double loss, double learning_rate, double grad_norm,
                                const std::optional<LossScaleWindow>& fp16) {
  nlohmann::json e = {{"epoch", Epoch(step)},
                      {"grad_norm", grad_norm},
                      {"learning_rate", learning_rate},
                      {"loss", loss},
                      {"step", step}};
  if (fp16.has_value()) {
    e["skipped"] = fp16->skipped;
    e["loss_scale"] = fp16->loss_scale;
  }
  entries_->push_back(std::move(e));
}

void LogHistory::AddEval(int64_t step, double eval_loss, std::optional<double> eval_accuracy) {
  if (eval_accuracy.has_value()) {  // HF's compute_metrics keys, sorted as HF writes them
    entries_->push_back({{"epoch", Epoch(step)},
                         {"eval_accuracy", *eval_accuracy},
                         {"eval_loss", eval_loss},
                         {"step", step}});
    return;
  }
  entries_->push_back({{"epoch", Epoch(step)}, {"eval_loss", eval_loss}, {"step", step}});
}

nlohmann::json LogHistory::FinalEntry(const Final& f) const {
  return {{"epoch", Epoch(f.step)},
          {"step", f.step},
          {"total_flos", f.total_flos},
          {"train_loss", f.train_loss},
          {"train_runtime", f.train_runtime},
          {"train_samples_per_second", f.train_samples_per_second},
          {"train_tokens_per_second", f.train_tokens_per_second}};
}

}  // namespace traind::engine
