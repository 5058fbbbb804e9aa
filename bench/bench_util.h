// Helpers shared by the traind benches: timers, and the timed step loop through the trainer's
// StepRunner (so a bench measures what the trainer runs).
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <memory>
#include <vector>

#include "backend/arena.h"
#include "models/model.h"
#include "optim/adamw.h"
#include "train/step_runner.h"

namespace traind::bench {

using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// CPU seconds used by this process (all threads): a load-robust second measure of the work.
inline double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The value of the command-line flag argv[*i], advancing *i past it; exits with status 2 naming
// the flag when the value is missing.
inline const char* FlagValue(int argc, char** argv, int* i) {
  if (*i + 1 >= argc) {
    std::fprintf(stderr, "%s needs a value\n", argv[*i]);
    std::exit(2);
  }
  return argv[++*i];
}

struct StepTimes {
  std::vector<double> seconds;  // wall time of each timed step
  double cpu_seconds = 0.0;     // process CPU time over the timed steps
  double first_loss = 0.0;      // loss of the first (warm-up) step
  double last_loss = 0.0;
};

// `warmup` untimed then `steps` timed optimizer steps of `accumulation_steps` micro-batches each,
// at learning rate 1e-4, through a StepRunner over `model` and `optimizer`; `timed_start` runs
// once just before the first timed step (e.g. to reset a profiler).
inline Result<StepTimes> RunTimedSteps(engine::Model* model, engine::AdamWOptimizer* optimizer,
                                       engine::DeviceArena* arena, int64_t accumulation_steps,
                                       const engine::StepRunner::NextBatch& next_batch,
                                       int warmup, int steps,
                                       const std::function<void()>& timed_start,
                                       bool use_graphs = true) {
  engine::StepRunner::Options options;
  options.accumulation_steps = accumulation_steps;
  options.use_graphs = use_graphs;
  TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<engine::StepRunner> runner,
                          engine::StepRunner::Create(options, model, optimizer, arena));
  StepTimes t;
  double cpu0 = 0.0;
  for (int s = 0; s < warmup + steps; ++s) {
    if (s == warmup) {
      timed_start();
      cpu0 = ProcessCpuSeconds();
    }
    const Clock::time_point t0 = Clock::now();
    double wait = 0.0;
    TRAIND_ASSIGN_OR_RETURN(engine::StepRunner::Outcome out,
                            runner->Run(next_batch, 1e-4, 1.0f, &wait));
    if (s >= warmup) t.seconds.push_back(Seconds(t0, Clock::now()));
    if (s == 0) t.first_loss = out.loss;
    t.last_loss = out.loss;
  }
  t.cpu_seconds = ProcessCpuSeconds() - cpu0;
  return t;
}

}  // namespace traind::bench
