// Generate(): a model folder + tokenizer -> KvDecoder on the job's device -> sampled tokens.
#include "traind/engine/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include <nlohmann/json.hpp>

#include "backend/arena.h"
#include "backend/device_registry.h"
#include "core/safetensors.h"
#include "data/instruction_data.h"
#include "models/decoder.h"
#include "models/hf_config.h"
#include "models/kv_decoder.h"
#include "models/layout.h"
#include "train/checkpoint.h"
#include "train/sampler.h"
#include "traind/engine/tokenizer.h"

namespace traind::engine {
namespace fs = std::filesystem;

std::string ValidUtf8(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = len > 0 && i + len <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
    }
    if (ok && len == 2) ok = c >= 0xC2;  // no overlong forms
    if (ok && len == 3) {
      const unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
      ok = !(c == 0xE0 && c1 < 0xA0) && !(c == 0xED && c1 >= 0xA0);  // overlong, surrogates
    }
    if (ok && len == 4) {
      const unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
      ok = c <= 0xF4 && !(c == 0xF0 && c1 < 0x90) && !(c == 0xF4 && c1 >= 0x90);
    }
    if (ok) {
      out.append(s, i, static_cast<size_t>(len));
      i += static_cast<size_t>(len);
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

namespace {

Result<nlohmann::json> ReadJson(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return Status::NotFound(path.string() + ": cannot open");
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(path.string() + ": not valid JSON: " + e.what());
  }
}

// PEFT adapters folded into the base model's HF tensors: W += (alpha/r) B A, or its transpose for
// GPT-2's Conv1D weights (fan_in_fan_out). Names: base_model.model.<module>.lora_A.weight.
Status MergeAdapters(const fs::path& dir, const nlohmann::json& cfg, SafetensorsFile* base) {
  TRAIND_ASSIGN_OR_RETURN(SafetensorsFile ad, ReadSafetensors((dir / kAdapterModelFile).string()));
  const double r = cfg.value("r", 0.0), alpha = cfg.value("lora_alpha", 0.0);
  if (!(r > 0)) return Status::InvalidArgument((dir / kAdapterConfigFile).string() + ": r missing");
  const bool fan_in_fan_out = cfg.value("fan_in_fan_out", false);
  const std::string kPrefix = "base_model.model.", kA = ".lora_A.weight";
  for (const auto& [name, a_tensor] : ad.tensors) {
    if (name.size() < kA.size() || name.compare(name.size() - kA.size(), kA.size(), kA) != 0) {
      continue;
    }
    std::string module = name.substr(0, name.size() - kA.size());
    if (module.rfind(kPrefix, 0) == 0) module = module.substr(kPrefix.size());
    auto b_it = ad.tensors.find(name.substr(0, name.size() - kA.size()) + ".lora_B.weight");
    auto w_it = base->tensors.find(module + ".weight");
    if (w_it == base->tensors.end() && module.rfind("transformer.", 0) == 0) {
      w_it = base->tensors.find(module.substr(12) + ".weight");
    }
    if (b_it == ad.tensors.end() || w_it == base->tensors.end()) {
      return Status::InvalidArgument((dir / kAdapterModelFile).string() + ": adapter " + name +
                                     " has no lora_B or no base weight " + module + ".weight");
    }
    TRAIND_ASSIGN_OR_RETURN(std::vector<float> A, a_tensor.ToF32());
    TRAIND_ASSIGN_OR_RETURN(std::vector<float> B, b_it->second.ToF32());
    TRAIND_ASSIGN_OR_RETURN(std::vector<float> W, w_it->second.ToF32());
    const int64_t rank = a_tensor.shape.at(0), in = a_tensor.shape.at(1);
    const int64_t out = b_it->second.shape.at(0);
    if (static_cast<int64_t>(W.size()) != in * out) {
      return Status::InvalidArgument("adapter " + name + " does not fit " + module + ".weight");
    }
    const double scale = alpha / r;
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t c = 0; c < in; ++c) {
        double acc = 0;
        for (int64_t k = 0; k < rank; ++k) acc += double{B[o * rank + k]} * A[k * in + c];
        W[fan_in_fan_out ? c * out + o : o * in + c] += static_cast<float>(scale * acc);
      }
    }
    w_it->second = HostTensor::FromF32(W.data(), w_it->second.shape);
  }
  return Status::Ok();
}

struct LoadedModel {
  ModelConfig config;
  SafetensorsFile weights;
  std::string tokenizer_dir;  // where tokenizer files were found ("" = none)
};

Result<LoadedModel> LoadModelDir(const std::string& dir_name) {
  const fs::path dir(dir_name);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return Status::NotFound("model folder " + dir_name + " does not exist");
  }
  LoadedModel m;
  TRAIND_ASSIGN_OR_RETURN(m.config, ReadHfConfig((dir / kConfigFile).string()));
  if (HasTokenizerFiles(dir.string())) m.tokenizer_dir = dir.string();
  const bool full = fs::exists(dir / kModelFile, ec) ||
                    fs::exists(dir / "model.safetensors.index.json", ec);
  if (full) {
    TRAIND_ASSIGN_OR_RETURN(m.weights, ReadHfWeights(dir.string()));
    return m;
  }
  if (!fs::exists(dir / kAdapterModelFile, ec)) {
    return Status::NotFound(dir_name + " holds neither model.safetensors nor " +
                            std::string(kAdapterModelFile) + ": not a finished job's output_dir");
  }
  TRAIND_ASSIGN_OR_RETURN(nlohmann::json cfg, ReadJson(dir / kAdapterConfigFile));
  const nlohmann::json base = cfg.value("base_model_name_or_path", nlohmann::json());
  if (!base.is_string()) {
    return Status::FailedPrecondition(
        dir_name + " holds LoRA adapters over a randomly initialised base (no "
                   "base_model_name_or_path); train with training.peft.merge: true to generate");
  }
  TRAIND_ASSIGN_OR_RETURN(m.weights, ReadHfWeights(base.get<std::string>()));
  if (m.tokenizer_dir.empty() && HasTokenizerFiles(base.get<std::string>())) {
    m.tokenizer_dir = base.get<std::string>();
  }
  TRAIND_RETURN_IF_ERROR(MergeAdapters(dir, cfg, &m.weights));
  return m;
}

}  // namespace

Status ValidateGenerateOptions(const GenerateOptions& o) {
  if (o.model_dir.empty()) return Status::InvalidArgument("generate: OUTPUT_DIR is empty");
  if (o.max_new_tokens < 1) {
    return Status::InvalidArgument("--max-new-tokens must be >= 1, got " +
                                   std::to_string(o.max_new_tokens));
  }
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature)) {
    return Status::InvalidArgument("--temperature must be >= 0, got " +
                                   std::to_string(o.temperature));
  }
  if (o.top_k < 0) {
    return Status::InvalidArgument("--top-k must be >= 0 (0: off), got " +
                                   std::to_string(o.top_k));
  }
  if (!(o.top_p > 0 && o.top_p <= 1)) {
    return Status::InvalidArgument("--top-p must be in (0, 1], got " + std::to_string(o.top_p));
  }
  return Status::Ok();
}

int32_t SampleToken(const std::vector<float>& logits, int64_t vocab_limit,
                    const GenerateOptions& o, std::mt19937_64* rng) {
  const int64_t n = std::min<int64_t>(vocab_limit, static_cast<int64_t>(logits.size()));
  if (o.temperature == 0 || o.top_k == 1) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.begin() + n) -
                                logits.begin());
  }
  // Candidates by decreasing logit (stable: ties keep the lower id first).
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&logits](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (o.top_k > 0 && o.top_k < n) order.resize(static_cast<size_t>(o.top_k));
  std::vector<double> p(order.size());
  const double mx = logits[order[0]] / o.temperature;
  double sum = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    p[i] = std::exp(logits[order[i]] / o.temperature - mx);
    sum += p[i];
  }
  size_t keep = order.size();
  if (o.top_p < 1) {  // the smallest prefix whose probability reaches top_p (at least one token)
    double cum = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      cum += p[i] / sum;
      if (cum >= o.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += p[i];
  const double u = (static_cast<double>((*rng)() >> 11) + 0.5) * 0x1.0p-53 * kept;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return order[i];
  }
  return order[keep - 1];
}

Result<GenerateResult> Generate(const GenerateOptions& o, const DeviceOptions& device) {
  TRAIND_RETURN_IF_ERROR(ValidateGenerateOptions(o));
  TRAIND_ASSIGN_OR_RETURN(LoadedModel m, LoadModelDir(o.model_dir));
  const std::string tok_name = !o.tokenizer.empty() ? o.tokenizer
                               : !m.tokenizer_dir.empty() ? m.tokenizer_dir
                                                          : std::string("byte");
  TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok,
                          DefaultTokenizerFactory().Open(tok_name, ""));
  GenerateResult r;
  r.prompt = o.prompt;
  if (o.chat) {
    std::vector<std::string> folders = {o.model_dir};
    if (!m.tokenizer_dir.empty() && m.tokenizer_dir != o.model_dir) folders.push_back(m.tokenizer_dir);
    TRAIND_ASSIGN_OR_RETURN(r.prompt, RenderChatPrompt(folders, o.prompt));
  }
  TRAIND_ASSIGN_OR_RETURN(r.prompt_ids, tok->Encode(r.prompt, /*add_special_tokens=*/!o.chat));
  if (r.prompt_ids.empty()) {
    if (!tok->bos_id() && !tok->eos_id()) {
      return Status::InvalidArgument("--prompt is empty and the tokenizer has no begin token");
    }
    r.prompt_ids.push_back(tok->bos_id() ? *tok->bos_id() : *tok->eos_id());
  }
  for (int32_t id : r.prompt_ids) {
    if (id >= m.config.vocab_size) {
      return Status::InvalidArgument("the prompt's token id " + std::to_string(id) +
                                     " is beyond the model's vocab_size " +
                                     std::to_string(m.config.vocab_size) + " (tokenizer " +
                                     tok_name + ")");
    }
  }
  const int64_t max_pos = m.config.max_positions();
  const int64_t n_prompt = static_cast<int64_t>(r.prompt_ids.size());
  if (n_prompt >= max_pos) {
    return Status::InvalidArgument("the prompt is " + std::to_string(n_prompt) +
                                   " tokens; the model has " + std::to_string(max_pos) +
                                   " positions, so nothing can follow it");
  }
  const int64_t max_len = std::min(max_pos, n_prompt + o.max_new_tokens);

  auto note = [](const std::string&) {};
  TRAIND_ASSIGN_OR_RETURN(OpenedDevice dev, OpenDevice(device, /*allow_tf32=*/false, note));
  r.device = dev.device;
  TRAIND_RETURN_IF_ERROR(CheckSupports(*dev.backend, Model::RequiredOps(m.config)));
  TRAIND_RETURN_IF_ERROR(CheckSupports(*dev.backend, {Op::kAttentionDecode}));
  const ArchDims d = MakeArchDims(m.config);
  const ParamTable table = BuildParams(d);
  std::vector<float> host(static_cast<size_t>(table.total), 0.0f);
  TRAIND_RETURN_IF_ERROR(HfToFlat(m.config.arch, table, m.weights, host.data()));
  m.weights = SafetensorsFile{};  // the host copy above is all that is needed now
  DeviceArena arena(dev.backend.get(), dev.budget_bytes);
  TRAIND_ASSIGN_OR_RETURN(void* params, arena.Allocate(MemoryCategory::kWeights,
                                                       table.total * 4, "model weights"));
  dev.backend->CopyHostToDevice(params, host.data(), host.size() * sizeof(float));
  host = {};
  TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<KvDecoder> dec,
                          KvDecoder::Create(m.config, static_cast<const float*>(params), max_len,
                                            &arena));

  const auto t0 = std::chrono::steady_clock::now();
  std::mt19937_64 rng(o.seed);
  const int64_t vocab_limit = std::min<int64_t>(m.config.vocab_size, tok->vocab_size());
  std::vector<float> logits;
  for (int32_t id : r.prompt_ids) TRAIND_RETURN_IF_ERROR(dec->Step(id, &logits));
  r.finish_reason = "length";
  while (true) {
    const int32_t next = SampleToken(logits, vocab_limit, o, &rng);
    r.ids.push_back(next);
    if (o.stop_at_eos && tok->eos_id() && next == *tok->eos_id()) {
      r.finish_reason = "eos";
      break;
    }
    if (static_cast<int64_t>(r.ids.size()) >= o.max_new_tokens) break;
    if (n_prompt + static_cast<int64_t>(r.ids.size()) >= max_pos) {
      r.finish_reason = "max_positions";
      break;
    }
    TRAIND_RETURN_IF_ERROR(dec->Step(next, &logits));
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // The continuation as the difference of two decodes, so that a tokenizer which joins tokens
  // across the boundary (SentencePiece's leading space) decodes it as it reads after the prompt.
  std::vector<int32_t> all = r.prompt_ids;
  all.insert(all.end(), r.ids.begin(), r.ids.end());
  TRAIND_ASSIGN_OR_RETURN(std::string full, tok->Decode(all, /*skip_special_tokens=*/true));
  TRAIND_ASSIGN_OR_RETURN(std::string head, tok->Decode(r.prompt_ids, true));
  if (full.compare(0, head.size(), head) == 0) {
    r.text = ValidUtf8(full.substr(head.size()));
  } else {
    TRAIND_ASSIGN_OR_RETURN(std::string cont, tok->Decode(r.ids, true));
    r.text = ValidUtf8(cont);
  }
  return r;
}

}  // namespace traind::engine
