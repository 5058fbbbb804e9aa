// Example data for the encoder families: see example_data.h.
#include "data/example_data.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <string_view>
#include <thread>

#include <nlohmann/json.hpp>

#include "data/packing.h"
#include "data/window_order.h"
#include "traind/engine/tokenizer.h"

namespace traind::engine {
namespace {

uint64_t Mix(uint64_t z) {  // splitmix64's finaliser
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double Unit(uint64_t h) { return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0); }

// How the tokenizer's post-processor wraps a text: prefix + text ids + suffix.
struct Specials {
  std::vector<int32_t> prefix, suffix;
  size_t size() const { return prefix.size() + suffix.size(); }
};

Result<Specials> ProbeSpecials(const Tokenizer& tok) {
  TRAIND_ASSIGN_OR_RETURN(std::vector<int32_t> both, tok.Encode("", true));
  Specials s;
  if (both.empty()) return s;
  // Where the text goes: find a probe's plain ids inside its post-processed ids.
  for (const char* probe : {"a", "the", "x y", "0"}) {
    TRAIND_ASSIGN_OR_RETURN(std::vector<int32_t> full, tok.Encode(probe, true));
    TRAIND_ASSIGN_OR_RETURN(std::vector<int32_t> plain, tok.Encode(probe, false));
    if (plain.empty() || full.size() != plain.size() + both.size()) continue;
    for (size_t p = 0; p <= both.size(); ++p) {
      if (std::equal(plain.begin(), plain.end(), full.begin() + static_cast<std::ptrdiff_t>(p)) &&
          std::equal(both.begin(), both.begin() + static_cast<std::ptrdiff_t>(p), full.begin())) {
        s.prefix.assign(both.begin(), both.begin() + static_cast<std::ptrdiff_t>(p));
        s.suffix.assign(both.begin() + static_cast<std::ptrdiff_t>(p), both.end());
        return s;
      }
    }
  }
  s.prefix = both;  // not found: every special first (never happens with BERT or SentencePiece)
  return s;
}

// The label of a line: an integer in [0, num_labels) or a label name.
Result<int32_t> ParseLabel(const nlohmann::json& v, const ModelConfig& c, const std::string& where,
                           const std::string& field) {
  const std::string at = where + ": " + field + " (data.label_field): ";
  if (v.is_number_integer() || v.is_number_unsigned()) {
    const int64_t id = v.is_number_unsigned() ? static_cast<int64_t>(std::min<uint64_t>(
                                                    v.get<uint64_t>(), uint64_t{1} << 62))
                                              : v.get<int64_t>();
    if (id < 0 || id >= c.num_labels) {
      return Status::InvalidArgument(at + std::to_string(id) + " is not in [0, " +
                                     std::to_string(c.num_labels) + ") (model.num_labels " +
                                     std::to_string(c.num_labels) + ")");
    }
    return static_cast<int32_t>(id);
  }
  if (v.is_string()) {
    const std::string name = v.get<std::string>();
    std::string names;
    for (int64_t i = 0; i < c.num_labels; ++i) {
      const std::string n = i < static_cast<int64_t>(c.id2label.size())
                                ? c.id2label[static_cast<size_t>(i)]
                                : "LABEL_" + std::to_string(i);
      if (n == name) return static_cast<int32_t>(i);
      if (i < 8) names += (i ? ", " : "") + n;
    }
    if (c.num_labels > 8) names += ", ...";
    return Status::InvalidArgument(at + "'" + name + "' is not a label name (config id2label: " +
                                   names + ")");
  }
  return Status::InvalidArgument(at + "expected an integer label or a label name, got " +
                                 (v.is_null() ? std::string("null") : v.dump()));
}

// Each jsonl line's text (and label): one example per line, encoded, truncated, unpadded.
Status ReadJsonlExamples(const DataSpec& spec, const ModelConfig& c, const Tokenizer& tok,
                         const Specials& sp, bool labelled, std::string_view all, int64_t* max_id,
                         std::vector<int32_t>* lengths_out,
                         std::vector<std::vector<int32_t>>* rows_out,
                         std::vector<int32_t>* labels_out) {
  const std::string& path = spec.train_file;
  const std::string& field = spec.text_field;
  std::vector<std::string> texts;
  std::vector<int32_t>& labels = *labels_out;
  size_t pos = 0, line_no = 0;
  while (pos < all.size()) {
    size_t nl = all.find('\n', pos);
    if (nl == std::string_view::npos) nl = all.size();
    std::string_view line = all.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string where = "data.train_file: " + path + " line " + std::to_string(line_no);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      return Status::InvalidArgument(where + ": not valid JSON (" + e.what() + ")");
    }
    if (!j.is_object()) return Status::InvalidArgument(where + ": expected a JSON object");
    if (!j.contains(field)) {
      return Status::InvalidArgument(where + ": no field '" + field + "' (data.text_field)");
    }
    if (!j[field].is_string()) {
      return Status::InvalidArgument(where + ": " + field +
                                     " (data.text_field): expected a string, got " +
                                     j[field].dump());
    }
    if (labelled) {
      const std::string& lf = *spec.label_field;
      if (!j.contains(lf)) {
        return Status::InvalidArgument(where + ": no field '" + lf + "' (data.label_field)");
      }
      TRAIND_ASSIGN_OR_RETURN(int32_t label, ParseLabel(j[lf], c, where, lf));
      labels.push_back(label);
    }
    texts.push_back(j[field].get<std::string>());
  }
  const int64_t T = spec.seq_len;
  const int64_t room = T - static_cast<int64_t>(sp.size());
  if (room < 1) {
    return Status::InvalidArgument("data.seq_len: " + std::to_string(T) + " leaves no room for text "
                                   "beside the tokenizer's " + std::to_string(sp.size()) +
                                   " special tokens");
  }
  std::vector<Result<std::vector<int32_t>>> parts(texts.size(), Status::Internal("not encoded"));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < texts.size();) parts[i] = tok.Encode(texts[i], false);
  };
  std::thread helper(work);
  work();
  helper.join();
  rows_out->resize(texts.size());
  lengths_out->resize(texts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!parts[i].ok()) return parts[i].status();
    std::vector<int32_t>& text = *parts[i];
    if (static_cast<int64_t>(text.size()) > room) text.resize(static_cast<size_t>(room));
    std::vector<int32_t>& row = (*rows_out)[i];
    row.reserve(text.size() + sp.size());
    row.insert(row.end(), sp.prefix.begin(), sp.prefix.end());
    row.insert(row.end(), text.begin(), text.end());
    row.insert(row.end(), sp.suffix.begin(), sp.suffix.end());
    for (int32_t id : row) *max_id = std::max<int64_t>(*max_id, id);
    (*lengths_out)[i] = static_cast<int32_t>(row.size());
  }
  return Status::Ok();
}

ExampleSet RowsOf(const std::vector<std::vector<int32_t>>& rows, const std::vector<int32_t>& labels,
                  size_t begin, size_t end, int64_t T, int32_t pad) {
  std::vector<int32_t> ids, lengths, ls;
  for (size_t i = begin; i < end; ++i) {
    ids.insert(ids.end(), rows[i].begin(), rows[i].end());
    lengths.push_back(static_cast<int32_t>(rows[i].size()));
    if (!labels.empty()) ls.push_back(labels[i]);
  }
  return ExampleSet::OfRows(std::move(ids), std::move(lengths), std::move(ls), T, pad);
}

}  // namespace

// ---- ExampleSet ----

ExampleSet ExampleSet::OfStream(TokenStream stream, int64_t T) {
  ExampleSet s;
  s.T_ = T > 0 ? T : 1;
  s.count_ = stream.size() / s.T_;
  s.stream_ = std::move(stream);
  return s;
}

ExampleSet ExampleSet::OfRows(std::vector<int32_t> ids, std::vector<int32_t> lengths,
                              std::vector<int32_t> labels, int64_t T, int32_t pad_id) {
  ExampleSet s;
  s.T_ = T > 0 ? T : 1;
  s.count_ = static_cast<int64_t>(lengths.size());
  s.pad_ = pad_id;
  s.ids_ = std::move(ids);
  s.labels_ = std::move(labels);
  s.offsets_.resize(lengths.size() + 1, 0);
  for (size_t i = 0; i < lengths.size(); ++i) {
    s.offsets_[i + 1] = s.offsets_[i] + std::min<int64_t>(lengths[i], s.T_);
  }
  return s;
}

ExampleSet ExampleSet::OfLabelledRows(std::vector<int32_t> ids, std::vector<int32_t> token_labels,
                                      std::vector<int32_t> lengths, int64_t T, int32_t pad_id) {
  // Rows keep T + 1 ids: the last one is only a target.
  ExampleSet s;
  s.T_ = T > 0 ? T : 1;
  s.count_ = static_cast<int64_t>(lengths.size());
  s.pad_ = pad_id;
  s.labelled_rows_ = true;
  s.offsets_.resize(lengths.size() + 1, 0);
  int64_t src = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t keep = std::min<int64_t>(lengths[i], s.T_ + 1);
    s.ids_.insert(s.ids_.end(), ids.begin() + src, ids.begin() + src + keep);
    s.token_labels_.insert(s.token_labels_.end(), token_labels.begin() + src,
                           token_labels.begin() + src + keep);
    src += lengths[i];
    s.offsets_[i + 1] = s.offsets_[i] + keep;
  }
  return s;
}

ExampleSet ExampleSet::OfPackedRows(std::vector<int32_t> ids, std::vector<int32_t> token_labels,
                                    std::vector<int32_t> lengths, int64_t T, int32_t pad_id) {
  ExampleSet s;
  s.T_ = T > 0 ? T : 1;
  s.pad_ = pad_id;
  s.labelled_rows_ = true;
  // Each example kept to T + 1 ids (OfLabelledRows' rule) takes max(kept - 1, 1) positions.
  std::vector<int64_t> begin(lengths.size()), keep(lengths.size()), sizes(lengths.size());
  int64_t src = 0;
  for (size_t e = 0; e < lengths.size(); ++e) {
    begin[e] = src;
    keep[e] = std::min<int64_t>(lengths[e], s.T_ + 1);
    sizes[e] = std::max<int64_t>(keep[e] - 1, 1);
    src += lengths[e];
  }
  const std::vector<std::vector<int64_t>> rows = PackBestFitDecreasing(sizes, s.T_);
  s.count_ = static_cast<int64_t>(rows.size());
  s.offsets_.push_back(0);
  s.row_segs_.push_back(0);
  s.seg_offsets_.push_back(0);
  for (const std::vector<int64_t>& row : rows) {
    for (int64_t e : row) {
      const auto from = static_cast<std::ptrdiff_t>(begin[static_cast<size_t>(e)]);
      const auto n = static_cast<std::ptrdiff_t>(keep[static_cast<size_t>(e)]);
      s.ids_.insert(s.ids_.end(), ids.begin() + from, ids.begin() + from + n);
      s.token_labels_.insert(s.token_labels_.end(), token_labels.begin() + from,
                             token_labels.begin() + from + n);
      s.seg_offsets_.push_back(static_cast<int64_t>(s.ids_.size()));
    }
    s.row_segs_.push_back(static_cast<int64_t>(s.seg_offsets_.size()) - 1);
    s.offsets_.push_back(static_cast<int64_t>(s.ids_.size()));
  }
  return s;
}

template <class F>
void ExampleSet::ForEachSegment(int64_t i, F&& f) const {
  if (row_segs_.empty()) {
    f(offsets_[static_cast<size_t>(i)],
      offsets_[static_cast<size_t>(i) + 1] - offsets_[static_cast<size_t>(i)]);
    return;
  }
  for (int64_t e = row_segs_[static_cast<size_t>(i)]; e < row_segs_[static_cast<size_t>(i) + 1];
       ++e) {
    f(seg_offsets_[static_cast<size_t>(e)],
      seg_offsets_[static_cast<size_t>(e) + 1] - seg_offsets_[static_cast<size_t>(e)]);
  }
}

void ExampleSet::RowLayout(int64_t i, int32_t* doc_start, int32_t* positions) const {
  int64_t pos = 0;
  ForEachSegment(i, [&](int64_t /*first*/, int64_t k) {
    // Unpacked: the row's min(k, T) ids; packed: the positions the example takes.
    const int64_t used = packed() ? std::max<int64_t>(k - 1, 1) : std::min<int64_t>(k, T_);
    for (int64_t t = 0; t < used && pos + t < T_; ++t) {
      doc_start[pos + t] = static_cast<int32_t>(pos);
      positions[pos + t] = static_cast<int32_t>(t);
    }
    pos += used;
  });
  for (int64_t t = pos; t < T_; ++t) {  // padding: each position its own example
    doc_start[t] = static_cast<int32_t>(t);
    positions[t] = 0;
  }
}

void ExampleSet::TokenTargets(int64_t i, int32_t* targets) const {
  std::fill(targets, targets + T_, -1);
  if (!labelled_rows_) return;
  if (packed()) {
    int64_t pos = 0;
    ForEachSegment(i, [&](int64_t first, int64_t k) {
      for (int64_t t = 0; t + 1 < k && pos + t < T_; ++t) {
        const int32_t label = token_labels_[static_cast<size_t>(first + t + 1)];
        targets[pos + t] = label < 0 ? -1 : label;
      }
      pos += std::max<int64_t>(k - 1, 1);
    });
    return;
  }
  const int64_t begin = offsets_[static_cast<size_t>(i)];
  const int64_t n = offsets_[static_cast<size_t>(i) + 1] - begin;
  for (int64_t t = 0; t + 1 < n && t < T_; ++t) {
    const int32_t label = token_labels_[static_cast<size_t>(begin + t + 1)];
    targets[t] = label < 0 ? -1 : label;
  }
}

int64_t ExampleSet::Length(int64_t i) const {
  if (stream_) return T_;
  return offsets_[static_cast<size_t>(i) + 1] - offsets_[static_cast<size_t>(i)];
}

int32_t ExampleSet::Get(int64_t i, int32_t* ids, int32_t* mask) const {
  if (stream_) {
    stream_->CopyWindow(i * T_, T_, ids);
    std::fill(mask, mask + T_, 1);
    return -1;
  }
  if (packed()) {
    int64_t pos = 0;
    ForEachSegment(i, [&](int64_t first, int64_t k) {
      const int64_t used = std::min(std::max<int64_t>(k - 1, 1), T_ - pos);
      std::copy(ids_.begin() + first, ids_.begin() + first + used, ids + pos);
      pos += used;
    });
    std::fill(ids + pos, ids + T_, pad_);
    std::fill(mask, mask + pos, 1);
    std::fill(mask + pos, mask + T_, 0);
    return -1;
  }
  const int64_t begin = offsets_[static_cast<size_t>(i)];
  const int64_t n = std::min<int64_t>(offsets_[static_cast<size_t>(i) + 1] - begin, T_);
  std::copy(ids_.begin() + begin, ids_.begin() + begin + n, ids);
  std::fill(ids + n, ids + T_, pad_);
  std::fill(mask, mask + n, 1);
  std::fill(mask + n, mask + T_, 0);
  return labels_.empty() ? -1 : labels_[static_cast<size_t>(i)];
}

// ---- masking ----

MlmDraw MlmDraws(uint64_t seed, int64_t epoch, int64_t example, int64_t position,
                 int64_t vocab_size) {
  const uint64_t base =
      Mix(Mix(Mix(Mix(seed) ^ static_cast<uint64_t>(epoch)) ^ static_cast<uint64_t>(example)) ^
          static_cast<uint64_t>(position));
  MlmDraw d;
  d.select = Unit(Mix(base ^ 0x1ull));
  d.replace = Unit(Mix(base ^ 0x2ull));
  const unsigned __int128 wide =
      static_cast<unsigned __int128>(Mix(base ^ 0x3ull)) * static_cast<uint64_t>(vocab_size);
  d.random_id = static_cast<int32_t>(static_cast<uint64_t>(wide >> 64));
  return d;
}

void MlmMasking::Apply(int64_t epoch, int64_t example, int64_t T, int32_t* ids,
                       const int32_t* mask, int32_t* targets) const {
  for (int64_t t = 0; t < T; ++t) {
    targets[t] = -1;
    if (mask[t] == 0 || IsSpecial(ids[t])) continue;
    const MlmDraw d = MlmDraws(seed, epoch, example, t, vocab_size);
    if (!(d.select < probability)) continue;
    targets[t] = ids[t];
    if (d.replace < 0.8) {
      ids[t] = mask_id;
    } else if (d.replace < 0.9) {
      ids[t] = d.random_id;
    }
  }
}

// ---- loading ----

Result<ExampleData> LoadExampleData(const DataSpec& spec, const ModelConfig& config,
                                    uint64_t seed, const TokenizeProgress& progress) {
  ExampleData out;
  out.classification = config.head == "sequence_classification";
  const int64_t T = spec.seq_len;
  TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok,
                          DefaultTokenizerFactory().Open(spec.tokenizer, ""));
  const bool byte = tok->kind() == "byte";
  out.pad_id = tok->pad_id() ? *tok->pad_id() : static_cast<int32_t>(config.pad_token_id);
  int64_t max_id = out.pad_id;
  if (!out.classification) {
    MlmMasking m;
    m.seed = seed;
    m.vocab_size = config.vocab_size;
    if (byte) {
      m.mask_id = static_cast<int32_t>(config.vocab_size - 1);
    } else {
      std::optional<int32_t> found;
      for (const char* name : {"[MASK]", "<mask>"}) {
        Result<std::vector<int32_t>> ids = tok->Encode(name, false);
        if (!ids.ok() || ids->size() != 1) continue;
        Result<std::string> back = tok->Decode(*ids, /*skip_special_tokens=*/true);
        if (back.ok() && back->empty()) {
          found = (*ids)[0];
          break;
        }
      }
      if (!found) {
        return Status::InvalidArgument(
            "data.tokenizer: " + spec.tokenizer + " has no mask token ([MASK] or <mask>, a "
            "special token), which model.head masked_lm needs");
      }
      m.mask_id = *found;
      // Special tokens (HF's all_special_ids) are never selected: an id is special when
      // Decode(skip_special_tokens) leaves it out.
      m.special.assign(static_cast<size_t>(tok->vocab_size()), false);
      for (int64_t id = 0; id < tok->vocab_size(); ++id) {
        Result<std::string> text = tok->Decode({static_cast<int32_t>(id)}, true);
        if (text.ok() && text->empty()) m.special[static_cast<size_t>(id)] = true;
      }
    }
    if (m.special.size() <= static_cast<size_t>(out.pad_id)) {
      m.special.resize(static_cast<size_t>(out.pad_id) + 1, false);
    }
    // The pad id is never a target. With the byte tokenizer it is an ordinary byte (0 by
    // default, which text does not hold); jsonl padding carries mask 0 anyway.
    m.special[static_cast<size_t>(out.pad_id)] = true;
    max_id = std::max<int64_t>(max_id, m.mask_id);
    out.mlm = std::move(m);
  }
  if (!out.classification && spec.format != "jsonl") {
    // The token stream, cut into seq_len examples (token_data.h loads and maps it).
    DataSpec stream_spec = spec;
    TRAIND_ASSIGN_OR_RETURN(TokenData d, LoadTokenData(stream_spec, progress));
    out.train = ExampleSet::OfStream(std::move(d.train), T);
    out.validation = ExampleSet::OfStream(std::move(d.validation), T);
    out.vocab_size_needed = std::max(d.vocab_size_needed, max_id + 1);
    return out;
  }
  if (spec.format != "jsonl") {
    return Status::InvalidArgument("data.format: sequence_classification needs jsonl, got '" +
                                   spec.format + "'");
  }
  if (out.classification && !spec.label_field) {
    return Status::InvalidArgument("data.label_field: required with sequence_classification");
  }
  TRAIND_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file,
                          MappedFile::Open(spec.train_file, "data.train_file"));
  TRAIND_ASSIGN_OR_RETURN(Specials sp, ProbeSpecials(*tok));
  std::vector<int32_t> lengths, labels;
  std::vector<std::vector<int32_t>> rows;
  TRAIND_RETURN_IF_ERROR(ReadJsonlExamples(spec, config, *tok, sp, out.classification,
                                           file->bytes(), &max_id, &lengths, &rows, &labels));
  if (progress.report) {
    TokenizeReport r;
    r.file = spec.train_file;
    r.tokenizer = tok->fingerprint();
    r.bytes_total = r.bytes_done = static_cast<int64_t>(file->size());
    for (int32_t n : lengths) r.tokens += n;
    r.done = true;
    progress.report(r);
  }
  const int64_t n = static_cast<int64_t>(rows.size());
  const int64_t n_train = TrainTokenCount(n, spec.validation_split);
  if (n_train < 1) {
    return Status::InvalidArgument("data.train_file: " + spec.train_file + ": " +
                                   std::to_string(n) + " examples leave no training example "
                                   "(data.validation_split " +
                                   std::to_string(spec.validation_split) + ")");
  }
  out.train = RowsOf(rows, labels, 0, static_cast<size_t>(n_train), T, out.pad_id);
  out.validation = RowsOf(rows, labels, static_cast<size_t>(n_train), static_cast<size_t>(n), T,
                          out.pad_id);
  out.vocab_size_needed = max_id + 1;
  return out;
}

void FillExampleBatch(const ExampleData& data, const ExampleSet& set, const int64_t* rows,
                      const int64_t* epochs, int64_t B, int32_t* inputs, int32_t* targets,
                      int32_t* mask) {
  const int64_t T = set.seq_len();
  std::fill(targets, targets + B * T, -1);
  for (int64_t b = 0; b < B; ++b) {
    int32_t* in = inputs + b * T;
    int32_t* m = mask + b * T;
    int32_t* positions = mask + B * T + b * T;  // token-labelled sets only
    if (rows[b] < 0) {
      std::fill(in, in + T, data.pad_id);
      std::fill(m, m + T, 0);
      if (set.token_labelled()) {  // all padding: each position its own example
        for (int64_t t = 0; t < T; ++t) m[t] = static_cast<int32_t>(t);
        std::fill(positions, positions + T, 0);
      }
      continue;
    }
    const int32_t label = set.Get(rows[b], in, m);
    if (set.token_labelled()) {
      set.TokenTargets(rows[b], targets + b * T);
      set.RowLayout(rows[b], m, positions);
    } else if (data.classification) {
      targets[b] = label;
    } else if (data.mlm) {
      data.mlm->Apply(epochs[b], rows[b], T, in, m, targets + b * T);
    }
  }
}

// ---- ExampleLoader ----

ExampleLoader::ExampleLoader(const ExampleData* data, int64_t B, bool shuffle, uint64_t seed,
                             LoaderPosition start)
    : data_(data),
      B_(B > 0 ? B : 1),
      n_(data->train.size()),
      shuffle_(shuffle),
      seed_(seed),
      rows_(static_cast<size_t>(B_)),
      row_epochs_(static_cast<size_t>(B_)) {
  if (n_ > 0) {
    start.epoch += start.next_window / n_;
    start.next_window %= n_;
    if (start.next_window < 0) start.next_window = 0;
  } else {
    start.next_window = 0;
  }
  position_ = start;
}

double ExampleLoader::Next(int32_t* inputs, int32_t* targets, int32_t* mask) {
  for (int64_t b = 0; b < B_; ++b) {
    if (n_ == 0) {
      rows_[static_cast<size_t>(b)] = -1;
      continue;
    }
    if (order_epoch_ != position_.epoch) {
      order_ = WindowOrder(n_, shuffle_, seed_, position_.epoch);
      order_epoch_ = position_.epoch;
    }
    rows_[static_cast<size_t>(b)] = order_[static_cast<size_t>(position_.next_window)];
    row_epochs_[static_cast<size_t>(b)] = position_.epoch;
    if (++position_.next_window == n_) {
      position_.next_window = 0;
      ++position_.epoch;
    }
  }
  FillExampleBatch(*data_, data_->train, rows_.data(), row_epochs_.data(), B_, inputs, targets,
                   mask);
  return 0.0;
}

}  // namespace traind::engine
