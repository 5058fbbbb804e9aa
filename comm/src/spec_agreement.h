// What the ranks of one world must agree on (JOBSPEC.md "Batching semantics": ranks meet at
// master_addr:master_port, and ranks whose specs disagree on what must agree fail at start naming
// the field). Each rank publishes its spec's agreement document in the rendezvous store; every
// rank compares each joined rank's document with rank 0's (rendezvous.cc). Private to comm/.
#pragma once

#include <string>
#include <vector>

#include "traind/engine/job_spec.h"
#include "traind/engine/status.h"

namespace traind::comm {

// One field of the agreement: its spec path ("training.learning_rate"), the value as messages show
// it, and what is compared (the value itself, or a path's contents identity).
struct AgreedField {
  std::string path;
  std::string shown;
  std::string compared;
};

// Every field of the canonical spec (engine::JobSpecToJson: a field it writes is compared), in its
// order, but those that may differ between ranks: name, output_dir (rank 0 alone writes it),
// training.overwrite_output_dir, training.offload_dir (each rank's own store), and
// distributed.{rank, world_size, master_addr, master_port} (the world size is checked at the
// rank's claim, resolved from the environment; the address is where they met). Path fields
// (data.train_file, data.tokenizer, model.init_from, training.resume_from_checkpoint) are compared
// by their contents' identity when the path exists (a file: its size and an FNV-1a hash of its
// first, middle and last MiB; a folder: the same for each of its top-level files, by name), so
// machines that mount the same data at different paths agree; otherwise by the value. Reads at
// most 3 MiB of each file.
std::vector<AgreedField> FieldsRanksMustAgree(const engine::JobSpec& spec);

// The document a rank publishes: its job's name (for messages only) and its fields. One JSON text.
std::string EncodeAgreement(const std::string& job_name, const std::vector<AgreedField>& fields);

// The first disagreement between rank `r`'s document and rank 0's, as the message the ranks fail
// with: "distributed: rank 1's training.learning_rate 0.001 disagrees with rank 0's 0.0003". Empty
// when they agree. A document that does not decode is a disagreement too (it names the rank).
std::string FirstDisagreement(int r, const std::string& theirs, const std::string& rank0s);

// The job name in a document ("" when it has none or does not decode).
std::string AgreementJobName(const std::string& document);

}  // namespace traind::comm
