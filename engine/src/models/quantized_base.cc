#include "models/quantized_base.h"

#include <algorithm>
#include <map>
#include <set>

#include "backend/quant4.h"

namespace traind::engine {

std::vector<QuantizedTensor> QuantizedTensors(const ParamTable& table) {
  std::set<int64_t> linear;
  for (const LayerParams& l : table.layers) {
    if (l.router_w >= 0) return {};  // mixtral: its experts' 4-bit base is not planned
    for (int64_t w : {l.qkv_w, l.proj_w, l.up_w, l.down_w}) {
      if (w >= 0) linear.insert(w);
    }
    linear.insert(l.fused_parts.begin(), l.fused_parts.end());
  }
  std::vector<QuantizedTensor> out;
  for (const ParamInfo& p : table.infos) {
    if (linear.count(p.offset) != 0) out.push_back({p.offset, p.numel});
  }
  return out;
}

int64_t Quant4TensorBytes(int64_t n, bool double_quant) {
  const int64_t absmax = double_quant ? Quant4Blocks(n) + 4 * Quant4NestedBlocks(n) + 4 : 4 * Quant4Blocks(n);
  return Quant4Bytes(n) + absmax;
}

QuantizedBaseBytes QuantizedBasePlan(const ParamTable& table, bool double_quant) {
  QuantizedBaseBytes b;
  std::set<int64_t> mine;
  for (const QuantizedTensor& t : QuantizedTensors(table)) {
    b.elements += t.numel;
    b.quantized += Quant4TensorBytes(t.numel, double_quant);
    mine.insert(t.offset);
  }
  if (double_quant && b.elements > 0) b.quantized += 256 * 4;  // the nested code table
  for (const LayerParams& l : table.layers) {
    int64_t layer = 0;
    for (const ParamInfo& p : table.infos) {
      const bool in_layer = p.offset == l.qkv_w || p.offset == l.proj_w || p.offset == l.up_w ||
                            p.offset == l.down_w ||
                            std::find(l.fused_parts.begin(), l.fused_parts.end(), p.offset) !=
                                l.fused_parts.end();
      if (in_layer && mine.count(p.offset) != 0) layer += p.numel;
    }
    b.largest = std::max(b.largest, layer);
  }
  return b;
}

Quant4Layout MakeQuant4Layout(const ParamTable& table) {
  Quant4Layout q;
  std::map<int64_t, int64_t> layer_of;  // offset -> layer
  for (size_t l = 0; l < table.layers.size(); ++l) {
    const LayerParams& p = table.layers[l];
    for (int64_t w : {p.qkv_w, p.proj_w, p.up_w, p.down_w}) {
      if (w >= 0) layer_of[w] = static_cast<int64_t>(l);
    }
    for (int64_t w : p.fused_parts) layer_of[w] = static_cast<int64_t>(l);
  }
  std::vector<int64_t> scratch(table.layers.size(), 0);
  for (const QuantizedTensor& t : QuantizedTensors(table)) {
    Quant4Slot s;
    s.offset = t.offset;
    s.numel = t.numel;
    for (const ParamInfo& p : table.infos) {
      if (p.offset != t.offset) continue;
      s.rows = p.shape.empty() ? 1 : p.shape[0];
      s.cols = s.rows > 0 ? p.numel / s.rows : 0;
    }
    s.layer = layer_of.at(t.offset);
    s.codes = q.code_bytes;
    s.blocks = q.blocks;
    s.nested = q.nested_blocks;
    s.scratch = scratch[s.layer];
    scratch[s.layer] += t.numel;
    q.code_bytes += Quant4Bytes(t.numel);
    q.blocks += Quant4Blocks(t.numel);
    q.nested_blocks += Quant4NestedBlocks(t.numel);
    q.elements += t.numel;
    q.tensors.push_back(s);
  }
  for (int64_t n : scratch) q.largest = std::max(q.largest, n);
  return q;
}

const Quant4Slot* Quant4Layout::Find(int64_t offset) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), offset,
                             [](const Quant4Slot& s, int64_t at) { return s.offset < at; });
  return it != tensors.end() && it->offset == offset ? &*it : nullptr;
}

int64_t Quant4Layout::QuantizedBefore(int64_t offset) const {
  int64_t n = 0;
  for (const Quant4Slot& s : tensors) {
    if (s.offset >= offset) break;
    n += s.numel;
  }
  return n;
}

bool LookupReads16Bit(const ParamTable& table, const ModelOptions& o) {
  if (!o.quant4.enabled || o.compute_type == DType::kF32) return false;
  if (table.wte != 0 || table.lm_head == table.wte || table.wpe >= 0 || table.tte >= 0) return false;
  const ParamInfo& wte = table.infos.front();
  if (wte.shape.size() != 2 || wte.shape[1] % 2 != 0) return false;
  return !QuantizedTensors(table).empty();
}

std::vector<Fp32ResidentTensor> QLoraResidentTensors(const ParamTable& table, const ModelOptions& o) {
  std::vector<Fp32ResidentTensor> out;
  const bool drop = LookupReads16Bit(table, o);
  int64_t packed = 0;
  for (Fp32ResidentTensor t : Fp32ResidentTensors(table)) {
    if (drop && t.offset == table.wte) continue;
    t.packed = packed;
    packed += t.numel;
    out.push_back(t);
  }
  return out;
}

}  // namespace traind::engine
