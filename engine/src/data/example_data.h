// Example data for the encoder families (bert): fixed-length examples with an attention mask
// instead of next-token windows (JOBSPEC.md data.label_field, model.head).
//
// - sequence_classification: data.format jsonl, each line an object with data.text_field (a
//   string) and data.label_field (an integer in [0, num_labels), or a label name of the config's
//   id2label, "LABEL_<i>" when it names none). Each text is encoded with the tokenizer's
//   post-processor (WordPiece/BERT: [CLS] tokens [SEP]; byte: no specials), truncated as HF does
//   (the text's tokens cut so that the specials still fit: the final [SEP] is kept), right-padded
//   to seq_len with the pad id (the tokenizer's, else config pad_token_id) and a mask of 1 for
//   real tokens, 0 for padding.
// - masked_lm: format text or tokens: the token stream (LoadTokenData's, memory-mapped) cut into
//   examples of seq_len tokens with stride seq_len, mask all ones (HF run_mlm's group_texts);
//   format jsonl: each line one padded example as above (run_mlm's line_by_line). Masking as HF's
//   DataCollatorForLanguageModeling (mlm_probability 0.15): every position that is real (mask 1)
//   and not a special token (the tokenizer's special tokens: [CLS] [SEP] [PAD] [UNK] [MASK]; the
//   pad id) is selected with probability 0.15; a selected position becomes the mask id with
//   probability 0.8, a uniformly random id in [0, vocab_size) with 0.1, and stays with 0.1; its
//   target is the original id (-1 everywhere else). The draws are a counter-based hash of (seed,
//   epoch, example index in its set, position) (MlmDraws), so any run that reaches an example in
//   the same epoch (resumed, data parallel) masks it the same way; validation examples use the
//   fixed epoch kEvalMaskEpoch, so every evaluation scores the same masks. The mask id: the
//   tokenizer's [MASK] (or <mask>) token; with the byte tokenizer, which has none, config
//   vocab_size - 1 (byte 255 for vocab 256: never part of UTF-8 text); a tokenizer without a mask
//   token is an error.
// - Split: the last validation_split fraction of the examples (stream: of the tokens, as the
//   causal families) is held out for evaluation.
// - Order: as the token windows' (window_order.h): epoch e's example order is WindowOrder(n,
//   shuffle, seed, e); micro-batch k holds examples k*B .. k*B+B-1 of the order, wrapping into the
//   next epoch; LoaderPosition counts examples.
// Batch layout (B*T int32 each): inputs, attention mask, targets. masked_lm: targets per position;
// sequence_classification: targets[b] for b < B is row b's label (-1 = none), targets[B..B*T) -1.
// Instruction data (token-labelled sets): the mask is 2*B*T, each row's doc_start then (from
// B*T on) each row's positions (ExampleSet::RowLayout), for the decoders' example rows.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/token_data.h"
#include "data/token_stream.h"
#include "traind/engine/job_spec.h"
#include "traind/engine/status.h"

namespace traind::engine {

// One split's examples: stream chunks (example i = stream[i*T, i*T + T), mask all ones, no
// label) or padded rows (ids, real lengths and labels of each).
class ExampleSet {
 public:
  ExampleSet() = default;
  static ExampleSet OfStream(TokenStream stream, int64_t T);
  // `ids`: the examples' ids (unpadded, concatenated; lengths[i] <= T each), `labels` one per
  // example (-1 = none) or empty.
  static ExampleSet OfRows(std::vector<int32_t> ids, std::vector<int32_t> lengths,
                           std::vector<int32_t> labels, int64_t T, int32_t pad_id);

  // Instruction data (instruction_data.h): rows of up to T + 1 ids with one HF label per id
  // (-100: no loss); Get gives the first T ids, TokenTargets the next-token targets.
  static ExampleSet OfLabelledRows(std::vector<int32_t> ids, std::vector<int32_t> token_labels,
                                   std::vector<int32_t> lengths, int64_t T, int32_t pad_id);
  // Instruction data packed (data.packing): the examples (each kept to T + 1 ids as above) placed
  // by PackBestFitDecreasing (packing.h) into rows of T positions. An example of k ids takes
  // max(k - 1, 1) positions: its last id is only the target of the one before it, so nothing is
  // predicted across examples; the rest of a row is padding. Get, TokenTargets and RowLayout then
  // give packed row i.
  static ExampleSet OfPackedRows(std::vector<int32_t> ids, std::vector<int32_t> token_labels,
                                 std::vector<int32_t> lengths, int64_t T, int32_t pad_id);
  bool token_labelled() const { return !token_labels_.empty() || labelled_rows_; }
  bool packed() const { return !row_segs_.empty(); }
  // Example i's next-token targets (T of them): targets[t] = labels[t + 1] where that carries
  // loss, else -1 (padding, the end of the example, -100 labels).
  void TokenTargets(int64_t i, int32_t* targets) const;
  // Token-labelled sets: row i's doc_start (per position, the first position of its example; a
  // padding position is its own) and positions (within its example; 0 on padding), T each: what a
  // decoder with ModelOptions::example_rows reads (Backend::AttentionForward's doc_start,
  // Backend::Rope's positions).
  void RowLayout(int64_t i, int32_t* doc_start, int32_t* positions) const;
  // The int32 per token of a micro-batch's mask from FillExampleBatch: 2 for token-labelled sets
  // (doc_start then positions, each B*T), else 1 (the attention mask).
  int64_t MaskWords() const { return token_labelled() ? 2 : 1; }

  int64_t size() const { return count_; }
  int64_t seq_len() const { return T_; }
  // Example i: its T ids (padded) and attention mask; returns its label (-1 = none).
  int32_t Get(int64_t i, int32_t* ids, int32_t* mask) const;
  // The real (unpadded) length of example i.
  int64_t Length(int64_t i) const;

 private:
  int64_t T_ = 1;
  int64_t count_ = 0;
  int32_t pad_ = 0;
  std::optional<TokenStream> stream_;
  std::vector<int32_t> ids_;
  std::vector<int64_t> offsets_;  // rows: count + 1 offsets into ids_
  std::vector<int32_t> labels_;
  std::vector<int32_t> token_labels_;  // OfLabelledRows: parallel to ids_
  bool labelled_rows_ = false;
  // OfPackedRows: row i holds the examples [row_segs_[i], row_segs_[i + 1]), example e the ids
  // [seg_offsets_[e], seg_offsets_[e + 1]) of ids_ (offsets_ then bound each row's). Empty else.
  std::vector<int64_t> row_segs_;
  std::vector<int64_t> seg_offsets_;
  // Row i's examples as (first id, id count) pairs, in order (one unless packed).
  template <class F>
  void ForEachSegment(int64_t i, F&& f) const;
};

// Masked-language-model masking (HF DataCollatorForLanguageModeling).
struct MlmMasking {
  int32_t mask_id = 0;
  int64_t vocab_size = 0;      // random replacements are drawn from [0, vocab_size)
  double probability = 0.15;   // mlm_probability
  std::vector<bool> special;   // ids never selected (indexed by id; shorter: not special)
  uint64_t seed = 0;

  bool IsSpecial(int32_t id) const {
    return id >= 0 && static_cast<size_t>(id) < special.size() && special[static_cast<size_t>(id)];
  }
  // In place on one example of T positions: ids -> masked ids, targets <- original ids at the
  // selected positions, -1 elsewhere. Positions with attention mask 0 are never selected.
  void Apply(int64_t epoch, int64_t example, int64_t T, int32_t* ids, const int32_t* mask,
             int32_t* targets) const;
};

// The epoch validation examples are masked with (no training epoch is negative).
constexpr int64_t kEvalMaskEpoch = -1;

// The three uniform draws in [0, 1) and the random id of one position (exposed for tests):
// select < probability; then replace < 0.8 -> mask id, < 0.9 -> random id, else unchanged.
struct MlmDraw {
  double select = 0, replace = 0;
  int32_t random_id = 0;
};
MlmDraw MlmDraws(uint64_t seed, int64_t epoch, int64_t example, int64_t position,
                 int64_t vocab_size);

struct ExampleData {
  ExampleSet train;
  ExampleSet validation;
  bool classification = false;      // head sequence_classification (labels), else masked_lm
  std::optional<MlmMasking> mlm;    // masked_lm
  int32_t pad_id = 0;
  int64_t vocab_size_needed = 0;    // max id + 1 (ids, pad, mask)
};

// Loads data.train_file for `config` (arch bert, head set) as described above; `seed` keys the
// masks (training.seed). Errors name the file, the line and the field ("data.train_file: f.jsonl
// line 3: label: 7 is not in [0, 2)"); INVALID_ARGUMENT when no training example is left.
Result<ExampleData> LoadExampleData(const DataSpec& spec, const ModelConfig& config,
                                    uint64_t seed, const TokenizeProgress& progress = {});

// Fills a micro-batch of B rows from `set`: row b holds example rows[b] (-1: an empty row: pad
// ids, mask 0, no target). epochs[b] keys row b's masks (masked_lm; a batch may wrap into the
// next epoch). Layout: see the header comment.
void FillExampleBatch(const ExampleData& data, const ExampleSet& set, const int64_t* rows,
                      const int64_t* epochs, int64_t B, int32_t* inputs, int32_t* targets,
                      int32_t* mask);

// The training micro-batches: example order and positions as BatchLoader's windows (window
// i <-> example i). Synchronous (a micro-batch is a few copies and hashes).
class ExampleLoader {
 public:
  // `data` must outlive the loader.
  ExampleLoader(const ExampleData* data, int64_t B, bool shuffle, uint64_t seed,
                LoaderPosition start = {});
  // The next micro-batch (B*T each); returns the seconds waited (0: nothing is prefetched).
  double Next(int32_t* inputs, int32_t* targets, int32_t* mask);
  LoaderPosition position() const { return position_; }
  int64_t examples_per_epoch() const { return n_; }

 private:
  const ExampleData* data_;
  int64_t B_, n_;
  bool shuffle_;
  uint64_t seed_;
  LoaderPosition position_;
  int64_t order_epoch_ = -1;
  std::vector<int64_t> order_;
  std::vector<int64_t> rows_;
  std::vector<int64_t> row_epochs_;
};

}  // namespace traind::engine
