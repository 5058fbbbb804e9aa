// Helpers for the model tests: tiny gpt2/llama configs, a model on the CPU backend with its arena,
// seeded batches, gradients in HF layout, temp dirs and the PyTorch reference runner.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/arena.h"
#include "backend/cpu/cpu_kernels.h"
#include "models/model.h"
#include "core/safetensors.h"

namespace traind::engine::testing {

inline ModelConfig TinyGpt2() {
  ModelConfig c;
  c.arch = Arch::kGpt2;
  c.vocab_size = 67;  // not a multiple of 64: exercises the padded vocabulary
  c.n_positions = 24;
  c.n_embd = 32;
  c.n_layer = 2;
  c.n_head = 4;
  return c;
}

inline ModelConfig TinyLlama(bool tied) {
  ModelConfig c;
  c.arch = Arch::kLlama;
  c.vocab_size = 67;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;  // GQA
  c.max_position_embeddings = 32;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = tied;
  return c;
}

// The llama-like families and llama's variants, at TinyLlama's size (HS 8): qwen2 (q/k/v
// biases, tied), mistral (sliding window 5 < T), llama with Llama 3.1's rope_scaling (an
// original context of 64 puts HS 8's four frequencies in every regime: kept, smoothed, divided),
// llama with an explicit head_dim (16: NH*HS = 64 != hidden_size), attention_bias and linear
// rope_scaling; qwen3 (per-head q/k norms, head_dim 12) and gemma (scaled embeddings, 1 + w norms,
// GeGLU, multi-query with head_dim 16).
inline ModelConfig TinyFamily(const std::string& variant) {
  ModelConfig c = TinyLlama(/*tied=*/false);
  if (variant == "qwen2") {
    c.arch = Arch::kQwen2;
    c.tie_word_embeddings = true;
  } else if (variant == "mistral") {
    c.arch = Arch::kMistral;
    c.sliding_window = 5;
  } else if (variant == "llama3_rope") {
    c.rope_scaling.rope_type = "llama3";
    c.rope_scaling.factor = 8.0;
    c.rope_scaling.low_freq_factor = 1.0;
    c.rope_scaling.high_freq_factor = 4.0;
    c.rope_scaling.original_max_position_embeddings = 64;
    c.rope_theta = 500000.0;
  } else if (variant == "qwen3") {
    // Qwen3: q_norm / k_norm over each head before RoPE; head_dim 12 (NH*HS = 48 != 32) and
    // untied as Qwen3-8B.
    c.arch = Arch::kQwen3;
    c.head_dim = 12;
  } else if (variant == "gemma") {
    // Gemma: embeddings times sqrt(32), RMSNorm as x * (1 + w), GeGLU, tied; multi-query
    // attention and head_dim 16 as gemma-2b (one kv head, NH*HS = 64 != 32).
    c.arch = Arch::kGemma;
    c.num_key_value_heads = 1;
    c.head_dim = 16;
    c.tie_word_embeddings = true;
  } else if (variant == "llama_head_dim") {
    c.head_dim = 16;
    c.attention_bias = true;
    c.rope_scaling.rope_type = "linear";
    c.rope_scaling.factor = 2.0;
  }
  return c;
}

// The small gpt2 of the benches (6 layers, d384, 6 heads, vocab 50304 = GPT-2's padded, T256).
inline ModelConfig SmallGpt2() {
  ModelConfig c;
  c.arch = Arch::kGpt2;
  c.vocab_size = 50304;
  c.n_positions = 256;
  c.n_embd = 384;
  c.n_layer = 6;
  c.n_head = 6;
  return c;
}

inline ModelOptions TinyOptions(int64_t B = 3, int64_t T = 16) {
  ModelOptions o;
  o.micro_batch = B;
  o.seq_len = T;
  return o;
}

// A model with its own CPU backend and unbudgeted arena.
struct TestModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeviceArena> arena;
  std::unique_ptr<Model> model;

  static TestModel Make(const ModelConfig& c, const ModelOptions& o, int threads = 2) {
    TestModel t;
    t.backend = MakeCpuBackend(threads);
    t.arena = std::make_unique<DeviceArena>(t.backend.get(), 0);
    auto m = Model::Create(c, o, t.arena.get());
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (m.ok()) t.model = std::move(m).value();
    return t;
  }
};

struct Batch {
  std::vector<int32_t> ids, targets;
};

// Seeded tokens in [0, V); every `ignore_every`-th target is -1 (ignored) when > 0.
inline Batch MakeBatch(int64_t N, int64_t V, uint32_t seed, int ignore_every = 7) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(V - 1));
  Batch b;
  for (int64_t i = 0; i < N; ++i) {
    b.ids.push_back(tok(rng));
    b.targets.push_back(ignore_every > 0 && i % ignore_every == 3 ? -1 : tok(rng));
  }
  return b;
}

inline void SetBatch(TestModel& t, const Batch& b) {
  t.backend->CopyHostToDevice(t.model->inputs(), b.ids.data(), b.ids.size() * sizeof(int32_t));
  t.backend->CopyHostToDevice(t.model->targets(), b.targets.data(),
                              b.targets.size() * sizeof(int32_t));
}

inline std::vector<float> ToHost(Backend& be, const float* p, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  be.CopyDeviceToHost(v.data(), p, v.size() * sizeof(float));
  be.Synchronize();
  return v;
}

// The gradients under HF names and layouts: runs ExportHf on the gradient buffer.
inline SafetensorsFile GradsAsHf(TestModel& t) {
  Model& m = *t.model;
  const size_t bytes = static_cast<size_t>(m.num_params()) * sizeof(float);
  std::vector<float> saved = ToHost(*t.backend, m.param_data(), m.num_params());
  t.backend->CopyDeviceToDevice(m.param_data(), m.grad_data(), bytes);
  SafetensorsFile g = m.ExportHf();
  t.backend->CopyHostToDevice(m.param_data(), saved.data(), bytes);
  t.backend->Synchronize();
  return g;
}

// One fresh directory under $TMPDIR (or /tmp), removed with the object.
struct TempDir {
  std::string path;
  TempDir() {
    const char* base = getenv("TMPDIR");
    std::string tmpl = std::string(base ? base : "/tmp") + "/traind_model_test_XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    char* p = mkdtemp(buf.data());
    path = p ? std::string(p) : std::string();
  }
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
};

inline bool PythonTorchAvailable() {
  static const bool ok = std::system(TRAIND_TEST_PYTHON " -c 'import torch' > /dev/null 2>&1") == 0;
  return ok;
}

// Runs tests/engine/reference/<script> on `dir`; true on exit status 0.
inline bool RunReference(const std::string& script, const std::string& dir) {
  const std::string cmd =
      std::string(TRAIND_TEST_PYTHON) + " " + TRAIND_TESTS_DIR + "/reference/" + script + " " + dir;
  return std::system(cmd.c_str()) == 0;
}

// ||a - b|| / ||b|| (||b|| = 0: returns ||a||).
inline double RelErr(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// For its lifetime, bf16 GEMMs on the CPU take oneDNN's bf16 matmul (native = true: its
// emulation on an AVX-512 CPU without bf16 arithmetic, slow, the same products) or widen to fp32
// (false), whatever this CPU has (cpu::Bf16GemmNative); then the setting before it again. The
// packing tests take oneDNN's, so that they run its packed layouts on every AVX-512 CPU.
class ScopedBf16GemmNative {
 public:
  explicit ScopedBf16GemmNative(bool native) : before_(cpu::SetBf16GemmNativeForTesting(native)) {}
  ~ScopedBf16GemmNative() { cpu::SetBf16GemmNativeForTesting(before_); }
  ScopedBf16GemmNative(const ScopedBf16GemmNative&) = delete;
  ScopedBf16GemmNative& operator=(const ScopedBf16GemmNative&) = delete;

 private:
  int before_;
};

}  // namespace traind::engine::testing
