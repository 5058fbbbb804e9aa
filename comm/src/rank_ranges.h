// The ranks' ranges of a flat buffer for the collectives with a count per rank
// (Communicator::ReduceScatterSumInPlace, AllGatherInPlace): shared by the Gloo and NCCL
// communicators, so both refuse the same bad counts with the same message.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "traind/engine/status.h"

namespace traind::comm {

struct RankRanges {
  std::vector<int64_t> offset;  // rank r's range starts at offset[r] (the counts before it)
  int64_t total = 0;            // the sum of the counts
};

// INVALID_ARGUMENT ("<what>: ...") unless `counts` holds one entry >= 0 per rank of `world`.
inline Result<RankRanges> CheckedRankRanges(const char* what,
                                                    const std::vector<int64_t>& counts, int world) {
  if (static_cast<int>(counts.size()) != world) {
    return Status::InvalidArgument(std::string(what) + ": " +
                                           std::to_string(counts.size()) +
                                           " counts for a world of " + std::to_string(world));
  }
  RankRanges ranges;
  ranges.offset.resize(counts.size());
  for (size_t r = 0; r < counts.size(); ++r) {
    if (counts[r] < 0) {
      return Status::InvalidArgument(std::string(what) + ": rank " + std::to_string(r) +
                                             "'s count " + std::to_string(counts[r]) +
                                             " is negative");
    }
    ranges.offset[r] = ranges.total;
    ranges.total += counts[r];
  }
  return ranges;
}

}  // namespace traind::comm
