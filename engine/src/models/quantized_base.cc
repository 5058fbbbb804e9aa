#include "models/quantized_base.h"

#include <algorithm>
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

}  // namespace traind::engine
