// Token data: loads a data file into train/validation token streams (memory-mapped views:
// token_stream.h), and the prefetching BatchLoader that cuts the training stream into
// micro-batches (batching semantics: JOBSPEC.md).
// The shuffle permutation is our own Fisher-Yates over std::mt19937_64, so it is the same with
// every standard library (std::shuffle and std::uniform_int_distribution are not specified).
#include "data/token_data.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string_view>
#include <thread>

#include <nlohmann/json.hpp>

#include "data/token_cache.h"
#include "data/window_order.h"
#include "traind/engine/mutex.h"
#include "traind/engine/tokenizer.h"

namespace traind::engine {
namespace {

// Runs `encode` (which adds the source bytes it has encoded to its argument and returns the
// number of tokens) on a worker thread while this thread reports progress to `progress.report`:
// a first report, one per interval while the count moves, and a last one (done) when `encode`
// succeeded. Without a report callback it runs `encode` here.
Result<int64_t> EncodeWithProgress(
    const TokenizeProgress& progress, TokenizeReport report,
    const std::function<Result<int64_t>(std::atomic<int64_t>*)>& encode) {
  std::atomic<int64_t> done{0};
  if (!progress.report) return encode(&done);
  const auto t0 = std::chrono::steady_clock::now();
  auto since = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  progress.report(report);
  Mutex mu;
  CondVar cv;
  bool finished = false;  // under mu
  Result<int64_t> result = Status::Internal("tokenization did not finish");  // under mu until joined
  std::thread worker([&] {
    Result<int64_t> r = encode(&done);
    {
      MutexLock lock(&mu);
      result = std::move(r);
      finished = true;
    }
    cv.NotifyAll();
  });
  const auto wait = std::chrono::duration<double>(
      progress.interval_seconds > 0 ? progress.interval_seconds : 0.002);
  int64_t reported = 0;
  mu.Lock();
  while (!finished) {
    cv.WaitFor(&mu, wait);
    if (finished) break;
    const int64_t now_done = done.load();
    if (now_done == reported) continue;
    reported = now_done;
    report.bytes_done = std::min(now_done, report.bytes_total);
    report.seconds = since();
    mu.Unlock();
    progress.report(report);
    mu.Lock();
  }
  mu.Unlock();
  worker.join();
  if (result.ok()) {
    report.bytes_done = report.bytes_total;
    report.tokens = *result;
    report.seconds = since();
    report.done = true;
    progress.report(report);
  }
  return result;
}

// The report of a cache hit.
void ReportCacheHit(const TokenizeProgress& progress, TokenizeReport report, size_t tokens) {
  if (!progress.report) return;
  report.cache_hit = true;
  report.done = true;
  report.tokens = static_cast<int64_t>(tokens);
  progress.report(report);
}

TokenizeReport FirstReport(const std::string& path, const std::string& fingerprint, size_t bytes) {
  TokenizeReport r;
  r.file = path;
  r.tokenizer = fingerprint;
  r.bytes_total = static_cast<int64_t>(bytes);
  return r;
}

// The stream of freshly encoded ids: written to the token cache and mapped from there, so the
// vector is freed when this returns; when the cache cannot be written (no cache folder, a full
// disk) the stream owns the vector instead. The cache is an optimisation, never an error.
TokenStream CacheAndMap(const std::string& cache, const Result<TokenCacheKey>& key,
                        std::vector<int32_t> ids) {
  if (key.ok() && !cache.empty() && WriteTokenCache(cache, *key, ids).ok()) {
    if (std::optional<TokenStream> mapped = ReadTokenCache(cache, *key);
        mapped && mapped->size() == static_cast<int64_t>(ids.size())) {
      return std::move(*mapped);
    }
  }
  return TokenStream(std::move(ids));
}

// The ids of a text file through a tokenizer other than byte: from the token cache when it holds
// this file and tokenizer, else from the tokenizer (2 threads), then cached and mapped.
Result<TokenStream> TokenizeText(const Tokenizer& tok, const std::string& path,
                                 std::string_view text, const TokenizeProgress& progress) {
  const std::string cache = TokenCachePath(path, tok.fingerprint());
  const TokenizeReport first = FirstReport(path, tok.fingerprint(), text.size());
  Result<TokenCacheKey> key = TokenCacheKeyFor(path, tok.fingerprint());
  if (key.ok()) {
    if (std::optional<TokenStream> cached = ReadTokenCache(cache, *key)) {
      ReportCacheHit(progress, first, static_cast<size_t>(cached->size()));
      return std::move(*cached);
    }
  }
  auto named = [&](const Status& s) {
    return Status(s.code(), "data.train_file: " + path + ": " + s.message());
  };
  // Stream the ids into the cache part by part as the tokenizer hands them out in order
  // (EncodeLargeTo), then map it: they are never all in memory at once. uint16 when the vocab
  // fits (ids are below vocab_size()).
  if (key.ok() && !cache.empty()) {
    Result<std::unique_ptr<TokenCacheWriter>> writer =
        TokenCacheWriter::Create(cache, *key, tok.vocab_size() <= 65536 ? 2 : 4);
    if (writer.ok()) {
      bool write_failed = false;  // set by emit (calls never overlap), read after the join
      Result<int64_t> count = EncodeWithProgress(
          progress, first, [&](std::atomic<int64_t>* done) -> Result<int64_t> {
            TRAIND_RETURN_IF_ERROR(
                tok.EncodeLargeTo(text, 2, done, [&](const std::vector<int32_t>& part) {
                  Status st = (*writer)->Append(part.data(), part.size());
                  if (!st.ok()) write_failed = true;
                  return st;
                }));
            return (*writer)->count();
          });
      if (!count.ok() && !write_failed) return named(count.status());
      if (count.ok() && (*writer)->Commit().ok()) {
        if (std::optional<TokenStream> mapped = ReadTokenCache(cache, *key);
            mapped && mapped->size() == *count) {
          return std::move(*mapped);
        }
      }
      // The cache could not be written (a full disk, say): drop the temporary file and encode
      // again, into memory.
      writer->reset();
    }
  }
  std::vector<int32_t> ids;
  Result<int64_t> count = EncodeWithProgress(
      progress, first, [&](std::atomic<int64_t>* done) -> Result<int64_t> {
        TRAIND_ASSIGN_OR_RETURN(ids, tok.EncodeLarge(text, 2, done));
        return static_cast<int64_t>(ids.size());
      });
  if (!count.ok()) return named(count.status());
  return CacheAndMap(cache, key, std::move(ids));
}

// The ids of a JSON-lines file: each non-empty line an object whose `field` holds a document's
// text; documents are encoded in parallel and joined with the tokenizer's eos after each one
// (tokenizers without an eos, such as byte, join them with a newline). Cached like text files,
// under the fingerprint plus "jsonl:<field>". Progress counts each document's whole line.
Result<TokenStream> TokenizeJsonl(const Tokenizer& tok, const std::string& path,
                                  const std::string& field, std::string_view all,
                                  const TokenizeProgress& progress) {
  const std::string fp = tok.fingerprint() + "|jsonl:" + field;
  const std::string cache = TokenCachePath(path, fp);
  const TokenizeReport first = FirstReport(path, fp, all.size());
  Result<TokenCacheKey> key = TokenCacheKeyFor(path, fp);
  if (key.ok()) {
    if (std::optional<TokenStream> cached = ReadTokenCache(cache, *key)) {
      ReportCacheHit(progress, first, static_cast<size_t>(cached->size()));
      return std::move(*cached);
    }
  }
  std::vector<std::string> docs;
  std::vector<int64_t> line_bytes;  // of each document's line, its newline included
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
    } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for 1e999
      return Status::InvalidArgument(where + ": not valid JSON (" + e.what() + ")");
    }
    if (!j.is_object() || !j.contains(field) || !j[field].is_string()) {
      return Status::InvalidArgument(where + ": expected an object with a string field '" +
                                     field + "' (data.text_field)");
    }
    docs.push_back(j[field].get<std::string>());
    line_bytes.push_back(static_cast<int64_t>(line.size()) + 1);
  }
  std::vector<int32_t> ids;
  auto encode_all = [&](std::atomic<int64_t>* done) -> Result<int64_t> {
    std::vector<Result<std::vector<int32_t>>> parts(docs.size(), Status::Internal("not encoded"));
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i; (i = next.fetch_add(1)) < docs.size();) {
        parts[i] = tok.Encode(docs[i], false);
        done->fetch_add(line_bytes[i]);
      }
    };
    std::thread helper(work);
    work();
    helper.join();
    const std::optional<int32_t> eos = tok.eos_id();
    for (size_t i = 0; i < parts.size(); ++i) {
      if (!parts[i].ok()) return parts[i].status();
      ids.insert(ids.end(), parts[i]->begin(), parts[i]->end());
      ids.push_back(eos ? *eos : int32_t{'\n'});
    }
    return static_cast<int64_t>(ids.size());
  };
  TRAIND_RETURN_IF_ERROR(EncodeWithProgress(progress, first, encode_all).status());
  std::vector<std::string>().swap(docs);
  return CacheAndMap(cache, key, std::move(ids));
}

// Returns the heap's free pages to the kernel (glibc's malloc_trim; a no-op elsewhere).
void ReleaseFreedHeap() {
#ifdef __GLIBC__
  ::malloc_trim(0);
#endif
}

}  // namespace

uint64_t EpochSeed(uint64_t seed, int64_t epoch) {
  // splitmix64 of seed, then of (that ^ epoch): well-mixed and fully specified.
  auto mix = [](uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  return mix(mix(seed) ^ static_cast<uint64_t>(epoch));
}

std::vector<int64_t> WindowOrder(int64_t windows, bool shuffle, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(windows > 0 ? windows : 0));
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  if (!shuffle || windows < 2) return order;
  std::mt19937_64 rng(EpochSeed(seed, epoch));
  for (uint64_t i = static_cast<uint64_t>(windows) - 1; i > 0; --i) {
    // Uniform j in [0, i] by rejection: accept r below the largest multiple of (i + 1).
    const uint64_t bound = i + 1;
    const uint64_t limit = std::numeric_limits<uint64_t>::max() -
                           std::numeric_limits<uint64_t>::max() % bound;
    uint64_t r;
    do {
      r = rng();
    } while (r >= limit);
    std::swap(order[i], order[r % bound]);
  }
  return order;
}

Result<TokenData> LoadTokenData(const DataSpec& spec, const TokenizeProgress& progress) {
  TRAIND_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file,
                          MappedFile::Open(spec.train_file, "data.train_file"));
  TokenStream all;
  bool through_tokenizer = false;  // a tokenizer other than byte was loaded (and maybe ran)
  if (spec.format == "text") {
    TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok,
                            DefaultTokenizerFactory().Open(spec.tokenizer, ""));
    if (tok->kind() == "byte") {  // the bytes are the ids: map the file itself
      TRAIND_ASSIGN_OR_RETURN(
          all, TokenStream::OfFile(file, 0, static_cast<int64_t>(file->size()), /*width=*/1));
    } else {
      through_tokenizer = true;
      TRAIND_ASSIGN_OR_RETURN(all, TokenizeText(*tok, spec.train_file, file->bytes(), progress));
    }
  } else if (spec.format == "jsonl") {
    TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok,
                            DefaultTokenizerFactory().Open(spec.tokenizer, ""));
    through_tokenizer = true;
    TRAIND_ASSIGN_OR_RETURN(
        all, TokenizeJsonl(*tok, spec.train_file, spec.text_field, file->bytes(), progress));
  } else if (spec.format == "tokens") {
    int w = 0;
    if (spec.token_dtype == "uint16") w = 2;
    else if (spec.token_dtype == "uint32") w = 4;
    else return Status::InvalidArgument("data.token_dtype: expected uint16 or uint32, got '" +
                                        spec.token_dtype + "'");
    if (file->size() % static_cast<uint64_t>(w) != 0) {
      return Status::InvalidArgument("data.train_file: " + spec.train_file + ": " +
                                     std::to_string(file->size()) +
                                     " bytes is not a multiple of " + std::to_string(w) +
                                     " (data.token_dtype " + spec.token_dtype + ")");
    }
    const auto count = static_cast<int64_t>(file->size() / static_cast<uint64_t>(w));
    TRAIND_ASSIGN_OR_RETURN(all, TokenStream::OfFile(file, 0, count, w));
  } else {
    return Status::InvalidArgument("data.format: expected text, tokens or jsonl, got '" + spec.format +
                                   "'");
  }
  file.reset();  // `all` holds the mapping it reads (the source's, or the token cache's)
  if (through_tokenizer) {
    // The tokenizer is gone (and on a miss, its encoded ids and their parts): hand the freed heap
    // back, or glibc keeps it (~20 MB after a 32 MiB text's miss) for the whole run.
    ReleaseFreedHeap();
  }
  // One pass over the ids (over the mapping: its pages, not a copy): the largest id, and no id
  // above int32 (only uint32 tokens files can hold one).
  const TokenStream::Scan scan = all.ScanIds();
  if (scan.first_too_large >= 0) {
    const auto id = static_cast<uint32_t>(all[scan.first_too_large]);
    return Status::InvalidArgument("data.train_file: " + spec.train_file + ": token " +
                                   std::to_string(scan.first_too_large) + " has id " +
                                   std::to_string(id) + ", above the largest supported id 2147483647");
  }
  const int64_t n = all.size();
  const int64_t n_train = TrainTokenCount(n, spec.validation_split);
  const int64_t window = spec.seq_len + 1;
  if (n_train < window) {
    return Status::InvalidArgument(
        "data.train_file: " + spec.train_file + ": " + std::to_string(n) + " tokens give a " +
        "training stream of " + std::to_string(n_train) + " tokens, shorter than one window of " +
        "seq_len + 1 = " + std::to_string(window) + ": use more data or a smaller data.seq_len");
  }
  if (n - n_train > 0 && n - n_train < window) {
    return Status::InvalidArgument(
        "data.validation_split: the validation stream has " + std::to_string(n - n_train) +
        " tokens, shorter than one window of seq_len + 1 = " + std::to_string(window) +
        ": raise validation_split, set it to 0, or lower data.seq_len");
  }
  TokenData out;
  out.vocab_size_needed = std::max<int64_t>(scan.max_id, 0) + 1;
  out.train = all.Slice(0, n_train);
  out.validation = all.Slice(n_train, n - n_train);
  return out;
}

int64_t TrainTokenCount(int64_t n, double validation_split) {
  // As Python's int(n * (1 - validation_split)) with the same double arithmetic.
  return static_cast<int64_t>(static_cast<double>(n) * (1.0 - validation_split));
}

// ---- BatchLoader ----

struct BatchLoader::Impl {
  TokenStream tokens;  // shares the storage (a mapping or a vector) with the caller
  int64_t B, T, W;  // W: windows per epoch
  bool shuffle;
  uint64_t seed;
  size_t capacity;

  struct Batch {
    std::vector<int32_t> inputs, targets;
    LoaderPosition after;  // the position following this batch
  };

  mutable Mutex mu;
  CondVar cv;
  std::deque<Batch> ready TRAIND_GUARDED_BY(mu);  // produced, not yet taken
  LoaderPosition consumer TRAIND_GUARDED_BY(mu);  // position of the next batch Next() returns
  bool stop TRAIND_GUARDED_BY(mu) = false;
  std::thread worker;

  // Producer-only state.
  LoaderPosition produced;
  int64_t order_epoch = -1;
  std::vector<int64_t> order;

  void Produce(Batch* b) {
    b->inputs.resize(static_cast<size_t>(B * T));
    b->targets.resize(static_cast<size_t>(B * T));
    for (int64_t r = 0; r < B; ++r) {
      int32_t* in = b->inputs.data() + r * T;
      int32_t* tg = b->targets.data() + r * T;
      if (W == 0) {  // precondition broken (stream shorter than a window): an all-ignored batch
        std::fill(in, in + T, 0);
        std::fill(tg, tg + T, -1);
        continue;
      }
      if (order_epoch != produced.epoch) {
        order = WindowOrder(W, shuffle, seed, produced.epoch);
        order_epoch = produced.epoch;
      }
      const int64_t start = order[static_cast<size_t>(produced.next_window)] * T;
      tokens.CopyWindow(start, T, in);
      tokens.CopyWindow(start + 1, T, tg);
      if (++produced.next_window == W) {
        produced.next_window = 0;
        ++produced.epoch;
      }
    }
    b->after = produced;
  }

  void Run() {
    for (;;) {
      {
        MutexLock lock(&mu);
        while (!stop && ready.size() >= capacity) cv.Wait(&mu);
        if (stop) return;
      }
      Batch b;
      Produce(&b);  // outside the lock: the consumer can take batches meanwhile
      {
        MutexLock lock(&mu);
        ready.push_back(std::move(b));
      }
      cv.NotifyAll();
    }
  }
};

BatchLoader::BatchLoader(TokenStream tokens, int64_t B, int64_t T, bool shuffle, uint64_t seed,
                         LoaderPosition start, int prefetch)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.tokens = std::move(tokens);
  s.B = B > 0 ? B : 1;
  s.T = T > 0 ? T : 1;
  const int64_t len = s.tokens.size();
  s.W = len > 1 ? (len - 1) / s.T : 0;
  s.shuffle = shuffle;
  s.seed = seed;
  s.capacity = static_cast<size_t>(prefetch > 0 ? prefetch : 1);
  // Normalise the start position (a checkpoint may hold next_window == W at an epoch's end).
  if (s.W > 0) {
    start.epoch += start.next_window / s.W;
    start.next_window %= s.W;
    if (start.next_window < 0) start.next_window = 0;
  } else {
    start.next_window = 0;
  }
  {
    MutexLock lock(&s.mu);  // no other thread yet; taken so the analysis can check the field
    s.consumer = start;
  }
  s.produced = start;
  s.worker = std::thread([&s] { s.Run(); });
}

BatchLoader::~BatchLoader() {
  {
    MutexLock lock(&impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.NotifyAll();
  impl_->worker.join();
}

double BatchLoader::Next(int32_t* inputs, int32_t* targets) {
  Impl& s = *impl_;
  const auto t0 = std::chrono::steady_clock::now();
  Impl::Batch b;
  {
    MutexLock lock(&s.mu);
    while (s.ready.empty()) s.cv.Wait(&s.mu);
    b = std::move(s.ready.front());
    s.ready.pop_front();
    s.consumer = b.after;
  }
  s.cv.NotifyAll();
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::memcpy(inputs, b.inputs.data(), b.inputs.size() * sizeof(int32_t));
  std::memcpy(targets, b.targets.data(), b.targets.size() * sizeof(int32_t));
  return waited;
}

LoaderPosition BatchLoader::position() const {
  MutexLock lock(&impl_->mu);
  return impl_->consumer;
}

int64_t BatchLoader::windows_per_epoch() const { return impl_->W; }

}  // namespace traind::engine
