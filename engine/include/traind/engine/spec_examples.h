// The training examples of a job spec as the job sees them (`trainctl tokenize --spec`,
// docs/cli.md): text, ids and HF labels (-100: no loss), before packing, in file
// order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "traind/engine/job_spec.h"
#include "traind/engine/status.h"

namespace traind::engine {

struct SpecExample {
  std::string text;
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;  // one per id; -100 where the token carries no loss
};

// The first `n` training examples of `spec` (causal families): prompt-completion and
// conversational jsonl lines (JOBSPEC.md "Instruction data") truncated to seq_len + 1 ids (the
// last one only a target), or for stream data (text, tokens, jsonl text) the first windows of
// seq_len + 1 tokens (every token but the first carries loss). Errors as the job's data loading.
Result<std::vector<SpecExample>> SpecTrainingExamples(const JobSpec& spec, int64_t n);

}  // namespace traind::engine
