// Packing against padding for instruction tuning (data.packing): loss-bearing tokens per second
// of a tiny llama-like model (the instruct-chat example's: byte vocabulary, 4 layers, d128, 4 heads,
// 2 kv heads, SwiGLU 384) trained on a mixed-length conversational set (examples/instruct/
// chat.jsonl, made by scripts/make_instruct_data.py, rendered with its chat template,
// assistant_only_loss), B rows of T per step:
//   padding: one example a row, right-padded (ExampleSet::OfLabelledRows);
//   packing: the examples packed best-fit decreasing (ExampleSet::OfPackedRows), attention only
//            inside each example (doc_start), positions restarting at 0.
// Both through the trainer's StepRunner (upload, Forward, Backward, grad norm, AdamW), with the
// same micro-batches fed to the PyTorch peer (torch_packing_bench.py: the same model from torch
// primitives; padding with the causal mask, packing with a block-diagonal causal mask and per-token
// positions) in the same run, same threads. Prints each side's loss tokens/s and the ratios
// (packing over padding on each side; traind over torch in each mode) as RESULT lines.
// Usage: packing_bench [--data F.jsonl] [--template F.jinja] [--seq T] [--batch B] [--steps N]
//                      [--warmup N] [--threads N] [--rounds R] [--quick] [--no-peer]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/arena.h"
#include "backend/backend.h"
#include "data/example_data.h"
#include "data/instruction_data.h"
#include "models/model.h"
#include "optim/adamw.h"
#include "train/step_runner.h"

namespace traind::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

const char* FlagValue(int argc, char** argv, int* i) {
  if (*i + 1 >= argc) {
    std::fprintf(stderr, "%s needs a value\n", argv[*i]);
    std::exit(2);
  }
  return argv[++*i];
}

struct Flags {
  std::string data = std::string(TRAIND_BENCH_DIR) + "/../examples/instruct/chat.jsonl";
  std::string tmpl = std::string(TRAIND_BENCH_DIR) + "/../examples/instruct/chat_template.jinja";
  int64_t seq = 512, batch = 8, layers = 4;
  int steps = 8, warmup = 1, threads = 2, rounds = 2;
  bool peer = true;
};

// One micro-batch as FillExampleBatch gives it: ids, targets, doc_start then positions.
struct MicroBatch {
  std::vector<int32_t> in, tg, rows;
  int64_t loss_tokens = 0;
};

std::vector<MicroBatch> Batches(const engine::ExampleSet& set, int64_t B, int64_t count) {
  engine::ExampleData data;
  data.pad_id = 0;
  const int64_t T = set.seq_len();
  std::vector<MicroBatch> out;
  int64_t next = 0;
  for (int64_t k = 0; k < count; ++k) {
    MicroBatch m;
    m.in.resize(static_cast<size_t>(B * T));
    m.tg.resize(static_cast<size_t>(B * T));
    m.rows.resize(static_cast<size_t>(2 * B * T));
    std::vector<int64_t> rows(static_cast<size_t>(B)), epochs(static_cast<size_t>(B), 0);
    for (int64_t& r : rows) r = next++ % set.size();  // in order, wrapping
    engine::FillExampleBatch(data, set, rows.data(), epochs.data(), B, m.in.data(), m.tg.data(),
                             m.rows.data());
    for (int32_t t : m.tg) m.loss_tokens += t != -1;
    out.push_back(std::move(m));
  }
  return out;
}

engine::ModelConfig Config(const Flags& f) {
  engine::ModelConfig c;
  c.arch = engine::Arch::kLlama;
  c.vocab_size = 256;
  c.hidden_size = 128;
  c.intermediate_size = 384;
  c.num_hidden_layers = f.layers;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = f.seq;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = false;
  return c;
}

struct Side {
  double loss_tok_s = 0, tok_s = 0, step_ms = 0, first_loss = 0, last_loss = 0;
};

// warmup + steps optimizer steps of one micro-batch each over `batches` (in order).
Result<Side> RunTraind(const Flags& f, const std::vector<MicroBatch>& batches) {
  std::unique_ptr<engine::Backend> be = engine::MakeCpuBackend(f.threads);
  engine::DeviceArena arena(be.get(), 0);
  engine::ModelOptions mo;
  mo.micro_batch = f.batch;
  mo.seq_len = f.seq;
  mo.example_rows = true;
  TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<engine::Model> m,
                          engine::Model::Create(Config(f), mo, &arena));
  m->InitRandom(1234);
  engine::AdamWOptions ao;
  ao.beta2 = 0.95;
  ao.weight_decay = 0.1;
  TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<engine::AdamWOptimizer> opt,
                          engine::AdamWOptimizer::Create(m->params(), m->num_params(), ao, &arena));
  engine::StepRunner::Options so;
  so.normalize_over_step = true;  // the trainer's setting for instruction data
  TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<engine::StepRunner> runner,
                          engine::StepRunner::Create(so, m.get(), opt.get(), &arena));
  size_t k = 0;
  const engine::StepRunner::NextMaskedBatch next = [&](int32_t* in, int32_t* tg, int32_t* rows,
                                                       double*) {
    const MicroBatch& b = batches[k++ % batches.size()];
    std::copy(b.in.begin(), b.in.end(), in);
    std::copy(b.tg.begin(), b.tg.end(), tg);
    std::copy(b.rows.begin(), b.rows.end(), rows);
    return Status::Ok();
  };
  Side s;
  double seconds = 0;
  int64_t loss_tokens = 0;
  for (int step = 0; step < f.warmup + f.steps; ++step) {
    const int64_t tokens = batches[k % batches.size()].loss_tokens;
    const Clock::time_point t0 = Clock::now();
    double wait = 0;
    TRAIND_ASSIGN_OR_RETURN(engine::StepRunner::Outcome out, runner->Run(next, 1e-4, 1.0f, &wait));
    if (step >= f.warmup) {
      seconds += Seconds(t0, Clock::now());
      loss_tokens += tokens;
    }
    if (step == 0) s.first_loss = out.loss;
    s.last_loss = out.loss;
  }
  s.loss_tok_s = static_cast<double>(loss_tokens) / seconds;
  s.tok_s = static_cast<double>(f.steps * f.batch * f.seq) / seconds;
  s.step_ms = 1e3 * seconds / f.steps;
  return s;
}

// The peer on the same micro-batches; its RESULT line's loss_tok_s (0 when it failed).
double RunTorch(const Flags& f, const std::string& mode, const std::string& file) {
  const std::string cmd = std::string("/usr/bin/python3 ") + TRAIND_BENCH_DIR +
                          "/torch_packing_bench.py --batches " + file + " --mode " + mode +
                          " --seq " + std::to_string(f.seq) + " --batch " + std::to_string(f.batch) +
                          " --layers " + std::to_string(f.layers) + " --steps " +
                          std::to_string(f.steps) + " --warmup " + std::to_string(f.warmup) +
                          " --threads " + std::to_string(f.threads);
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return 0;
  char line[4096];
  double v = 0;
  while (fgets(line, sizeof(line), p) != nullptr) {
    std::fputs(line, stdout);
    const char* at = std::strstr(line, "loss_tok_s=");
    if (std::strncmp(line, "RESULT side=torch", 17) == 0 && at != nullptr) v = std::atof(at + 11);
  }
  pclose(p);
  return v;
}

int Main(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--data") f.data = FlagValue(argc, argv, &i);
    else if (a == "--template") f.tmpl = FlagValue(argc, argv, &i);
    else if (a == "--seq") f.seq = std::atoll(FlagValue(argc, argv, &i));
    else if (a == "--batch") f.batch = std::atoll(FlagValue(argc, argv, &i));
    else if (a == "--steps") f.steps = std::atoi(FlagValue(argc, argv, &i));
    else if (a == "--warmup") f.warmup = std::atoi(FlagValue(argc, argv, &i));
    else if (a == "--threads") f.threads = std::atoi(FlagValue(argc, argv, &i));
    else if (a == "--rounds") f.rounds = std::atoi(FlagValue(argc, argv, &i));
    else if (a == "--no-peer") f.peer = false;
    else if (a == "--quick") f.seq = 128, f.batch = 2, f.steps = 1, f.warmup = 0, f.layers = 2, f.rounds = 1;
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (f.steps < 1 || f.seq < 2 || f.batch < 1 || f.rounds < 1) {
    std::fprintf(stderr, "--steps, --batch, --rounds must be >= 1 and --seq >= 2\n");
    return 2;
  }
  engine::DataSpec d;
  d.train_file = f.data;
  d.format = "jsonl";
  d.tokenizer = "byte";
  d.chat_template = f.tmpl;
  d.assistant_only_loss = true;
  d.seq_len = f.seq;
  auto ex = engine::ReadInstructionExamples(d, "");
  if (!ex.ok()) {
    std::fprintf(stderr, "%s\n", ex.status().ToString().c_str());
    return 1;
  }
  std::vector<int32_t> ids, labels, lengths;
  int64_t longest = 0, total = 0;
  for (const auto& e : *ex) {
    ids.insert(ids.end(), e.ids.begin(), e.ids.end());
    labels.insert(labels.end(), e.labels.begin(), e.labels.end());
    lengths.push_back(static_cast<int32_t>(e.ids.size()));
    longest = std::max<int64_t>(longest, static_cast<int64_t>(e.ids.size()));
    total += static_cast<int64_t>(e.ids.size());
  }
  const engine::ExampleSet padded =
      engine::ExampleSet::OfLabelledRows(ids, labels, lengths, f.seq, 0);
  const engine::ExampleSet packed = engine::ExampleSet::OfPackedRows(ids, labels, lengths, f.seq, 0);
  std::printf("packing_bench: %zu examples from %s (%lld ids on average, longest %lld), T=%lld "
              "B=%lld: %lld padded rows, %lld packed rows; %d+%d steps, %d threads, %d rounds\n",
              ex->size(), f.data.c_str(), static_cast<long long>(total / std::max<size_t>(ex->size(), 1)),
              static_cast<long long>(longest), static_cast<long long>(f.seq),
              static_cast<long long>(f.batch), static_cast<long long>(padded.size()),
              static_cast<long long>(packed.size()), f.warmup, f.steps, f.threads, f.rounds);
  const int64_t count = f.warmup + f.steps;
  const std::vector<MicroBatch> modes[2] = {Batches(padded, f.batch, count),
                                            Batches(packed, f.batch, count)};
  const char* names[2] = {"padding", "packing"};
  std::string files[2];
  for (int m = 0; m < 2; ++m) {  // the micro-batches for the peer
    nlohmann::json j = nlohmann::json::array();
    for (const MicroBatch& b : modes[m]) {
      const auto N = static_cast<std::ptrdiff_t>(b.in.size());
      j.push_back({{"ids", b.in},
                   {"targets", b.tg},
                   {"doc_start", std::vector<int32_t>(b.rows.begin(), b.rows.begin() + N)},
                   {"positions", std::vector<int32_t>(b.rows.begin() + N, b.rows.end())}});
    }
    files[m] = "/tmp/packing_bench_" + std::to_string(getpid()) + "_" + names[m] + ".json";
    std::ofstream(files[m]) << j.dump();
  }
  // Rounds alternate the sides and modes; each column is the median over the rounds.
  std::vector<double> ours[2], theirs[2];
  for (int r = 0; r < f.rounds; ++r) {
    for (int m = 0; m < 2; ++m) {
      auto s = RunTraind(f, modes[m]);
      if (!s.ok()) {
        std::fprintf(stderr, "traind %s: %s\n", names[m], s.status().ToString().c_str());
        return 1;
      }
      int64_t lt = 0;
      for (const MicroBatch& b : modes[m]) lt += b.loss_tokens;
      std::printf("traind %s round %d: step %.1f ms, %.0f tok/s, %.0f loss tok/s (%.1f loss tokens "
                  "a row), loss %.4f -> %.4f\n",
                  names[m], r + 1, s->step_ms, s->tok_s, s->loss_tok_s,
                  static_cast<double>(lt) / static_cast<double>(count * f.batch), s->first_loss,
                  s->last_loss);
      ours[m].push_back(s->loss_tok_s);
      if (f.peer) theirs[m].push_back(RunTorch(f, names[m], files[m]));
    }
  }
  for (const std::string& file : files) std::remove(file.c_str());
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double t_pad = median(ours[0]), t_pack = median(ours[1]);
  const double p_pad = median(theirs[0]), p_pack = median(theirs[1]);
  std::printf("RESULT packing_bench side=traind T=%lld B=%lld padding_loss_tok_s=%.1f "
              "packing_loss_tok_s=%.1f packing_over_padding=%.2f\n",
              static_cast<long long>(f.seq), static_cast<long long>(f.batch), t_pad, t_pack,
              t_pack / t_pad);
  if (f.peer) {
    std::printf("RESULT packing_bench side=torch T=%lld B=%lld padding_loss_tok_s=%.1f "
                "packing_loss_tok_s=%.1f packing_over_padding=%.2f\n",
                static_cast<long long>(f.seq), static_cast<long long>(f.batch), p_pad, p_pack,
                p_pad > 0 ? p_pack / p_pad : 0.0);
    std::printf("RESULT packing_bench traind_over_torch padding=%.2f packing=%.2f\n",
                p_pad > 0 ? t_pad / p_pad : 0.0, p_pack > 0 ? t_pack / p_pack : 0.0);
  }
  return 0;
}

}  // namespace
}  // namespace traind::bench

int main(int argc, char** argv) { return traind::bench::Main(argc, argv); }
