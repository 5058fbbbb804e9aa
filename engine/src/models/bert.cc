// BERT family parameter table: HF BertForSequenceClassification / BertForMaskedLM names, nn.Linear
// weights as stored (OC, C), query|key|value fused into one (3C, C) weight and (3C) bias, the MLM
// decoder tied to the word embeddings (its bias a (Vp) vector, V in files).
#include <string>

#include "models/layout.h"

namespace traind::engine {

ParamTable BertParams(const ArchDims& d) {
  ParamTable t;
  const int64_t C = d.C;
  // HF BertPreTrainedModel._init_weights: normal(0, initializer_range) for Linear and Embedding
  // weights (the padding row zeroed, in the model's init), zeros for biases, LayerNorm (1, 0); no
  // residual scaling.
  const ParamExtra normal{false, false, InitKind::kNormal};
  const ParamExtra zeros{false, false, InitKind::kZeros};
  const ParamExtra ones{false, false, InitKind::kOnes};
  ParamExtra head_normal = normal, head_zeros = zeros, head_ones = ones;
  head_normal.task_head = head_zeros.task_head = head_ones.task_head = true;

  t.wte = t.Add("bert.embeddings.word_embeddings.weight", {d.Vp, C}, {d.V, C},
                {false, true, InitKind::kNormal}, true);
  t.wpe = t.Add("bert.embeddings.position_embeddings.weight", {d.max_T, C}, {d.max_T, C}, normal,
                true);
  t.tte = t.Add("bert.embeddings.token_type_embeddings.weight", {d.type_vocab, C},
                {d.type_vocab, C}, normal, true);
  t.emb_ln_w = t.Add("bert.embeddings.LayerNorm.weight", {C}, {C}, ones, false);
  t.emb_ln_b = t.Add("bert.embeddings.LayerNorm.bias", {C}, {C}, zeros, false);
  for (int64_t l = 0; l < d.L; ++l) {
    const std::string p = "bert.encoder.layer." + std::to_string(l) + ".";
    LayerParams lp;
    lp.qkv_w = t.Add(p + "attention.self.query.weight", {C, C}, {C, C}, normal, true);
    t.Add(p + "attention.self.key.weight", {C, C}, {C, C}, normal, true);
    t.Add(p + "attention.self.value.weight", {C, C}, {C, C}, normal, true);
    lp.qkv_b = t.Add(p + "attention.self.query.bias", {C}, {C}, zeros, false);
    t.Add(p + "attention.self.key.bias", {C}, {C}, zeros, false);
    t.Add(p + "attention.self.value.bias", {C}, {C}, zeros, false);
    lp.proj_w = t.Add(p + "attention.output.dense.weight", {C, C}, {C, C}, normal, true);
    lp.proj_b = t.Add(p + "attention.output.dense.bias", {C}, {C}, zeros, false);
    lp.ln1_w = t.Add(p + "attention.output.LayerNorm.weight", {C}, {C}, ones, false);
    lp.ln1_b = t.Add(p + "attention.output.LayerNorm.bias", {C}, {C}, zeros, false);
    lp.up_w = t.Add(p + "intermediate.dense.weight", {d.H, C}, {d.H, C}, normal, true);
    lp.up_b = t.Add(p + "intermediate.dense.bias", {d.H}, {d.H}, zeros, false);
    lp.down_w = t.Add(p + "output.dense.weight", {C, d.H}, {C, d.H}, normal, true);
    lp.down_b = t.Add(p + "output.dense.bias", {C}, {C}, zeros, false);
    lp.ln2_w = t.Add(p + "output.LayerNorm.weight", {C}, {C}, ones, false);
    lp.ln2_b = t.Add(p + "output.LayerNorm.bias", {C}, {C}, zeros, false);
    t.layers.push_back(lp);
  }
  if (d.head == "sequence_classification") {
    t.pool_w = t.Add("bert.pooler.dense.weight", {C, C}, {C, C}, head_normal, true);
    t.pool_b = t.Add("bert.pooler.dense.bias", {C}, {C}, head_zeros, false);
    t.cls_w = t.Add("classifier.weight", {d.num_labels, C}, {d.num_labels, C}, head_normal, true);
    t.cls_b = t.Add("classifier.bias", {d.num_labels}, {d.num_labels}, head_zeros, false);
  } else {  // masked_lm
    t.mlm_w = t.Add("cls.predictions.transform.dense.weight", {C, C}, {C, C}, head_normal, true);
    t.mlm_b = t.Add("cls.predictions.transform.dense.bias", {C}, {C}, head_zeros, false);
    t.mlm_ln_w = t.Add("cls.predictions.transform.LayerNorm.weight", {C}, {C}, head_ones, false);
    t.mlm_ln_b = t.Add("cls.predictions.transform.LayerNorm.bias", {C}, {C}, head_zeros, false);
    ParamExtra bias = head_zeros;
    bias.vocab_rows = true;  // (Vp) here, (V) in files
    t.mlm_bias = t.Add("cls.predictions.bias", {d.Vp}, {d.V}, bias, false);
    t.lm_head = t.wte;
  }
  return t;
}

}  // namespace traind::engine
