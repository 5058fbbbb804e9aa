// Best-fit decreasing packing: see packing.h.
#include "data/packing.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <utility>

namespace traind::engine {

std::vector<std::vector<int64_t>> PackBestFitDecreasing(const std::vector<int64_t>& sizes,
                                                        int64_t capacity) {
  std::vector<int64_t> order(sizes.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return sizes[a] > sizes[b]; });
  std::vector<std::vector<int64_t>> rows;
  // Open rows by (room left, row index): lower_bound({size, 0}) is the best fit, the earliest row
  // among equals.
  std::set<std::pair<int64_t, int64_t>> open;
  for (int64_t i : order) {
    const int64_t size = std::clamp<int64_t>(sizes[i], 1, capacity);
    auto it = open.lower_bound({size, 0});
    int64_t row;
    int64_t room;
    if (it == open.end()) {
      row = static_cast<int64_t>(rows.size());
      rows.emplace_back();
      room = capacity;
    } else {
      row = it->second;
      room = it->first;
      open.erase(it);
    }
    rows[static_cast<size_t>(row)].push_back(i);
    if (room - size > 0) open.insert({room - size, row});
  }
  for (std::vector<int64_t>& r : rows) std::sort(r.begin(), r.end());
  return rows;
}

}  // namespace traind::engine
