// gpt2_table_bench: one row of the memory/speed techniques table (issue 4) on the CPU backend:
// full GPT-2 training steps as the trainer runs them (StepRunner: k x (upload, Forward,
// Backward), grad norm, AdamW) with or without gradient accumulation, gradient checkpointing and
// bf16 compute; prints time per sample, samples/s and
// peak memory (arena high-water and process RSS growth). bench/run_all.sh --table runs every row
// beside its PyTorch peer (bench/torch_gpt2_table.py) and prints the table with the ratios.
// Usage: gpt2_table_bench --row baseline|accum|ckpt|bf16|all [--arch gpt2|llama]
//                         [--model tiny|small] [--batch B] [--accum K] [--steps N] [--warmup N]
//                         [--threads N]
//                         [--profile | --profile-cpu]   (per-op wall / process CPU time)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/arena.h"
#include "models/model.h"
#include "optim/adamw.h"
#include "bench_util.h"
#include "profiling_backend.h"

namespace traind::bench {
namespace {

using engine::Backend;
using engine::DType;

struct ModelShape {
  std::string arch, name;
  int64_t layers, channels, heads, seq_len, vocab;
  int64_t kv_heads = 0, intermediate = 0;  // llama only
};
// --arch llama: configs of comparable size to gpt2's (same L, C, NH, T, V): grouped-query
// attention (2 kv heads), SwiGLU MLP of intermediate ~8C/3, RMSNorm, rotary, untied lm_head.
const ModelShape kModels[] = {
    {"gpt2", "tiny", 4, 256, 4, 128, 256},
    {"gpt2", "small", 6, 384, 6, 256, 50304},
    {"llama", "tiny", 4, 256, 4, 128, 256, 2, 688},
    {"llama", "small", 6, 384, 6, 256, 50304, 2, 1024},
};

// A row of the table: which techniques are on.
struct Row {
  bool accum = false, ckpt = false, bf16 = false;
};
bool ParseRow(const std::string& s, Row* r) {
  if (s == "baseline") *r = {};
  else if (s == "accum") *r = {true, false, false};
  else if (s == "ckpt") *r = {false, true, false};
  else if (s == "bf16") *r = {false, false, true};
  else if (s == "all") *r = {true, true, true};
  else return false;
  return true;
}

// Reads "Key:   123 kB" from /proc/self/status, in bytes (-1 when absent).
int64_t ProcStatusBytes(const std::string& key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key + ":", 0) == 0) return 1024 * std::atoll(line.c_str() + key.size() + 1);
  }
  return -1;
}
// Resets VmHWM to the current RSS (Linux >= 4.0). False when not permitted.
bool ResetPeakRss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

// Whether 16-bit GEMMs run as native bf16 kernels (oneDNN) rather than widened to fp32.
bool NativeBf16Gemm(int threads) {
  const int64_t n = 64;
  std::vector<uint16_t> a(n * n, engine::F32ToBF16(0.5f));
  std::vector<float> c(n * n, 0.0f);
  return engine::cpu::DnnlGemm16(false, false, n, n, n, 1.0f, a.data(), n, a.data(), n, 0.0f,
                                 c.data(), n, DType::kBF16, DType::kF32, threads) &&
         c[0] == 0.25f * static_cast<float>(n);
}

int Run(const ModelShape& ms, const std::string& row_name, const Row& row, int64_t batch,
        int64_t accum_k, int steps, int warmup, int threads, bool profile, bool cpu_time) {
  const bool peak_reset = ResetPeakRss();
  const int64_t rss0 = ProcStatusBytes("VmRSS");
  const int64_t B = row.accum ? batch / accum_k : batch;
  const int64_t k = row.accum ? accum_k : 1;
  const DType ct = row.bf16 ? DType::kBF16 : DType::kF32;
  const bool llama = ms.arch == "llama";
  // llama: "llama tiny" and its GQA / SwiGLU sizes; gpt2's lines stay as they were.
  const std::string name = llama ? "llama " + ms.name : ms.name;
  const std::string llama_dims = llama ? " NKV=" + std::to_string(ms.kv_heads) +
                                             " H=" + std::to_string(ms.intermediate)
                                       : "";
  const char* arch_kv = llama ? " arch=llama" : "";
  std::printf("traind %s row=%s: L=%lld C=%lld NH=%lld%s T=%lld V=%lld micro_batch=%lld "
              "accum=%lld ckpt=%d compute=%s threads=%d gemm=%s bf16_gemm=%s\n",
              name.c_str(), row_name.c_str(), static_cast<long long>(ms.layers),
              static_cast<long long>(ms.channels), static_cast<long long>(ms.heads),
              llama_dims.c_str(),
              static_cast<long long>(ms.seq_len), static_cast<long long>(ms.vocab),
              static_cast<long long>(B), static_cast<long long>(k), row.ckpt ? 1 : 0,
              engine::DTypeName(ct), threads, engine::cpu::GemmLibrary(),
              row.bf16 ? (NativeBf16Gemm(threads) ? "onednn-native" : "widened-to-fp32") : "-");

  std::unique_ptr<Backend> cpu = engine::MakeCpuBackend(threads);
  ProfilingBackend prof(cpu.get(), cpu_time);
  Backend* be = profile ? static_cast<Backend*>(&prof) : cpu.get();
  const engine::ModelConfig mc =
      BenchModelConfig(ms.layers, ms.channels, ms.heads, ms.vocab, llama ? ms.kv_heads : 0,
                       llama ? ms.intermediate : 0);
  engine::ModelOptions mo;
  mo.micro_batch = B;
  mo.seq_len = ms.seq_len;
  mo.gradient_checkpointing = row.ckpt;
  mo.checkpoint_every = 1;
  mo.compute_type = ct;
  mo.pack_weights = true;  // a cpu job's (PacksGemmWeights)
  engine::DeviceArena arena(be, 0);
  auto model = engine::Model::Create(mc, mo, &arena);
  if (!model.ok()) {
    // A technique the engine does not have (yet): say so, never a number.
    std::printf("RESULT side=traind model=%s row=%s status=not_available reason=\"%s\"%s\n",
                ms.name.c_str(), row_name.c_str(), model.status().ToString().c_str(), arch_kv);
    return 0;
  }
  engine::Model& m = **model;
  m.InitRandom(1234);
  m.ParamsChanged();
  engine::AdamWOptions ao;
  ao.beta2 = 0.95;
  ao.weight_decay = 0.1;
  auto opt = engine::AdamWOptimizer::Create(m.params(), m.num_params(), ao, &arena);
  if (!opt.ok()) {
    std::fprintf(stderr, "AdamWOptimizer::Create: %s\n", opt.status().ToString().c_str());
    return 1;
  }
  const int64_t plan = engine::Model::PlanBytes(mc, mo).total() +
                       engine::AdamWOptimizer::PlanBytes(m.num_params()) +
                       engine::StepRunner::PlanBytes(B, ms.seq_len);
  // One step's tokens: batch sequences of T (+1 for the shifted targets) in k micro-batches.
  const int64_t N = B * ms.seq_len;
  std::vector<int32_t> ids(static_cast<size_t>(k * N + 1));
  std::mt19937 rng(42);
  for (auto& t : ids) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(ms.vocab));

  int64_t micro = 0;  // micro-batches handed out this step
  auto next_batch = [&](int32_t* in, int32_t* tg, double*) {
    const int32_t* src = ids.data() + (micro++ % k) * N;
    std::copy(src, src + N, in);
    std::copy(src + 1, src + N + 1, tg);
    return Status::Ok();
  };
  // The trainer's step path (StepRunner: uploads, k micro-batches, grad norm, AdamW, 16-bit copy).
  auto run = RunTimedSteps(&m, opt->get(), &arena, k, next_batch, warmup, steps,
                           [&] { prof.Reset(); });
  if (!run.ok()) {
    std::fprintf(stderr, "steps: %s\n", run.status().ToString().c_str());
    return 1;
  }
  const std::vector<double>& times = run->seconds;
  const double first_loss = run->first_loss, loss = run->last_loss, cpu_s = run->cpu_seconds;
  const int64_t hwm = ProcStatusBytes("VmHWM");
  if (times.empty()) {
    std::printf("traind %s row=%s: loss %.4f (no timed steps)\n", name.c_str(),
                row_name.c_str(), loss);
    return 0;
  }
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  const double samples = static_cast<double>(B * k);
  std::printf("  step median %.1f ms (min %.1f, max %.1f, %zu steps) for %lld samples, loss "
              "%.4f -> %.4f\n  arena peak %.1f MiB (plan %.1f MiB), process RSS growth %.1f "
              "MiB%s\n",
              1e3 * median, 1e3 * sorted.front(), 1e3 * sorted.back(), times.size(),
              static_cast<long long>(B * k), first_loss, loss, arena.peak_bytes() / 1048576.0,
              plan / 1048576.0, (hwm - rss0) / 1048576.0,
              peak_reset ? "" : " (VmHWM could not be reset: includes earlier peaks)");
  std::printf("RESULT side=traind model=%s row=%s status=ok micro_batch=%lld accum=%lld "
              "sample_ms=%.3f samples_s=%.3f cpu_ms_per_sample=%.3f peak_bytes=%lld "
              "plan_bytes=%lld rss_bytes=%lld loss=%.4f%s\n",
              ms.name.c_str(), row_name.c_str(), static_cast<long long>(B),
              static_cast<long long>(k), 1e3 * median / samples, samples / median,
              1e3 * cpu_s / (samples * static_cast<double>(times.size())),
              static_cast<long long>(arena.peak_bytes()), static_cast<long long>(plan),
              static_cast<long long>(hwm - rss0), loss, arch_kv);
  if (profile) {
    double total = 0.0;
    for (double t : times) total += t;
    prof.Print(total, static_cast<int>(times.size()));
  }
  return 0;
}

}  // namespace
}  // namespace traind::bench

int main(int argc, char** argv) {
  std::string arch = "gpt2", model = "small", row_name;
  int64_t batch = 8, accum = 4;
  int steps = 3, warmup = 1, threads = 2;
  bool profile = false, cpu_time = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return traind::bench::FlagValue(argc, argv, &i); };
    if (a == "--row") row_name = next();
    else if (a == "--model") model = next();
    else if (a == "--arch") arch = next();
    else if (a == "--batch") batch = std::atoll(next());
    else if (a == "--accum") accum = std::atoll(next());
    else if (a == "--steps") steps = std::atoi(next());
    else if (a == "--warmup") warmup = std::atoi(next());
    else if (a == "--threads") threads = std::atoi(next());
    else if (a == "--profile") profile = true;
    else if (a == "--profile-cpu") profile = cpu_time = true;
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  traind::bench::Row row;
  if (!traind::bench::ParseRow(row_name, &row)) {
    std::fprintf(stderr, "usage: %s --row baseline|accum|ckpt|bf16|all [--arch gpt2|llama] "
                 "[--model tiny|small] "
                 "[--batch B] [--accum K] [--steps N] [--warmup N] [--threads N] "
                 "[--profile | --profile-cpu]\n", argv[0]);
    return 2;
  }
  if (batch < 1 || accum < 1 || batch % accum != 0 || steps < 0 || warmup < 0 || threads < 1) {
    std::fprintf(stderr, "--batch must be a positive multiple of --accum; steps, warmup >= 0\n");
    return 2;
  }
  for (const auto& ms : traind::bench::kModels) {
    if (ms.arch == arch && ms.name == model) {
      return traind::bench::Run(ms, row_name, row, batch, accum, steps, warmup, threads, profile,
                                cpu_time);
    }
  }
  std::fprintf(stderr, "unknown model %s / arch %s (tiny, small; gpt2, llama)\n", model.c_str(),
               arch.c_str());
  return 2;
}
