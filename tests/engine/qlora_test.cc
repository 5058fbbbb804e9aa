// A frozen LoRA base costs its compute type and no more (issue 43 item 0): with training.peft and
// bf16/fp16 the base's GEMM weights are held only in the compute type, with or without offload, and
// the cpu's packed weight copies are dropped by the planner (before it refuses a job) when they do
// not fit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_kernels.h"
#include "core/half.h"
#include "lora_test_util.h"
#include "model_test_util.h"
#include "models/decoder.h"
#include "models/hf_config.h"
#include "models/quantized_base.h"
#include "optim/optimizer.h"
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
  s.model.config.arch = Arch::kLlama;
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
  c.arch = Arch::kLlama;
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

// A job with a 4-bit base plans (its quantized bytes named); sample_every is refused with it; a
// pre-quantized init_from checkpoint under a spec without a 4-bit base is refused where it is
// planned, naming the key (qlora_prequantized_test loads such checkpoints).
TEST(QuantizationSpec, PlansAndRefusesWhatIsNotBuiltByName) {
  auto s = ParseJobSpec(QSpec("{load_in_4bit: true, bnb_4bit_quant_type: nf4}", ", bf16: true"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto est = EstimateJob(*s, DeviceOptions{});
  ASSERT_TRUE(est.ok()) << est.status().ToString();
  EXPECT_GT(est->quantized_base_bytes, 0);
  EXPECT_GT(est->quantized_base_params, 0);
  auto sample = ParseJobSpec(QSpec("{load_in_4bit: true}", ", sample_every: 5"));
  ASSERT_FALSE(sample.ok());
  EXPECT_NE(sample.status().message().find("training.sample_every"), std::string::npos)
      << sample.status().ToString();

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
  EXPECT_EQ(pre.status().code(), Status::Code::kFailedPrecondition) << pre.status().ToString();
  EXPECT_NE(pre.status().message().find("has quantization_config"), std::string::npos)
      << pre.status().ToString();
  EXPECT_NE(pre.status().message().find("model.quantization_config is null"), std::string::npos)
      << pre.status().ToString();
}

// ---- the 4-bit base in the model (ModelOptions::quant4) ----

using testing::MakeBatch;
using testing::TestModel;
using testing::ToHost;

using testing::kGpt2All;
using testing::kLlamaAll;

struct QCase {
  const char* name;
  ModelConfig config;
  std::vector<std::string> targets;
  Quant4Type type;
  bool double_quant;
};

std::vector<QCase> QCases() {
  return {{"llama nf4", testing::TinyLlama(false), kLlamaAll, Quant4Type::kNF4, false},
          {"llama nf4 double quant", testing::TinyLlama(false), kLlamaAll, Quant4Type::kNF4, true},
          {"llama fp4", testing::TinyLlama(false), kLlamaAll, Quant4Type::kFP4, false},
          {"llama fp4 double quant", testing::TinyLlama(true), {"q_proj", "v_proj"}, Quant4Type::kFP4, true},
          {"gpt2 nf4 double quant", testing::TinyGpt2(), kGpt2All, Quant4Type::kNF4, true},
          {"gpt2 fp4", testing::TinyGpt2(), {"c_attn"}, Quant4Type::kFP4, false}};
}

ModelOptions QOptions(const QCase& c, DType ct, bool quant, bool ckpt = false) {
  ModelOptions o = testing::TinyOptions(3, 16);
  o.compute_type = ct;
  o.lora.r = 4;
  o.lora.alpha = 12.0;
  o.lora.targets = c.targets;
  o.master_weights_off_device = ct != DType::kF32;  // as JobModelOptions sets it for LoRA
  o.gradient_checkpointing = ckpt;
  o.quant4.enabled = quant;
  o.quant4.type = c.type;
  o.quant4.double_quant = c.double_quant;
  return o;
}

// A full-precision base (seeded init at 4x, nonlinear ranges) as an HF file, and the same file
// with every block linear weight replaced by dequantize(quantize(W)) (cpu::Quantize4bitHost, then
// cpu::Dequantize4bit: the backend's scalar code, tested against bitsandbytes' semantics in
// quant4_test).
struct Bases {
  SafetensorsFile full, dequantized;
};
Bases MakeBases(const QCase& c, uint64_t seed) {
  TestModel plain = TestModel::Make(c.config, testing::TinyOptions(3, 16));
  Model& m = *plain.model;
  m.InitRandom(seed);
  plain.backend->Scale(m.param_data(), 4.0f, m.num_params());
  Bases b;
  b.full = m.ExportHf();
  std::vector<float> flat = ToHost(*plain.backend, m.param_data(), m.num_params());
  const ParamTable table = BuildParams(MakeArchDims(c.config));
  for (const QuantizedTensor& t : QuantizedTensors(table)) {
    const cpu::Quant4Host q =
        cpu::Quantize4bitHost(flat.data() + t.offset, DType::kF32, t.numel, c.type, c.double_quant, 1);
    cpu::Dequantize4bit(q.View(), flat.data() + t.offset, DType::kF32, 1);
  }
  plain.backend->CopyHostToDevice(m.param_data(), flat.data(), flat.size() * sizeof(float));
  plain.backend->Synchronize();
  b.dequantized = m.ExportHf();
  return b;
}

// Random B (PEFT starts it at zero, which would make dA zero and the check weak).
void InitAdaptersForCheck(TestModel& t, uint64_t seed) {
  t.model->InitAdapters(seed);
  testing::RandomizeLoraB(t, seed);
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The 4-bit model computes exactly what LoRA computes on the dequantized base: the same loss and
// adapter gradients, bit for bit, in fp32, bf16 and fp16, with and without checkpointing (the
// recomputation dequantizes again); its exported base is that dequantized base; nothing of the
// block weights is held but their 4 bits (the plan's weights shrink by their 16/32-bit bytes).
TEST(QLora, EqualsLoraOnTheDequantizedBase) {
  for (const QCase& qc : QCases()) {
    const Bases bases = MakeBases(qc, 5);
    for (const DType ct : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (const bool ckpt : {false, true}) {
        SCOPED_TRACE(std::string(qc.name) + " " + DTypeName(ct) + (ckpt ? " checkpointing" : ""));
        TestModel q = TestModel::Make(qc.config, QOptions(qc, ct, true, ckpt));
        TestModel l = TestModel::Make(qc.config, QOptions(qc, ct, false, ckpt));
        ASSERT_NE(q.model, nullptr);
        ASSERT_NE(l.model, nullptr);
        ASSERT_TRUE(q.model->LoadHf(bases.full).ok());
        // In 16 bits an untied token table is looked up in the compute type too (no fp32 copy).
        SafetensorsFile lora_base = bases.dequantized;
        const ParamTable tab = BuildParams(MakeArchDims(qc.config));
        if (LookupReads16Bit(tab, QOptions(qc, ct, true))) {
          HostTensor& e = lora_base.tensors.at(tab.infos[static_cast<size_t>(tab.wte)].hf_name);
          std::vector<float> v = *e.ToF32();
          std::vector<uint16_t> h(v.size());
          F32To16Span(ct == DType::kBF16, v.data(), static_cast<int64_t>(v.size()), h.data());
          for (size_t k = 0; k < v.size(); ++k) v[k] = ct == DType::kBF16 ? BF16ToF32(h[k]) : F16ToF32(h[k]);
          e = HostTensor::FromF32(v.data(), e.shape);
        }
        ASSERT_TRUE(l.model->LoadHf(lora_base).ok());
        InitAdaptersForCheck(q, 9);
        InitAdaptersForCheck(l, 9);
        const testing::Batch batch = MakeBatch(3 * 16, qc.config.vocab_size, 77);
        testing::SetBatch(q, batch);
        testing::SetBatch(l, batch);
        double loss[2];
        std::vector<float> grads[2];
        TestModel* models[2] = {&q, &l};
        for (int i = 0; i < 2; ++i) {
          Model& m = *models[i]->model;
          m.ZeroGrad();
          loss[i] = m.Forward(true, 1.0f);
          m.Backward();
          grads[i] = ToHost(*models[i]->backend, m.grad_data(), m.num_trainable());
        }
        EXPECT_EQ(loss[0], loss[1]);
        EXPECT_TRUE(SameBits(grads[0], grads[1]));
        double gsum = 0;
        for (float g : grads[0]) gsum += std::abs(g);
        EXPECT_GT(gsum, 0.0);
        // Plan == measured; the weights category holds 4 bits a block weight, not 16 or 32.
        const MemoryBytes pq = Model::PlanBytes(qc.config, QOptions(qc, ct, true, ckpt));
        const MemoryBytes pl = Model::PlanBytes(qc.config, QOptions(qc, ct, false, ckpt));
        EXPECT_EQ(q.arena->peak_bytes(), pq.total());
        const ParamTable table = BuildParams(MakeArchDims(qc.config));
        const QuantizedBaseBytes qb = QuantizedBasePlan(table, qc.double_quant);
        const int64_t saved = qb.elements * static_cast<int64_t>(DTypeSize(ct)) - qb.quantized +
                              (LookupReads16Bit(table, QOptions(qc, ct, true))
                                   ? 4 * table.infos[static_cast<size_t>(table.wte)].numel
                                   : 0);
        EXPECT_NEAR(static_cast<double>(pl.weights - pq.weights), static_cast<double>(saved), 64.0 * 8)
            << "weights " << pl.weights << " -> " << pq.weights;
        if (ct != DType::kF32 || ckpt) continue;
        // fp32: the export is the dequantized base exactly, and the merged export LoRA's merge
        // on it.
        const SafetensorsFile exported = q.model->ExportHf();
        for (const auto& [name, t] : bases.dequantized.tensors) {
          auto it = exported.tensors.find(name);
          ASSERT_NE(it, exported.tensors.end()) << name;
          EXPECT_TRUE(SameBits(*it->second.ToF32(), *t.ToF32())) << name;
        }
        const SafetensorsFile mq = q.model->ExportMerged(), ml = l.model->ExportMerged();
        ASSERT_EQ(mq.tensors.size(), ml.tensors.size());
        for (const auto& [name, t] : ml.tensors) {
          EXPECT_TRUE(SameBits(*mq.tensors.at(name).ToF32(), *t.ToF32())) << "merged " << name;
        }
      }
    }
  }
}

// The quantized store holds bitsandbytes' bits whatever the path: InitRandom (the init streamed
// in pieces) equals LoadHf of the same init.
TEST(QLora, SeededInitEqualsLoadingTheSameWeights) {
  const QCase qc = QCases()[1];
  TestModel plain = TestModel::Make(qc.config, testing::TinyOptions(3, 16));
  plain.model->InitRandom(3);
  const SafetensorsFile file = plain.model->ExportHf();
  TestModel a = TestModel::Make(qc.config, QOptions(qc, DType::kBF16, true));
  TestModel b = TestModel::Make(qc.config, QOptions(qc, DType::kBF16, true));
  a.model->InitRandom(3);
  ASSERT_TRUE(b.model->LoadHf(file).ok());
  const SafetensorsFile ea = a.model->ExportHf(), eb = b.model->ExportHf();
  ASSERT_EQ(ea.tensors.size(), eb.tensors.size());
  for (const auto& [name, t] : ea.tensors) {
    EXPECT_TRUE(SameBits(*t.ToF32(), *eb.tensors.at(name).ToF32())) << name;
  }
}

// Adapter weights after 3 AdamW steps against PyTorch (tests/engine/reference/qlora_reference.py:
// its own bitsandbytes-semantics quantizer, LoRA written from torch primitives, torch.optim.AdamW,
// float32 like the engine's fp32 compute), NF4 and FP4, double quantization on and off. The
// dequantized bases are equal bit for bit; the adapters within kAdapterTol, norm-wise relative to
// their change over the 3 steps (fp32 products summed in different orders, through Adam's
// normalisation).
constexpr double kAdapterTol = 5e-5;  // measured worst 1.3e-5

TEST(QLora, AdaptersAfterThreeAdamWStepsMatchTorch) {
  if (!testing::PythonTorchAvailable()) GTEST_SKIP() << "no torch for " TRAIND_TEST_PYTHON;
  for (const QCase& qc : QCases()) {
    SCOPED_TRACE(qc.name);
    const Bases bases = MakeBases(qc, 7);
    TestModel t = TestModel::Make(qc.config, QOptions(qc, DType::kF32, true));
    ASSERT_NE(t.model, nullptr);
    Model& m = *t.model;
    ASSERT_TRUE(m.LoadHf(bases.full).ok());
    InitAdaptersForCheck(t, 13);
    testing::TempDir dir;
    ASSERT_TRUE(WriteSafetensors(dir.path + "/model.safetensors", bases.full).ok());
    ASSERT_TRUE(WriteSafetensors(dir.path + "/adapters.safetensors", m.ExportAdapters()).ok());
    const std::vector<float> before = ToHost(*t.backend, m.trainable_data(), m.num_trainable());
    TrainingSpec tr;
    tr.optim = "adamw";
    tr.weight_decay = 0.01;
    const double lr = 2e-3;
    auto opt = MakeOptimizer(tr, m.trainable_params(), m.num_trainable(), t.arena.get());
    ASSERT_TRUE(opt.ok()) << opt.status().ToString();
    nlohmann::json batches = nlohmann::json::array();
    std::vector<double> losses;
    for (int step = 0; step < 3; ++step) {
      const testing::Batch batch = MakeBatch(3 * 16, qc.config.vocab_size, 100 + step);
      batches.push_back({{"ids", batch.ids}, {"targets", batch.targets}});
      testing::SetBatch(t, batch);
      m.ZeroGrad();
      losses.push_back(m.Forward(true, 1.0f));
      m.Backward();
      (*opt)->Step(m.trainable_data(), m.grad_data(), lr, 1.0f);
    }
    const std::vector<float> after = ToHost(*t.backend, m.trainable_data(), m.num_trainable());
    nlohmann::json cfg = nlohmann::json::parse(WriteHfConfigJson(qc.config));
    nlohmann::json c = {{"arch", ArchName(qc.config.arch)}, {"config", cfg}, {"B", 3}, {"T", 16},
                        {"r", 4}, {"alpha", 12.0}, {"target_modules", qc.targets},
                        {"quant_type", Quant4TypeName(qc.type)}, {"double_quant", qc.double_quant},
                        {"lr", lr}, {"betas", {tr.adam_beta1, tr.adam_beta2}}, {"eps", tr.adam_epsilon},
                        {"weight_decay", tr.weight_decay}, {"batches", batches}};
    std::ofstream(dir.path + "/case.json") << c.dump();
    ASSERT_TRUE(testing::RunReference("qlora_reference.py", dir.path));
    // The reference's dequantized base is the engine's, bit for bit.
    auto ref_base = ReadSafetensors(dir.path + "/ref_base.safetensors");
    ASSERT_TRUE(ref_base.ok()) << ref_base.status().ToString();
    const SafetensorsFile ours_base = m.ExportHf();
    for (const auto& [name, want] : ref_base->tensors) {
      auto it = ours_base.tensors.find(name);
      ASSERT_NE(it, ours_base.tensors.end()) << name;
      EXPECT_TRUE(SameBits(*it->second.ToF32(), *want.ToF32())) << name;
    }
    nlohmann::json ref;
    std::ifstream(dir.path + "/ref.json") >> ref;
    for (int step = 0; step < 3; ++step) {
      EXPECT_NEAR(losses[step], ref["losses"][step].get<double>(), 1e-5 * losses[step]) << step;
    }
    auto ref_ad = ReadSafetensors(dir.path + "/ref_adapters.safetensors");
    ASSERT_TRUE(ref_ad.ok());
    double worst = 0;
    for (const ParamInfo& p : m.trainable_params()) {
      auto want = ref_ad->tensors.at(p.hf_name).ToF32();
      ASSERT_TRUE(want.ok());
      std::vector<float> d_ours(p.numel), d_ref(p.numel);
      for (int64_t i = 0; i < p.numel; ++i) {
        d_ours[i] = after[p.offset + i] - before[p.offset + i];
        d_ref[i] = (*want)[i] - before[p.offset + i];
      }
      const double rel = testing::RelErr(d_ours, d_ref);
      worst = std::max(worst, rel);
      EXPECT_LE(rel, kAdapterTol) << p.hf_name;
    }
    std::printf("[%s] losses %.6f %.6f %.6f (torch %.6f %.6f %.6f); adapters' change after 3 AdamW "
                "steps: worst relative error %.2e (tol %.0e)\n",
                qc.name, losses[0], losses[1], losses[2], ref["losses"][0].get<double>(),
                ref["losses"][1].get<double>(), ref["losses"][2].get<double>(), worst, kAdapterTol);
  }
}

// ---- estimates ----

// An 8B llama (hidden 4096, intermediate 14336, 32 layers, 32 heads, 8 kv heads, vocab 128256,
// untied), bf16, r 16 on every projection, seq 2048, batch 1, checkpointing.
JobSpec Llama8bQLora(bool quant) {
  JobSpec s = Llama7bLora();
  s.name = "llama8b-qlora";
  ModelConfig& c = s.model.config;
  c.vocab_size = 128256;
  c.intermediate_size = 14336;
  c.num_key_value_heads = 8;
  c.rope_theta = 500000.0;
  s.training.peft->target_modules = kLlamaAll;
  if (quant) s.model.quantization_config = testing::Nf4DoubleQuantBf16();
  return s;
}

TEST(QLoraEstimate, EightBillionPlansUnderTenGiB) {
  DeviceOptions d;
  d.device = "cpu";
  d.memory_budget_bytes = 24 * kGiB;
  auto q = EstimateJob(Llama8bQLora(true), d);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  auto full = EstimateJob(Llama8bQLora(false), d);
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  std::printf("[8B QLoRA nf4+dq bf16, cpu] total %.2f GiB (weights %.2f, 4-bit base %.2f GiB of %lld "
              "weights); LoRA without quantization: total %.2f GiB, weights %.2f GiB\n",
              static_cast<double>(q->bytes.total()) / kGiB, static_cast<double>(q->bytes.weights) / kGiB,
              static_cast<double>(q->quantized_base_bytes) / kGiB,
              static_cast<long long>(q->quantized_base_params),
              static_cast<double>(full->bytes.total()) / kGiB,
              static_cast<double>(full->bytes.weights) / kGiB);
  EXPECT_LE(q->bytes.total(), 10 * kGiB);
  EXPECT_GE(static_cast<double>(full->bytes.total()), 2.5 * static_cast<double>(q->bytes.weights));
  EXPECT_GE(static_cast<double>(full->bytes.weights), 2.5 * static_cast<double>(q->bytes.weights));
  // The weights: the 4-bit base plus the 16-bit embeddings and lm head (and norms, adapters).
  const int64_t C = 4096, V = 128256;
  EXPECT_GE(q->bytes.weights, q->quantized_base_bytes + 2 * 2 * V * C);
  EXPECT_LE(q->bytes.weights, q->quantized_base_bytes + 2 * 2 * V * C + 256 * (int64_t{1} << 20));
  EXPECT_EQ(q->quantized_base_bytes,
            QuantizedBasePlan(BuildParams(MakeArchDims(Llama8bQLora(true).model.config)), true).quantized);
}

// The advice for a job that does not fit names QLoRA with its bytes.
TEST(QLoraEstimate, AdviceNamesQLoraWithItsBytes) {
  DeviceOptions d;
  d.device = "cpu";
  d.memory_budget_bytes = 12 * kGiB;
  auto est = EstimateJobWithAdvice(Llama8bQLora(false), d);
  ASSERT_TRUE(est.ok()) << est.status().ToString();
  ASSERT_FALSE(est->fits);
  bool named = false;
  for (const PlanLever& l : est->levers) {
    if (l.change.find("(QLoRA)") == std::string::npos) continue;
    named = true;
    EXPECT_TRUE(l.fits) << l.change;
    EXPECT_LT(l.bytes, 12 * kGiB);
  }
  EXPECT_TRUE(named);
  EXPECT_NE(est->reason.find("QLoRA"), std::string::npos) << est->reason;
}

// ---- a QLoRA job ----

// A short fine-tune of a small pretrained llama (hidden 64, 2 layers, full fine-tuning fp32 for
// 80 steps first, so its logits are far from uniform): QLoRA (NF4, double quantization, bf16)
// tracks bf16 LoRA from the same base and batches (final eval loss within kQualityTol), both
// learn, each uses exactly its planned memory; the outputs are PEFT's adapters and, with merge,
// the merged model, the log naming the quantization and what the merge keeps of it.
constexpr double kQualityTol = 0.02;

TEST(QLoraJob, TracksBf16LoraAndWritesPeftOutputs) {
  const std::string dir = testing::MakeTempDir("qlora_job");
  const std::string data = dir + "/tokens.bin";
  testing::WriteSyntheticTokens(data, 3000, 64, 5);
  JobSpec pre = testing::TinySpec(dir + "/pretrain", data);
  pre.model.config = testing::TinyLlamaConfig({64, 128, 2, 4, 2, 64});
  pre.training.max_steps = 80;
  pre.training.warmup_steps = 5;
  pre.training.learning_rate = 1e-2;
  auto base = RunJob(pre, testing::TestRunOptions(), {});
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  std::map<std::string, double> eval;
  std::map<std::string, std::vector<double>> losses;
  std::vector<std::string> notes;
  for (const bool quant : {false, true}) {
    const std::string name = quant ? "qlora" : "lora";
    JobSpec s = testing::TinySpec(dir + "/" + name, data);
    s.model.config = pre.model.config;
    s.model.init_from = pre.output_dir;
    s.training.bf16 = true;
    s.training.max_steps = 40;
    s.training.warmup_steps = 3;
    s.training.learning_rate = 1e-2;
    s.training.peft = testing::LoraPeft(8, 16, kLlamaAll, /*merge=*/quant);
    if (quant) s.model.quantization_config = testing::Nf4DoubleQuantBf16();
    RunCallbacks cb;
    cb.on_step = [&](const StepReport& st) { losses[name].push_back(st.loss); };
    cb.on_message = [&](const std::string& line) { if (quant) notes.push_back(line); };
    auto est = EstimateJob(s, testing::TestRunOptions().device);
    ASSERT_TRUE(est.ok()) << est.status().ToString();
    auto r = RunJob(s, testing::TestRunOptions(), cb);
    ASSERT_TRUE(r.ok()) << name << ": " << r.status().ToString();
    EXPECT_EQ(r->peak_memory_bytes, r->plan.bytes.total()) << name;
    EXPECT_EQ(r->plan.bytes.total(), est->bytes.total()) << name;
    eval[name] = r->eval_loss;
    std::printf("[%s bf16] plan %lld = peak %lld bytes (weights %lld, 4-bit base %lld); loss %.4f -> %.4f, "
                "eval %.4f (base pretrained to %.4f)\n",
                name.c_str(), static_cast<long long>(est->bytes.total()),
                static_cast<long long>(r->peak_memory_bytes), static_cast<long long>(r->plan.bytes.weights),
                static_cast<long long>(r->plan.quantized_base_bytes), losses[name].front(),
                losses[name].back(), r->eval_loss, base->eval_loss);
    EXPECT_LT(losses[name].back(), losses[name].front()) << name << ": the adapters must learn";
    EXPECT_TRUE(std::filesystem::exists(s.output_dir + "/adapter_model.safetensors"));
    EXPECT_TRUE(std::filesystem::exists(s.output_dir + "/adapter_config.json"));
    if (quant) {
      EXPECT_GT(r->plan.quantized_base_bytes, 0);
      auto merged = ReadSafetensors(s.output_dir + "/model.safetensors");
      ASSERT_TRUE(merged.ok()) << merged.status().ToString();
      EXPECT_TRUE(merged->tensors.count("model.layers.0.self_attn.q_proj.weight"));
    }
  }
  const double rel = std::abs(eval["qlora"] - eval["lora"]) / eval["lora"];
  std::printf("[qlora vs lora, bf16] final eval loss %.4f vs %.4f: %.2f%% apart (tol %.0f%%)\n",
              eval["qlora"], eval["lora"], 100 * rel, 100 * kQualityTol);
  EXPECT_LE(rel, kQualityTol);
  bool quantized_note = false, merge_note = false;
  for (const std::string& n : notes) {
    quantized_note |= n.find("quantized at load to nf4 with double quantization") != std::string::npos;
    merge_note |= n.find("the merged model is the 4-bit base dequantized") != std::string::npos;
  }
  EXPECT_TRUE(quantized_note);
  EXPECT_TRUE(merge_note);
}

}  // namespace
}  // namespace traind::engine
