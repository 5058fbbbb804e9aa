// QLoRA from checkpoints saved pre-quantized by bitsandbytes (transformers' save_pretrained of a
// 4-bit model), the merged export in the compute dtype, and the streamed init_from load.
// The bitsandbytes folders come from an independent writer, reference/bnb_checkpoint.py (the
// serialization written from bitsandbytes' QuantState.as_dict(packed=True) and Linear4bit's state
// dict, the codes from quant4_reference.py's numpy model of its kernels), never from traind's
// quantizer.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <nlohmann/json.hpp>
#include <regex>

#include "model_test_util.h"
#include "models/decoder.h"
#include "models/hf_config.h"
#include "train/quantization_spec.h"
#include "trainer_test_util.h"

namespace traind::engine {
namespace {

using ::testing::HasSubstr;
using testing::TestModel;

const std::vector<std::string> kLlamaAll = {"q_proj", "k_proj",    "v_proj",   "o_proj",
                                            "gate_proj", "up_proj", "down_proj"};

// A full-precision HF folder of `config` (seeded init at 4x), `dtype` F32 or BF16 tensors.
std::string WriteFullFolder(const ModelConfig& config, uint64_t seed, const std::string& dtype = "F32") {
  const std::string dir = testing::MakeTempDir("bnb_full");
  TestModel t = TestModel::Make(config, testing::TinyOptions(3, 16));
  t.model->InitRandom(seed);
  t.backend->Scale(t.model->param_data(), 4.0f, t.model->num_params());
  SafetensorsFile f = t.model->ExportHf();
  if (dtype != "F32") {
    for (auto& [name, tensor] : f.tensors) tensor = *CastTensor(tensor, dtype);
  }
  EXPECT_TRUE(WriteSafetensors(dir + "/model.safetensors", f).ok());
  testing::WriteFile(dir + "/config.json", WriteHfConfigJson(config));
  return dir;
}

// The bitsandbytes folder of `full` written by the independent writer.
std::string WriteBnbFolder(const std::string& full, const std::string& qtype, bool dq,
                           const std::string& compute = "bfloat16") {
  const std::string dir = testing::MakeTempDir("bnb_4bit");
  std::string out;
  const int rc = testing::RunPython("bnb_checkpoint.py",
                                    "write " + full + " " + dir + " " + qtype + " " + (dq ? "1" : "0") + " " + compute,
                                    &out);
  EXPECT_EQ(rc, 0) << out;
  return dir;
}

ModelOptions QOptions(DType ct, Quant4Type type, bool dq, const std::vector<std::string>& targets) {
  ModelOptions o = testing::TinyOptions(3, 16);
  o.compute_type = ct;
  o.lora.r = 4;
  o.lora.alpha = 8.0;
  o.lora.targets = targets;
  o.master_weights_off_device = ct != DType::kF32;
  o.quant4.enabled = true;
  o.quant4.type = type;
  o.quant4.double_quant = dq;
  return o;
}

DecoderModel& Decoder(TestModel& t) { return *dynamic_cast<DecoderModel*>(t.model.get()); }

struct PreCase {
  const char* name;
  ModelConfig config;
  std::vector<std::string> targets;
  Quant4Type type;
  bool dq;
  DType compute;
  const char* file_dtype;
};

// The state a pre-quantized folder loads into is the state quantize-at-load makes of the same
// full-precision weights: the 4-bit store byte for byte (codes, absmax or absmax codes, nested
// absmax, offsets), and every exported tensor (the non-quantized ones loaded as usual). The
// writer's double-quantization offset is the exactly summed mean (as traind's); a checkpoint
// bitsandbytes wrote carries torch's fp32 mean, which loads as stored.
TEST(QLoraPrequantized, LoadsTheStateQuantizeAtLoadHolds) {
  if (!testing::HaveTorch()) GTEST_SKIP() << "no torch for the reference writer";
  const std::vector<PreCase> cases = {
      {"llama nf4", testing::TinyLlama(false), kLlamaAll, Quant4Type::kNF4, false, DType::kF32, "F32"},
      {"llama nf4 double quant bf16", testing::TinyLlama(false), kLlamaAll, Quant4Type::kNF4, true, DType::kBF16, "BF16"},
      {"llama fp4", testing::TinyLlama(true), {"q_proj", "v_proj"}, Quant4Type::kFP4, false, DType::kBF16, "F32"},
      {"llama fp4 double quant", testing::TinyLlama(false), kLlamaAll, Quant4Type::kFP4, true, DType::kF32, "F32"},
      {"gpt2 nf4 double quant", testing::TinyGpt2(), {"c_attn", "c_proj", "c_fc"}, Quant4Type::kNF4, true, DType::kF32, "F32"},
  };
  for (const PreCase& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string full = WriteFullFolder(c.config, 11, c.file_dtype);
    const std::string bnb = WriteBnbFolder(full, Quant4TypeName(c.type), c.dq);
    const ModelOptions o = QOptions(c.compute, c.type, c.dq, c.targets);
    TestModel at_load = TestModel::Make(c.config, o);
    TestModel pre = TestModel::Make(c.config, o);
    auto file = ReadHfWeights(full);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    ASSERT_TRUE(at_load.model->LoadHf(*file).ok());
    auto reader = HfWeightsReader::Open(bnb);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    const Status st = pre.model->LoadHfFrom(*reader);
    ASSERT_TRUE(st.ok()) << st.ToString();
    // The same folder read whole first (ReadHfWeights, as a resume's merge base is) loads the same.
    TestModel in_memory = TestModel::Make(c.config, o);
    auto whole = ReadHfWeights(bnb);
    ASSERT_TRUE(whole.ok()) << whole.status().ToString();
    ASSERT_TRUE(in_memory.model->LoadHf(*whole).ok());
    const std::vector<uint8_t> a = Decoder(at_load).Quant4StoreBytes(), b = Decoder(pre).Quant4StoreBytes();
    ASSERT_FALSE(a.empty());
    EXPECT_EQ(a.size(), b.size());
    EXPECT_TRUE(a == b) << "the 4-bit stores differ";
    EXPECT_TRUE(a == Decoder(in_memory).Quant4StoreBytes()) << "read whole first";
    const SafetensorsFile ea = at_load.model->ExportHf(), eb = pre.model->ExportHf();
    ASSERT_EQ(ea.tensors.size(), eb.tensors.size());
    for (const auto& [name, t] : ea.tensors) EXPECT_EQ(t.data, eb.tensors.at(name).data) << name;
  }
}

// A 3-step LoRA job (every llama target, r and alpha as given) from `init_from`, writing to `out`.
JobSpec ThreeStepLora(const std::string& out, const std::string& data, const ModelConfig& config,
                      const std::string& init_from, int64_t r, double alpha, double lr) {
  JobSpec s = testing::TinySpec(out, data);
  s.model.config = config;
  s.model.init_from = init_from;
  s.training.max_steps = 3;
  s.training.warmup_steps = 0;
  s.training.learning_rate = lr;
  PeftSpec p;
  p.r = r;
  p.lora_alpha = alpha;
  p.target_modules = kLlamaAll;
  s.training.peft = p;
  return s;
}

// Adapters after 3 AdamW steps of a QLoRA job from the pre-quantized folder equal, bit for bit,
// the same job from the full-precision folder (the same 4-bit state, so the same steps); the
// pre-quantized job takes its quantization from the folder's config.json.
TEST(QLoraPrequantized, ThreeAdamWStepsEqualTheFullPrecisionJob) {
  if (!testing::HaveTorch()) GTEST_SKIP() << "no torch for the reference writer";
  const std::string dir = testing::MakeTempDir("bnb_job");
  const std::string data = dir + "/tokens.bin";
  testing::WriteSyntheticTokens(data, 3000, 64, 5);
  const ModelConfig config = testing::TinyLlamaConfig({64, 128, 2, 4, 2, 64});
  for (const bool bf16 : {true, false}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    const std::string full = WriteFullFolder(config, 5);
    const std::string bnb = WriteBnbFolder(full, "nf4", true, bf16 ? "bfloat16" : "float32");
    std::map<std::string, std::vector<double>> losses;
    std::map<std::string, SafetensorsFile> adapters;
    std::vector<std::string> notes;
    for (const bool prequantized : {false, true}) {
      const std::string name = prequantized ? "prequantized" : "full";
      JobSpec s = ThreeStepLora(dir + "/" + name + (bf16 ? "16" : "32"), data, config,
                                prequantized ? bnb : full, 8, 16, 1e-2);
      s.training.bf16 = bf16;
      if (prequantized) {
        ASSERT_TRUE(ApplyCheckpointQuantization(&s).ok());  // as ParseJobSpec does
        ASSERT_TRUE(s.model.quantization_config.has_value());
        EXPECT_EQ(s.model.quantization_config->bnb_4bit_quant_type, "nf4");
        EXPECT_TRUE(s.model.quantization_config->bnb_4bit_use_double_quant);
      } else {
        QuantizationSpec q;
        q.load_in_4bit = true;
        q.bnb_4bit_quant_type = "nf4";
        q.bnb_4bit_use_double_quant = true;
        s.model.quantization_config = q;
      }
      ASSERT_TRUE(ReconcileQuantization(&s).ok());
      RunCallbacks cb;
      cb.on_step = [&](const StepReport& st) { losses[name].push_back(st.loss); };
      cb.on_message = [&](const std::string& line) { if (prequantized) notes.push_back(line); };
      auto r = RunJob(s, testing::TestRunOptions(), cb);
      ASSERT_TRUE(r.ok()) << name << ": " << r.status().ToString();
      EXPECT_EQ(r->peak_memory_bytes, r->plan.bytes.total()) << name;
      auto a = ReadSafetensors(s.output_dir + "/adapter_model.safetensors");
      ASSERT_TRUE(a.ok()) << a.status().ToString();
      adapters[name] = std::move(*a);
    }
    ASSERT_EQ(losses["full"].size(), 3u);
    EXPECT_EQ(losses["full"], losses["prequantized"]);
    ASSERT_EQ(adapters["full"].tensors.size(), adapters["prequantized"].tensors.size());
    for (const auto& [n, t] : adapters["full"].tensors) {
      EXPECT_EQ(t.data, adapters["prequantized"].tensors.at(n).data) << n;
    }
    bool note = false;
    for (const std::string& n : notes) note |= n.find("loaded pre-quantized (bitsandbytes) in nf4") != std::string::npos;
    EXPECT_TRUE(note);
  }
}

// ---- a damaged or inconsistent bitsandbytes state: one error naming the tensor ----

constexpr const char* kW = "model.layers.1.mlp.down_proj.weight";

struct Damage {
  const char* name;
  std::function<void(SafetensorsFile*)> apply;
  std::string tensor;  // the tensor the error must name
  const char* words;   // and a phrase of it
};

nlohmann::json StateJson(const SafetensorsFile& f) {
  const HostTensor& t = f.tensors.at(std::string(kW) + ".quant_state.bitsandbytes__nf4");
  return nlohmann::json::parse(std::string(t.data.begin(), t.data.end()));
}
void SetState(SafetensorsFile* f, const std::string& text) {
  HostTensor& t = f->tensors[std::string(kW) + ".quant_state.bitsandbytes__nf4"];
  t.data.assign(text.begin(), text.end());
  t.shape = {static_cast<int64_t>(text.size())};
}
std::function<void(SafetensorsFile*)> EditState(std::function<void(nlohmann::json*)> edit) {
  return [edit](SafetensorsFile* f) {
    nlohmann::json j = StateJson(*f);
    edit(&j);
    SetState(f, j.dump());
  };
}
std::function<void(SafetensorsFile*)> Erase(const std::string& suffix) {
  return [suffix](SafetensorsFile* f) { f->tensors.erase(kW + suffix); };
}

std::vector<Damage> Damages() {
  const std::string w = kW, qs = w + ".quant_state.bitsandbytes__nf4";
  return {
      {"missing_absmax", Erase(".absmax"), w + ".absmax", "is missing"},
      {"missing_quant_map", Erase(".quant_map"), w + ".quant_map", "is missing"},
      {"missing_nested_absmax", Erase(".nested_absmax"), w + ".nested_absmax", "is missing"},
      {"missing_nested_quant_map", Erase(".nested_quant_map"), w + ".nested_quant_map", "is missing"},
      {"missing_quant_state", Erase(".quant_state.bitsandbytes__nf4"), w, "quant state"},
      {"absmax_f32", [w](SafetensorsFile* f) {
         HostTensor& t = f->tensors[w + ".absmax"];
         t.dtype = "F32";
         t.data.resize(t.data.size() * 4, 0);
       }, w + ".absmax", "has dtype F32, expected U8"},
      {"weight_shape", [w](SafetensorsFile* f) {
         HostTensor& t = f->tensors[w];
         t.shape = {t.shape[0] / 2, 2};
       }, w, "has shape"},
      {"nested_absmax_short", [w](SafetensorsFile* f) {
         HostTensor& t = f->tensors[w + ".nested_absmax"];
         t.shape = {t.shape[0] + 1};
         t.data.resize(t.data.size() + 4, 0);
       }, w + ".nested_absmax", "has shape"},
      {"json_unparsable", [](SafetensorsFile* f) { SetState(f, "{\"quant_type\": \"nf4\", "); }, qs,
       "is not a JSON object"},
      {"json_blocksize_128", EditState([](nlohmann::json* j) { (*j)["blocksize"] = 128; }), qs,
       "\"blocksize\" is 128; only 64 is built"},
      {"json_shape", EditState([](nlohmann::json* j) { (*j)["shape"] = {48, 32}; }), qs,
       "\"shape\" is [48,32]"},
      {"json_quant_type", EditState([](nlohmann::json* j) { (*j)["quant_type"] = "fp4"; }), qs,
       "\"quant_type\" is \"fp4\""},
      {"json_not_nested", EditState([](nlohmann::json* j) {
         j->erase("nested_offset");
         j->erase("nested_blocksize");
       }), qs, "is not double quantized"},
      {"json_nested_blocksize", EditState([](nlohmann::json* j) { (*j)["nested_blocksize"] = 4096; }), qs,
       "\"nested_blocksize\" is 4096"},
      {"quant_map_not_nf4", [w](SafetensorsFile* f) {
         HostTensor& t = f->tensors[w + ".quant_map"];
         float v = 0.5f;
         std::memcpy(t.data.data() + 4 * 3, &v, 4);
       }, w + ".quant_map", "is not bitsandbytes' nf4 table"},
      {"quant_map_fp4", [w](SafetensorsFile* f) {
         HostTensor& t = f->tensors[w + ".quant_map"];
         for (int c = 0; c < 16; ++c) std::memcpy(t.data.data() + 4 * c, &Quant4Code(Quant4Type::kFP4)[c], 4);
       }, w + ".quant_map", "is not bitsandbytes' nf4 table"},
      {"nested_quant_map", [w](SafetensorsFile* f) {
         HostTensor& t = f->tensors[w + ".nested_quant_map"];
         t.data[100] ^= 1;
       }, w + ".nested_quant_map", "signed dynamic map"},
      {"second_state_fp4", [w](SafetensorsFile* f) {
         f->tensors[w + ".quant_state.bitsandbytes__fp4"] = f->tensors.at(w + ".quant_state.bitsandbytes__nf4");
       }, w + ".quant_state.bitsandbytes__fp4", "a second quant state beside"},
  };
}

void PrintTo(const Damage& d, std::ostream* os) { *os << d.name; }

class QLoraDamagedState : public ::testing::TestWithParam<Damage> {
 protected:
  static void SetUpTestSuite() {
    if (!testing::HaveTorch()) return;
    bnb_ = new std::string(WriteBnbFolder(WriteFullFolder(testing::TinyLlama(false), 3), "nf4", true));
  }
  static void TearDownTestSuite() {
    delete bnb_;
    bnb_ = nullptr;
  }
  static std::string* bnb_;
};
std::string* QLoraDamagedState::bnb_ = nullptr;

TEST_P(QLoraDamagedState, IsOneErrorNamingTheTensor) {
  if (bnb_ == nullptr) GTEST_SKIP() << "no torch for the reference writer";
  const Damage& d = GetParam();
  auto file = ReadSafetensors(*bnb_ + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  d.apply(&*file);
  const std::string dir = testing::MakeTempDir("bnb_damaged");
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", *file).ok());
  auto reader = HfWeightsReader::Open(dir);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  TestModel t = TestModel::Make(testing::TinyLlama(false), QOptions(DType::kF32, Quant4Type::kNF4, true, kLlamaAll));
  const Status st = t.model->LoadHfFrom(*reader);
  ASSERT_FALSE(st.ok()) << d.name;
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("tensor '" + d.tensor + "'"));
  EXPECT_THAT(st.message(), HasSubstr(d.words));
  std::printf("[%s] %s\n", d.name, st.message().c_str());
}

INSTANTIATE_TEST_SUITE_P(Damages, QLoraDamagedState, ::testing::ValuesIn(Damages()),
                         [](const ::testing::TestParamInfo<Damage>& i) { return std::string(i.param.name); });

// The job spec and a pre-quantized init_from: the folder's quantization_config applies when the
// spec gives none (planned, not refused); a spec that disagrees is one error naming the field; a
// 4-bit folder without training.peft, or loaded into a model without a 4-bit base, is refused by
// name.
TEST(QLoraPrequantized, SpecTakesOrChecksTheCheckpointsQuantization) {
  if (!testing::HaveTorch()) GTEST_SKIP() << "no torch for the reference writer";
  const ModelConfig config = testing::TinyLlama(false);
  const std::string bnb = WriteBnbFolder(WriteFullFolder(config, 4), "nf4", true, "bfloat16");
  const std::string dir = testing::MakeTempDir("bnb_spec");
  const std::string data = dir + "/tokens.bin";
  testing::WriteSyntheticTokens(data, 3000, 67, 5);
  auto yaml = [&](const std::string& model_extra, const std::string& training_extra) {
    return "model:\n  arch: llama\n  init_from: " + bnb + "\n" + model_extra +
           "data:\n  train_file: " + data + "\n  format: tokens\n  seq_len: 16\n"
           "training:\n  max_steps: 2\n" + training_extra + "output_dir: " + dir + "/out\n";
  };
  const std::string peft = "  peft: {type: lora, r: 4, target_modules: [q_proj, v_proj]}\n";
  auto s = ParseJobSpec(yaml("", peft));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE(s->model.quantization_config.has_value());
  EXPECT_EQ(s->model.quantization_config->bnb_4bit_quant_type, "nf4");
  EXPECT_TRUE(s->model.quantization_config->bnb_4bit_use_double_quant);
  EXPECT_EQ(s->model.quantization_config->bnb_4bit_compute_dtype, "bfloat16");
  EXPECT_TRUE(s->training.bf16);  // the file's compute dtype sets the precision no flag gave
  EXPECT_TRUE(ValidateJobInputs(*s).ok());
  auto est = EstimateJob(*s, DeviceOptions{});
  ASSERT_TRUE(est.ok()) << est.status().ToString();
  EXPECT_GT(est->quantized_base_bytes, 0);
  // The training precision wins over the file's compute dtype.
  auto fp32 = ParseJobSpec(yaml("", peft + "  fp16: true\n"));
  ASSERT_TRUE(fp32.ok()) << fp32.status().ToString();
  EXPECT_EQ(fp32->model.quantization_config->bnb_4bit_compute_dtype, "float16");

  auto other = ParseJobSpec(yaml("  quantization_config: {load_in_4bit: true, bnb_4bit_quant_type: fp4, "
                                 "bnb_4bit_use_double_quant: true}\n", peft));
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  for (const Status& st : {ValidateJobInputs(*other), EstimateJob(*other, DeviceOptions{}).status()}) {
    EXPECT_EQ(st.code(), Status::Code::kFailedPrecondition) << st.ToString();
    EXPECT_THAT(st.message(), HasSubstr("model.quantization_config.bnb_4bit_quant_type: fp4 disagrees with"));
  }
  auto single = ParseJobSpec(yaml("  quantization_config: {load_in_4bit: true, bnb_4bit_quant_type: nf4}\n", peft));
  ASSERT_TRUE(single.ok()) << single.status().ToString();
  EXPECT_THAT(ValidateJobInputs(*single).message(),
              HasSubstr("model.quantization_config.bnb_4bit_use_double_quant: false disagrees with"));

  auto no_peft = ParseJobSpec(yaml("", ""));
  ASSERT_FALSE(no_peft.ok());
  EXPECT_EQ(no_peft.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(no_peft.status().message(), HasSubstr("is a bitsandbytes 4-bit checkpoint"));
  EXPECT_THAT(no_peft.status().message(), HasSubstr("training.peft"));

  // A 4-bit tensor loaded into a model without a 4-bit base.
  auto reader = HfWeightsReader::Open(bnb);
  ASSERT_TRUE(reader.ok());
  ModelOptions plain = testing::TinyOptions(3, 16);
  TestModel t = TestModel::Make(config, plain);
  const Status st = t.model->LoadHfFrom(*reader);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("is stored in 4 bits (a bitsandbytes pre-quantized checkpoint)"));

  // config.json's quantization_config that is not bitsandbytes' 4 bits.
  nlohmann::json cfg = nlohmann::json::parse(testing::ReadFile(bnb + "/config.json"));
  for (const auto& [key, value, words] :
       std::vector<std::tuple<std::string, nlohmann::json, std::string>>{
           {"bnb_4bit_quant_storage", "bfloat16", "only uint8 storage"},
           {"load_in_8bit", true, "8-bit checkpoint is not built"},
           {"quant_method", "gptq", "only bitsandbytes"}}) {
    nlohmann::json c = cfg;
    c["quantization_config"][key] = value;
    testing::WriteFile(bnb + "/config.json", c.dump());
    auto bad = EstimateJob(*s, DeviceOptions{});
    EXPECT_EQ(bad.status().code(), Status::Code::kFailedPrecondition) << key;
    EXPECT_THAT(bad.status().message(), HasSubstr("quantization_config." + key)) << key;
    EXPECT_THAT(bad.status().message(), HasSubstr(words)) << key;
  }
  testing::WriteFile(bnb + "/config.json", cfg.dump());
}

// peft.merge on a 4-bit base writes the merged model in the compute dtype (PEFT's
// merge_and_unload on a 4-bit model): every tensor BF16 / F16 for bf16 / fp16 jobs, F32 for fp32,
// config.json's torch_dtype to match, and each value dequantize(W) + scale * B @ A rounded once to
// it, against reference/bnb_checkpoint.py's merge of the same folder and adapters.
TEST(QLoraMerge, WritesTheComputeDtype) {
  if (!testing::HaveTorch()) GTEST_SKIP() << "no torch for the reference";
  const std::string dir = testing::MakeTempDir("bnb_merge");
  const std::string data = dir + "/tokens.bin";
  testing::WriteSyntheticTokens(data, 3000, 64, 5);
  const ModelConfig config = testing::TinyLlamaConfig({64, 128, 2, 4, 2, 64});
  const std::string full = WriteFullFolder(config, 9);
  for (const auto& [precision, st_dtype, torch_dtype] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"bf16", "BF16", "bfloat16"}, {"f16", "F16", "float16"}, {"f32", "F32", "float32"}}) {
    SCOPED_TRACE(precision);
    const std::string bnb = WriteBnbFolder(full, "nf4", true, torch_dtype);
    JobSpec s = ThreeStepLora(dir + "/" + precision, data, config, bnb, 4, 8, 2e-2);
    s.training.bf16 = precision == "bf16";
    s.training.fp16 = precision == "f16";
    s.training.peft->merge = true;
    ASSERT_TRUE(ApplyCheckpointQuantization(&s).ok());
    ASSERT_TRUE(ReconcileQuantization(&s).ok());
    std::vector<std::string> notes;
    RunCallbacks cb;
    cb.on_message = [&](const std::string& line) { notes.push_back(line); };
    auto r = RunJob(s, testing::TestRunOptions(), cb);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    int merge_notes = 0;
    for (const std::string& n : notes) merge_notes += n.find("the merged model is the 4-bit base dequantized") != std::string::npos;
    EXPECT_EQ(merge_notes, 1);
    const nlohmann::json cfg = nlohmann::json::parse(testing::ReadFile(s.output_dir + "/config.json"));
    EXPECT_EQ(cfg["torch_dtype"], torch_dtype);
    EXPECT_FALSE(cfg.contains("quantization_config"));
    std::string out;
    const std::string ref = s.output_dir + "/ref_merged.safetensors";
    ASSERT_EQ(testing::RunPython("bnb_checkpoint.py", "merge " + bnb + " " + s.output_dir +
                                     "/adapter_model.safetensors 2.0 " + precision + " " + ref, &out), 0) << out;
    auto merged = ReadSafetensors(s.output_dir + "/model.safetensors");
    auto expect = ReadSafetensors(ref);
    ASSERT_TRUE(merged.ok() && expect.ok());
    EXPECT_EQ(merged->tensors.size(), expect->tensors.size());
    int64_t differ = 0, total = 0, adapted = 0;
    for (const auto& [name, t] : merged->tensors) {
      EXPECT_EQ(t.dtype, st_dtype) << name;
      ASSERT_TRUE(expect->tensors.count(name)) << name;
      const HostTensor& e = expect->tensors.at(name);
      EXPECT_EQ(t.shape, e.shape) << name;
      ASSERT_EQ(t.data.size(), e.data.size()) << name;
      const size_t es = SafetensorsDTypeSize(t.dtype);
      for (size_t k = 0; k < t.data.size(); k += es) {
        differ += std::memcmp(t.data.data() + k, e.data.data() + k, es) != 0;
        ++total;
      }
      adapted += name.find("_proj.weight") != std::string::npos;
    }
    std::printf("[merge %s] %lld of %lld values differ from the reference; %lld adapted weights\n",
                precision.c_str(), static_cast<long long>(differ), static_cast<long long>(total),
                static_cast<long long>(adapted));
    EXPECT_EQ(differ, 0);
    EXPECT_EQ(adapted, 2 * 7);
  }
}

// ---- the init_from load reads tensor by tensor ----

int64_t StatusKiB(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::strlen(key)));
  }
  return -1;
}
// Resets the peak resident set to the current one (Linux: clear_refs 5).
bool ResetPeakRss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  return static_cast<bool>(f);
}

// A QLoRA load from a folder peaks (host memory above what the model itself touches) near one
// tensor's copies, not the file: well under a third of a 160 MB fp32 file, where reading the file
// whole first (ReadHfWeights, as before) peaks above the file's size.
TEST(QLoraLoad, PeakHostMemoryIsNotTheFile) {
  const ModelConfig config = testing::TinyLlamaConfig({512, 1536, 12, 8, 8, 64});
  const std::string dir = testing::MakeTempDir("load_peak");
  {
    SafetensorsFile f;
    const ParamTable table = BuildParams(MakeArchDims(config));
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 0.02f);
    for (size_t i = 0; i < table.infos.size(); ++i) {
      const ParamInfo& p = table.infos[i];
      int64_t n = 1;
      for (int64_t d : p.hf_shape) n *= d;
      std::vector<float> v(static_cast<size_t>(n));
      for (float& x : v) x = nd(rng);
      f.tensors[p.hf_name] = HostTensor::FromF32(v.data(), p.hf_shape);
    }
    ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", f).ok());
  }
  const double file_mib = static_cast<double>(std::filesystem::file_size(dir + "/model.safetensors")) / 1048576.0;
  ModelOptions o = QOptions(DType::kBF16, Quant4Type::kNF4, true, {"q_proj", "v_proj"});
  o.micro_batch = 1;
  double peak_mib[2] = {0, 0};
  for (const bool streamed : {true, false}) {
    TestModel t = TestModel::Make(config, o, 1);
    ASSERT_TRUE(ResetPeakRss());
    const int64_t before = StatusKiB("VmRSS:");
    if (streamed) {
      auto reader = HfWeightsReader::Open(dir);
      ASSERT_TRUE(reader.ok());
      ASSERT_TRUE(t.model->LoadHfFrom(*reader).ok());
    } else {
      auto file = ReadHfWeights(dir);
      ASSERT_TRUE(file.ok());
      ASSERT_TRUE(t.model->LoadHf(*file).ok());
    }
    peak_mib[streamed ? 0 : 1] = static_cast<double>(StatusKiB("VmHWM:") - before) / 1024.0;
  }
  std::printf("[load peak] file %.1f MiB: tensor by tensor +%.1f MiB, whole file first +%.1f MiB\n",
              file_mib, peak_mib[0], peak_mib[1]);
  EXPECT_LT(peak_mib[0], file_mib / 3);
  EXPECT_GT(peak_mib[1], file_mib);  // what the bound above would catch
}

}  // namespace
}  // namespace traind::engine
