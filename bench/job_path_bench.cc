// job_path_bench: what a user sees against what the step bench measures (issue 14). One process
// runs, alternating, `--runs` times:
//   bench: the tiny gpt2 through the trainer's StepRunner (bench_util.h RunTimedSteps, as
//          gpt2_step_bench --config tiny): steady-state tokens/s = tokens per step / median step;
//   job:   the same model as a job, RunJob on the CPU backend (the path of `traind run` and of the
//          daemon's job runner): a text file through the byte tokenizer (vocab 256), seq_len 128,
//          batch 8, AdamW, `--steps` steps, logging every step, no eval, no checkpoints;
//          its `train_tokens_per_second` (RunSummary, trainer_state.json's final entry).
// and prints where the job's runtime goes (set-up before the first step, the first step, the
// steady steps, the time between steps) and the ratio job / bench against the target (>= 0.90).
// Usage: job_path_bench [--steps N] [--runs N] [--threads N] [--file TEXT]
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "bench_util.h"
#include "traind/engine/job_spec.h"
#include "traind/engine/trainer.h"

namespace traind::bench {
namespace {

constexpr int64_t kLayers = 4, kChannels = 256, kHeads = 4, kSeq = 128, kBatch = 8, kVocab = 256;

double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Steady-state tokens/s of the step bench (2 warm-up steps, `steps` timed, the median).
Result<double> BenchTokensPerSecond(int threads, int steps) {
  std::unique_ptr<engine::Backend> be = engine::MakeCpuBackend(threads);
  engine::ModelConfig mc;
  mc.arch = engine::Arch::kGpt2;
  mc.vocab_size = kVocab;
  mc.n_positions = 1024;
  mc.n_embd = kChannels;
  mc.n_layer = kLayers;
  mc.n_head = kHeads;
  engine::ModelOptions mo;
  mo.micro_batch = kBatch;
  mo.seq_len = kSeq;
  engine::DeviceArena arena(be.get(), 0);
  TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<engine::Model> model, engine::Model::Create(mc, mo, &arena));
  model->InitRandom(1234);
  engine::AdamWOptions ao;
  ao.beta2 = 0.95;
  ao.weight_decay = 0.1;
  TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<engine::AdamWOptimizer> opt,
                          engine::AdamWOptimizer::Create(model->params(), model->num_params(), ao, &arena));
  const int64_t n = kBatch * kSeq;
  const engine::StepRunner::NextBatch next_batch = FixedRandomBatch(n, kVocab);
  TRAIND_ASSIGN_OR_RETURN(StepTimes t, RunTimedSteps(model.get(), opt.get(), &arena, 1, next_batch,
                                                     /*warmup=*/2, steps, [] {}));
  return static_cast<double>(n) / Median(t.seconds);
}

struct JobRun {
  double train_tokens_per_second = 0, train_runtime = 0;
  double setup_s = 0;        // RunJob's start to the first step's start
  double first_step_s = 0;   // the first step's step_seconds
  double steady_step_s = 0;  // median step_seconds of the steps after the first
  double steps_s = 0;        // sum of every step's step_seconds
  double between_s = 0;      // time from the first step's start to the last step's end not in steps
  double steady_tok_s = 0;   // tokens per step / steady_step_s
  size_t steps = 0;
};

Result<JobRun> RunTheJob(const engine::JobSpec& spec, int threads) {
  std::vector<engine::StepReport> reports;
  std::vector<Clock::time_point> ends;
  engine::RunCallbacks cb;
  cb.on_step = [&](const engine::StepReport& r) {
    ends.push_back(Clock::now());
    reports.push_back(r);
  };
  engine::RunOptions opts;
  opts.device.device = "cpu";
  opts.device.threads = threads;
  const Clock::time_point t0 = Clock::now();
  TRAIND_ASSIGN_OR_RETURN(engine::RunSummary s, engine::RunJob(spec, opts, cb));
  if (reports.size() < 2) return Status::Internal("the job ran fewer than 2 steps");
  JobRun j;
  j.train_tokens_per_second = s.train_tokens_per_second;
  j.train_runtime = s.train_runtime;
  j.steps = reports.size();
  j.first_step_s = reports[0].step_seconds;
  j.setup_s = Seconds(t0, ends[0]) - j.first_step_s;
  std::vector<double> later;
  for (size_t i = 0; i < reports.size(); ++i) {
    j.steps_s += reports[i].step_seconds;
    if (i > 0) later.push_back(reports[i].step_seconds);
  }
  j.steady_step_s = Median(later);
  j.between_s = Seconds(ends.front(), ends.back()) + j.first_step_s - j.steps_s;
  j.steady_tok_s = static_cast<double>(kBatch * kSeq) / j.steady_step_s;
  return j;
}

int Main(int argc, char** argv) {
  int steps = 40, runs = 3, threads = 2;
  std::string file = std::string(TRAIND_BENCH_SHARED_DATA) + "/tinyshakespeare.txt";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--steps") steps = std::atoi(FlagValue(argc, argv, &i));
    else if (a == "--runs") runs = std::atoi(FlagValue(argc, argv, &i));
    else if (a == "--threads") threads = std::atoi(FlagValue(argc, argv, &i));
    else if (a == "--file") file = FlagValue(argc, argv, &i);
    else {
      std::fprintf(stderr, "job_path_bench: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (steps < 3 || runs < 1 || threads < 1) {
    std::fprintf(stderr, "job_path_bench: --steps at least 3, --runs and --threads at least 1\n");
    return 2;
  }
  const std::string tmp = (std::filesystem::temp_directory_path() /
                           ("traind_job_path_bench_" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(tmp);
  std::filesystem::create_directories(tmp);
  if (!std::filesystem::exists(file)) {
    // No corpus here: 600 KB of words, enough windows for any --steps this bench is run with.
    file = tmp + "/text.txt";
    std::ofstream out(file);
    std::mt19937 rng(7);
    const char* words[] = {"the", "king", "shall", "speak", "of", "night", "and", "my", "lord", "sweet"};
    for (int i = 0; i < 120000; ++i) out << words[rng() % 10] << ((i % 12 == 11) ? ".\n" : " ");
  }
  const std::string yaml =
      "name: job-path-bench\nmodel:\n  arch: gpt2\n  config: {vocab_size: 256, n_positions: 1024, "
      "n_embd: 256, n_layer: 4, n_head: 4}\ndata:\n  train_file: " + file +
      "\n  tokenizer: byte\n  seq_len: 128\n  validation_split: 0\n  shuffle: true\n"
      "training: {max_steps: " + std::to_string(steps) +
      ", per_device_train_batch_size: 8, logging_steps: 1, save_steps: 0, learning_rate: 1.0e-4, "
      "weight_decay: 0.1, adam_beta2: 0.95}\noutput_dir: " + tmp + "/out\n";
  Result<engine::JobSpec> spec = engine::ParseJobSpec(yaml, "");
  if (!spec.ok()) {
    std::fprintf(stderr, "job_path_bench: %s\n", spec.status().ToString().c_str());
    return 2;
  }
  std::printf("job_path_bench: gpt2 tiny (4 layers, d256, 4 heads, T128, B8, vocab 256), %d steps, "
              "%d runs, %d threads, data %s (byte tokenizer), logging every step\n",
              steps, runs, threads, file.c_str());
  std::vector<double> ratios;
  for (int run = 1; run <= runs; ++run) {
    Result<double> bench = BenchTokensPerSecond(threads, steps);
    if (!bench.ok()) {
      std::fprintf(stderr, "job_path_bench: bench side: %s\n", bench.status().ToString().c_str());
      return 1;
    }
    std::filesystem::remove_all(tmp + "/out");
    Result<JobRun> job = RunTheJob(*spec, threads);
    if (!job.ok()) {
      std::fprintf(stderr, "job_path_bench: job side: %s\n", job.status().ToString().c_str());
      return 1;
    }
    const double ratio = job->train_tokens_per_second / *bench;
    ratios.push_back(ratio);
    std::printf("run %d: bench steady %.0f tok/s; job train_tokens_per_second %.0f (runtime %.3f s, %zu "
                "steps), job steady %.0f tok/s; job / bench %.3f\n",
                run, *bench, job->train_tokens_per_second, job->train_runtime, job->steps,
                job->steady_tok_s, ratio);
    std::printf("  job runtime: set-up before step 1 %.3f s, step 1 %.3f s, steps 2+ %.3f s (median "
                "%.2f ms), between steps %.3f s\n",
                job->setup_s, job->first_step_s, job->steps_s - job->first_step_s,
                1e3 * job->steady_step_s, job->between_s);
    std::printf("RESULT job_path run=%d bench_tok_s=%.1f job_tok_s=%.1f job_steady_tok_s=%.1f "
                "ratio=%.4f setup_s=%.4f first_step_s=%.4f between_s=%.4f\n",
                run, *bench, job->train_tokens_per_second, job->steady_tok_s, ratio, job->setup_s,
                job->first_step_s, job->between_s);
  }
  std::filesystem::remove_all(tmp);
  const double median = Median(ratios);
  std::printf("target: a %d-step job within 10%% of the bench's steady state (job / bench >= 0.90), "
              "median of %d runs %.3f: %s\n",
              steps, runs, median, median >= 0.90 ? "MET" : "NOT MET");
  return 0;
}

}  // namespace
}  // namespace traind::bench

int main(int argc, char** argv) { return traind::bench::Main(argc, argv); }
