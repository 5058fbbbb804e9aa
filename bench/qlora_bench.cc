// qlora_bench: the QLoRA step against the LoRA step on the CPU backend, in one run: the same
// llama-shaped model (`tiny`: 4 layers, d256, intermediate 688, 4 heads, T128, vocab 256;
// `small`: 6 layers, d512, intermediate 1376, 8 heads, T256, vocab 32000), the same batches, the
// trainer's step path (StepRunner: upload, Forward, Backward, grad norm, AdamW on the adapters),
// LoRA r 16 on every projection; once with the base in the compute type (LoRA), once in 4 bits
// (QLoRA: NF4 or FP4, double quantization on or off), each block's weights dequantized into the
// scratch before its GEMMs in forward, recomputation and backward. Prints the median step time,
// the arena peak (= the plan) and its weights bytes for each, and the ratios.
// Usage: qlora_bench [--model tiny|small] [--batch B] [--steps N] [--warmup N] [--threads N]
//                    [--compute f32|bf16] [--quant nf4|fp4] [--double-quant 0|1] [--ckpt 0|1]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "backend/arena.h"
#include "backend/backend.h"
#include "bench_util.h"
#include "models/model.h"
#include "train/planner.h"

namespace traind::bench {
namespace {

struct Shape {
  std::string name;
  int64_t layers, channels, intermediate, heads, seq_len, vocab;
};
const Shape kShapes[] = {{"tiny", 4, 256, 688, 4, 128, 256}, {"small", 6, 512, 1376, 8, 256, 32000}};

struct Outcome {
  double median_ms = 0, first_loss = 0, last_loss = 0;
  int64_t peak = 0, plan = 0, weights = 0;
};

int Run(const Shape& s, int64_t B, int steps, int warmup, int threads, engine::DType compute,
        bool ckpt, const engine::ModelOptions::Quant4& quant, Outcome* out) {
  std::unique_ptr<engine::Backend> be = engine::MakeCpuBackend(threads);
  engine::ModelConfig mc;
  mc.arch = engine::Arch::kLlama;
  mc.vocab_size = s.vocab;
  mc.hidden_size = s.channels;
  mc.intermediate_size = s.intermediate;
  mc.num_hidden_layers = s.layers;
  mc.num_attention_heads = s.heads;
  mc.num_key_value_heads = s.heads;
  mc.max_position_embeddings = s.seq_len;
  mc.tie_word_embeddings = false;
  engine::ModelOptions mo;
  mo.micro_batch = B;
  mo.seq_len = s.seq_len;
  mo.compute_type = compute;
  mo.gradient_checkpointing = ckpt;
  mo.lora.r = 16;
  mo.lora.alpha = 32;
  mo.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  mo.master_weights_off_device = compute != engine::DType::kF32;  // as jobs set it for LoRA
  mo.quant4 = quant;
  engine::TrainingSpec ts;  // AdamW
  ts.weight_decay = 0.1;
  ts.bf16 = compute == engine::DType::kBF16;
  engine::DeviceArena arena(be.get(), 0);
  auto made = MakeSeededModel(mc, mo, ts, &arena);
  if (!made.ok()) {
    std::fprintf(stderr, "%s\n", made.status().ToString().c_str());
    return 1;
  }
  const engine::MemoryBytes bytes = engine::JobBytes(mc, mo, ts);
  out->plan = bytes.total();
  out->weights = bytes.weights;
  auto run = RunTimedSteps(made->model.get(), made->optimizer.get(), &arena, 1,
                           FixedRandomBatch(B * s.seq_len, s.vocab), warmup, steps, [] {},
                           /*use_graphs=*/true, /*learning_rate=*/1e-3);
  if (!run.ok()) {
    std::fprintf(stderr, "steps: %s\n", run.status().ToString().c_str());
    return 1;
  }
  out->first_loss = run->first_loss;
  out->last_loss = run->last_loss;
  out->median_ms = MedianMs(run->seconds);
  out->peak = arena.peak_bytes();
  return 0;
}

}  // namespace
}  // namespace traind::bench

int main(int argc, char** argv) {
  using namespace traind;
  std::string model = "tiny", compute_name = "bf16", quant_name = "nf4";
  int64_t batch = 2;
  int steps = 3, warmup = 1, threads = 2, dq = 1, ckpt = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model") model = bench::FlagValue(argc, argv, &i);
    else if (a == "--batch") batch = std::atoll(bench::FlagValue(argc, argv, &i));
    else if (a == "--steps") steps = std::atoi(bench::FlagValue(argc, argv, &i));
    else if (a == "--warmup") warmup = std::atoi(bench::FlagValue(argc, argv, &i));
    else if (a == "--threads") threads = std::atoi(bench::FlagValue(argc, argv, &i));
    else if (a == "--compute") compute_name = bench::FlagValue(argc, argv, &i);
    else if (a == "--quant") quant_name = bench::FlagValue(argc, argv, &i);
    else if (a == "--double-quant") dq = std::atoi(bench::FlagValue(argc, argv, &i));
    else if (a == "--ckpt") ckpt = std::atoi(bench::FlagValue(argc, argv, &i));
    else {
      std::fprintf(stderr, "unknown flag %s (see the usage at the top of qlora_bench.cc)\n", a.c_str());
      return 2;
    }
  }
  const bench::Shape* shape = nullptr;
  for (const auto& s : bench::kShapes) {
    if (s.name == model) shape = &s;
  }
  if (shape == nullptr || batch < 1 || steps < 1 || (compute_name != "f32" && compute_name != "bf16") ||
      (quant_name != "nf4" && quant_name != "fp4")) {
    std::fprintf(stderr, "--model tiny|small, --batch >= 1, --steps >= 1, --compute f32|bf16, "
                         "--quant nf4|fp4\n");
    return 2;
  }
  const engine::DType compute = compute_name == "bf16" ? engine::DType::kBF16 : engine::DType::kF32;
  engine::ModelOptions::Quant4 quant;
  quant.enabled = true;
  quant.type = quant_name == "nf4" ? engine::Quant4Type::kNF4 : engine::Quant4Type::kFP4;
  quant.double_quant = dq != 0;
  std::printf("qlora_bench: llama %s (%lld layers, d%lld, intermediate %lld, T%lld, vocab %lld), B%lld, "
              "%d threads, %s, LoRA r 16 on every projection, AdamW; QLoRA %s%s%s\n",
              shape->name.c_str(), static_cast<long long>(shape->layers),
              static_cast<long long>(shape->channels), static_cast<long long>(shape->intermediate),
              static_cast<long long>(shape->seq_len), static_cast<long long>(shape->vocab),
              static_cast<long long>(batch), threads, compute_name.c_str(), quant_name.c_str(),
              dq ? " with double quantization" : "", ckpt ? ", gradient checkpointing" : "");
  bench::Outcome lora, qlora;
  if (bench::Run(*shape, batch, steps, warmup, threads, compute, ckpt != 0, {}, &lora) != 0) return 1;
  if (bench::Run(*shape, batch, steps, warmup, threads, compute, ckpt != 0, quant, &qlora) != 0) return 1;
  auto print = [&](const char* mode, const bench::Outcome& x) {
    std::printf("RESULT qlora_bench model=%s mode=%s step_ms=%.1f tok_s=%.0f peak_bytes=%lld "
                "plan_bytes=%lld weights_bytes=%lld loss=%.4f->%.4f\n",
                shape->name.c_str(), mode, x.median_ms,
                1e3 * static_cast<double>(batch * shape->seq_len) / x.median_ms,
                static_cast<long long>(x.peak), static_cast<long long>(x.plan),
                static_cast<long long>(x.weights), x.first_loss, x.last_loss);
  };
  print("lora", lora);
  print("qlora", qlora);
  std::printf("RESULT qlora_bench model=%s qlora_over_lora step_time=%.3f peak=%.3f weights=%.3f\n",
              shape->name.c_str(), qlora.median_ms / lora.median_ms,
              static_cast<double>(qlora.peak) / static_cast<double>(lora.peak),
              static_cast<double>(qlora.weights) / static_cast<double>(lora.weights));
  return 0;
}
