// The step loop of a training session: optimizer steps until max_steps, with step reports, the
// logging windows, evaluation, checkpoints and samples at their intervals; and the evaluation pass
// itself. Its parts (step_loop.cc, docs/engine.md): the options made once (the spec, the device's
// capabilities, the environment), the training batches, the step report, the logging window, the
// preemption handshake.
#pragma once

#include <optional>

#include "train/session.h"
#include "traind/engine/status.h"

namespace traind::engine {

// Trains `s` from s->state.global_step to max_steps. Sets *last_eval to the last evaluation loss
// (NaN without validation windows). CANCELLED when asked between micro-batches; any error leaves
// every checkpoint already written intact.
Status RunStepLoop(TrainingSession* s, double* last_eval);

// Mean loss over every validation window (stride T, in order), B windows per forward pass; the
// last partial pass is padded with ignored targets (-1). NaN when there is no window. CANCELLED
// when cancellation is asked between passes.
// Encoder families (bert): the validation examples in order, B per pass (example_data.h); the
// mean loss over every target, and with sequence_classification *accuracy (when not null) =
// correct / labelled examples.
// Reads the session (the model's weights are not changed; its activations are scratch).
Result<double> Evaluate(const TrainingSession& s, std::optional<double>* accuracy = nullptr);

}  // namespace traind::engine
