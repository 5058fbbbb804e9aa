// A frozen LoRA base costs its compute type and no more (issue 43 item 0): with training.peft and
// bf16/fp16 the base's GEMM weights are held only in the compute type, with or without offload, and
// the cpu's packed weight copies are dropped by the planner (before it refuses a job) when they do
// not fit.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "models/quantized_base.h"
#include "train/planner.h"
#include "trainer_test_util.h"

namespace traind::engine {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// A 7B llama (hidden 4096, intermediate 11008, 32 layers, 32 heads, vocab 32000, untied), bf16,
// LoRA r 16 on q/k/v/o, seq 2048, batch 1, checkpointing, on the cpu device with `budget` bytes.
JobSpec Llama7bLora() {
  JobSpec s;
  s.name = "llama7b-lora";
  s.model.config.arch = "llama";
  s.model.config.vocab_size = 32000;
  s.model.config.hidden_size = 4096;
  s.model.config.intermediate_size = 11008;
  s.model.config.num_hidden_layers = 32;
  s.model.config.num_attention_heads = 32;
  s.model.config.num_key_value_heads = 32;
  s.model.config.max_position_embeddings = 2048;
  s.model.config.tie_word_embeddings = false;
  s.data.train_file = "unused.bin";
  s.data.seq_len = 2048;
  s.output_dir = "unused";
  s.training.bf16 = true;
  s.training.per_device_train_batch_size = 1;
  s.training.gradient_checkpointing = true;
  PeftSpec p;
  p.r = 16;
  p.lora_alpha = 32;
  p.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
  s.training.peft = p;
  return s;
}

// The base's parameters as HF counts them.
int64_t Llama7bParams() {
  const int64_t C = 4096, I = 11008, L = 32, V = 32000;
  return 2 * V * C + L * (4 * C * C + 3 * C * I + 2 * C) + C;
}

TEST(FrozenBase, SevenBillionLoraPlansItsWeightsInBf16) {
  const int64_t base16 = 2 * Llama7bParams();
  DeviceOptions d;
  d.device = "cpu";
  d.memory_budget_bytes = 24 * kGiB;  // the issue's machine
  auto est = EstimateJob(Llama7bLora(), d);
  ASSERT_TRUE(est.ok()) << est.status().ToString();
  std::printf("[7B LoRA bf16, cpu 24 GiB] weights %.2f GiB (base in bf16 %.2f GiB), total %.2f GiB; %s\n",
              static_cast<double>(est->bytes.weights) / kGiB, static_cast<double>(base16) / kGiB,
              static_cast<double>(est->bytes.total()) / kGiB, est->reason.c_str());
  EXPECT_LE(static_cast<double>(est->bytes.weights), 1.1 * static_cast<double>(base16));
  EXPECT_GE(est->bytes.weights, base16);
  // The packed copies did not fit: dropped, and the reason says so.
  EXPECT_FALSE(est->packed_weights);
  EXPECT_NE(est->reason.find("packed weight copies"), std::string::npos) << est->reason;

  // On a device that does not pack, with or without offload: the same weights.
  JobSpec offload = Llama7bLora();
  offload.training.offload = "cpu";
  for (const JobSpec& s : {Llama7bLora(), offload}) {
    const ModelConfig& c = s.model.config;
    const MemoryBytes b = JobBytes(c, JobModelOptions(s, 1, true, /*pack_weights=*/false), s.training);
    EXPECT_LE(static_cast<double>(b.weights), 1.1 * static_cast<double>(base16)) << s.training.offload;
  }
  // Full fine-tuning keeps its fp32 master weights (no LoRA: nothing changes there).
  JobSpec full = Llama7bLora();
  full.training.peft.reset();
  const MemoryBytes fb = JobBytes(full.model.config, JobModelOptions(full, 1, true), full.training);
  EXPECT_GE(fb.weights, 3 * Llama7bParams());
}

// With room for them, the cpu keeps its packed copies (a speed choice, not dropped needlessly).
TEST(FrozenBase, PackedCopiesStayWhenTheyFit) {
  DeviceOptions d;
  d.device = "cpu";
  d.memory_budget_bytes = 200 * kGiB;
  auto est = EstimateJob(Llama7bLora(), d);
  ASSERT_TRUE(est.ok()) << est.status().ToString();
  EXPECT_TRUE(est->packed_weights);
  EXPECT_GT(static_cast<double>(est->bytes.weights), 2.0 * 2 * Llama7bParams());
  EXPECT_EQ(est->reason.find("packed weight copies"), std::string::npos) << est->reason;
}

// The 4-bit base's arithmetic (models/quantized_base.h) for an 8B llama (hidden 4096, intermediate
// 14336, 32 layers, 32 heads, 8 kv heads, vocab 128256): every block linear weight, each tensor
// on its own (bitsandbytes' Linear4bit): codes n/2 bytes, absmax fp32 per 64, or with double
// quant a uint8 per 64, an fp32 per 256*64 and an fp32 offset, plus the nested code table once.
TEST(QuantizedBase, EightBillionLlamaBaseBytes) {
  ModelConfig c;
  c.arch = "llama";
  c.vocab_size = 128256;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_hidden_layers = 32;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.max_position_embeddings = 2048;
  const ParamTable t = BuildParams(MakeArchDims(c));
  const int64_t C = 4096, KV = 1024, I = 14336, L = 32;
  const std::vector<QuantizedTensor> q = QuantizedTensors(t);
  ASSERT_EQ(q.size(), static_cast<size_t>(7 * L));  // q, k, v, o, gate, up, down
  // Hand count: per layer q and o (C*C), k and v (KV*C), gate, up and down (I*C).
  const int64_t per_layer = 2 * C * C + 2 * KV * C + 3 * I * C;
  auto bytes = [](int64_t n, bool dq) {  // one tensor, from the definition (n divides by 64 here)
    const int64_t blocks = n / 64;
    return n / 2 + (dq ? blocks + 4 * ((blocks + 255) / 256) + 4 : 4 * blocks);
  };
  for (const bool dq : {false, true}) {
    const QuantizedBaseBytes b = QuantizedBasePlan(t, dq);
    EXPECT_EQ(b.elements, L * per_layer);
    EXPECT_EQ(b.largest, per_layer);
    const int64_t layer_bytes = 2 * bytes(C * C, dq) + 2 * bytes(KV * C, dq) + 3 * bytes(I * C, dq);
    EXPECT_EQ(b.quantized, L * layer_bytes + (dq ? 1024 : 0)) << dq;
    std::printf("[8B llama 4-bit base%s] %lld weights in %.3f GiB (%.4f bytes a weight; bf16 %.3f GiB)\n",
                dq ? ", double quant" : "", static_cast<long long>(b.elements),
                static_cast<double>(b.quantized) / kGiB,
                static_cast<double>(b.quantized) / static_cast<double>(b.elements),
                2.0 * static_cast<double>(b.elements) / kGiB);
  }
  // Double quantization: 0.5 + 1/64 + 4/16384 bytes a weight, against 0.5 + 4/64.
  EXPECT_LT(QuantizedBasePlan(t, true).quantized, QuantizedBasePlan(t, false).quantized);
  // Embeddings, norms and the lm head are not among them.
  for (const QuantizedTensor& x : q) {
    EXPECT_NE(x.offset, t.wte);
    EXPECT_NE(x.offset, t.lm_head);
  }
}

// model.quantization_config (JOBSPEC.md): HF BitsAndBytesConfig's names, only with training.peft,
// its compute dtype agreeing with training.bf16/fp16 or setting them.
std::string QSpec(const std::string& quant, const std::string& training_extra, bool peft = true) {
  return "model:\n  arch: llama\n  config: {vocab_size: 64, hidden_size: 32, intermediate_size: 64,\n"
         "    num_hidden_layers: 2, num_attention_heads: 4, max_position_embeddings: 64}\n"
         "  quantization_config: " + quant + "\n"
         "data: {train_file: t.bin, seq_len: 16}\n"
         "training: {max_steps: 2" + (peft ? std::string(", peft: {type: lora, r: 4, target_modules: [q_proj, v_proj]}") : std::string()) +
         training_extra + "}\noutput_dir: out\n";
}

TEST(QuantizationSpec, ParsesValidatesAndRoundTrips) {
  auto ok = ParseJobSpec(QSpec("{load_in_4bit: true, bnb_4bit_quant_type: nf4, "
                               "bnb_4bit_use_double_quant: true, bnb_4bit_compute_dtype: bfloat16}", ""));
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  ASSERT_TRUE(ok->model.quantization_config.has_value());
  const QuantizationSpec& q = *ok->model.quantization_config;
  EXPECT_EQ(q.bnb_4bit_quant_type, "nf4");
  EXPECT_TRUE(q.bnb_4bit_use_double_quant);
  EXPECT_TRUE(ok->training.bf16) << "bnb_4bit_compute_dtype bfloat16 sets training.bf16";
  EXPECT_FALSE(ok->training.fp16);
  // The JSON form parses back to the same spec.
  const std::string json = JobSpecToJson(*ok);
  EXPECT_NE(json.find("\"bnb_4bit_quant_type\": \"nf4\""), std::string::npos) << json;
  auto again = ParseJobSpec(json);
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << json;
  ASSERT_TRUE(again->model.quantization_config.has_value());
  EXPECT_EQ(again->model.quantization_config->bnb_4bit_compute_dtype, "bfloat16");
  EXPECT_TRUE(again->model.quantization_config->bnb_4bit_use_double_quant);
  EXPECT_EQ(JobSpecToJson(*again), json);

  // BitsAndBytesConfig's defaults: fp4, no double quant; the compute dtype is the training's.
  auto d = ParseJobSpec(QSpec("{load_in_4bit: true}", ", fp16: true"));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->model.quantization_config->bnb_4bit_quant_type, "fp4");
  EXPECT_FALSE(d->model.quantization_config->bnb_4bit_use_double_quant);
  EXPECT_EQ(d->model.quantization_config->bnb_4bit_compute_dtype, "float16");
  auto f32 = ParseJobSpec(QSpec("{load_in_4bit: true, bnb_4bit_compute_dtype: float32}", ""));
  ASSERT_TRUE(f32.ok()) << f32.status().ToString();
  EXPECT_FALSE(f32->training.bf16 || f32->training.fp16);
  auto none = ParseJobSpec(QSpec("null", ""));
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_FALSE(none->model.quantization_config.has_value());
  EXPECT_EQ(JobSpecToJson(*none).find("quantization_config"), std::string::npos);
}

TEST(QuantizationSpec, BadInputIsOneErrorNamingTheField) {
  struct Case {
    std::string quant, training;
    bool peft;
    std::string expect;
  };
  const Case cases[] = {
      {"{load_in_4bit: true}", "", false, "model.quantization_config: needs training.peft"},
      {"{bnb_4bit_quant_type: nf4}", "", true, "model.quantization_config.load_in_4bit: must be true"},
      {"{load_in_4bit: true, bnb_4bit_quant_type: int4}", "", true,
       "model.quantization_config.bnb_4bit_quant_type: expected one of"},
      {"{load_in_4bit: true, bnb_4bit_compute_dtype: float16}", ", bf16: true", true,
       "model.quantization_config.bnb_4bit_compute_dtype: float16 disagrees with training.bf16"},
      {"{load_in_4bit: true, bnb_4bit_compute_dtype: float32}", ", fp16: true", true,
       "model.quantization_config.bnb_4bit_compute_dtype: float32 disagrees with training.fp16"},
      {"{load_in_8bit: true}", "", true, "model.quantization_config.load_in_8bit"},
      {"{load_in_4bit: true, bnb_4bit_quant_storage: uint8}", "", true,
       "model.quantization_config.bnb_4bit_quant_storage"},
      {"{load_in_4bit: true, quant_method: gptq}", "", true, "model.quantization_config.quant_method"},
      {"{load_in_4bit: true, bnb_4bit_use_double_quant: maybe}", "", true,
       "model.quantization_config.bnb_4bit_use_double_quant"},
  };
  for (const Case& c : cases) {
    auto r = ParseJobSpec(QSpec(c.quant, c.training, c.peft));
    ASSERT_FALSE(r.ok()) << c.quant;
    EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument) << r.status().ToString();
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos) << r.status().ToString();
  }
}

// Until the 4-bit base is built, a job asking for it is refused where it is planned (run and
// estimate alike), and so is a pre-quantized init_from checkpoint, naming the key.
TEST(QuantizationSpec, NotBuiltYetIsRefusedByName) {
  auto s = ParseJobSpec(QSpec("{load_in_4bit: true, bnb_4bit_quant_type: nf4}", ", bf16: true"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto est = EstimateJob(*s, DeviceOptions{});
  ASSERT_FALSE(est.ok());
  EXPECT_EQ(est.status().code(), Status::Code::kUnimplemented);
  EXPECT_NE(est.status().message().find("model.quantization_config"), std::string::npos);

  const std::string dir = testing::MakeTempDir("prequant");
  std::ofstream(dir + "/config.json")
      << R"({"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
             "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 64,
             "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": true,
                                     "bnb_4bit_quant_type": "nf4"}})";
  JobSpec from = *s;
  from.model.quantization_config.reset();
  from.model.init_from = dir;
  auto pre = EstimateJob(from, DeviceOptions{});
  ASSERT_FALSE(pre.ok());
  EXPECT_EQ(pre.status().code(), Status::Code::kUnimplemented) << pre.status().ToString();
  EXPECT_NE(pre.status().message().find("has quantization_config"), std::string::npos)
      << pre.status().ToString();
}

}  // namespace
}  // namespace traind::engine
