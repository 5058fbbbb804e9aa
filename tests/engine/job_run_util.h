// Helpers of the tests that run whole jobs on chat data and compare runs: the conversations and
// the plain chat template, the chat job spec, a job's step losses and final weights on a device,
// the weight comparison, and the check that accumulation equals the batch it splits.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "trainer_test_util.h"
#include "traind/engine/trainer.h"

namespace traind::engine::testing {

// Each message "<role>content</role>\n"; with add_generation_prompt a final "<assistant>".
inline const std::string kPlainChatTemplate =
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}";

// `n` conversations (a user word, an assistant answer of 1 to 9 words), of unequal lengths, one
// JSON line each.
inline std::string Conversations(int n) {
  std::string out;
  const char* words[] = {"red", "green", "blue", "cat", "dog", "sun", "moon", "tree"};
  for (int i = 0; i < n; ++i) {
    std::string a;
    for (int k = 0; k <= (i * 7) % 9; ++k) a += std::string(k ? " " : "") + words[(i + k) % 8];
    out += std::string(R"({"messages":[{"role":"user","content":")") + words[i % 8] +
           R"("},{"role":"assistant","content":")" + a + "\"}]}\n";
  }
  return out;
}

// Writes Conversations(n) to dir/chat.jsonl and kPlainChatTemplate to dir/t.jinja.
inline void WriteChatFiles(const std::string& dir, int n) {
  WriteFile(dir + "/chat.jsonl", Conversations(n));
  WriteFile(dir + "/t.jinja", kPlainChatTemplate);
}

// TinySpec's gpt2 (vocabulary 256, `seq_len` positions) on the chat data `data` rendered with
// `tmpl`, byte tokens, the loss on the assistant's tokens, in file order, no validation; three
// plain SGD steps (lr 0.1 constant, no clipping, no decay: weights follow gradients linearly),
// logged every step, no evaluation or checkpoint. Output in dir/out/out (TinySpec's).
inline JobSpec ChatJobSpec(const std::string& dir, const std::string& data, const std::string& tmpl,
                           int64_t seq_len) {
  JobSpec spec = TinySpec(dir + "/out", data);
  spec.model.config.vocab_size = 256;
  spec.model.config.n_positions = seq_len;
  spec.data.format = "jsonl";
  spec.data.tokenizer = "byte";
  spec.data.chat_template = tmpl;
  spec.data.assistant_only_loss = true;
  spec.data.seq_len = seq_len;
  spec.data.shuffle = false;
  spec.data.validation_split = 0.0;
  spec.training.optim = "sgd";
  spec.training.learning_rate = 0.1;
  spec.training.max_grad_norm = 0.0;
  spec.training.weight_decay = 0.0;
  spec.training.warmup_steps = 0;
  spec.training.lr_scheduler_type = "constant";
  spec.training.max_steps = 3;
  spec.training.eval_steps = 0;
  spec.training.save_steps = 0;
  spec.training.logging_steps = 1;
  return spec;
}

// A finished job: its step losses, its messages and its final model.safetensors.
struct JobOutcome {
  std::vector<double> losses;
  std::vector<std::string> notes;
  SafetensorsFile weights;
};

// RunJob of `spec` on `device` (one thread; CUDA graphs as `graphs` says) into
// spec.output_dir + "_" + `tag`.
inline JobOutcome RunJobOn(JobSpec spec, const std::string& device, const std::string& tag,
                           bool graphs = true) {
  spec.output_dir += "_" + tag;
  RunOptions o = TestRunOptions(1);
  o.device.device = device;
  o.device.cuda_graphs = graphs;
  JobOutcome out;
  RunCallbacks cb;
  cb.on_step = [&](const StepReport& r) { out.losses.push_back(r.loss); };
  cb.on_message = [&](const std::string& line) { out.notes.push_back(line); };
  auto r = RunJob(spec, o, cb);
  EXPECT_TRUE(r.ok()) << device << ": " << r.status().ToString();
  if (!r.ok()) return out;
  auto w = ReadSafetensors(spec.output_dir + "/model.safetensors");
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  if (w.ok()) out.weights = std::move(w).value();
  return out;
}

// The largest over `want`'s tensors of max|got - want| / max|want| (the tensor's scale; the plain
// difference for an all-zero tensor); infinity when `got` lacks a tensor or one does not read.
inline double WorstScaledWeightDiff(const SafetensorsFile& got, const SafetensorsFile& want) {
  double worst = 0.0;
  for (const auto& [name, t] : want.tensors) {
    auto it = got.tensors.find(name);
    if (it == got.tensors.end()) return INFINITY;
    auto a = it->second.ToF32();
    auto b = t.ToF32();
    if (!a.ok() || !b.ok() || a->size() != b->size()) return INFINITY;
    double diff = 0.0, scale = 0.0;
    for (size_t i = 0; i < b->size(); ++i) {
      diff = std::max(diff, std::abs(double((*a)[i]) - (*b)[i]));
      scale = std::max(scale, std::abs(double((*b)[i])));
    }
    worst = std::max(worst, scale > 0 ? diff / scale : diff);
  }
  return worst;
}

// `spec` (three steps) trained at micro-batch 4 with no accumulation and at 2 with 2 accumulation
// steps (into `dir`/k0 and /k1): the step losses within 1e-6 relative and every final weight
// within 1e-6, since a step's loss is the mean over its loss tokens however the batch is split.
// `tag` starts the printed lines.
inline void ExpectAccumulationMatchesBatch(const JobSpec& spec, const std::string& dir,
                                           const std::string& tag) {
  std::vector<StepReport> steps[2];
  std::string outs[2];
  const int64_t batch[2] = {4, 2}, accum[2] = {1, 2};
  for (int k = 0; k < 2; ++k) {
    JobSpec s = spec;
    s.output_dir = dir + "/k" + std::to_string(k);
    s.training.per_device_train_batch_size = batch[k];
    s.training.gradient_accumulation_steps = accum[k];
    RunCallbacks cb;
    cb.on_step = [&, k](const StepReport& r) { steps[k].push_back(r); };
    auto r = RunJob(s, TestRunOptions(), cb);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    outs[k] = s.output_dir;
  }
  ASSERT_EQ(steps[0].size(), 3u);
  ASSERT_EQ(steps[1].size(), 3u);
  for (size_t s = 0; s < 3; ++s) {
    std::printf("[%s] step %zu: loss B4 %.9f, B2 x 2 %.9f\n", tag.c_str(), s + 1, steps[0][s].loss,
                steps[1][s].loss);
    EXPECT_NEAR(steps[1][s].loss, steps[0][s].loss, 1e-6 * steps[0][s].loss) << "step " << s + 1;
  }
  auto a = ReadSafetensors(outs[0] + "/model.safetensors");
  auto b = ReadSafetensors(outs[1] + "/model.safetensors");
  ASSERT_TRUE(a.ok() && b.ok());
  double worst = 0.0;
  for (const auto& [name, t] : a->tensors) {
    auto x = t.ToF32();
    auto y = b->tensors.at(name).ToF32();
    ASSERT_TRUE(x.ok() && y.ok()) << name;
    for (size_t i = 0; i < x->size(); ++i) worst = std::max(worst, std::abs(double((*x)[i]) - (*y)[i]));
  }
  std::printf("[%s] largest weight difference after 3 steps: %.3g\n", tag.c_str(), worst);
  EXPECT_LE(worst, 1e-6);
}

}  // namespace traind::engine::testing
