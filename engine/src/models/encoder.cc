// EncoderModel (bert): buffer plan, forward, backward (with block recomputation), init and HF
// conversion. See encoder.h for the math.
#include "models/encoder.h"

#include <algorithm>
#include <cassert>

#include "models/decoder.h"
#include "nn/attention.h"
#include "nn/cross_entropy.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/mlp.h"
#include "nn/norm.h"

namespace traind::engine {

void PlanEncoderBuffers(const ArchDims& d, const ModelOptions& o, int64_t num_params,
                        BufferPlanner* p, EncoderBuffers* b) {
  using MC = MemoryCategory;
  const int64_t B = o.micro_batch, T = o.seq_len, N = B * T, C = d.C;
  const CheckpointLayout cl = MakeCheckpointLayout(d, o);
  const DType t = o.compute_type;
  const bool mixed = t != DType::kF32;
  const bool cls = d.head == "sequence_classification";

  p->Add(MC::kWeights, num_params, &b->params);
  if (mixed) p->Add(MC::kWeights, num_params, t, &b->params16);
  p->Add(MC::kGradients, num_params, &b->grads);

  p->Add(MC::kActivations, N, &b->inputs);
  p->Add(MC::kActivations, N, &b->targets);
  p->Add(MC::kActivations, N, &b->mask);
  p->Add(MC::kActivations, N, &b->positions);
  p->Add(MC::kActivations, N * C, &b->emb);
  p->Add(MC::kActivations, N, &b->emb_mean);
  p->Add(MC::kActivations, N, &b->emb_rstd);
  b->res_store.assign(static_cast<size_t>(cl.residuals()), nullptr);
  for (float*& r : b->res_store) p->Add(MC::kActivations, N * C, &r);
  b->block_store.assign(static_cast<size_t>(cl.n_sets), EncoderBlockActs{});
  for (EncoderBlockActs& a : b->block_store) {
    if (mixed) p->Add(MC::kActivations, N * C, t, &a.x16);
    p->Add(MC::kActivations, N * 3 * C, t, &a.qkv);
    p->Add(MC::kActivations, N * C, &a.r1);
    p->Add(MC::kActivations, N, &a.ln1_mean);
    p->Add(MC::kActivations, N, &a.ln1_rstd);
    p->Add(MC::kActivations, N * C, &a.x1);
    if (mixed) p->Add(MC::kActivations, N * C, t, &a.x1_16);
    p->Add(MC::kActivations, N * d.H, &a.h);
    p->Add(MC::kActivations, N * d.H, t, &a.a);
    p->Add(MC::kActivations, N * C, &a.r2);
    p->Add(MC::kActivations, N, &a.ln2_mean);
    p->Add(MC::kActivations, N, &a.ln2_rstd);
  }
  b->atty_store.assign(static_cast<size_t>(d.L), nullptr);
  b->lse_store.assign(static_cast<size_t>(d.L), nullptr);
  for (int64_t l = 0; l < d.L; ++l) {
    p->Add(MC::kActivations, N * C, t, &b->atty_store[l]);
    p->Add(MC::kActivations, B * d.NH * T, &b->lse_store[l]);
  }
  if (cls) {
    p->Add(MC::kActivations, B * C, &b->pooled);
    b->logits_rows = B;
    b->logits_width = d.num_labels;
  } else {
    p->Add(MC::kActivations, N * C, &b->mlm_t);
    p->Add(MC::kActivations, N * C, &b->mlm_g);
    p->Add(MC::kActivations, N, &b->mlm_mean);
    p->Add(MC::kActivations, N, &b->mlm_rstd);
    p->Add(MC::kActivations, N * C, t, &b->mlm_u);
    b->logits_rows = LogitsChunkRows(d, o);
    b->logits_width = d.Vp;
  }
  p->Add(MC::kActivations, b->logits_rows * b->logits_width, &b->logits);
  p->Add(MC::kActivations, N, &b->losses);

  p->Add(MC::kTemporary, N * C, &b->dres);
  p->Add(MC::kTemporary, N * C, &b->tmp_c);
  p->Add(MC::kTemporary, N * C, &b->tmp_d);
  p->Add(MC::kTemporary, N * std::max(3 * C, d.H), &b->scratch_big);
  p->Add(MC::kTemporary, C, &b->pad_row);
  if (mixed) {
    // Every gradient entering a 16-bit GEMM (or the attention backward) fits whole (N rows of C,
    // 3C or H); the MLM logits gradient goes through in chunks of at least min(N, 512) rows
    // (nn::GemmPrecision).
    constexpr int64_t kMinLogitRows = 512;
    b->scratch16_elems = std::max({N * 3 * C, N * d.H});
    if (!cls) b->scratch16_elems = std::max(b->scratch16_elems, std::min(N, kMinLogitRows) * d.Vp);
    p->Add(MC::kTemporary, b->scratch16_elems, t, &b->scratch16);
    // With pack_weights (a cpu job), each layer input packed for its weight gradient, as the
    // decoder (the encoder keeps no packed weights: its GEMMs read them plain).
    if (const int64_t room = PackedActivationBytes(d, o); room > 0) {
      p->Add(MC::kTemporary, room / static_cast<int64_t>(DTypeSize(t)), t, &b->packed_activation);
    }
  }

  // Views, as the decoder's ResolveViews: res[l] is block l's input, res[L] the final state.
  b->res.assign(static_cast<size_t>(d.L + 1), nullptr);
  b->blocks.assign(static_cast<size_t>(d.L), EncoderBlockActs{});
}

namespace {

void ResolveEncoderViews(const ArchDims& d, const ModelOptions& o, EncoderBuffers* b) {
  const CheckpointLayout cl = MakeCheckpointLayout(d, o);
  for (int64_t l = 0; l <= d.L; ++l) b->res[l] = b->res_store[cl.ResidualSlot(l, d.L)];
  for (int64_t l = 0; l < d.L; ++l) {
    b->blocks[l] = b->block_store[cl.SetOf(l)];
    b->blocks[l].atty = b->atty_store[l];
    b->blocks[l].lse = b->lse_store[l];
  }
}

}  // namespace

EncoderModel::EncoderModel(const ModelConfig& config, const ModelOptions& options,
                           DeviceArena* arena)
    : config_(config),
      options_(options),
      d_(MakeArchDims(config)),
      table_(BuildParams(d_)),
      be_(arena->backend()),
      B_(options.micro_batch),
      T_(options.seq_len),
      N_(options.micro_batch * options.seq_len) {}

Result<std::unique_ptr<EncoderModel>> EncoderModel::Make(const ModelConfig& config,
                                                         const ModelOptions& options,
                                                         DeviceArena* arena) {
  std::unique_ptr<EncoderModel> m(new EncoderModel(config, options, arena));
  BufferPlanner planner;
  PlanEncoderBuffers(m->d_, options, m->table_.total, &planner, &m->bufs_);
  TRAIND_RETURN_IF_ERROR(planner.Allocate(arena));
  ResolveEncoderViews(m->d_, options, &m->bufs_);
  m->mixed_ = options.compute_type != DType::kF32;
  m->gp_ = nn::GemmPrecision{options.compute_type, m->bufs_.scratch16, m->bufs_.scratch16_elems,
                             m->bufs_.packed_activation, PackedActivationBytes(m->d_, options)};
  std::vector<int32_t> pos(static_cast<size_t>(m->N_)), ones(static_cast<size_t>(m->N_), 1);
  for (int64_t n = 0; n < m->N_; ++n) pos[n] = static_cast<int32_t>(n % options.seq_len);
  m->be_->CopyHostToDevice(m->bufs_.positions, pos.data(), pos.size() * sizeof(int32_t));
  // Until the caller writes one: every position is a real token.
  m->be_->CopyHostToDevice(m->bufs_.mask, ones.data(), ones.size() * sizeof(int32_t));
  return m;
}

void EncoderModel::InitRandom(uint64_t seed) {
  // Tensor by tensor through a bounded host buffer (as the decoder's).
  InitFlatParamsTo(d_, table_, seed, [this](int64_t offset, const float* v, int64_t n) {
    be_->CopyHostToDevice(bufs_.params + offset, v, static_cast<size_t>(n) * sizeof(float));
  });
  // nn.Embedding(padding_idx): the padding row starts at zero.
  const std::vector<float> zeros(static_cast<size_t>(d_.C), 0.0f);
  be_->CopyHostToDevice(bufs_.params + table_.wte + config_.pad_token_id * d_.C, zeros.data(),
                        zeros.size() * sizeof(float));
  be_->Synchronize();
  weights16_stale_ = true;
}

Status EncoderModel::LoadHf(const SafetensorsFile& file) {
  std::vector<float> host(static_cast<size_t>(table_.total), 0.0f);
  std::vector<size_t> missing;
  TRAIND_RETURN_IF_ERROR(HfToFlat(config_.arch, table_, file, host.data(), &missing));
  newly_initialized_.clear();
  if (!missing.empty()) {
    std::vector<float> init(static_cast<size_t>(table_.total), 0.0f);
    InitFlatParams(d_, table_, kHeadInitSeed, init.data());
    for (size_t i : missing) {
      const ParamInfo& info = table_.infos[i];
      std::copy_n(init.begin() + info.offset, info.numel, host.begin() + info.offset);
      newly_initialized_.push_back(info.hf_name);
    }
  }
  be_->CopyHostToDevice(bufs_.params, host.data(), host.size() * sizeof(float));
  be_->Synchronize();
  weights16_stale_ = true;
  return Status::Ok();
}

SafetensorsStream EncoderModel::StreamHf(size_t piece_bytes) {
  return StreamFlatToHf(be_, &table_, {bufs_.params, nullptr}, piece_bytes, nullptr);
}

void EncoderModel::ParamsChanged() {
  if (!mixed_) return;
  be_->Cast(bufs_.params16, options_.compute_type, bufs_.params, DType::kF32, table_.total);
  weights16_stale_ = false;
}

void EncoderModel::ZeroGrad() {
  be_->Memset0(bufs_.grads, static_cast<size_t>(table_.total) * sizeof(float));
}

const void* EncoderModel::W(int64_t offset) const {
  if (offset < 0) return nullptr;
  if (!mixed_) return bufs_.params + offset;
  return static_cast<const char*>(bufs_.params16) + offset * DTypeSize(options_.compute_type);
}

const void* EncoderModel::AsGemmInput(void* dst16, const float* src) {
  if (!mixed_) return src;
  be_->Cast(dst16, options_.compute_type, src, DType::kF32, N_ * d_.C);
  return dst16;
}

void EncoderModel::ForwardToHidden() {
  Backend& be = *be_;
  if (mixed_ && weights16_stale_) ParamsChanged();
  const nn::NormShape ns{N_, d_.C, false, d_.eps};
  nn::EmbeddingForward(be, bufs_.emb, bufs_.inputs, bufs_.positions, P(table_.wte), P(table_.wpe),
                       N_, d_.C);
  be.AddBias(bufs_.emb, P(table_.tte), N_, d_.C);  // token type 0 on every position
  nn::NormForward(be, ns, bufs_.res[0], bufs_.emb_mean, bufs_.emb_rstd, bufs_.emb,
                  P(table_.emb_ln_w), P(table_.emb_ln_b));
  for (int64_t l = 0; l < d_.L; ++l) BlockForward(l);
}

void EncoderModel::BlockForward(int64_t l, bool recompute) {
  Backend& be = *be_;
  const DType ct = options_.compute_type;
  const LayerParams& p = table_.layers[l];
  const EncoderBlockActs& a = bufs_.blocks[l];
  const float* x = bufs_.res[l];
  float* y = bufs_.res[l + 1];
  const int64_t C = d_.C;
  const nn::NormShape ns{N_, C, false, d_.eps};
  nn::AttentionShape as = AttentionShapeOf(d_, B_, T_);
  as.causal = false;
  as.key_mask = bufs_.mask;
  as.operand_type = options_.compute_type;
  nn::MlpShape ms{N_, C, d_.H, /*swiglu=*/false};
  ms.gelu_erf = true;
  const nn::MlpWeights mw{W(p.up_w), P(p.up_b), W(p.down_w), P(p.down_b)};

  const void* xin = AsGemmInput(a.x16, x);
  // 16 bits: the projection's fp32 output in scratch_big (free until the MLP), rounded into qkv;
  // attention reads it and writes atty in the compute type (Backend::AttentionForward16).
  float* qkv = mixed_ ? bufs_.scratch_big : static_cast<float*>(a.qkv);
  nn::LinearForward(be, qkv, xin, W(p.qkv_w), P(p.qkv_b), N_, C, 3 * C, ct);
  if (recompute) {  // a recompute finds atty and lse as the first forward left them
    if (mixed_) nn::AttentionRope16(be, as, qkv, a.qkv);  // no RoPE: the rounding
  } else if (mixed_) {
    nn::AttentionForward16(be, as, a.atty, a.lse, qkv, a.qkv);
  } else {
    nn::AttentionForward(be, as, static_cast<float*>(a.atty), a.lse, qkv);
  }
  nn::LinearForward(be, bufs_.tmp_c, a.atty, W(p.proj_w), P(p.proj_b), N_, C, C, ct);
  be.Add(a.r1, x, bufs_.tmp_c, N_ * C);
  nn::NormForward(be, ns, a.x1, a.ln1_mean, a.ln1_rstd, a.r1, P(p.ln1_w), P(p.ln1_b));
  const void* x1in = AsGemmInput(a.x1_16, a.x1);
  nn::MlpForward(be, ms, mw, bufs_.tmp_c, a.h, a.a, x1in, ct, bufs_.scratch_big);
  be.Add(a.r2, a.x1, bufs_.tmp_c, N_ * C);
  nn::NormForward(be, ns, y, a.ln2_mean, a.ln2_rstd, a.r2, P(p.ln2_w), P(p.ln2_b));
}

void EncoderModel::BlockBackward(int64_t l) {
  Backend& be = *be_;
  const LayerParams& p = table_.layers[l];
  const EncoderBlockActs& a = bufs_.blocks[l];
  const float* x = bufs_.res[l];
  const int64_t C = d_.C;
  const size_t nc_bytes = static_cast<size_t>(N_ * C) * sizeof(float);
  const nn::NormShape ns{N_, C, false, d_.eps};
  nn::AttentionShape as = AttentionShapeOf(d_, B_, T_);
  as.causal = false;
  as.key_mask = bufs_.mask;
  as.operand_type = options_.compute_type;
  nn::MlpShape ms{N_, C, d_.H, /*swiglu=*/false};
  ms.gelu_erf = true;
  const nn::MlpWeights mw{W(p.up_w), P(p.up_b), W(p.down_w), P(p.down_b)};
  const nn::MlpGrads mg{G(p.up_w), G(p.up_b), G(p.down_w), G(p.down_b)};
  const void* xin = mixed_ ? a.x16 : static_cast<const void*>(x);
  const void* x1in = mixed_ ? a.x1_16 : static_cast<const void*>(a.x1);
  float* dres = bufs_.dres;  // d(y) in, d(x) out
  float* dtmp = bufs_.tmp_c;
  float* dx1 = bufs_.tmp_d;
  float* dbig = bufs_.scratch_big;

  // y = LN2(r2): d r2 into dx1.
  be.Memset0(dx1, nc_bytes);
  nn::NormBackward(be, ns, dx1, G(p.ln2_w), G(p.ln2_b), dres, a.r2, P(p.ln2_w), a.ln2_mean,
                   a.ln2_rstd);
  // r2 = x1 + mlp(x1): d x1 = d r2 + the MLP's input gradient.
  nn::MlpBackward(be, ms, mw, mg, dtmp, dx1, a.h, a.a, x1in, dbig, dbig, gp_);
  be.Add(dx1, dx1, dtmp, N_ * C);
  // x1 = LN1(r1): d r1 into dres.
  be.Memset0(dres, nc_bytes);
  nn::NormBackward(be, ns, dres, G(p.ln1_w), G(p.ln1_b), dx1, a.r1, P(p.ln1_w), a.ln1_mean,
                   a.ln1_rstd);
  // r1 = x + proj(attn(qkv(x))): d x = d r1 + the attention path's input gradient.
  nn::LinearBackward(be, dtmp, G(p.proj_w), G(p.proj_b), dres, a.atty, W(p.proj_w), N_, C, C, gp_);
  if (mixed_) {  // the output gradient rounded into scratch16 (free until the qkv backward)
    be.Cast(bufs_.scratch16, options_.compute_type, dtmp, DType::kF32, N_ * C);
    nn::AttentionBackward16(be, as, dbig, bufs_.scratch16, a.atty, a.lse, a.qkv);
  } else {
    nn::AttentionBackward(be, as, dbig, dtmp, static_cast<const float*>(a.atty), a.lse,
                          static_cast<const float*>(a.qkv));
  }
  nn::LinearBackward(be, dtmp, G(p.qkv_w), G(p.qkv_b), dbig, xin, W(p.qkv_w), N_, C, 3 * C, gp_);
  be.Add(dres, dres, dtmp, N_ * C);
}

void EncoderModel::HeadAndLoss(bool for_backward, float grad_scale, const float* device_scale) {
  Backend& be = *be_;
  const int64_t C = d_.C;
  const float* hidden = bufs_.res[d_.L];
  if (classifier()) {
    // pooled = tanh(hidden[b, 0] W_p^T + b_p): the first row of every sequence (stride T*C).
    be.Gemm(false, true, B_, C, C, 1.0f, hidden, T_ * C, P(table_.pool_w), C, 0.0f, bufs_.pooled,
            C);
    be.AddBias(bufs_.pooled, P(table_.pool_b), B_, C);
    be.TanhForward(bufs_.pooled, bufs_.pooled, B_ * C);
    nn::LinearForward(be, bufs_.logits, bufs_.pooled, P(table_.cls_w), P(table_.cls_b), B_, C,
                      d_.num_labels);
    // Labels are targets[0..B); dlogits stay in place for HeadBackward.
    be.SoftmaxCrossEntropy(bufs_.logits, bufs_.losses, bufs_.targets, B_, d_.num_labels,
                           d_.num_labels, grad_scale, for_backward, device_scale);
    return;
  }
  // masked_lm: u = LN(gelu(hidden W_t^T + b_t)), then the tied decoder in row chunks.
  const DType ct = options_.compute_type;
  const nn::NormShape ns{N_, C, false, d_.eps};
  nn::LinearForward(be, bufs_.mlm_t, hidden, P(table_.mlm_w), P(table_.mlm_b), N_, C, C);
  be.GeluErfForward(bufs_.mlm_g, bufs_.mlm_t, N_ * C);
  float* uf = mixed_ ? bufs_.tmp_d : static_cast<float*>(bufs_.mlm_u);
  nn::NormForward(be, ns, uf, bufs_.mlm_mean, bufs_.mlm_rstd, bufs_.mlm_g, P(table_.mlm_ln_w),
                  P(table_.mlm_ln_b));
  if (mixed_) be.Cast(bufs_.mlm_u, ct, uf, DType::kF32, N_ * C);
  const int64_t rows = bufs_.logits_rows;
  for (int64_t r0 = 0; r0 < N_; r0 += rows) {
    const int64_t n = std::min(rows, N_ - r0);
    const void* u = static_cast<const char*>(bufs_.mlm_u) + r0 * C * DTypeSize(ct);
    nn::LinearForward(be, bufs_.logits, u, W(table_.wte), P(table_.mlm_bias), n, C, d_.Vp, ct);
    be.SoftmaxCrossEntropy(bufs_.logits, bufs_.losses + r0, bufs_.targets + r0, n, d_.V, d_.Vp,
                           grad_scale, for_backward, device_scale);
    if (!for_backward) continue;
    // d u rows into tmp_c; the tied decoder's weight (wte) and bias gradients (+=).
    nn::LinearBackward(be, bufs_.tmp_c + r0 * C, G(table_.wte), G(table_.mlm_bias), bufs_.logits,
                       u, W(table_.wte), n, C, d_.Vp, gp_);
  }
}

void EncoderModel::HeadBackward() {
  Backend& be = *be_;
  const int64_t C = d_.C;
  const float* hidden = bufs_.res[d_.L];
  if (classifier()) {
    float* dpooled = bufs_.tmp_c;  // (B,C)
    nn::LinearBackward(be, dpooled, G(table_.cls_w), G(table_.cls_b), bufs_.logits, bufs_.pooled,
                       P(table_.cls_w), B_, C, d_.num_labels);
    be.TanhBackward(dpooled, bufs_.pooled, dpooled, B_ * C);
    // Only the first row of every sequence feeds the pooler.
    be.Memset0(bufs_.dres, static_cast<size_t>(N_ * C) * sizeof(float));
    be.Gemm(false, false, B_, C, C, 1.0f, dpooled, C, P(table_.pool_w), C, 0.0f, bufs_.dres,
            T_ * C);
    be.Gemm(true, false, C, C, B_, 1.0f, dpooled, C, hidden, T_ * C, 1.0f, G(table_.pool_w), C);
    be.BiasBackward(G(table_.pool_b), dpooled, B_, C);
    return;
  }
  const nn::NormShape ns{N_, C, false, d_.eps};
  float* dg = bufs_.tmp_d;
  be.Memset0(dg, static_cast<size_t>(N_ * C) * sizeof(float));
  nn::NormBackward(be, ns, dg, G(table_.mlm_ln_w), G(table_.mlm_ln_b), bufs_.tmp_c, bufs_.mlm_g,
                   P(table_.mlm_ln_w), bufs_.mlm_mean, bufs_.mlm_rstd);
  be.GeluErfBackward(dg, bufs_.mlm_t, dg, N_ * C);
  nn::LinearBackward(be, bufs_.dres, G(table_.mlm_w), G(table_.mlm_b), dg, hidden,
                     P(table_.mlm_w), N_, C, C);
}

double EncoderModel::Forward(bool for_backward, float grad_scale) {
  const int64_t n_valid = nn::CountValidTargets(*be_, bufs_.targets, N_, &host_targets_);
  ForwardToHidden();
  const float scale = n_valid > 0 ? grad_scale / static_cast<float>(n_valid) : 0.0f;
  HeadAndLoss(for_backward, scale, nullptr);
  ready_for_backward_ = for_backward;
  return nn::MeanLoss(*be_, bufs_.losses, classifier() ? B_ : N_, n_valid, &host_losses_);
}

void EncoderModel::ForwardOnDevice(const float* grad_scale, const float* loss_weight,
                                   double* loss_sum) {
  ForwardToHidden();
  HeadAndLoss(/*for_backward=*/true, 1.0f, grad_scale);
  be_->AccumulateSum(loss_sum, bufs_.losses, classifier() ? B_ : N_, loss_weight);
  ready_for_backward_ = true;
}

int64_t EncoderModel::CorrectPredictions() {
  if (!classifier()) return -1;
  const int64_t NL = d_.num_labels;
  std::vector<float> logits(static_cast<size_t>(B_ * NL));
  std::vector<int32_t> labels(static_cast<size_t>(B_));
  be_->CopyDeviceToHost(logits.data(), bufs_.logits, logits.size() * sizeof(float));
  be_->CopyDeviceToHost(labels.data(), bufs_.targets, labels.size() * sizeof(int32_t));
  be_->Synchronize();
  int64_t correct = 0;
  for (int64_t b = 0; b < B_; ++b) {
    if (labels[b] < 0) continue;
    const float* row = logits.data() + b * NL;
    const int64_t best = std::max_element(row, row + NL) - row;  // first maximum, as torch.argmax
    correct += best == labels[b] ? 1 : 0;
  }
  return correct;
}

void EncoderModel::Backward() {
  assert(ready_for_backward_ && "Backward() needs a Forward(for_backward=true) first");
  if (!ready_for_backward_) return;
  ready_for_backward_ = false;
  Backend& be = *be_;
  const int64_t C = d_.C;
  HeadBackward();
  BackwardBySegments(
      d_.L, options_, [this](int64_t l) { BlockForward(l, /*recompute=*/true); },
      [this](int64_t l) {
        BlockBackward(l);
        if (on_block_gradients_) on_block_gradients_(l);
      });
  // res[0] = LN(emb): d emb into tmp_d, then the three tables.
  const nn::NormShape ns{N_, C, false, d_.eps};
  float* demb = bufs_.tmp_d;
  be.Memset0(demb, static_cast<size_t>(N_ * C) * sizeof(float));
  nn::NormBackward(be, ns, demb, G(table_.emb_ln_w), G(table_.emb_ln_b), bufs_.dres, bufs_.emb,
                   P(table_.emb_ln_w), bufs_.emb_mean, bufs_.emb_rstd);
  // nn.Embedding(padding_idx): the lookup adds nothing to the padding row (the tied MLM decoder
  // may have): keep its gradient aside around the scatter-add.
  float* pad_grad = G(table_.wte) + config_.pad_token_id * C;
  const size_t row_bytes = static_cast<size_t>(C) * sizeof(float);
  be.CopyDeviceToDevice(bufs_.pad_row, pad_grad, row_bytes);
  be.EmbeddingBackward(G(table_.wte), demb, bufs_.inputs, N_, C);
  be.CopyDeviceToDevice(pad_grad, bufs_.pad_row, row_bytes);
  be.EmbeddingBackward(G(table_.wpe), demb, bufs_.positions, N_, C);
  be.BiasBackward(G(table_.tte), demb, N_, C);  // token type 0's row
}

}  // namespace traind::engine
