// GPT-2 family parameter table: HF GPT2LMHeadModel names, Conv1D weights transposed to (OC,C),
// tied wte/lm_head, learned positions, biases everywhere.
#include <string>

#include "models/layout.h"

namespace traind::engine {

ParamTable Gpt2Params(const ArchDims& d) {
  ParamTable t;
  const int64_t C = d.C;
  const ParamExtra normal{false, false, InitKind::kNormal};
  const ParamExtra conv{true, false, InitKind::kNormal};
  const ParamExtra conv_resid{true, false, InitKind::kNormalResidual};
  const ParamExtra zeros{false, false, InitKind::kZeros};
  const ParamExtra ones{false, false, InitKind::kOnes};

  t.wte =
      t.Add("transformer.wte.weight", {d.Vp, C}, {d.V, C}, {false, true, InitKind::kNormal}, true);
  t.wpe = t.Add("transformer.wpe.weight", {d.max_T, C}, {d.max_T, C}, normal, true);
  for (int64_t l = 0; l < d.L; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    LayerParams lp;
    lp.ln1_w = t.Add(p + "ln_1.weight", {C}, {C}, ones, false);
    lp.ln1_b = t.Add(p + "ln_1.bias", {C}, {C}, zeros, false);
    lp.qkv_w = t.Add(p + "attn.c_attn.weight", {3 * C, C}, {C, 3 * C}, conv, true);
    lp.qkv_b = t.Add(p + "attn.c_attn.bias", {3 * C}, {3 * C}, zeros, false);
    lp.proj_w = t.Add(p + "attn.c_proj.weight", {C, C}, {C, C}, conv_resid, true);
    lp.proj_b = t.Add(p + "attn.c_proj.bias", {C}, {C}, zeros, false);
    lp.ln2_w = t.Add(p + "ln_2.weight", {C}, {C}, ones, false);
    lp.ln2_b = t.Add(p + "ln_2.bias", {C}, {C}, zeros, false);
    lp.up_w = t.Add(p + "mlp.c_fc.weight", {d.H, C}, {C, d.H}, conv, true);
    lp.up_b = t.Add(p + "mlp.c_fc.bias", {d.H}, {d.H}, zeros, false);
    lp.down_w = t.Add(p + "mlp.c_proj.weight", {C, d.H}, {d.H, C}, conv_resid, true);
    lp.down_b = t.Add(p + "mlp.c_proj.bias", {C}, {C}, zeros, false);
    t.layers.push_back(lp);
  }
  t.lnf_w = t.Add("transformer.ln_f.weight", {C}, {C}, ones, false);
  t.lnf_b = t.Add("transformer.ln_f.bias", {C}, {C}, zeros, false);
  t.lm_head = t.wte;
  return t;
}

}  // namespace traind::engine
