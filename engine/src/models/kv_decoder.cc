// KvDecoder: one token through the decoder blocks against the key/value cache (see kv_decoder.h).
#include "models/kv_decoder.h"
#include "models/moe_routing.h"

#include <algorithm>
#include <string>
#include <vector>

#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/mlp.h"
#include "nn/norm.h"

namespace traind::engine {
namespace {

struct Sizes {
  int64_t cache, x, ln, stats, qkv, att, tmp, h, a, logits, router, expert_out, in16, act;
  int64_t plus_one = 0;  // gemma: one norm's 1 + w, then C ones
};

Sizes SizesOf(const ArchDims& d, int64_t max_len, DType gemm_type) {
  Sizes s;
  const bool w16 = gemm_type != DType::kF32;
  // The widest GEMM input (C, NH*HS or H elements of 2 bytes), in floats.
  s.in16 = w16 ? (std::max({d.C, d.NH * d.HS, d.H}) + 1) / 2 : 0;
  s.act = w16 ? d.H : 0;
  s.cache = d.L * max_len * 2 * d.NKV * d.HS;
  s.x = d.C;
  s.ln = d.C;
  s.stats = 2;
  s.qkv = d.qkv_width();
  s.att = d.NH * d.HS;
  s.tmp = d.C;
  s.h = d.up_width();
  s.a = d.H;
  s.logits = d.Vp;
  s.router = d.moe() ? d.E : 0;      // mixtral: the router's logits
  s.expert_out = d.moe() ? d.C : 0;  // one expert's output before its weight
  s.plus_one = d.norm_plus_one() ? 2 * d.C : 0;
  return s;
}

// Every buffer rounded to 64 floats, as one allocation per kind (cache: kActivations).
int64_t Round64(int64_t n) { return (n + 63) / 64 * 64; }
int64_t WorkFloats(const Sizes& s) {
  return Round64(s.x) + Round64(s.ln) + Round64(s.stats) + Round64(s.qkv) + Round64(s.att) +
         Round64(s.tmp) + Round64(s.h) + Round64(s.a) + Round64(s.logits) + Round64(s.router) +
         Round64(s.expert_out) + Round64(s.in16) + Round64(s.act) + Round64(s.plus_one);
}

}  // namespace

KvDecoder::KvDecoder(const ModelConfig& config, KvWeights weights, int64_t max_len, Backend* be)
    : d_(MakeArchDims(config)), table_(BuildParams(d_)), w_(std::move(weights)), max_len_(max_len),
      be_(be) {}

MemoryBytes KvDecoder::PlanBytes(const ModelConfig& config, int64_t max_len, DType gemm_type) {
  const ArchDims d = MakeArchDims(config);
  const Sizes s = SizesOf(d, max_len, gemm_type);
  MemoryBytes b;
  b.activations = s.cache * static_cast<int64_t>(sizeof(float));
  b.temporary = (WorkFloats(s) + 64) * static_cast<int64_t>(sizeof(float));
  return b;
}

Result<std::unique_ptr<KvDecoder>> KvDecoder::Create(const ModelConfig& config,
                                                     const float* params, int64_t max_len,
                                                     DeviceArena* arena) {
  return Create(config, KvWeights::Flat(params), max_len, arena);
}

Result<std::unique_ptr<KvDecoder>> KvDecoder::Create(const ModelConfig& config, KvWeights weights,
                                                     int64_t max_len, DeviceArena* arena) {
  const DType gemm_type = weights.gemm_type;
  std::unique_ptr<KvDecoder> k(new KvDecoder(config, std::move(weights), max_len, arena->backend()));
  const ArchDims& d = k->d_;
  if (!d.family->generation || !d.f().causal || !d.f().pre_ln) {
    return Status::InvalidArgument("generation needs a causal pre-norm decoder (gpt2, llama); " +
                                   std::string(ArchName(config.arch)) + " is not one");
  }
  if (max_len < 1 || max_len > d.max_T) {
    return Status::InvalidArgument("generation length " + std::to_string(max_len) +
                                   " outside [1, " + std::to_string(d.max_T) +
                                   "] (the model's max positions)");
  }
  const Sizes s = SizesOf(d, max_len, gemm_type);
  TRAIND_ASSIGN_OR_RETURN(void* cache, arena->Allocate(MemoryCategory::kActivations,
                                                       s.cache * 4, "key/value cache"));
  TRAIND_ASSIGN_OR_RETURN(void* work, arena->Allocate(MemoryCategory::kTemporary,
                                                      (WorkFloats(s) + 64) * 4,
                                                      "generation buffers"));
  k->cache_ = static_cast<float*>(cache);
  float* p = static_cast<float*>(work);
  auto take = [&p](int64_t n) {
    float* r = p;
    p += Round64(n);
    return r;
  };
  k->x_ = take(s.x);
  k->ln_ = take(s.ln);
  k->mean_ = take(s.stats);
  k->rstd_ = k->mean_ + 1;
  k->qkv_ = take(s.qkv);
  k->att_ = take(s.att);
  k->tmp_ = take(s.tmp);
  k->h_ = take(s.h);
  k->a_ = take(s.a);
  k->logits_ = take(s.logits);
  k->router_ = take(s.router);
  k->expert_out_ = take(s.expert_out);
  if (s.in16 > 0) k->in16_ = take(s.in16);
  if (s.act > 0) k->act_ = take(s.act);
  if (s.plus_one > 0) {
    k->plus_one_ = take(s.plus_one);
    const std::vector<float> ones(static_cast<size_t>(d.C), 1.0f);
    k->be_->CopyHostToDevice(k->plus_one_ + d.C, ones.data(), ones.size() * sizeof(float));
  }
  k->ids_ = reinterpret_cast<int32_t*>(p);  // the 64 floats past the work buffers
  return k;
}

const float* KvDecoder::NormW(int64_t offset) {
  if (plus_one_ == nullptr) return P(offset);
  be_->Add(plus_one_, P(offset), plus_one_ + d_.C, d_.C);  // gemma: 1 + w, as HF in fp32
  return plus_one_;
}

const void* KvDecoder::In(const float* x, int64_t n) {
  if (w_.gemm_type == DType::kF32) return x;
  be_->Cast(in16_, w_.gemm_type, x, DType::kF32, n);
  return in16_;
}

Status KvDecoder::Step(int32_t token, std::vector<float>* logits) {
  if (length_ >= max_len_) {
    return Status::FailedPrecondition("the key/value cache is full (" + std::to_string(max_len_) +
                                      " positions)");
  }
  if (token < 0 || token >= d_.V) {
    return Status::InvalidArgument("token id " + std::to_string(token) +
                                   " outside the model's vocabulary [0, " + std::to_string(d_.V) +
                                   ")");
  }
  Backend& be = *be_;
  const int64_t t = length_;
  const int64_t C = d_.C, kvw = 2 * d_.NKV * d_.HS, qkvw = d_.qkv_width();
  const int32_t ids[2] = {token, static_cast<int32_t>(t)};
  be.CopyHostToDevice(ids_, ids, sizeof(ids));
  nn::EmbeddingForward(be, x_, ids_, d_.rotary() ? nullptr : ids_ + 1, P(table_.wte),
                       P(table_.wpe), 1, C);
  if (d_.f().embed_scale) be.Scale(x_, EmbedScale(d_), C);
  const nn::NormShape ns{1, C, d_.rms_norm(), d_.eps};
  nn::MlpShape ms{1, C, d_.H, d_.swiglu()};
  ms.geglu = d_.geglu();
  const DType ct = w_.gemm_type;
  for (int64_t l = 0; l < d_.L; ++l) {
    const LayerParams& lp = table_.layers[l];
    float* cache = cache_ + l * max_len_ * kvw;
    nn::NormForward(be, ns, ln_, mean_, rstd_, x_, NormW(lp.ln1_w), P(lp.ln1_b));
    nn::LinearForward(be, qkv_, In(ln_, C), W(lp.qkv_w), P(lp.qkv_b), 1, C, qkvw, ct);
    if (d_.qk_norm()) {  // qwen3: each head of q and k normalised before RoPE
      be.HeadRmsNormForward(qkv_, nullptr, nullptr, P(lp.q_norm), 1, d_.NH, d_.HS, qkvw, d_.eps);
      be.HeadRmsNormForward(qkv_ + d_.NH * d_.HS, nullptr, nullptr, P(lp.k_norm), 1, d_.NKV,
                            d_.HS, qkvw, d_.eps);
    }
    if (d_.rotary()) {  // q's and k's heads are adjacent: one call rotates both
      be.Rope(qkv_, 1, 1, d_.NH + d_.NKV, d_.HS, qkvw, d_.rope_theta, false, t, d_.rope_scaling);
    }
    // The row's k | v (contiguous after q) become cache row t.
    be.CopyDeviceToDevice(cache + t * kvw, qkv_ + d_.NH * d_.HS, kvw * sizeof(float));
    be.AttentionDecode(att_, qkv_, cache, cache + d_.NKV * d_.HS, 1, t + 1, max_len_, d_.NH,
                       d_.NKV, d_.HS, qkvw, kvw, d_.window);
    nn::LinearForward(be, tmp_, In(att_, d_.NH * d_.HS), W(lp.proj_w), P(lp.proj_b), 1, d_.NH * d_.HS, C, ct);
    be.Add(x_, x_, tmp_, C);
    nn::NormForward(be, ns, ln_, mean_, rstd_, x_, NormW(lp.ln2_w), P(lp.ln2_b));
    if (d_.moe()) {
      TRAIND_RETURN_IF_ERROR(MoeStep(lp));
    } else {
      const nn::MlpWeights mw{W(lp.up_w), P(lp.up_b), W(lp.down_w), P(lp.down_b)};
      nn::MlpForward(be, ms, mw, tmp_, h_, a_, In(ln_, C), ct, act_);
    }
    be.Add(x_, x_, tmp_, C);
  }
  nn::NormForward(be, ns, ln_, mean_, rstd_, x_, NormW(table_.lnf_w), P(table_.lnf_b));
  nn::LinearForward(be, logits_, In(ln_, C), W(table_.lm_head), nullptr, 1, C, d_.Vp, ct);
  logits->resize(static_cast<size_t>(d_.V));
  be.CopyDeviceToHost(logits->data(), logits_, static_cast<size_t>(d_.V) * sizeof(float));
  be.Synchronize();
  TRAIND_RETURN_IF_ERROR(be.status());
  ++length_;
  return Status::Ok();
}

Status KvDecoder::MoeStep(const LayerParams& lp) {
  Backend& be = *be_;
  const int64_t C = d_.C, H = d_.H, E = d_.E, K = d_.K;
  const DType ct = w_.gemm_type;
  nn::LinearForward(be, router_, In(ln_, C), W(lp.router_w), nullptr, 1, C, E, ct);
  std::vector<float> logits(static_cast<size_t>(E)), probs(static_cast<size_t>(E));
  std::vector<float> weights(static_cast<size_t>(K));
  std::vector<int32_t> experts(static_cast<size_t>(K)), order;
  be.CopyDeviceToHost(logits.data(), router_, logits.size() * sizeof(float));
  be.Synchronize();
  TRAIND_RETURN_IF_ERROR(be.status());
  RouteToken(logits.data(), E, K, probs.data(), experts.data(), weights.data(), &order);
  be.Memset0(tmp_, static_cast<size_t>(C) * sizeof(float));
  for (int64_t j = 0; j < K; ++j) {
    const int32_t e = experts[j];
    nn::LinearForward(be, h_, In(ln_, C), W(lp.expert_up[e]), nullptr, 1, C, 2 * H, ct);
    be.SwiGluForward(a_, h_, 1, H);
    nn::LinearForward(be, expert_out_, In(a_, H), W(lp.expert_down[e]), nullptr, 1, H, C, ct);
    be.Scale(expert_out_, weights[j], C);
    be.Add(tmp_, tmp_, expert_out_, C);
  }
  return Status::Ok();
}

}  // namespace traind::engine
