// Helpers shared by the trainer and optimizer tests: a tiny gpt2 job spec on synthetic token data,
// temporary folders, file comparison, and running the PyTorch reference scripts.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "traind/engine/job_spec.h"
#include "traind/engine/trainer.h"
#include "synthetic_tokens.h"

namespace traind::engine::testing {

// Removes the folders MakeTempDir made when the test binary exits (kept when the environment
// sets TRAIND_KEEP_TEST_DIRS, for debugging).
struct TempDirCleaner {
  std::vector<std::string> dirs;
  ~TempDirCleaner() {
    if (std::getenv("TRAIND_KEEP_TEST_DIRS") != nullptr) return;
    std::error_code ec;
    for (const std::string& d : dirs) std::filesystem::remove_all(d, ec);
  }
};

// A fresh empty folder under the test temp dir, unique per call.
inline std::string MakeTempDir(const std::string& tag) {
  static int counter = 0;
  static TempDirCleaner cleaner;
  const std::string dir = ::testing::TempDir() + "traind_" + tag + "_" +
                          std::to_string(::getpid()) + "_" + std::to_string(counter++);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  cleaner.dirs.push_back(dir);
  return dir;
}

// `n` uint16 tokens below `vocab` with learnable structure (a noisy repeating pattern), seeded.
using test_data::WriteSyntheticTokens;

// A llama-family config (untied embeddings) of vocab 64 and the given size.
struct TinyLlamaSize {
  int64_t hidden, intermediate, layers, heads, kv_heads, positions;
};
inline ModelConfig TinyLlamaConfig(const TinyLlamaSize& z) {
  ModelConfig m;
  m.arch = Arch::kLlama;
  m.vocab_size = 64;
  m.hidden_size = z.hidden;
  m.intermediate_size = z.intermediate;
  m.num_hidden_layers = z.layers;
  m.num_attention_heads = z.heads;
  m.num_key_value_heads = z.kv_heads;
  m.max_position_embeddings = z.positions;
  m.tie_word_embeddings = false;
  return m;
}

// A tiny gpt2 job (vocab 64, 2 layers, d32, T16, B4) on `data_file` (uint16 tokens), writing to
// dir/out. Cosine with warmup, weight decay and clipping on, so every rule is exercised.
inline JobSpec TinySpec(const std::string& dir, const std::string& data_file) {
  JobSpec s;
  s.name = "tiny";
  s.model.config.arch = Arch::kGpt2;
  s.model.config.vocab_size = 64;
  s.model.config.n_positions = 32;
  s.model.config.n_embd = 32;
  s.model.config.n_layer = 2;
  s.model.config.n_head = 2;
  s.data.train_file = data_file;
  s.data.format = "tokens";
  s.data.token_dtype = "uint16";
  s.data.seq_len = 16;
  s.data.validation_split = 0.1;
  s.data.shuffle = true;
  s.training.max_steps = 6;
  s.training.per_device_train_batch_size = 4;
  s.training.learning_rate = 3e-3;
  s.training.lr_scheduler_type = "cosine";
  s.training.warmup_steps = 2;
  s.training.weight_decay = 0.1;
  s.training.max_grad_norm = 1.0;
  s.training.seed = 7;
  s.training.logging_steps = 2;
  s.output_dir = dir + "/out";
  return s;
}

// One CPU thread: on the shared 2-core CI machine, OpenMP teams of two spin against other jobs
// and run these tiny models many times slower. Tests of determinism pass threads explicitly.
// The tiny gpt2 (4 layers, d256, 4 heads, T128, B8, byte vocabulary) on `text`, 200
// steps in window order (shuffle off), cosine lr 2e-3 with 20 warmup steps, weight decay 0.1,
// clipping 1.0, seed 1234, writing to `output_dir`. (3e-3 is on the edge of stability here: fp32
// runs differing only in GEMM library end 3% apart.)
inline JobSpec TinyShakespeareSpec(const std::string& text, const std::string& output_dir) {
  JobSpec spec;
  spec.model.config.arch = Arch::kGpt2;
  spec.model.config.vocab_size = 256;
  spec.model.config.n_positions = 128;
  spec.model.config.n_embd = 256;
  spec.model.config.n_layer = 4;
  spec.model.config.n_head = 4;
  spec.data.train_file = text;
  spec.data.format = "text";
  spec.data.seq_len = 128;
  spec.data.validation_split = 0.01;
  spec.data.shuffle = false;
  TrainingSpec& t = spec.training;
  t.max_steps = 200;
  t.per_device_train_batch_size = 8;
  t.learning_rate = 2e-3;
  t.lr_scheduler_type = "cosine";
  t.warmup_steps = 20;
  t.weight_decay = 0.1;
  t.max_grad_norm = 1.0;
  t.seed = 1234;
  spec.output_dir = output_dir;
  return spec;
}

inline RunOptions TestRunOptions(int threads = 1) {
  RunOptions o;
  o.device.device = "cpu";
  o.device.threads = threads;
  return o;
}

// The resume check shared by the trainer and LoRA tests, for 6-step specs with save_steps 2: `a`
// runs uninterrupted; `b` (another output_dir) is cancelled from step 3's report, so its newest
// checkpoint is checkpoint-2, and then resumed; `after_cancel` runs between the two (for checks of
// what the cancelled run left). Each result is nullopt when that run was not made.
struct CancelResumeRuns {
  std::vector<double> losses_a;  // steps 1..6
  std::vector<double> losses_b;  // steps 1..3, then 3..6 after the resume from step 2
  size_t steps_before_resume = 0;
  std::optional<Result<RunSummary>> a, b_cancelled, b_resumed;
  std::vector<std::string> resume_notes;  // the resumed run's messages
};
inline CancelResumeRuns RunCancelledAndResumed(const JobSpec& a, const JobSpec& b,
                                               const std::function<void()>& after_cancel = {}) {
  CancelResumeRuns r;
  RunCallbacks cb_a;
  cb_a.on_step = [&](const StepReport& s) { r.losses_a.push_back(s.loss); };
  r.a = RunJob(a, TestRunOptions(2), cb_a);
  if (!r.a->ok()) return r;
  std::atomic<bool> cancel{false};
  RunOptions ob = TestRunOptions(2);
  ob.cancel = &cancel;
  RunCallbacks cb_b;
  cb_b.on_step = [&](const StepReport& s) {
    r.losses_b.push_back(s.loss);
    if (s.step == 3) cancel.store(true);
  };
  r.b_cancelled = RunJob(b, ob, cb_b);
  r.steps_before_resume = r.losses_b.size();
  if (after_cancel) after_cancel();
  RunOptions oc = TestRunOptions(2);
  oc.resume = true;
  RunCallbacks cb_c;
  cb_c.on_step = [&](const StepReport& s) { r.losses_b.push_back(s.loss); };
  cb_c.on_message = [&](const std::string& m) { r.resume_notes.push_back(m); };
  r.b_resumed = RunJob(b, oc, cb_c);
  return r;
}

// Every step loss of the resumed run equals the uninterrupted run's, bit for bit.
inline void ExpectResumedLossesIdentical(const CancelResumeRuns& r) {
  ASSERT_EQ(r.losses_a.size(), 6u);
  ASSERT_EQ(r.losses_b.size(), 7u);
  for (int s = 0; s < 6; ++s) {
    EXPECT_EQ(s < 2 ? r.losses_b[s] : r.losses_b[s + 1], r.losses_a[s]) << "step " << s + 1;
  }
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// Runs `script` (under tests/engine/reference) with the Debian python on `arg`; returns the exit
// status and leaves stdout+stderr in `output`.
inline int RunPython(const std::string& script, const std::string& arg, std::string* output) {
  const std::string cmd = std::string(TRAIND_TEST_PYTHON) + " " + TRAIND_TESTS_DIR +
                          "/reference/" + script + " " + arg + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  output->clear();
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) output->append(buf, n);
  return ::pclose(p);
}

// True when the Debian python has torch (the project's scripts install python3-torch).
inline bool HaveTorch() {
  std::string out;
  const std::string cmd = std::string(TRAIND_TEST_PYTHON) + " -c 'import torch' 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return false;
  char buf[256];
  while (std::fread(buf, 1, sizeof(buf), p) > 0) {
  }
  return ::pclose(p) == 0;
}

// max |a - b| / max |b| over a tensor pair of F32 data (0 when both are all zero).
inline double MaxRelDiff(const HostTensor& a, const HostTensor& b) {
  auto fa = a.ToF32();
  auto fb = b.ToF32();
  if (!fa.ok() || !fb.ok() || fa->size() != fb->size()) return 1e30;
  double num = 0, den = 0;
  for (size_t i = 0; i < fa->size(); ++i) {
    num = std::max(num, std::abs(static_cast<double>((*fa)[i]) - (*fb)[i]));
    den = std::max(den, std::abs(static_cast<double>((*fb)[i])));
  }
  return den > 0 ? num / den : num;
}

// MaxRelDiff for a gpt2 weight `name` of width C, with the key third [C, 2C) of attn.c_attn.bias
// left out: its true gradient is exactly zero (softmax is invariant to a bias shared by all keys),
// so its computed gradient is rounding noise, which Adam normalises into steps of about +-lr:
// two implementations, or two device runs whose attention backward accumulates with atomics, move
// it by different O(lr) amounts. Those elements are only checked to stay within `key_bias_bound`
// (steps x lr); every other element is compared.
inline double MaxRelDiffOutsideKeyBias(const std::string& name, const HostTensor& a, const HostTensor& b,
                                       int64_t C, double key_bias_bound) {
  if (name.find("attn.c_attn.bias") == std::string::npos) return MaxRelDiff(a, b);
  auto fa = a.ToF32();
  auto fb = b.ToF32();
  if (!fa.ok() || !fb.ok() || fa->size() != fb->size() || static_cast<int64_t>(fa->size()) != 3 * C) return 1e30;
  double num = 0, den = 0;
  for (size_t i = 0; i < fa->size(); ++i) {
    den = std::max(den, std::abs(double{(*fb)[i]}));
    if (static_cast<int64_t>(i) >= C && static_cast<int64_t>(i) < 2 * C) {
      EXPECT_LE(std::abs((*fa)[i]), key_bias_bound) << name << "[" << i << "]";
    } else {
      num = std::max(num, std::abs(double{(*fa)[i]} - (*fb)[i]));
    }
  }
  return den > 0 ? num / den : num;
}

// trainer_state.json's log_history without the final summary entry (its train_runtime and
// throughput differ between otherwise identical runs).
inline nlohmann::json LogWithoutSummary(const std::string& path) {
  nlohmann::json st = nlohmann::json::parse(ReadFile(path));
  nlohmann::json out = nlohmann::json::array();
  for (auto& e : st["log_history"]) {
    if (!e.contains("train_runtime")) out.push_back(e);
  }
  return out;
}

}  // namespace traind::engine::testing
