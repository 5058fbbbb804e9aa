// bert_table_bench: one row of the memory-anatomy guide's experiment (HF "Methods and tools for
// efficient training on a single GPU": bert-large-uncased, sequence classification, seq 512,
// batch 4) on the CPU backend: full BERT training steps as the trainer runs them (StepRunner:
// k x (upload, Forward, Backward), grad norm and clipping at 1.0, the optimizer) with one technique
// per row, or all of them; prints time per sample, samples/s and peak memory (arena high-water,
// process RSS growth and peak). bench/run_all.sh --bert runs every row beside its PyTorch peer
// (bench/torch_bert_table.py) and prints the table with the ratios (bert_table_summary.py).
// Rows (the HF Trainer's defaults: AdamW lr 5e-5, betas (0.9, 0.999), eps 1e-8, no weight decay,
// max_grad_norm 1.0):
//   baseline    micro-batch 4, fp32, AdamW
//   accum       4 micro-batches of 1
//   ckpt        gradient checkpointing, every block
//   bf16        bf16 compute (fp32 master weights)
//   adafactor   Adafactor (the Trainer's optim="adafactor": no relative step, no parameter scale)
//   adamw_8bit  8-bit AdamW (bitsandbytes semantics)
//   all         1 x 4 accumulation, checkpointing, bf16, Adafactor
//   mixtral     a Mixtral-style sparse MoE causal LM at the config's width, depth and sequence
//               (8 SwiGLU experts of intermediate/4, top 2, random tokens, next-token loss),
//               micro-batch 4, fp32 AdamW; traind only (torch_bert_table.py has no MoE peer)
//   dense       the same causal LM (llama) with one SwiGLU MLP of 2 x intermediate/4, the MoE
//               row's active parameters per token: the pair shows the cost of routing
// Usage: bert_table_bench --row ROW [--config tiny|base|large] [--batch B] [--accum K]
//                         [--steps N] [--warmup N] [--threads N] [--seq T] [--profile-cpu]
//                         [--no-pack]   (bf16: layer inputs not packed for the weight gradients)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/arena.h"
#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "bench_util.h"
#include "models/model.h"
#include "optim/optimizer.h"
#include "profiling_backend.h"
#include "train/step_runner.h"

namespace traind::bench {
namespace {

using engine::Backend;
using engine::DType;

// bert-large-uncased / bert-base-uncased config.json shapes; tiny for a quick look.
struct BertShape {
  std::string name;
  int64_t layers, hidden, heads, intermediate, seq_len;
};
const BertShape kConfigs[] = {
    {"tiny", 4, 256, 4, 1024, 128},
    {"base", 12, 768, 12, 3072, 512},
    {"large", 24, 1024, 16, 4096, 512},
};
constexpr int64_t kVocab = 30522, kMaxPositions = 512, kTypeVocab = 2;
constexpr double kLr = 5e-5;  // the HF Trainer's default learning_rate

struct Row {
  bool accum = false, ckpt = false, bf16 = false;
  std::string optim = "adamw";
  bool mixtral = false;
  bool dense = false;  // the dense causal LM with mixtral's active parameters per token
};
bool ParseRow(const std::string& s, Row* r) {
  *r = Row{};
  if (s == "baseline") return true;
  if (s == "accum") r->accum = true;
  else if (s == "ckpt") r->ckpt = true;
  else if (s == "bf16") r->bf16 = true;
  else if (s == "adafactor") r->optim = "adafactor";
  else if (s == "adamw_8bit") r->optim = "adamw_8bit";
  else if (s == "all") *r = {true, true, true, "adafactor", false};
  else if (s == "mixtral") r->mixtral = true;
  else if (s == "dense") r->dense = true;
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

// StepRunner::PlanBytes with the attention-mask slots where the runner has them (the mask argument
// is being added to the runner; before that an encoder's mask is not uploaded per micro-batch).
template <typename R = engine::StepRunner>
int64_t RunnerPlanBytes(int64_t B, int64_t T, bool mask) {
  if constexpr (requires { R::PlanBytes(B, T, mask); }) {
    return R::PlanBytes(B, T, mask);
  } else {
    return R::PlanBytes(B, T);
  }
}

int Run(const BertShape& bs, const std::string& row_name, const Row& row, int64_t batch,
        int64_t accum_k, int steps, int warmup, int threads, bool profile, bool pack) {
  const bool peak_reset = ResetPeakRss();
  const int64_t rss0 = ProcStatusBytes("VmRSS");
  const int64_t B = row.accum ? batch / accum_k : batch;
  const int64_t k = row.accum ? accum_k : 1;
  const int64_t T = bs.seq_len;
  const DType ct = row.bf16 ? DType::kBF16 : DType::kF32;
  std::printf("traind bert-%s row=%s: L=%lld C=%lld NH=%lld H=%lld T=%lld V=%lld micro_batch=%lld "
              "accum=%lld ckpt=%d compute=%s optim=%s threads=%d gemm=%s packed=%d\n",
              bs.name.c_str(), row_name.c_str(), static_cast<long long>(bs.layers),
              static_cast<long long>(bs.hidden), static_cast<long long>(bs.heads),
              static_cast<long long>(bs.intermediate), static_cast<long long>(T),
              static_cast<long long>(kVocab), static_cast<long long>(B),
              static_cast<long long>(k), row.ckpt ? 1 : 0, engine::DTypeName(ct),
              row.optim.c_str(), threads, engine::cpu::GemmLibrary(), pack && row.bf16 ? 1 : 0);

  std::unique_ptr<Backend> cpu_backend = engine::MakeCpuBackend(threads);
  // --profile-cpu: every op through ProfilingBackend (process CPU time per op), printed at the end.
  ProfilingBackend prof(cpu_backend.get(), /*cpu_time=*/true);
  Backend* cpu = profile ? static_cast<Backend*>(&prof) : cpu_backend.get();
  engine::ModelConfig mc;
  mc.arch = row.mixtral ? engine::Arch::kMixtral : row.dense ? engine::Arch::kLlama : engine::Arch::kBert;
  mc.vocab_size = kVocab;
  mc.hidden_size = bs.hidden;
  mc.intermediate_size = bs.intermediate;
  mc.num_hidden_layers = bs.layers;
  mc.num_attention_heads = bs.heads;
  mc.max_position_embeddings = kMaxPositions;
  mc.type_vocab_size = kTypeVocab;
  mc.layer_norm_eps = 1e-12;
  mc.pad_token_id = 0;
  mc.head = "sequence_classification";
  mc.num_labels = 2;
  if (row.mixtral) {
    mc.head.clear();
    mc.intermediate_size = bs.intermediate / 4;
    mc.num_key_value_heads = bs.heads;
    mc.num_local_experts = 8;
    mc.num_experts_per_tok = 2;
    mc.rms_norm_eps = 1e-5;
  }
  if (row.dense) {  // one SwiGLU MLP as wide as mixtral's two active experts together
    mc.head.clear();
    mc.intermediate_size = 2 * (bs.intermediate / 4);
    mc.num_key_value_heads = bs.heads;
    mc.rms_norm_eps = 1e-5;
  }
  engine::ModelOptions mo;
  mo.micro_batch = B;
  mo.seq_len = T;
  mo.gradient_checkpointing = row.ckpt;
  mo.checkpoint_every = 1;
  mo.compute_type = ct;
  mo.pack_weights = pack;  // a cpu job's (PacksGemmWeights): bf16 packs each layer input
  engine::DeviceArena arena(cpu, 0);
  auto model = engine::Model::Create(mc, mo, &arena);
  if (!model.ok()) {
    std::printf("RESULT side=traind model=%s row=%s status=not_available reason=\"%s\"\n",
                bs.name.c_str(), row_name.c_str(), model.status().ToString().c_str());
    return 0;
  }
  engine::Model& m = **model;
  m.InitRandom(1234);
  m.ParamsChanged();
  engine::TrainingSpec ts;  // the HF Trainer's defaults (adam_* already are)
  ts.optim = row.optim;
  ts.learning_rate = kLr;
  ts.weight_decay = 0.0;
  auto opt = engine::MakeOptimizer(ts, m.params(), m.num_params(), &arena);
  if (!opt.ok()) {
    std::printf("RESULT side=traind model=%s row=%s status=not_available reason=\"%s\"\n",
                bs.name.c_str(), row_name.c_str(), opt.status().ToString().c_str());
    return 0;
  }
  const int64_t opt_plan = engine::OptimizerPlanBytes(ts, m.params(), m.num_params());
  const int64_t plan = engine::Model::PlanBytes(mc, mo).total() + opt_plan +
                       RunnerPlanBytes(B, T, m.attention_mask() != nullptr);
  std::printf("  %s: params %lld (%.1f MiB fp32), optimizer state %.1f MiB\n",
              row.mixtral ? "mixtral (8 experts of intermediate/4, top 2, next-token loss)"
              : row.dense ? "dense llama (SwiGLU of 2 x intermediate/4: mixtral's active size)"
                          : "bert sequence classification",
              static_cast<long long>(m.num_params()), 4.0 * m.num_params() / 1048576.0,
              opt_plan / 1048576.0);

  // One step's samples (bert): k micro-batches of B random sequences (ids in [1, V): 0 is the padding
  // row) and labels 0/1; targets()[b] = label of sequence b, the rest -1.
  const int64_t N = B * T;
  std::vector<int32_t> ids(static_cast<size_t>(k * N + 1)), labels(static_cast<size_t>(k * B));
  std::mt19937 rng(42);
  for (auto& t : ids) t = 1 + static_cast<int32_t>(rng() % static_cast<uint32_t>(kVocab - 1));
  for (auto& l : labels) l = static_cast<int32_t>(rng() % 2u);
  int64_t micro = 0;
  engine::StepRunner::NextBatch next_batch = [&](int32_t* in, int32_t* tg, double*) {
    const int64_t a = micro++ % k;
    std::copy(ids.data() + a * N, ids.data() + (a + 1) * N, in);
    if (row.mixtral || row.dense) {  // next-token targets
      std::copy(ids.data() + a * N + 1, ids.data() + (a + 1) * N + 1, tg);
      return Status::Ok();
    }
    std::fill(tg, tg + N, -1);
    std::copy(labels.data() + a * B, labels.data() + (a + 1) * B, tg);
    return Status::Ok();
  };

  engine::StepRunner::Options so;
  so.accumulation_steps = k;
  so.max_grad_norm = 1.0;  // the Trainer's default
  auto runner = engine::StepRunner::Create(so, &m, opt->get(), &arena);
  if (!runner.ok()) {
    std::fprintf(stderr, "StepRunner::Create: %s\n", runner.status().ToString().c_str());
    return 1;
  }
  std::vector<double> times;
  double first_loss = 0.0, loss = 0.0, cpu0 = 0.0;
  for (int s = 0; s < warmup + steps; ++s) {
    if (s == warmup) {
      cpu0 = ProcessCpuSeconds();
      prof.Reset();
    }
    const Clock::time_point t0 = Clock::now();
    double wait = 0.0;
    auto out = (*runner)->Run(next_batch, kLr, 1.0f, &wait);
    if (!out.ok()) {
      std::fprintf(stderr, "step %d: %s\n", s, out.status().ToString().c_str());
      return 1;
    }
    const double sec = Seconds(t0, Clock::now());
    if (s >= warmup) times.push_back(sec);
    if (s == 0) first_loss = out->loss;
    loss = out->loss;
    std::printf("  step %d: %.1f ms%s, loss %.4f, grad norm %.4f\n", s, 1e3 * sec,
                s < warmup ? " (warm-up)" : "", out->loss, out->grad_norm);
    std::fflush(stdout);
  }
  const double cpu_s = ProcessCpuSeconds() - cpu0;
  const int64_t hwm = ProcStatusBytes("VmHWM");
  if (times.empty()) {
    std::printf("traind bert-%s row=%s: loss %.4f (no timed steps)\n", bs.name.c_str(),
                row_name.c_str(), loss);
    return 0;
  }
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  const double samples = static_cast<double>(B * k);
  std::printf("  step median %.1f ms (min %.1f, max %.1f, %zu steps) for %lld samples, loss "
              "%.4f -> %.4f\n  arena peak %.1f MiB (plan %.1f MiB), process RSS growth %.1f "
              "MiB, peak RSS %.1f MiB%s\n",
              1e3 * median, 1e3 * sorted.front(), 1e3 * sorted.back(), times.size(),
              static_cast<long long>(B * k), first_loss, loss, arena.peak_bytes() / 1048576.0,
              plan / 1048576.0, (hwm - rss0) / 1048576.0, hwm / 1048576.0,
              peak_reset ? "" : " (VmHWM could not be reset: includes earlier peaks)");
  std::printf("RESULT side=traind model=%s row=%s status=ok micro_batch=%lld accum=%lld "
              "optim=%s sample_ms=%.3f samples_s=%.4f cpu_ms_per_sample=%.3f peak_bytes=%lld "
              "plan_bytes=%lld rss_bytes=%lld hwm_bytes=%lld loss=%.4f\n",
              bs.name.c_str(), row_name.c_str(), static_cast<long long>(B),
              static_cast<long long>(k), row.optim.c_str(), 1e3 * median / samples,
              samples / median, 1e3 * cpu_s / (samples * static_cast<double>(times.size())),
              static_cast<long long>(arena.peak_bytes()), static_cast<long long>(plan),
              static_cast<long long>(hwm - rss0), static_cast<long long>(hwm), loss);
  if (profile) prof.Print(cpu_s, static_cast<int>(times.size()));
  return 0;
}

}  // namespace
}  // namespace traind::bench

int main(int argc, char** argv) {
  std::string config = "large", row_name;
  int64_t batch = 4, accum = 4, seq = 0;
  int steps = 2, warmup = 1, threads = 2;
  bool profile = false, pack = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return traind::bench::FlagValue(argc, argv, &i); };
    if (a == "--row") row_name = next();
    else if (a == "--config" || a == "--model") config = next();
    else if (a == "--batch") batch = std::atoll(next());
    else if (a == "--accum") accum = std::atoll(next());
    else if (a == "--steps") steps = std::atoi(next());
    else if (a == "--warmup") warmup = std::atoi(next());
    else if (a == "--threads") threads = std::atoi(next());
    else if (a == "--seq") seq = std::atoll(next());
    else if (a == "--profile-cpu") profile = true;
    else if (a == "--no-pack") pack = false;
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  traind::bench::Row row;
  if (!traind::bench::ParseRow(row_name, &row)) {
    std::fprintf(stderr, "usage: %s --row baseline|accum|ckpt|bf16|adafactor|adamw_8bit|all|"
                 "mixtral|dense [--config tiny|base|large] [--batch B] [--accum K] [--steps N] "
                 "[--warmup N] [--threads N] [--seq T] [--profile-cpu] [--no-pack]\n", argv[0]);
    return 2;
  }
  if (batch < 1 || accum < 1 || batch % accum != 0 || steps < 0 || warmup < 0 || threads < 1 ||
      seq < 0 || seq > traind::bench::kMaxPositions) {
    std::fprintf(stderr, "--batch must be a positive multiple of --accum; steps, warmup >= 0; "
                 "--seq <= 512\n");
    return 2;
  }
  for (auto bs : traind::bench::kConfigs) {
    if (bs.name == config) {
      if (seq > 0) bs.seq_len = seq;
      return traind::bench::Run(bs, row_name, row, batch, accum, steps, warmup, threads, profile,
                                pack);
    }
  }
  std::fprintf(stderr, "unknown config %s (tiny, base, large)\n", config.c_str());
  return 2;
}
