// LLaMA and Mixtral parameter table (also mistral's, qwen2's, qwen3's with q_norm/k_norm, and
// gemma's, whose norm weights start at zero): HF LlamaForCausalLM / MixtralForCausalLM names
// (the same attention; mixtral's MLP is block_sparse_moe), RMSNorm weights, no biases, GQA
// (k/v_proj have NKV*HS rows), q/k/v_proj contiguous so they form one fused (QKV, C) weight and
// gate_proj/up_proj contiguous (gate first) as one (2H, C) weight; lm_head only when untied.
#include <string>

#include "models/layout.h"

namespace traind::engine {

ParamTable LlamaParams(const ArchDims& d) {
  ParamTable t;
  const int64_t C = d.C;
  const int64_t KV = d.NKV * d.HS;
  const ParamExtra normal{false, false, InitKind::kNormal};
  const ParamExtra resid{false, false, InitKind::kNormalResidual};
  // The norms' weights: ones, or gemma's w of x * (1 + w): zeros (HF's GemmaRMSNorm init).
  const ParamExtra norm_w{false, false, d.norm_plus_one() ? InitKind::kZeros : InitKind::kOnes};
  const ParamExtra zeros{false, false, InitKind::kZeros};

  t.wte = t.Add("model.embed_tokens.weight", {d.Vp, C}, {d.V, C}, {false, true, InitKind::kNormal},
                true);
  for (int64_t l = 0; l < d.L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerParams lp;
    lp.ln1_w = t.Add(p + "input_layernorm.weight", {C}, {C}, norm_w, false);
    // q, k, v rows back to back: the fused qkv weight (QKV, C).
    lp.qkv_w =
        t.Add(p + "self_attn.q_proj.weight", {d.NH * d.HS, C}, {d.NH * d.HS, C}, normal, true);
    lp.fused_parts.push_back(t.Add(p + "self_attn.k_proj.weight", {KV, C}, {KV, C}, normal, true));
    lp.fused_parts.push_back(t.Add(p + "self_attn.v_proj.weight", {KV, C}, {KV, C}, normal, true));
    if (d.qkv_bias) {  // qwen2, llama attention_bias: q, k, v biases back to back (QKV)
      lp.qkv_b = t.Add(p + "self_attn.q_proj.bias", {d.NH * d.HS}, {d.NH * d.HS}, zeros, false);
      t.Add(p + "self_attn.k_proj.bias", {KV}, {KV}, zeros, false);
      t.Add(p + "self_attn.v_proj.bias", {KV}, {KV}, zeros, false);
    }
    if (d.qk_norm()) {  // qwen3: q_norm and k_norm (HS each), RMSNorm weights
      lp.q_norm = t.Add(p + "self_attn.q_norm.weight", {d.HS}, {d.HS}, norm_w, false);
      lp.k_norm = t.Add(p + "self_attn.k_norm.weight", {d.HS}, {d.HS}, norm_w, false);
    }
    lp.proj_w =
        t.Add(p + "self_attn.o_proj.weight", {C, d.NH * d.HS}, {C, d.NH * d.HS}, resid, true);
    if (d.proj_bias) lp.proj_b = t.Add(p + "self_attn.o_proj.bias", {C}, {C}, zeros, false);
    lp.ln2_w = t.Add(p + "post_attention_layernorm.weight", {C}, {C}, norm_w, false);
    if (d.moe()) {
      // mixtral's block_sparse_moe: the router (E, C) and E SwiGLU experts, each w1 (gate) and
      // w3 (up) back to back as one (2H, C) weight, and w2 (C, H).
      const std::string m = p + "block_sparse_moe.";
      lp.router_w = t.Add(m + "gate.weight", {d.E, C}, {d.E, C}, normal, true);
      for (int64_t e = 0; e < d.E; ++e) {
        const std::string x = m + "experts." + std::to_string(e) + ".";
        lp.expert_up.push_back(t.Add(x + "w1.weight", {d.H, C}, {d.H, C}, normal, true));
        lp.fused_parts.push_back(t.Add(x + "w3.weight", {d.H, C}, {d.H, C}, normal, true));
        lp.expert_down.push_back(t.Add(x + "w2.weight", {C, d.H}, {C, d.H}, resid, true));
      }
    } else {
      // gate rows then up rows: the fused (2H, C) weight SwiGluForward expects ([gate | up]).
      lp.up_w = t.Add(p + "mlp.gate_proj.weight", {d.H, C}, {d.H, C}, normal, true);
      lp.fused_parts.push_back(t.Add(p + "mlp.up_proj.weight", {d.H, C}, {d.H, C}, normal, true));
      lp.down_w = t.Add(p + "mlp.down_proj.weight", {C, d.H}, {C, d.H}, resid, true);
    }
    t.layers.push_back(lp);
  }
  t.lnf_w = t.Add("model.norm.weight", {C}, {C}, norm_w, false);
  if (d.tied) {
    t.lm_head = t.wte;
  } else {
    t.lm_head =
        t.Add("lm_head.weight", {d.Vp, C}, {d.V, C}, {false, true, InitKind::kNormal}, true);
  }
  return t;
}

}  // namespace traind::engine
