// Helpers of the optimizer parity tests: a set of hand-made parameter views over one flat buffer,
// seeded parameters and per-step gradients, the case files of reference/optim_case.py, and the
// relative error measure.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "backend/step_scalars.h"
#include "core/param_info.h"
#include "core/safetensors.h"
#include "data/window_order.h"
#include "models/hf_config.h"
#include "models/layout.h"
#include "models/model.h"
#include "trainer_test_util.h"

namespace traind::engine::testing {

// Views of the given shapes laid out back to back; >= 2-D views decay, vectors do not.
inline std::vector<ParamInfo> MakeParams(const std::vector<std::vector<int64_t>>& shapes,
                                         int64_t* num_params) {
  std::vector<ParamInfo> out;
  int64_t off = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    ParamInfo p;
    p.hf_name = std::to_string(i);
    p.hf_name.insert(p.hf_name.begin(), 'p');  // not "p" + ...: GCC 12's -Wrestrict false positive
    p.shape = p.hf_shape = shapes[i];
    p.numel = 1;
    for (int64_t d : shapes[i]) p.numel *= d;
    p.offset = off;
    p.weight_decay = shapes[i].size() >= 2;
    off += p.numel;
    out.push_back(p);
  }
  *num_params = off;
  return out;
}

// n values ~ scale * N(0, 1) (+ offset), seeded.
inline std::vector<float> RandomVector(int64_t n, uint32_t seed, float scale, float offset = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = offset + scale * d(rng);
  return v;
}

inline void WriteFloats(const std::string& path, const std::vector<float>& v) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
}

inline std::vector<float> ReadFloats(const std::string& path) {
  const std::string s = ReadFile(path);
  std::vector<float> v(s.size() / 4);
  std::memcpy(v.data(), s.data(), v.size() * 4);
  return v;
}

// The number of elements of the tensor HF has (the product of hf_shape): a padded vocabulary
// table's first V rows; the view's elements past it are padding.
inline int64_t HfNumel(const ParamInfo& p) {
  int64_t n = 1;
  for (int64_t d : p.hf_shape) n *= d;
  return n;
}

// The parameter table of a tiny model of `arch` ("gpt2", "llama" with an untied lm_head, "bert"
// with the masked_lm head) whose vocabulary, 61, is not a multiple of 64: wte (and lm_head,
// bert's MLM decoder bias) laid out with 64 rows where HF has 61. `transposed` (one per view):
// the views that are HF's tensor transposed (gpt2's Conv1D weights).
inline std::vector<ParamInfo> PaddedVocabParams(const std::string& arch, int64_t* num_params,
                                                std::vector<bool>* transposed) {
  ModelConfig c;
  c.arch = ParseArch(arch).value();
  c.vocab_size = 61;
  if (c.arch == Arch::kGpt2) {
    c.n_positions = 16;
    c.n_embd = 32;
    c.n_layer = 1;
    c.n_head = 4;
  } else {
    c.hidden_size = 32;
    c.intermediate_size = 48;
    c.num_hidden_layers = 1;
    c.num_attention_heads = 4;
    c.num_key_value_heads = c.arch == Arch::kLlama ? 2 : 4;
    c.max_position_embeddings = 16;
    c.tie_word_embeddings = false;
    if (c.arch == Arch::kBert) c.head = "masked_lm";
  }
  const ParamTable table = BuildParams(MakeArchDims(c));
  *num_params = table.total;
  transposed->clear();
  for (const ParamExtra& e : table.extras) transposed->push_back(e.transposed);
  return table.infos;
}

// `v` with every view's padding (the elements past HfNumel) set to 0, as a model keeps its
// padded vocabulary rows (weights and gradients).
inline std::vector<float> ZeroPadding(std::vector<float> v, const std::vector<ParamInfo>& params) {
  for (const ParamInfo& p : params) {
    if (HfNumel(p) >= p.numel) continue;
    std::fill(v.begin() + p.offset + HfNumel(p), v.begin() + p.offset + p.numel, 0.0f);
  }
  return v;
}

// Writes case.json / init.bin / grads.bin (optim_case.py) for `configs`. Each parameter's
// hf_shape goes with it (the reference runs on HF's tensor: a padded view's first HfNumel
// elements), and `transposed` (empty, or one per view) marks the views that are HF's transpose.
inline void WriteOptimCase(const std::string& dir, const std::vector<ParamInfo>& params,
                           int64_t num_params, const std::vector<float>& init,
                           const std::vector<std::vector<float>>& grads,
                           const std::vector<double>& lrs, const std::vector<float>& grad_scales,
                           const nlohmann::json& configs,
                           const std::vector<bool>& transposed = {}) {
  nlohmann::json c;
  c["num_params"] = num_params;
  c["steps"] = grads.size();
  c["lrs"] = lrs;
  c["grad_scales"] = grad_scales;
  c["configs"] = configs;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params[i];
    c["params"].push_back({{"name", p.hf_name},
                           {"shape", p.shape},
                           {"hf_shape", p.hf_shape},
                           {"transposed", !transposed.empty() && transposed[i]},
                           {"offset", p.offset},
                           {"numel", p.numel},
                           {"decay", p.weight_decay}});
  }
  WriteFile(dir + "/case.json", c.dump());
  WriteFloats(dir + "/init.bin", init);
  std::vector<float> all;
  for (const auto& g : grads) all.insert(all.end(), g.begin(), g.end());
  WriteFloats(dir + "/grads.bin", all);
}

// max |a - b| / max |b| over each parameter view (the trainer tests' MaxRelDiff measure: relative
// to the tensor's scale, so elements that cancel to ~0 are not judged against their own size),
// and the worst view.
inline double MaxRelError(const std::vector<float>& a, const std::vector<float>& b,
                          const std::vector<ParamInfo>& params) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0.0;
  for (const ParamInfo& p : params) {
    double diff = 0.0, scale = 0.0;
    for (int64_t i = p.offset; i < p.offset + p.numel; ++i) {
      diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
      scale = std::max(scale, std::abs(static_cast<double>(b[i])));
    }
    worst = std::max(worst, scale > 0.0 ? diff / scale : diff);
  }
  return worst;
}

// A trainer run and its torch reference, from the same initial weights (TrainAgainstTorch).
struct TorchParityRun {
  RunSummary run;
  nlohmann::json ref;                // reference/train_reference.py's ref.json
  std::vector<nlohmann::json> logs;  // our log_history's training entries (logging_steps 1)
  std::string init;                  // the init_from folder both sides started from
};

// The trainer against reference/train_reference.py (torch's optimizer + clip_grad_norm_ +
// LambdaLR on the torch-primitive model): `spec`'s model (micro-batch 4, T 16) seeded with 11,
// `tweak` (may be null) applied to its weights, exported as dir/init for model.init_from; RunJob
// on `spec` (uint16 tokens in `data`, `n_tokens` of them; 1 thread); the reference on the same
// case, with weight decay 0.1, AdamW's betas (0.9, 0.999) and eps 1e-8, the spec's steps, learning
// rate, warmup (cosine) and max_grad_norm, and `extra` fields merged in.
inline void TrainAgainstTorch(JobSpec* spec, const std::string& dir, const std::string& data,
                              int64_t n_tokens, const nlohmann::json& extra,
                              const std::function<void(Model&)>& tweak, TorchParityRun* out) {
  out->init = dir + "/init";
  std::filesystem::create_directories(out->init);
  {
    std::unique_ptr<Backend> backend = MakeCpuBackend(1);
    DeviceArena arena(backend.get(), 0);
    ModelOptions mo;
    mo.micro_batch = 4;
    mo.seq_len = 16;
    auto model = Model::Create(spec->model.config, mo, &arena);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    (*model)->InitRandom(11);
    if (tweak) tweak(**model);
    ASSERT_TRUE(WriteSafetensors(out->init + "/model.safetensors", (*model)->ExportHf()).ok());
    WriteFile(out->init + "/config.json", WriteHfConfigJson(spec->model.config));
  }
  spec->model.init_from = out->init;
  auto run = RunJob(*spec, TestRunOptions(), {});
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  out->run = *run;

  const TrainingSpec& t = spec->training;
  nlohmann::json c = {{"arch", ArchName(spec->model.config.arch)},
                      {"config", nlohmann::json::parse(WriteHfConfigJson(spec->model.config))},
                      {"data_file", data}, {"format", "uint16"},
                      {"train_tokens", TrainTokenCount(n_tokens, spec->data.validation_split)},
                      {"seq_len", 16}, {"micro_batch", 4}, {"accum", 1}, {"steps", t.max_steps},
                      {"lr", t.learning_rate}, {"schedule", "cosine"}, {"warmup", t.warmup_steps},
                      {"weight_decay", 0.1}, {"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8},
                      {"max_grad_norm", t.max_grad_norm}, {"threads", 1}, {"eval", true}};
  c.update(extra);
  WriteFile(dir + "/case.json", c.dump());
  std::filesystem::copy_file(out->init + "/model.safetensors", dir + "/init.safetensors");
  std::string output;
  ASSERT_EQ(RunPython("train_reference.py", dir, &output), 0) << output;
  out->ref = nlohmann::json::parse(ReadFile(dir + "/ref.json"));
  nlohmann::json st = nlohmann::json::parse(ReadFile(spec->output_dir + "/trainer_state.json"));
  for (auto& e : st["log_history"]) {
    if (e.contains("loss")) out->logs.push_back(e);
  }
}

// Per-step loss and grad norm (before clipping) within 1e-5 relative, the learning rate within
// 1e-12 (when `check_lr`), and the eval loss within 1e-5 relative, of `r` against its reference.
inline void ExpectStepsMatchTorch(const TorchParityRun& r, int steps, bool check_lr) {
  ASSERT_EQ(r.logs.size(), static_cast<size_t>(steps));
  for (int s = 0; s < steps; ++s) {
    const double loss = r.ref["losses"][s], norm = r.ref["grad_norms"][s], lr = r.ref["lrs"][s];
    EXPECT_NEAR(r.logs[s]["loss"].get<double>(), loss, 1e-5 * std::abs(loss)) << "step " << s;
    EXPECT_NEAR(r.logs[s]["grad_norm"].get<double>(), norm, 1e-5 * norm) << "step " << s;
    if (check_lr) {
      EXPECT_NEAR(r.logs[s]["learning_rate"].get<double>(), lr, 1e-12) << "step " << s;
    }
  }
  const double eval = r.ref["eval_loss"].get<double>();
  EXPECT_NEAR(r.run.eval_loss, eval, 1e-5 * eval);
}

// `steps` optimizer steps of the trainer (training.optim `optim` with `args`) on a tiny gpt2 whose
// vocabulary, 61, is padded to 64 rows, with weight decay 0.1, warmup + cosine (lr 2e-3) and
// max_grad_norm 0.05 (every step clipped), against reference/train_reference.py (torch AdamW, or
// HF's Adafactor in torch, + clip_grad_norm_ + LambdaLR) on HF's 61-row tensors from the same
// initial weights: per-step loss, grad norm and (without a relative step) learning rate, the
// eval loss and every final weight within 1e-5 relative.
inline void ExpectTrainerStepsMatchTorch(const std::string& optim, const OptimArgs& args,
                                         int steps) {
  const std::string dir = MakeTempDir("trainer_parity_" + optim);
  const std::string data = dir + "/tokens.bin";
  const int64_t n_tokens = 4000;
  // A vocabulary of 61: wte laid out with 64 rows, 3 of them padding that neither the global
  // gradient norm nor weight decay may see (HF's wte has 61 rows).
  WriteSyntheticTokens(data, n_tokens, 61, 3);
  JobSpec spec = TinySpec(dir, data);
  spec.model.config.vocab_size = 61;
  spec.data.shuffle = false;
  spec.training.optim = optim;
  spec.training.optim_args = args;
  spec.training.max_steps = steps;
  spec.training.warmup_steps = 1;
  spec.training.learning_rate = 2e-3;
  spec.training.max_grad_norm = 0.05;  // below the gradient norm: every step is clipped
  spec.training.logging_steps = 1;

  // Initial weights: ours, exported under HF names, used by both sides through init_from; the
  // reference's optimizer as ours.
  const nlohmann::json extra = {
      {"optim", optim},
      {"adafactor", {{"relative_step", args.relative_step},
                     {"scale_parameter", args.scale_parameter},
                     {"warmup_init", args.warmup_init},
                     {"beta1", args.beta1 ? nlohmann::json(*args.beta1) : nlohmann::json()},
                     {"clip_threshold", args.clip_threshold},
                     {"decay_rate", args.decay_rate},
                     {"eps1", 1e-30},
                     {"eps2", 1e-3}}}};
  TorchParityRun r;
  TrainAgainstTorch(&spec, dir, data, n_tokens, extra, nullptr, &r);
  if (::testing::Test::HasFatalFailure()) return;
  // A relative step is Adafactor's own, not the schedule's.
  ExpectStepsMatchTorch(r, steps, /*check_lr=*/!args.relative_step);
  for (int s = 0; s < steps; ++s) {
    EXPECT_GT(r.ref["grad_norms"][s].get<double>(), 0.05) << "the test must clip";
  }
  const std::string& init = r.init;

  auto ours = ReadSafetensors(spec.output_dir + "/model.safetensors");
  auto theirs = ReadSafetensors(dir + "/ref_final.safetensors");
  auto start = ReadSafetensors(init + "/model.safetensors");
  ASSERT_TRUE(ours.ok() && theirs.ok() && start.ok());
  ASSERT_EQ(ours->tensors.size(), theirs->tensors.size());
  for (const auto& [name, t] : theirs->tensors) {
    ASSERT_TRUE(ours->tensors.count(name)) << name;
    if (name.find("attn.c_attn.bias") != std::string::npos) {
      // The key third of c_attn.bias has an exactly-zero true gradient (softmax ignores a shift
      // shared by all keys), so both sides see only rounding noise there, which Adam's
      // m / sqrt(v) turns into steps of up to lr in either direction. Compare the query and
      // value thirds strictly, the key third only against that bound. Adafactor's first update
      // of a vector is g / |g| elementwise (beta2t = 0 at step 1): the query third's tiny
      // gradients (keys nearly alike at init) move as noise too (0.8% of the tensor's scale
      // apart, with or without a padded vocabulary), so there the whole tensor gets the bound.
      const int64_t C = spec.model.config.n_embd;
      auto a = ours->tensors[name].ToF32().value(), b = t.ToF32().value();
      double num = 0, den = 0, key_diff = 0;
      for (int64_t i = 0; i < 3 * C; ++i) {
        const double d = std::abs(static_cast<double>(a[i]) - b[i]);
        if (i >= C && i < 2 * C) {
          key_diff = std::max(key_diff, d);
        } else {
          num = std::max(num, d);
          den = std::max(den, std::abs(static_cast<double>(b[i])));
        }
      }
      if (optim == "adafactor") {
        EXPECT_LE(num, 3 * spec.training.learning_rate) << name << " (query and value thirds)";
      } else {
        EXPECT_LE(num / den, 1e-5) << name << " (query and value thirds)";
      }
      EXPECT_LE(key_diff, 3 * spec.training.learning_rate) << name << " (key third)";
      continue;
    }
    const double rel = MaxRelDiff(ours->tensors[name], t);
    EXPECT_LE(rel, 1e-5) << name;
    // The weights moved (so the comparison is not of untouched initial values).
    EXPECT_GT(MaxRelDiff(start->tensors[name], t), 1e-4) << name;
  }
}

// The StepRunner's device-scalar protocol (FillNextStep / IssueStep / CountStep) against Step:
// two optimizers `a` and `b` of one kind on the CPU backend (device memory is host memory) take 3
// steps with the same gradients, `a` through Step with the multiplier the runner would compute,
// `b` from StepScalars: parameters equal after every step, and an overflowed fp16 step (grad_sq
// infinite, skip_nonfinite) changes nothing.
template <class Optimizer>
void ExpectIssueStepMatchesStep(Optimizer* a, Optimizer* b, int64_t n) {
  std::vector<float> pa = RandomVector(n, 5, 1.0f), pb = pa;
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> g = RandomVector(n, 6 + step, 50.0f);
    StepScalars s;
    s.lr = 0.01f;
    s.loss_scale = 8.0f;
    s.max_grad_norm = 1.0f;
    s.skip_nonfinite = 1;
    for (float x : g) s.grad_sq += double{x} * x;
    b->FillNextStep(&s);
    a->Step(pa.data(), g.data(), s.lr, StepGradMultiplier(s.grad_sq, s.loss_scale, s.max_grad_norm));
    b->IssueStep(pb.data(), g.data(), &s);
    b->CountStep();
    EXPECT_EQ(pa, pb) << "step " << step;
    s.grad_sq = INFINITY;  // an overflowed step: no change
    b->IssueStep(pb.data(), g.data(), &s);
    EXPECT_EQ(pa, pb) << "step " << step;
  }
}

}  // namespace traind::engine::testing
