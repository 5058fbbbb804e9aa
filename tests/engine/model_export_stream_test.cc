// The streamed model write (Model::StreamHf / StreamMerged -> WriteSafetensorsStream): the file is
// byte-identical to the whole-model path it replaced (a host copy of every parameter through the
// HF layout into a SafetensorsFile, then WriteSafetensors), for every family and for LoRA's merged
// export, whatever the piece size; the write adds only its buffers to the process's RSS; a failed
// write names the path and leaves no file behind.
#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "model_test_util.h"
#include "rss_test_util.h"
#include "models/decoder.h"
#include "models/layout.h"

namespace traind::engine::testing {
namespace {

namespace fs = std::filesystem;

// The export as it was before streaming (decoder.cc's FlatToHf / ToHfLayout, and ExportMerged's
// merge), kept here as the reference: `host` is the model's flat parameters.
SafetensorsFile OldExport(const ModelConfig& config, const std::vector<float>& host) {
  const ParamTable table = BuildParams(MakeArchDims(config));
  SafetensorsFile out;
  out.metadata["format"] = "pt";
  for (size_t i = 0; i < table.infos.size(); ++i) {
    const ParamInfo& info = table.infos[i];
    const float* src = host.data() + info.offset;
    int64_t hf_numel = 1;
    for (int64_t s : info.hf_shape) hf_numel *= s;
    std::vector<float> v(static_cast<size_t>(hf_numel));
    if (table.extras[i].transposed) {
      const int64_t OC = info.shape[0], C = info.shape[1];
      for (int64_t o = 0; o < OC; ++o)
        for (int64_t c = 0; c < C; ++c) v[c * OC + o] = src[o * C + c];
    } else {
      std::copy(src, src + hf_numel, v.begin());
    }
    out.tensors[info.hf_name] = HostTensor::FromF32(v.data(), info.hf_shape);
  }
  return out;
}

// The old ExportMerged's merge on the host copy: W += float(scale * sum_k B A) in double, for each
// adapter pair (PEFT names) on its base tensor (the engine's (out, in) layout).
void OldMerge(Model& m, Backend& be, const LoraOptions& lora, std::vector<float>* host) {
  const std::vector<float> ad = ToHost(be, m.trainable_data(), m.num_trainable());
  const float scale = static_cast<float>(lora.alpha / static_cast<double>(lora.r));
  std::map<std::string, const ParamInfo*> by_name;
  for (const ParamInfo& p : m.trainable_params()) by_name[p.hf_name] = &p;
  const std::string prefix = "base_model.model.", a_suffix = ".lora_A.weight";
  for (const auto& [name, a] : by_name) {
    if (name.size() < a_suffix.size() ||
        name.compare(name.size() - a_suffix.size(), a_suffix.size(), a_suffix) != 0) {
      continue;
    }
    const std::string module = name.substr(prefix.size(), name.size() - prefix.size() - a_suffix.size());
    const ParamInfo* b = by_name.at(prefix + module + ".lora_B.weight");
    const ParamInfo* w = nullptr;
    for (const ParamInfo& p : m.params()) {
      if (p.hf_name == module + ".weight") w = &p;
    }
    ASSERT_NE(w, nullptr) << module;
    const int64_t out = w->shape[0], in = w->shape[1], r = lora.r;
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t c = 0; c < in; ++c) {
        double acc = 0.0;
        for (int64_t k = 0; k < r; ++k) {
          acc += static_cast<double>(ad[b->offset + o * r + k]) * ad[a->offset + k * in + c];
        }
        (*host)[w->offset + o * in + c] += static_cast<float>(scale * acc);
      }
    }
  }
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Writes `stream` at several piece sizes (the default, one float, sizes that cut rows unevenly)
// and expects each file to equal `expected` byte for byte; ExportHf-style collection too.
void ExpectStreamsEqual(const std::function<SafetensorsStream(size_t)>& stream,
                        const SafetensorsFile& expected, const std::string& what) {
  TempDir dir;
  const std::string ref = dir.path + "/old.safetensors";
  ASSERT_TRUE(WriteSafetensors(ref, expected).ok());
  const std::string want = ReadAll(ref);
  ASSERT_GT(want.size(), 8u);
  for (size_t piece : {kHfExportPieceBytes, size_t{4}, size_t{100}, size_t{1000}, size_t{4096}}) {
    const std::string path = dir.path + "/streamed-" + std::to_string(piece) + ".safetensors";
    const Status s = WriteSafetensorsStream(path, stream(piece));
    ASSERT_TRUE(s.ok()) << what << ": " << s.ToString();
    EXPECT_TRUE(ReadAll(path) == want) << what << ": piece " << piece << " bytes: file differs";
    EXPECT_FALSE(fs::exists(path + ".tmp")) << path;
  }
  Result<SafetensorsFile> collected = CollectSafetensorsStream(stream(333));
  ASSERT_TRUE(collected.ok()) << collected.status().ToString();
  EXPECT_EQ(collected->metadata, expected.metadata) << what;
  ASSERT_EQ(collected->tensors.size(), expected.tensors.size()) << what;
  for (const auto& [name, t] : expected.tensors) {
    ASSERT_EQ(collected->tensors.count(name), 1u) << what << ": " << name;
    EXPECT_EQ(collected->tensors.at(name).shape, t.shape) << name;
    EXPECT_TRUE(collected->tensors.at(name).data == t.data) << what << ": " << name;
  }
}

void ExpectStreamedEqualsOld(const ModelConfig& c, const std::string& what) {
  TestModel t = TestModel::Make(c, TinyOptions(1, 8));
  ASSERT_NE(t.model, nullptr) << what;
  t.model->InitRandom(7);
  const std::vector<float> host = ToHost(*t.backend, t.model->param_data(), t.model->num_params());
  const SafetensorsFile old = OldExport(c, host);
  Model* m = t.model.get();
  ExpectStreamsEqual([m](size_t piece) { return m->StreamHf(piece); }, old, what);
  ExpectStreamsEqual([m](size_t piece) { return m->StreamMerged(piece); }, old, what + " merged");
  const SafetensorsFile exported = m->ExportHf();
  ASSERT_EQ(exported.tensors.size(), old.tensors.size());
  for (const auto& [name, tensor] : old.tensors) {
    EXPECT_TRUE(exported.tensors.at(name).data == tensor.data) << what << ": " << name;
  }
}

ModelConfig TinyBertFor(const std::string& head) {
  ModelConfig c;
  c.arch = Arch::kBert;
  c.vocab_size = 61;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 4;
  c.max_position_embeddings = 24;
  c.type_vocab_size = 2;
  c.layer_norm_eps = 1e-12;
  c.pad_token_id = 0;
  c.head = head;
  c.num_labels = 3;
  return c;
}

ModelConfig TinyMixtralFor(bool tied) {
  ModelConfig c = TinyLlama(tied);
  c.arch = Arch::kMixtral;
  c.intermediate_size = 24;
  c.num_local_experts = 4;
  c.num_experts_per_tok = 2;
  return c;
}

TEST(ModelExportStream, Gpt2FileEqualsTheWholeModelPath) { ExpectStreamedEqualsOld(TinyGpt2(), "gpt2"); }

TEST(ModelExportStream, LlamaFileEqualsTheWholeModelPath) {
  ExpectStreamedEqualsOld(TinyLlama(false), "llama untied");
  ExpectStreamedEqualsOld(TinyLlama(true), "llama tied");
}

TEST(ModelExportStream, MixtralFileEqualsTheWholeModelPath) {
  ExpectStreamedEqualsOld(TinyMixtralFor(false), "mixtral");
}

TEST(ModelExportStream, BertFileEqualsTheWholeModelPath) {
  ExpectStreamedEqualsOld(TinyBertFor("masked_lm"), "bert masked_lm");
  ExpectStreamedEqualsOld(TinyBertFor("sequence_classification"), "bert sequence_classification");
}

void ExpectMergedEqualsOld(const ModelConfig& c, std::vector<std::string> targets,
                           const std::string& what) {
  ModelOptions o = TinyOptions(1, 8);
  o.lora.r = 3;
  o.lora.alpha = 5.0;
  o.lora.targets = std::move(targets);
  TestModel t = TestModel::Make(c, o);
  ASSERT_NE(t.model, nullptr) << what;
  t.model->InitRandom(3);
  t.model->InitAdapters(4);
  // B starts at zero (no merge to see): random adapters instead.
  std::vector<float> ad(static_cast<size_t>(t.model->num_trainable()));
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  for (float& x : ad) x = nd(rng);
  t.backend->CopyHostToDevice(t.model->trainable_data(), ad.data(), ad.size() * sizeof(float));
  t.backend->Synchronize();
  std::vector<float> host = ToHost(*t.backend, t.model->param_data(), t.model->num_params());
  const SafetensorsFile plain = OldExport(c, host);
  OldMerge(*t.model, *t.backend, o.lora, &host);
  const SafetensorsFile merged = OldExport(c, host);
  ASSERT_FALSE(merged.tensors.begin()->second.data.empty());
  Model* m = t.model.get();
  ExpectStreamsEqual([m](size_t piece) { return m->StreamMerged(piece); }, merged, what + " merged");
  ExpectStreamsEqual([m](size_t piece) { return m->StreamHf(piece); }, plain, what + " base");
  size_t changed = 0;
  for (const auto& [name, tensor] : merged.tensors) changed += tensor.data != plain.tensors.at(name).data;
  EXPECT_GT(changed, 0u) << what << ": the merge changed nothing; the test would not see it";
}

TEST(ModelExportStream, LoraMergedFileEqualsTheWholeModelPath) {
  ExpectMergedEqualsOld(TinyGpt2(), {"c_attn", "c_proj", "c_fc"}, "gpt2 lora");
  ExpectMergedEqualsOld(TinyLlama(false),
                        {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"},
                        "llama lora");
}

// A gpt2 of 44.7M parameters (179 MiB of fp32 weights; the 50304-row embedding alone is 98 MiB,
// its Conv1D weights are transposed): the streamed save's RSS growth stays under 32 MiB (two 4 MiB
// buffers and the writer's), the whole-model path's is the model's size.
TEST(ModelExportStream, SaveRssGrowthIsBoundedWhateverTheModelSize) {
  ModelConfig c;
  c.arch = Arch::kGpt2;
  c.vocab_size = 50304;
  c.n_positions = 64;
  c.n_embd = 512;
  c.n_layer = 6;
  c.n_head = 8;
  TestModel t = TestModel::Make(c, TinyOptions(1, 8));
  ASSERT_NE(t.model, nullptr);
  t.model->InitRandom(5);
  const double model_mib = static_cast<double>(t.model->num_params()) * 4.0 / 1048576.0;
  ASSERT_GT(model_mib, 150.0);
  TempDir dir;
  const std::string streamed = dir.path + "/streamed.safetensors";
  const std::string whole = dir.path + "/whole.safetensors";

  int64_t before = StartPeakRss();
  const Status s = WriteSafetensorsStream(streamed, t.model->StreamHf(kHfExportPieceBytes));
  const int64_t streamed_growth = ProcStatusBytes("VmHWM") - before;
  ASSERT_TRUE(s.ok()) << s.ToString();

  before = StartPeakRss();
  ASSERT_TRUE(WriteSafetensors(whole, t.model->ExportHf()).ok());
  const int64_t whole_growth = ProcStatusBytes("VmHWM") - before;
  std::printf("model %.1f MiB: RSS growth while saving streamed %.1f MiB, whole-model path %.1f MiB\n",
              model_mib, static_cast<double>(streamed_growth) / 1048576.0,
              static_cast<double>(whole_growth) / 1048576.0);
  EXPECT_LT(streamed_growth, int64_t{32} << 20);
  EXPECT_GT(whole_growth, int64_t{100} << 20) << "the reference path no longer copies the model: "
                                                  "the bound above proves less than it says";
  EXPECT_TRUE(ReadAll(streamed) == ReadAll(whole)) << "the two files differ";
}

// A stream that cannot be written: one error naming the path, no file under it, no .tmp left.
TEST(ModelExportStream, FailedWriteNamesThePathAndLeavesNoFile) {
  TestModel t = TestModel::Make(TinyGpt2(), TinyOptions(1, 8));
  ASSERT_NE(t.model, nullptr);
  t.model->InitRandom(2);
  TempDir dir;

  // The path is a directory: the data goes to path.tmp, the rename fails, path.tmp is removed.
  const std::string is_dir = dir.path + "/model.safetensors";
  fs::create_directory(is_dir);
  Status s = WriteSafetensorsStream(is_dir, t.model->StreamHf(kHfExportPieceBytes));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(is_dir), std::string::npos) << s.ToString();
  EXPECT_TRUE(fs::is_directory(is_dir));
  EXPECT_FALSE(fs::exists(is_dir + ".tmp"));

  // The folder does not exist / is a file: nothing is created.
  for (const std::string& parent : {dir.path + "/missing", dir.path + "/a-file"}) {
    if (parent.find("a-file") != std::string::npos) std::ofstream(parent) << "x";
    const std::string path = parent + "/model.safetensors";
    s = WriteSafetensorsStream(path, t.model->StreamHf(kHfExportPieceBytes));
    ASSERT_FALSE(s.ok()) << path;
    EXPECT_NE(s.message().find(path), std::string::npos) << s.ToString();
  }

  // An existing model file whose replacement cannot be written stays as it was.
  const std::string good = dir.path + "/good.safetensors";
  ASSERT_TRUE(WriteSafetensorsStream(good, t.model->StreamHf(kHfExportPieceBytes)).ok());
  const std::string before = ReadAll(good);
  fs::create_directory(good + ".tmp");  // the temp file cannot be opened
  s = WriteSafetensorsStream(good, t.model->StreamHf(kHfExportPieceBytes));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(good), std::string::npos) << s.ToString();
  EXPECT_TRUE(ReadAll(good) == before);

  // An unwritable folder (mode bits; root ignores them, so only checked as another user).
  if (::geteuid() != 0) {
    const std::string ro = dir.path + "/read-only";
    fs::create_directory(ro);
    ::chmod(ro.c_str(), 0555);
    const std::string path = ro + "/model.safetensors";
    s = WriteSafetensorsStream(path, t.model->StreamHf(kHfExportPieceBytes));
    ::chmod(ro.c_str(), 0755);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find(path), std::string::npos) << s.ToString();
    EXPECT_FALSE(fs::exists(path));
  } else {
    std::printf("running as root: the mode-bit case (read-only folder) is not checked\n");
  }
}

// The random init draws its 64-bit stream in order and transforms it in parallel: every value
// equals the one-element-after-the-other Box-Muller of the same stream (written here as it was
// before), for gpt2 with padded vocabulary rows (no draws: zeros) and llama, over tensors larger
// than the parallel threshold and the 1M-element chunk.
TEST(InitFlatParams, ParallelTransformEqualsTheSequentialStream) {
  ModelConfig gpt2 = TinyGpt2();
  gpt2.vocab_size = 3001;  // padded rows
  gpt2.n_embd = 512;       // wte 3001 x 512 > the 1M-element chunk
  gpt2.n_head = 8;
  ModelConfig llama = TinyLlama(false);
  llama.vocab_size = 5000;  // embed_tokens and lm_head 160K elements each
  for (const ModelConfig& c : {gpt2, llama}) {
    SCOPED_TRACE(ArchName(c.arch));
    const ArchDims d = MakeArchDims(c);
    const ParamTable table = BuildParams(d);
    std::vector<float> got(static_cast<size_t>(table.total), -1.0f);
    InitFlatParams(d, table, 1234, got.data());
    std::vector<float> want(static_cast<size_t>(table.total), -1.0f);
    std::mt19937_64 rng(1234);
    auto normal = [&rng]() {
      const double u1 = (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53;
      const double u2 = (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53;
      return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    };
    const double std_resid = 0.02 / std::sqrt(2.0 * static_cast<double>(d.L));
    int64_t normals = 0, padded = 0;
    for (size_t i = 0; i < table.infos.size(); ++i) {
      const ParamInfo& info = table.infos[i];
      int64_t n = 1;
      for (int64_t s : info.hf_shape) n *= s;
      for (int64_t j = 0; j < info.numel; ++j) {
        float v = 0.0f;
        if (j < n) {
          switch (table.extras[i].init) {
            case InitKind::kZeros: v = 0.0f; break;
            case InitKind::kOnes: v = 1.0f; break;
            case InitKind::kNormal: v = static_cast<float>(0.02 * normal()); ++normals; break;
            case InitKind::kNormalResidual: v = static_cast<float>(std_resid * normal()); ++normals; break;
          }
        } else {
          ++padded;
        }
        want[static_cast<size_t>(info.offset + j)] = v;
      }
    }
    EXPECT_GT(normals, 65536);
    if (c.arch == Arch::kGpt2) {
      EXPECT_GT(padded, 0);
    }
    EXPECT_TRUE(got == want) << "the parallel init differs from the sequential stream";
  }
}

}  // namespace
}  // namespace traind::engine::testing
