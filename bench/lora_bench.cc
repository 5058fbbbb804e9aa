// lora_bench: LoRA against full fine-tuning on the CPU backend (issue 10), in one run: the same
// GPT-2 (`small` by default: 6 layers, d384, 6 heads, T256, vocab 50304; `tiny`: 4 layers, d256,
// 4 heads, T128, vocab 256), the same batches, the trainer's step path (StepRunner: upload,
// Forward, Backward, grad norm, AdamW), once training every parameter and once LoRA (r, alpha,
// target modules as flags; the base frozen). Prints the median step time, the arena peak
// (= the plan) and its gradient and optimizer bytes for each, and the ratios. With --dropout P a
// third run: LoRA with lora_dropout P (its cost over LoRA without). --compute bf16|f16: every run
// in that compute type (the adapters stay fp32).
// Usage: lora_bench [--model tiny|small] [--batch B] [--steps N] [--warmup N] [--threads N]
//                   [--r R] [--alpha A] [--targets c_attn,c_proj,c_fc] [--dropout P]
//                   [--compute f32|bf16|f16] [--profile]   (per-op wall time of each run)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backend/arena.h"
#include "backend/backend.h"
#include "bench_util.h"
#include "profiling_backend.h"
#include "models/model.h"
#include "train/planner.h"

namespace traind::bench {
namespace {

struct Shape {
  std::string name;
  int64_t layers, channels, heads, seq_len, vocab;
};
const Shape kShapes[] = {{"tiny", 4, 256, 4, 128, 256}, {"small", 6, 384, 6, 256, 50304}};

struct Result1 {
  double median_ms = 0, first_loss = 0, last_loss = 0;
  int64_t trainable = 0, peak = 0, plan = 0;
  engine::MemoryBytes bytes;
};

int Run(const Shape& s, int64_t B, int steps, int warmup, int threads,
        const engine::LoraOptions& lora, engine::DType compute, bool profile, Result1* out) {
  std::unique_ptr<engine::Backend> device = engine::MakeCpuBackend(threads);
  ProfilingBackend prof(device.get());
  engine::Backend* be = profile ? static_cast<engine::Backend*>(&prof) : device.get();
  const engine::ModelConfig mc = BenchModelConfig(s.layers, s.channels, s.heads, s.vocab);
  engine::ModelOptions mo;
  mo.micro_batch = B;
  mo.seq_len = s.seq_len;
  mo.lora = lora;
  mo.compute_type = compute;
  engine::TrainingSpec ts;  // AdamW
  ts.weight_decay = 0.1;
  ts.bf16 = compute == engine::DType::kBF16;
  ts.fp16 = compute == engine::DType::kF16;
  engine::DeviceArena arena(be, 0);
  auto made = MakeSeededModel(mc, mo, ts, &arena);
  if (!made.ok()) {
    std::fprintf(stderr, "%s\n", made.status().ToString().c_str());
    return 1;
  }
  out->bytes = engine::JobBytes(mc, mo, ts);
  out->plan = out->bytes.total();
  out->trainable = made->model->num_trainable();
  auto run = RunTimedSteps(made->model.get(), made->optimizer.get(), &arena, 1,
                           FixedRandomBatch(B * s.seq_len, s.vocab), warmup, steps, [] {},
                           /*use_graphs=*/true, /*learning_rate=*/1e-3);
  if (!run.ok()) {
    std::fprintf(stderr, "steps: %s\n", run.status().ToString().c_str());
    return 1;
  }
  out->first_loss = run->first_loss;
  out->last_loss = run->last_loss;
  if (profile) {
    double total = 0;
    for (double t : run->seconds) total += t;
    prof.Print(total, static_cast<int>(run->seconds.size()));
  }
  out->median_ms = MedianMs(run->seconds);
  out->peak = arena.peak_bytes();
  return 0;
}

}  // namespace
}  // namespace traind::bench

int main(int argc, char** argv) {
  using namespace traind;
  std::string model = "small", targets = "c_attn,c_proj,c_fc", compute_name = "f32";
  int64_t batch = 4, r = 8;
  double alpha = 16, dropout = 0;
  int steps = 3, warmup = 1, threads = 2;
  bool profile = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model") model = bench::FlagValue(argc, argv, &i);
    else if (a == "--batch") batch = std::atoll(bench::FlagValue(argc, argv, &i));
    else if (a == "--steps") steps = std::atoi(bench::FlagValue(argc, argv, &i));
    else if (a == "--warmup") warmup = std::atoi(bench::FlagValue(argc, argv, &i));
    else if (a == "--threads") threads = std::atoi(bench::FlagValue(argc, argv, &i));
    else if (a == "--r") r = std::atoll(bench::FlagValue(argc, argv, &i));
    else if (a == "--alpha") alpha = std::atof(bench::FlagValue(argc, argv, &i));
    else if (a == "--targets") targets = bench::FlagValue(argc, argv, &i);
    else if (a == "--dropout") dropout = std::atof(bench::FlagValue(argc, argv, &i));
    else if (a == "--compute") compute_name = bench::FlagValue(argc, argv, &i);
    else if (a == "--profile") profile = true;
    else {
      std::fprintf(stderr, "unknown flag %s (see the usage at the top of lora_bench.cc)\n", a.c_str());
      return 2;
    }
  }
  const bench::Shape* shape = nullptr;
  for (const auto& s : bench::kShapes) {
    if (s.name == model) shape = &s;
  }
  const engine::DType compute = compute_name == "bf16"  ? engine::DType::kBF16
                                : compute_name == "f16" ? engine::DType::kF16
                                                        : engine::DType::kF32;
  if (shape == nullptr || batch < 1 || steps < 1 || r < 1 || !(dropout >= 0 && dropout < 1) ||
      (compute == engine::DType::kF32 && compute_name != "f32")) {
    std::fprintf(stderr, "--model tiny|small, --batch >= 1, --steps >= 1, --r >= 1, "
                         "--dropout in [0, 1), --compute f32|bf16|f16\n");
    return 2;
  }
  engine::LoraOptions lora;
  lora.r = r;
  lora.alpha = alpha;
  std::stringstream ss(targets);
  for (std::string t; std::getline(ss, t, ',');) lora.targets.push_back(t);
  std::printf("lora_bench: gpt2 %s (%lld layers, d%lld, T%lld, vocab %lld), B%lld, %d threads, "
              "AdamW, %s; LoRA r=%lld alpha=%g targets=%s\n",
              shape->name.c_str(), static_cast<long long>(shape->layers),
              static_cast<long long>(shape->channels), static_cast<long long>(shape->seq_len),
              static_cast<long long>(shape->vocab), static_cast<long long>(batch), threads,
              compute_name.c_str(), static_cast<long long>(r), alpha, targets.c_str());
  bench::Result1 full, lo, lod;
  if (bench::Run(*shape, batch, steps, warmup, threads, {}, compute, profile, &full) != 0) return 1;
  if (bench::Run(*shape, batch, steps, warmup, threads, lora, compute, profile, &lo) != 0) return 1;
  if (dropout > 0) {
    engine::LoraOptions ld = lora;
    ld.dropout = dropout;
    if (bench::Run(*shape, batch, steps, warmup, threads, ld, compute, profile, &lod) != 0) return 1;
  }
  auto print = [&](const char* mode, const bench::Result1& x) {
    std::printf("RESULT lora_bench model=%s mode=%s trainable=%lld step_ms=%.1f tok_s=%.0f "
                "peak_bytes=%lld plan_bytes=%lld gradients_bytes=%lld optimizer_bytes=%lld "
                "loss=%.4f->%.4f\n",
                shape->name.c_str(), mode, static_cast<long long>(x.trainable), x.median_ms,
                1e3 * static_cast<double>(batch * shape->seq_len) / x.median_ms,
                static_cast<long long>(x.peak), static_cast<long long>(x.plan),
                static_cast<long long>(x.bytes.gradients), static_cast<long long>(x.bytes.optimizer),
                x.first_loss, x.last_loss);
  };
  print("full", full);
  print("lora", lo);
  if (dropout > 0) {
    print("lora_dropout", lod);
    std::printf("RESULT lora_bench model=%s lora_dropout_over_lora step_time=%.3f peak=%.3f\n",
                shape->name.c_str(), lod.median_ms / lo.median_ms,
                static_cast<double>(lod.peak) / static_cast<double>(lo.peak));
  }
  std::printf("RESULT lora_bench model=%s lora_over_full step_time=%.3f peak=%.3f "
              "gradients+optimizer=%.5f trainable_fraction=%.5f\n",
              shape->name.c_str(), lo.median_ms / full.median_ms,
              static_cast<double>(lo.peak) / static_cast<double>(full.peak),
              static_cast<double>(lo.bytes.gradients + lo.bytes.optimizer) /
                  static_cast<double>(full.bytes.gradients + full.bytes.optimizer),
              static_cast<double>(lo.trainable) / static_cast<double>(full.trainable));
  return 0;
}
