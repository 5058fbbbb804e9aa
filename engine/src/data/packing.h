// Packing of instruction examples into rows (JOBSPEC.md data.packing, as TRL's SFTTrainer
// packing_strategy "bfd"): best-fit decreasing. Examples are taken longest first (equal sizes in
// file order); each goes into the open row with the least room that still holds it (equal room:
// the row opened first), else into a new row. An example is never split (the caller truncates it
// to the row first). Rows are numbered in the order they were opened; each row lists its examples
// in file order. Deterministic: the same sizes give the same rows.
#pragma once

#include <cstdint>
#include <vector>

namespace traind::engine {

// sizes[i]: the positions example i takes (1 <= sizes[i] <= capacity). Returns the rows, each the
// ascending indices of its examples; every index appears in exactly one row.
std::vector<std::vector<int64_t>> PackBestFitDecreasing(const std::vector<int64_t>& sizes,
                                                        int64_t capacity);

}  // namespace traind::engine
