// training.sample_every: samples from the model in training (see sampler.h).
#include "train/sampler.h"

#include <algorithm>
#include <random>

#include "train/session.h"
#include "traind/engine/generate.h"

namespace traind::engine {
namespace {

constexpr int64_t kSampleMaxLength = 80;
constexpr int64_t kSamplePromptMax = 16;
constexpr double kSampleTemperature = 0.8;

}  // namespace

int64_t SampleLength(const ModelConfig& config) {
  return std::min<int64_t>(config.max_positions(), kSampleMaxLength);
}

MemoryBytes SamplerPlanBytes(const ModelConfig& config, const TrainingSpec& training, DType gemm_type) {
  if (training.sample_every <= 0) return MemoryBytes{};
  return KvDecoder::PlanBytes(config, SampleLength(config), gemm_type);
}

Status SetUpSampler(const JobSpec& spec, const ModelConfig& config, const TokenStream& train_tokens,
                    DeviceObjects* d) {
  if (spec.training.sample_every <= 0) return Status::Ok();
  auto sampler = std::make_unique<TrainingSampler>();
  const int64_t len = SampleLength(config);
  TRAIND_ASSIGN_OR_RETURN(sampler->decoder,
                          KvDecoder::Create(config, d->model->InferenceWeights(), len,
                                            d->arena.get()));
  if (spec.data.format != "tokens") {
    TRAIND_ASSIGN_OR_RETURN(sampler->tokenizer,
                            DefaultTokenizerFactory().Open(
                                spec.data.tokenizer, spec.model.init_from.value_or("")));
  }
  const int64_t n = std::min(std::min(kSamplePromptMax, std::max<int64_t>(len / 4, 1)),
                             static_cast<int64_t>(train_tokens.size()));
  for (int64_t i = 0; i < n; ++i) sampler->prompt.push_back(train_tokens[i]);
  d->sampler = std::move(sampler);
  return Status::Ok();
}

Status SampleNow(const RunRequest& r, TrainingSampler* sm, int64_t step) {
  if (sm == nullptr || r.callbacks->on_sample == nullptr) return Status::Ok();
  KvDecoder& dec = *sm->decoder;
  dec.Reset();
  GenerateOptions o;
  o.temperature = kSampleTemperature;
  std::mt19937_64 rng(static_cast<uint64_t>(r.spec.training.seed) * 0x9E3779B97F4A7C15ull ^
                      static_cast<uint64_t>(step));
  const int64_t vocab = sm->tokenizer != nullptr
                            ? std::min<int64_t>(dec.vocab_size(), sm->tokenizer->vocab_size())
                            : dec.vocab_size();
  std::vector<float> logits;
  for (int32_t id : sm->prompt) TRAIND_RETURN_IF_ERROR(dec.Step(id, &logits));
  SampleReport report;
  report.step = step;
  report.prompt_ids = sm->prompt;
  while (dec.length() < dec.max_len()) {
    const int32_t next = SampleToken(logits, vocab, o, &rng);
    report.ids.push_back(next);
    if (sm->tokenizer != nullptr && sm->tokenizer->eos_id() && next == *sm->tokenizer->eos_id()) {
      break;
    }
    if (dec.length() + 1 >= dec.max_len()) break;
    TRAIND_RETURN_IF_ERROR(dec.Step(next, &logits));
  }
  if (sm->tokenizer != nullptr) {
    Result<std::string> p = sm->tokenizer->Decode(report.prompt_ids, true);
    Result<std::string> t = sm->tokenizer->Decode(report.ids, true);
    if (p.ok()) report.prompt = ValidUtf8(*p);
    if (t.ok()) report.text = ValidUtf8(*t);
  }
  r.callbacks->on_sample(report);
  return Status::Ok();
}

}  // namespace traind::engine
