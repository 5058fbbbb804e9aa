// Helpers shared by the traind benches: timers, a seeded model and its optimizer, one fixed batch,
// and the timed step loop through the trainer's StepRunner (so a bench measures what the trainer
// runs).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "backend/arena.h"
#include "models/model.h"
#include "optim/adamw.h"
#include "optim/optimizer.h"
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

// The median of `seconds` in milliseconds (0 when empty).
inline double MedianMs(std::vector<double> seconds) {
  if (seconds.empty()) return 0.0;
  std::sort(seconds.begin(), seconds.end());
  return 1e3 * seconds[seconds.size() / 2];
}

// One batch of `n` random token ids below `vocab` (seed 42), handed out for every micro-batch:
// inputs ids[0, n), targets ids[1, n] (the next token).
inline engine::StepRunner::NextBatch FixedRandomBatch(int64_t n, int64_t vocab) {
  auto ids = std::make_shared<std::vector<int32_t>>(static_cast<size_t>(n + 1));
  std::mt19937 rng(42);
  for (auto& t : *ids) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return [ids, n](int32_t* in, int32_t* tg, double*) {
    std::copy(ids->begin(), ids->begin() + n, in);
    std::copy(ids->begin() + 1, ids->begin() + n + 1, tg);
    return Status::Ok();
  };
}

struct SeededModel {
  std::unique_ptr<engine::Model> model;
  std::unique_ptr<engine::Optimizer> optimizer;
};

// `mc` with `mo` in `arena`, its weights and adapters seeded (1234), and the optimizer `training`
// names (MakeOptimizer) over its trainable parameters. The error names the call that failed.
inline Result<SeededModel> MakeSeededModel(const engine::ModelConfig& mc,
                                           const engine::ModelOptions& mo,
                                           const engine::TrainingSpec& training,
                                           engine::DeviceArena* arena) {
  SeededModel out;
  auto model = engine::Model::Create(mc, mo, arena);
  if (!model.ok()) return Status(model.status().code(), "Model::Create: " + model.status().message());
  out.model = std::move(model).value();
  out.model->InitRandom(1234);
  out.model->InitAdapters(1234);
  auto opt = engine::MakeOptimizer(training, out.model->trainable_params(),
                                   out.model->num_trainable(), arena);
  if (!opt.ok()) return Status(opt.status().code(), "MakeOptimizer: " + opt.status().message());
  out.optimizer = std::move(opt).value();
  return out;
}

// `warmup` untimed then `steps` timed optimizer steps of `accumulation_steps` micro-batches each,
// at `learning_rate`, through a StepRunner over `model` and `optimizer`; `timed_start` runs once
// just before the first timed step (e.g. to reset a profiler).
inline Result<StepTimes> RunTimedSteps(engine::Model* model, engine::Optimizer* optimizer,
                                       engine::DeviceArena* arena, int64_t accumulation_steps,
                                       const engine::StepRunner::NextBatch& next_batch,
                                       int warmup, int steps,
                                       const std::function<void()>& timed_start,
                                       bool use_graphs = true, double learning_rate = 1e-4) {
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
                            runner->Run(next_batch, learning_rate, 1.0f, &wait));
    if (s >= warmup) t.seconds.push_back(Seconds(t0, Clock::now()));
    if (s == 0) t.first_loss = out.loss;
    t.last_loss = out.loss;
  }
  t.cpu_seconds = ProcessCpuSeconds() - cpu0;
  return t;
}

// The benches' model configs: gpt2 (n_positions 1024) when kv_heads is 0, else llama at the same
// L, C, NH, V with `kv_heads` grouped-query kv heads and a SwiGLU MLP of `intermediate` (RMSNorm
// eps 1e-6, rotary theta 10000, 1024 positions, untied lm_head).
inline engine::ModelConfig BenchModelConfig(int64_t layers, int64_t channels, int64_t heads,
                                            int64_t vocab, int64_t kv_heads = 0,
                                            int64_t intermediate = 0) {
  engine::ModelConfig mc;
  mc.vocab_size = vocab;
  if (kv_heads > 0) {
    mc.arch = engine::Arch::kLlama;
    mc.hidden_size = channels;
    mc.intermediate_size = intermediate;
    mc.num_hidden_layers = layers;
    mc.num_attention_heads = heads;
    mc.num_key_value_heads = kv_heads;
    mc.rms_norm_eps = 1e-6;
    mc.rope_theta = 10000.0;
    mc.max_position_embeddings = 1024;
    mc.tie_word_embeddings = false;
  } else {
    mc.arch = engine::Arch::kGpt2;
    mc.n_positions = 1024;
    mc.n_embd = channels;
    mc.n_layer = layers;
    mc.n_head = heads;
  }
  return mc;
}

}  // namespace traind::bench
