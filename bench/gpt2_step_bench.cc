// gpt2_step_bench: tokens/s of full training steps of GPT-2 configs, run as the trainer runs them
// (StepRunner: upload, Forward, Backward, grad norm, AdamW), plus the fp32 GEMM rate measured in
// the same process, for MFU. CPU backend by default; `--device cuda:0` runs the CUDA backend
// (bench/gpu_run.sh runs it beside the PyTorch CUDA peer, bench/torch_gpu_step.py).
// bench/run_all.sh runs it beside the PyTorch peer (bench/torch_gpt2_step.py) and prints ratios.
// Usage: gpt2_step_bench [--config tiny|small|gpt2|llama_tiny|llama_small|all] [--steps N]
//                        [--warmup N] [--threads N]
//                        [--device cpu|cuda:N|simt] [--dtype fp32|bf16] [--tf32]
//                        [--batch B] [--seq T] [--no-graphs] [--logits-chunk ROWS] [--no-pack]
//                        [--bf16-gemm onednn|widen] [--profile | --profile-cpu]
//                        (--profile: per-op wall time; --profile-cpu: process CPU time)
// --no-pack: bf16 on the cpu without packed weight copies (ModelOptions::pack_weights, which a
// job on the cpu device has; the default here too).
// --bf16-gemm: the CPU's bf16 GEMMs through oneDNN's bf16 matmul (its emulation where the CPU has
// no bf16 arithmetic) or widened to fp32 for sgemm; default: the CPU decides (cpu::Bf16GemmNative).
// --logits-chunk: rows per lm-head + cross-entropy chunk (ModelOptions::logits_chunk_rows;
// default: the planner's choice).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/arena.h"
#include "backend/device_registry.h"
#include "core/dtype.h"
#include "traind/engine/devices.h"
#include "models/model.h"
#include "optim/adamw.h"
#include "bench_util.h"
#include "profiling_backend.h"

namespace traind::bench {
namespace {

using engine::Backend;

struct BenchConfig {
  std::string name;
  int64_t layers, channels, heads, seq_len, batch, vocab;
  int default_steps;
  // llama only (arch "llama"): grouped-query kv heads and the SwiGLU width.
  int64_t kv_heads = 0, intermediate = 0;
};

const BenchConfig kConfigs[] = {
    {"tiny", 4, 256, 4, 128, 8, 256, 30},
    {"small", 6, 384, 6, 256, 8, 50304, 6},
    // GPT-2 124M at its full context: the GPU size (all: only with --device cuda:N).
    {"gpt2", 12, 768, 12, 1024, 8, 50304, 20},
    // The llama family at tiny's and small's sizes (gpt2_table_bench's llama configs): same L, C,
    // NH, T, V; 2 kv heads (GQA), SwiGLU of 688 / 1024, RMSNorm, rotary, untied lm_head.
    {"llama_tiny", 4, 256, 4, 128, 8, 256, 30, 2, 688},
    {"llama_small", 6, 384, 6, 256, 8, 50304, 6, 2, 1024},
};

struct RunFlags {
  int steps = -1, warmup = 2, threads = 2;
  bool profile = false, cpu_time = false;
  std::string device = "cpu";
  engine::DType dtype = engine::DType::kF32;
  bool tf32 = false, graphs = true;
  int64_t batch = 0, seq = 0;  // 0: the config's
  int64_t logits_chunk = 0;     // 0: the planner's
  bool pack = true;             // ModelOptions::pack_weights on the cpu device
};

// fp32 GEMM rate through the backend, C(1024,1024) = A(1024,1024) B(1024,1024), 10 timed runs:
// `wall` = best wall-clock GFLOP/s (the least disturbed run), `per_cpu_s` = GFLOP per process
// CPU-second over all runs (what other processes' load distorts much less).
struct SgemmRate {
  double wall = 0.0;
  double per_cpu_s = 0.0;
};
// The operands live in the backend's memory (device memory on CUDA; synchronised per run).
// ab_type kBF16: the same product with bf16 A and B and fp32 C, the ceiling of a bf16 step's GEMMs
// (the model's linears: bf16 operands, fp32 accumulation and output).
SgemmRate MeasureGemm(Backend* be, engine::DType ab_type = engine::DType::kF32) {
  const int64_t n = 1024;
  const double flops = 2.0 * n * n * n;
  const size_t ab_bytes = engine::DTypeSize(ab_type) * n * n, c_bytes = sizeof(float) * n * n;
  std::vector<float> ha(n * n, 0.5f), hb(n * n, 0.25f);
  std::vector<uint16_t> ha16(n * n, engine::F32ToBF16(0.5f)), hb16(n * n, engine::F32ToBF16(0.25f));
  const bool f32 = ab_type == engine::DType::kF32;
  void* a = be->Alloc(ab_bytes);
  void* b = be->Alloc(ab_bytes);
  float* c = static_cast<float*>(be->Alloc(c_bytes));
  be->CopyHostToDevice(a, f32 ? static_cast<const void*>(ha.data()) : ha16.data(), ab_bytes);
  be->CopyHostToDevice(b, f32 ? static_cast<const void*>(hb.data()) : hb16.data(), ab_bytes);
  auto gemm = [&] {
    be->Gemm(false, false, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n, ab_type, engine::DType::kF32);
  };
  gemm();  // warm-up
  be->Synchronize();
  double best = 1e30;
  const double cpu0 = ProcessCpuSeconds();
  for (int i = 0; i < 10; ++i) {
    auto t0 = Clock::now();
    gemm();
    be->Synchronize();
    best = std::min(best, Seconds(t0, Clock::now()));
  }
  const double cpu_s = ProcessCpuSeconds() - cpu0;
  be->Free(a);
  be->Free(b);
  be->Free(c);
  return {flops / best / 1e9, 10 * flops / cpu_s / 1e9};
}

int Run(BenchConfig bc, const RunFlags& f) {
  const int steps = f.steps >= 0 ? f.steps : bc.default_steps, warmup = f.warmup;
  const int threads = f.threads;
  const bool profile = f.profile, cpu_time = f.cpu_time;
  if (f.batch > 0) bc.batch = f.batch;
  if (f.seq > 0) bc.seq_len = f.seq;
  engine::DeviceOptions dopt;
  dopt.device = f.device;
  dopt.threads = threads;
  auto opened = engine::OpenDevice(dopt, f.tf32, [](const std::string& note) {
    std::fprintf(stderr, "%s\n", note.c_str());
  });
  if (!opened.ok()) {
    std::fprintf(stderr, "--device %s: %s\n", f.device.c_str(),
                 opened.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<Backend> device = std::move(opened->backend);
  // What differs between devices is asked of the device: the host's GEMMs (the cpu backend: the
  // MFU against its sgemm, the GEMM library named), whether an op has finished when it returns
  // (else the profiler synchronises after each op), whether the GEMMs pack their weights.
  const engine::DeviceCapabilities caps = device->capabilities();
  const bool host = !caps.has_own_memory;
  ProfilingBackend prof(device.get(), cpu_time, /*sync_each_op=*/!caps.ops_complete_on_return);
  Backend* be = profile ? static_cast<Backend*>(&prof) : device.get();
  const SgemmRate sgemm = MeasureGemm(device.get());
  const double sgemm_gflops = sgemm.wall;
  // A 16-bit step's MFU is against the GEMM of its own precision (bf16 x bf16 -> fp32).
  const bool mixed = f.dtype != engine::DType::kF32;
  const SgemmRate gemm16 = mixed ? MeasureGemm(device.get(), f.dtype) : sgemm;

  const engine::ModelConfig mc =
      BenchModelConfig(bc.layers, bc.channels, bc.heads, bc.vocab, bc.kv_heads, bc.intermediate);
  engine::ModelOptions mo;
  mo.micro_batch = bc.batch;
  mo.seq_len = bc.seq_len;
  mo.compute_type = f.dtype;
  mo.logits_chunk_rows = f.logits_chunk;
  mo.pack_weights = f.pack && caps.packs_gemm_weights;  // as a job's (PacksGemmWeights)
  engine::DeviceArena arena(be, 0);
  auto model = engine::Model::Create(mc, mo, &arena);
  if (!model.ok()) {
    std::fprintf(stderr, "Model::Create: %s\n", model.status().ToString().c_str());
    return 1;
  }
  engine::Model& m = **model;
  m.InitRandom(1234);
  engine::AdamWOptions ao;
  ao.beta2 = 0.95;
  ao.weight_decay = 0.1;
  auto opt = engine::AdamWOptimizer::Create(m.params(), m.num_params(), ao, &arena);
  if (!opt.ok()) {
    std::fprintf(stderr, "AdamWOptimizer::Create: %s\n", opt.status().ToString().c_str());
    return 1;
  }
  const int64_t N = bc.batch * bc.seq_len;
  const engine::StepRunner::NextBatch next_batch = FixedRandomBatch(N, bc.vocab);
  // The trainer's step path (StepRunner: batch upload, Forward, Backward, grad norm, AdamW).
  auto run = RunTimedSteps(&m, opt->get(), &arena, 1, next_batch, warmup, steps,
                           [&] { prof.Reset(); }, f.graphs);
  if (!run.ok()) {
    std::fprintf(stderr, "steps: %s\n", run.status().ToString().c_str());
    return 1;
  }
  const std::vector<double>& times = run->seconds;
  const double first_loss = run->first_loss, loss = run->last_loss;
  if (times.empty()) {
    std::printf("traind %s: loss %.4f (no timed steps)\n", bc.name.c_str(), loss);
    return 0;
  }
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  double total = 0.0;
  for (double t : times) total += t;
  const double median = sorted[sorted.size() / 2];
  const double cpu_per_step = run->cpu_seconds / static_cast<double>(times.size());
  const double tok_s = static_cast<double>(N) / median;
  const double flops = engine::Model::TrainingFlops(mc, bc.batch, bc.seq_len);
  const double achieved = flops / median / 1e9;
  // Model FLOPs per CPU-second over sgemm FLOPs per CPU-second: MFU with the load factored out.
  const double mfu_cpu = flops / cpu_per_step / 1e9 / sgemm.per_cpu_s;
  std::printf(
      "traind %s: L=%lld C=%lld NH=%lld T=%lld B=%lld V=%lld params=%lld threads=%d gemm=%s "
      "device=%s dtype=%s tf32=%d graphs=%d packed=%d bf16_gemm=%s epilogues=%s arena_peak=%lld\n",
      bc.name.c_str(), static_cast<long long>(bc.layers), static_cast<long long>(bc.channels),
      static_cast<long long>(bc.heads), static_cast<long long>(bc.seq_len),
      static_cast<long long>(bc.batch), static_cast<long long>(bc.vocab),
      static_cast<long long>(m.num_params()), threads,
      host ? engine::cpu::GemmLibrary() : "device", f.device.c_str(),
      engine::DTypeName(f.dtype), f.tf32 ? 1 : 0, f.graphs ? 1 : 0, mo.pack_weights ? 1 : 0,
      engine::cpu::Bf16GemmNative() ? "onednn" : "widen",
      std::getenv("TRAIND_CUBLASLT_EPILOGUES") != nullptr ? std::getenv("TRAIND_CUBLASLT_EPILOGUES")
                                                          : "default",
      static_cast<long long>(arena.peak_bytes()));
  std::printf(
      "  step median %.2f ms (min %.2f, max %.2f, %zu steps), %.0f tok/s, loss %.4f -> %.4f\n"
      "  process CPU time %.2f s/step: %.0f tokens per CPU-second\n",
      1e3 * median, 1e3 * sorted.front(), 1e3 * sorted.back(), times.size(), tok_s, first_loss,
      loss, cpu_per_step, static_cast<double>(N) / cpu_per_step);
  const double mfu16 = achieved / gemm16.wall;
  const double mfu16_cpu = flops / cpu_per_step / 1e9 / gemm16.per_cpu_s;
  if (host) {
    std::printf(
        "  model FLOPs/step %.3g, achieved %.1f GFLOP/s, sgemm 1024^3 %.1f GFLOP/s, MFU %.1f%%; "
        "by CPU time: %.1f GFLOP/CPU-s vs sgemm %.1f, MFU %.1f%%\n",
        flops, achieved, sgemm_gflops, 100.0 * achieved / sgemm_gflops,
        flops / cpu_per_step / 1e9, sgemm.per_cpu_s, 100.0 * mfu_cpu);
    if (mixed) {
      std::printf(
          "  %s GEMM 1024^3 (fp32 out) %.1f GFLOP/s: MFU %.1f%%; by CPU time %.1f GFLOP/CPU-s, "
          "MFU %.1f%%\n",
          engine::DTypeName(f.dtype), gemm16.wall, 100.0 * mfu16, gemm16.per_cpu_s,
          100.0 * mfu16_cpu);
    }
  } else {
    // On a GPU the fp32 GEMM is not the ceiling of a bf16/tf32 step: bench/gpu_run.sh divides
    // model_tflops by the bf16 GEMM rate it measures in the same call (RESULT's mfu fields stay
    // against the fp32 GEMM, for the CPU table's columns).
    std::printf("  model FLOPs/step %.3g, achieved %.2f TFLOP/s; fp32 GEMM 1024^3 %.1f TFLOP/s\n",
                flops, achieved / 1e3, sgemm_gflops / 1e3);
  }
  std::printf(
      "RESULT side=traind config=%s dtype=%s seq=%lld tok_s=%.1f step_ms=%.3f sgemm_gflops=%.1f "
      "mfu=%.4f tok_per_cpu_s=%.1f mfu_cpu=%.4f gemm_gflops=%.1f gemm_mfu=%.4f "
      "gemm_mfu_cpu=%.4f model_tflops=%.2f loss=%.4f\n",
      bc.name.c_str(), engine::DTypeName(f.dtype), static_cast<long long>(bc.seq_len), tok_s,
      1e3 * median, sgemm_gflops, achieved / sgemm_gflops, static_cast<double>(N) / cpu_per_step,
      mfu_cpu, gemm16.wall, mfu16, mfu16_cpu, achieved / 1e3, loss);
  if (profile) {
    // The GEMM ceiling line needs wall-clock op times (--profile) on the CPU.
    prof.Print(total, static_cast<int>(times.size()),
               host && !cpu_time ? gemm16.wall : 0.0, flops);
  }
  return 0;
}

}  // namespace
}  // namespace traind::bench

int main(int argc, char** argv) {
  std::string config = "all";
  traind::bench::RunFlags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return traind::bench::FlagValue(argc, argv, &i); };
    if (a == "--config") {
      config = next();
    } else if (a == "--steps") {
      f.steps = std::atoi(next());
    } else if (a == "--warmup") {
      f.warmup = std::atoi(next());
    } else if (a == "--threads") {
      f.threads = std::atoi(next());
    } else if (a == "--device") {
      f.device = next();
    } else if (a == "--dtype") {
      const std::string d = next();
      if (d == "fp32") {
        f.dtype = traind::engine::DType::kF32;
      } else if (d == "bf16") {
        f.dtype = traind::engine::DType::kBF16;
      } else {
        std::fprintf(stderr, "--dtype %s: expected fp32 or bf16\n", d.c_str());
        return 2;
      }
    } else if (a == "--tf32") {
      f.tf32 = true;
    } else if (a == "--no-graphs") {
      f.graphs = false;
    } else if (a == "--batch") {
      f.batch = std::atoll(next());
    } else if (a == "--seq") {
      f.seq = std::atoll(next());
    } else if (a == "--logits-chunk") {
      f.logits_chunk = std::atoll(next());
    } else if (a == "--no-pack") {
      f.pack = false;
    } else if (a == "--bf16-gemm") {
      const std::string g = next();
      if (g != "onednn" && g != "widen") {
        std::fprintf(stderr, "--bf16-gemm %s: expected onednn or widen\n", g.c_str());
        return 2;
      }
      traind::engine::cpu::SetBf16GemmNativeForTesting(g == "onednn" ? 1 : 0);
    } else if (a == "--profile") {
      f.profile = true;
    } else if (a == "--profile-cpu") {
      f.profile = f.cpu_time = true;
    } else {
      std::fprintf(stderr,
                   "unknown argument %s\nusage: %s "
                   "[--config tiny|small|gpt2|llama_tiny|llama_small|all] [--steps N] "
                   "[--warmup N] [--threads N] [--device cpu|cuda:N|simt] "
                   "[--dtype fp32|bf16] [--tf32] [--batch B] [--seq T] [--no-graphs] [--no-pack] "
                   "[--bf16-gemm onednn|widen] [--logits-chunk ROWS] [--profile | --profile-cpu]\n",
                   a.c_str(), argv[0]);
      return 2;
    }
  }
  traind::engine::RegisterGpuBackends();
  const auto caps = traind::engine::DeviceCapabilitiesOf(f.device);
  if (!caps.ok()) {
    std::fprintf(stderr, "--device %s: %s\n", f.device.c_str(), caps.status().ToString().c_str());
    return 2;
  }
  int rc = 0, matched = 0;
  for (const auto& bc : traind::bench::kConfigs) {
    // "all" keeps a run on the host's cores (the cpu backend) to gpt2's two small configs; name
    // gpt2 or a llama config to run it there.
    const bool in_all = bc.name == "tiny" || bc.name == "small" ||
                        (bc.name == "gpt2" && caps->has_own_memory);
    if (config == "all" ? !in_all : config != bc.name) continue;
    ++matched;
    rc |= traind::bench::Run(bc, f);
  }
  if (matched == 0) {
    std::fprintf(stderr, "unknown config %s (tiny, small, gpt2, llama_tiny, llama_small, all)\n",
                 config.c_str());
    return 2;
  }
  return rc;
}
