// The LoRA adapter table (see lora.h).
#include "models/lora.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace traind::engine {
namespace {

std::string Join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// "transformer.h.0.attn.c_attn.weight" -> "c_attn"
std::string ModuleShortName(const std::string& hf_name) {
  std::string m = hf_name.substr(0, hf_name.size() - std::string(".weight").size());
  return m.substr(m.rfind('.') + 1);
}

}  // namespace

const std::vector<std::string>& DefaultLoraTargets(Arch arch) {
  return FamilyOf(arch).lora_default_targets;
}

const std::vector<std::string>& LoraModuleNames(Arch arch) { return FamilyOf(arch).lora_modules; }

Status ValidateLora(Arch arch, const LoraOptions& o, DType compute_type) {
  if (!o.enabled()) return Status::Ok();
  const std::vector<std::string>& known = LoraModuleNames(arch);
  const std::string name = ArchName(arch);
  if (known.empty()) {
    return Status::InvalidArgument("training.peft: LoRA is not built for model.arch " + name);
  }
  for (size_t i = 0; i < o.targets.size(); ++i) {
    if (std::find(known.begin(), known.end(), o.targets[i]) == known.end()) {
      return Status::InvalidArgument("training.peft.target_modules[" + std::to_string(i) +
                                     "]: '" + o.targets[i] + "' is not a " + name +
                                     " module (known: " + Join(known) + ")");
    }
  }
  if (!(o.alpha > 0)) return Status::InvalidArgument("training.peft.lora_alpha: must be > 0");
  if (!(o.dropout >= 0 && o.dropout < 1)) {
    return Status::InvalidArgument("training.peft.lora_dropout: must be in [0, 1)");
  }
  if (compute_type != DType::kF32 && compute_type != DType::kBF16 && compute_type != DType::kF16) {
    return Status::InvalidArgument("training.peft: LoRA needs an fp32, bf16 or fp16 compute type");
  }
  return Status::Ok();
}

LoraTable BuildLoraTable(const ArchDims& d, const ParamTable& base, const LoraOptions& o) {
  LoraTable t;
  if (!o.enabled()) return t;
  t.r = o.r;
  t.scale = static_cast<float>(o.alpha / static_cast<double>(o.r));
  t.targets = o.targets.empty() ? d.family->lora_default_targets : o.targets;
  std::map<int64_t, size_t> by_offset;
  for (size_t i = 0; i < base.infos.size(); ++i) by_offset[base.infos[i].offset] = i;
  auto add = [&t](const std::string& name, std::vector<int64_t> shape) {
    ParamInfo info;
    info.hf_name = name;
    info.numel = shape[0] * shape[1];
    info.shape = shape;
    info.hf_shape = shape;
    info.offset = t.total;
    info.weight_decay = true;  // 2-D weights (the HF Trainer decays them)
    t.total += info.numel;
    t.infos.push_back(std::move(info));
    return t.infos.back().offset;
  };
  for (int64_t l = 0; l < d.L; ++l) {
    const LayerParams& lp = base.layers[l];
    struct Site {
      LoraSiteKind kind;
      int64_t w, rows, in;
    };
    const Site sites[] = {{LoraSiteKind::kQkv, lp.qkv_w, d.qkv_width(), d.C},
                          {LoraSiteKind::kProj, lp.proj_w, d.C, d.NH * d.HS},
                          {LoraSiteKind::kUp, lp.up_w, d.up_width(), d.C},
                          {LoraSiteKind::kDown, lp.down_w, d.C, d.H}};
    int64_t n_layer = 0;
    for (const Site& s : sites) {
      // The HF tensors that make up the fused weight, in row order.
      for (auto it = by_offset.find(s.w); it != by_offset.end() && it->first < s.w + s.rows * s.in;
           ++it) {
        const ParamInfo& info = base.infos[it->second];
        const std::string name = ModuleShortName(info.hf_name);
        if (std::find(t.targets.begin(), t.targets.end(), name) == t.targets.end()) continue;
        const std::string module = info.hf_name.substr(0, info.hf_name.size() - 7);
        LoraAdapterEntry e;
        e.layer = l;
        e.site = s.kind;
        e.in = s.in;
        e.out = info.shape[0];
        e.col = (info.offset - s.w) / s.in;
        e.base_w = s.w;
        e.base_in = s.in;
        e.a_off = add("base_model.model." + module + ".lora_A.weight", {t.r, e.in});
        e.b_off = add("base_model.model." + module + ".lora_B.weight", {e.out, t.r});
        t.adapters.push_back(e);
        t.max_in = std::max(t.max_in, e.in);
        ++n_layer;
      }
    }
    t.per_layer = n_layer;
  }
  return t;
}

}  // namespace traind::engine
