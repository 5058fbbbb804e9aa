// Mixtral family parameter table: HF MixtralForCausalLM names. LLaMA's attention (RMSNorm, RoPE,
// GQA, no biases, q/k/v rows fused) and, in place of its MLP, block_sparse_moe: the router
// (gate, (E, C)) and E SwiGLU experts, each w1 (gate) and w3 (up) back to back as one (2H, C)
// weight and w2 (C, H).
#include <string>

#include "models/layout.h"

namespace traind::engine {

ParamTable MixtralParams(const ArchDims& d) {
  ParamTable t;
  const int64_t C = d.C;
  const int64_t KV = d.NKV * d.HS;
  const ParamExtra normal{false, false, InitKind::kNormal};
  const ParamExtra resid{false, false, InitKind::kNormalResidual};
  const ParamExtra ones{false, false, InitKind::kOnes};

  t.wte = t.Add("model.embed_tokens.weight", {d.Vp, C}, {d.V, C}, {false, true, InitKind::kNormal},
                true);
  for (int64_t l = 0; l < d.L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerParams lp;
    lp.ln1_w = t.Add(p + "input_layernorm.weight", {C}, {C}, ones, false);
    lp.qkv_w =
        t.Add(p + "self_attn.q_proj.weight", {d.NH * d.HS, C}, {d.NH * d.HS, C}, normal, true);
    t.Add(p + "self_attn.k_proj.weight", {KV, C}, {KV, C}, normal, true);
    t.Add(p + "self_attn.v_proj.weight", {KV, C}, {KV, C}, normal, true);
    lp.proj_w =
        t.Add(p + "self_attn.o_proj.weight", {C, d.NH * d.HS}, {C, d.NH * d.HS}, resid, true);
    lp.ln2_w = t.Add(p + "post_attention_layernorm.weight", {C}, {C}, ones, false);
    const std::string m = p + "block_sparse_moe.";
    lp.router_w = t.Add(m + "gate.weight", {d.E, C}, {d.E, C}, normal, true);
    for (int64_t e = 0; e < d.E; ++e) {
      const std::string x = m + "experts." + std::to_string(e) + ".";
      lp.expert_up.push_back(t.Add(x + "w1.weight", {d.H, C}, {d.H, C}, normal, true));
      t.Add(x + "w3.weight", {d.H, C}, {d.H, C}, normal, true);
      lp.expert_down.push_back(t.Add(x + "w2.weight", {C, d.H}, {C, d.H}, resid, true));
    }
    t.layers.push_back(lp);
  }
  t.lnf_w = t.Add("model.norm.weight", {C}, {C}, ones, false);
  if (d.tied) {
    t.lm_head = t.wte;
  } else {
    t.lm_head =
        t.Add("lm_head.weight", {d.Vp, C}, {d.V, C}, {false, true, InitKind::kNormal}, true);
  }
  return t;
}

}  // namespace traind::engine
