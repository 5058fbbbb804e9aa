// LogHistory: the one place that writes trainer_state.json's log_history entries, in the HF
// Trainer's shape: a training window every logging_steps ({epoch, grad_norm, learning_rate, loss,
// step}, plus skipped/loss_scale in fp16), an evaluation ({epoch, eval_loss, step}; with
// sequence classification also eval_accuracy), and the final
// summary ({epoch, step, total_flos, train_loss, train_runtime, train_*_per_second}), which HF
// writes into the final trainer_state.json only.
#pragma once

#include <cstdint>
#include <optional>

#include <nlohmann/json.hpp>

namespace traind::engine {

class LogHistory {
 public:
  // `entries`: the JSON array to append to (TrainerState::log_history; not owned).
  // samples_per_step = micro_batch * accumulation; "epoch" = step * samples_per_step / windows.
  LogHistory(nlohmann::json* entries, int64_t samples_per_step, int64_t windows_per_epoch);

  double Epoch(int64_t step) const;

  // fp16 only: the steps the loss scaler skipped in the window and the scale after it.
  struct LossScaleWindow {
    int64_t skipped = 0;
    float loss_scale = 1.0f;
  };
  void AddTrainWindow(int64_t step, double loss, double learning_rate, double grad_norm,
                      const std::optional<LossScaleWindow>& fp16);
  // eval_accuracy: sequence classification (JOBSPEC.md: eval entries also hold it).
  void AddEval(int64_t step, double eval_loss, std::optional<double> eval_accuracy = std::nullopt);

  struct Final {
    int64_t step = 0;
    double total_flos = 0, train_loss = 0, train_runtime = 0;
    double train_samples_per_second = 0, train_tokens_per_second = 0;
  };
  // The final summary entry (not appended: TrainerStateJson adds it to the final file only).
  nlohmann::json FinalEntry(const Final& f) const;

 private:
  nlohmann::json* entries_;
  int64_t samples_per_step_;
  int64_t windows_per_epoch_;
};

}  // namespace traind::engine
