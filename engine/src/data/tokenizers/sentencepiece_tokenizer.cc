// SentencePiece .model files, encoded and decoded by libsentencepiece (Debian's
// libsentencepiece-dev) through libtraind_sentencepiece.so (shim/sentencepiece_shim.cc), which is
// dlopen()ed with RTLD_DEEPBIND: Debian's libsentencepiece exports its own protobuf-lite 3.14,
// which collides with the system libprotobuf in every binary that also speaks gRPC. The shim is
// found at $TRAIND_SENTENCEPIECE_SHIM, else next to the running binary, else at its build path.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>

#include "data/tokenizers/internal.h"
#include "core/environment.h"

namespace traind::engine::tokenizers {
namespace {

struct Shim {
  void* (*load)(const char*, size_t, char*, size_t) = nullptr;
  void (*free_handle)(void*) = nullptr;
  void (*info)(void*, int*) = nullptr;
  int (*encode)(void*, const char*, size_t, int**, size_t*, char*, size_t) = nullptr;
  int (*decode)(void*, const int*, size_t, char**, size_t*, char*, size_t) = nullptr;
  void (*release)(void*) = nullptr;
  std::string error;  // why it could not be loaded
};

std::string ExeDir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  std::string p(buf, static_cast<size_t>(n));
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? "" : p.substr(0, slash);
}

const Shim& LoadShim() {
  static const Shim* shim = [] {
    auto* s = new Shim();
    std::vector<std::string> candidates;
    const std::string env = ReadEngineEnvironment().sentencepiece_shim;  // TRAIND_SENTENCEPIECE_SHIM
    if (!env.empty()) candidates.push_back(env);
    candidates.push_back(ExeDir() + "/libtraind_sentencepiece.so");
#ifdef TRAIND_SENTENCEPIECE_SHIM_PATH
    candidates.push_back(TRAIND_SENTENCEPIECE_SHIM_PATH);
#endif
    void* lib = nullptr;
    std::string errors;
    for (const std::string& c : candidates) {
      lib = ::dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (lib != nullptr) break;
      const char* e = ::dlerror();
      errors += (errors.empty() ? "" : "; ") + std::string(e ? e : c);
    }
    if (lib == nullptr) {
      s->error = "the SentencePiece support library libtraind_sentencepiece.so cannot be loaded (" +
                 errors + "): build it with the engine and install libsentencepiece-dev, or set "
                 "TRAIND_SENTENCEPIECE_SHIM";
      return s;
    }
    s->load = reinterpret_cast<decltype(s->load)>(::dlsym(lib, "traind_spm_load"));
    s->free_handle = reinterpret_cast<decltype(s->free_handle)>(::dlsym(lib, "traind_spm_free"));
    s->info = reinterpret_cast<decltype(s->info)>(::dlsym(lib, "traind_spm_info"));
    s->encode = reinterpret_cast<decltype(s->encode)>(::dlsym(lib, "traind_spm_encode"));
    s->decode = reinterpret_cast<decltype(s->decode)>(::dlsym(lib, "traind_spm_decode"));
    s->release = reinterpret_cast<decltype(s->release)>(::dlsym(lib, "traind_spm_release"));
    if (!s->load || !s->free_handle || !s->info || !s->encode || !s->decode || !s->release) {
      s->error = "libtraind_sentencepiece.so lacks the traind_spm_* functions (a stale build?)";
    }
    return s;
  }();
  return *shim;
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const Shim& shim, void* handle, std::string fingerprint)
      : shim_(shim), handle_(handle), fingerprint_(std::move(fingerprint)) {
    shim_.info(handle_, info_);
  }
  ~SentencePieceTokenizer() override { shim_.free_handle(handle_); }

  std::string kind() const override { return "sentencepiece"; }
  int64_t vocab_size() const override { return info_[0]; }
  std::optional<int32_t> bos_id() const override { return Opt(info_[1]); }
  std::optional<int32_t> eos_id() const override { return Opt(info_[2]); }
  std::optional<int32_t> pad_id() const override { return Opt(info_[3]); }
  std::string fingerprint() const override { return fingerprint_; }

  Result<std::vector<int32_t>> Encode(std::string_view text,
                                      bool add_special_tokens) const override {
    int* ids = nullptr;
    size_t n = 0;
    char err[512] = {0};
    if (shim_.encode(handle_, text.data(), text.size(), &ids, &n, err, sizeof(err)) != 0) {
      return Status::InvalidArgument(std::string("sentencepiece: encode failed: ") + err);
    }
    std::vector<int32_t> out;
    out.reserve(n + 1);
    // As LLaMA's tokenizer: <s> first (when the model has one), no </s>.
    if (add_special_tokens && info_[1] >= 0) out.push_back(info_[1]);
    out.insert(out.end(), ids, ids + n);
    shim_.release(ids);
    return out;
  }

  Result<std::string> Decode(const std::vector<int32_t>& ids,
                             bool skip_special_tokens) const override {
    TRAIND_RETURN_IF_ERROR(CheckIds(ids, vocab_size()));
    // SentencePiece renders control pieces (<s>, </s>, <pad>) as nothing either way.
    (void)skip_special_tokens;
    std::vector<int> in(ids.begin(), ids.end());
    char* text = nullptr;
    size_t len = 0;
    char err[512] = {0};
    if (shim_.decode(handle_, in.data(), in.size(), &text, &len, err, sizeof(err)) != 0) {
      return Status::InvalidArgument(std::string("sentencepiece: decode failed: ") + err);
    }
    std::string out(text, len);
    shim_.release(text);
    return out;
  }

 private:
  static std::optional<int32_t> Opt(int id) {
    return id >= 0 ? std::optional<int32_t>(id) : std::nullopt;
  }
  const Shim& shim_;
  void* handle_;
  std::string fingerprint_;
  int info_[4] = {0, -1, -1, -1};
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> MakeSentencePiece(const std::string& path) {
  TRAIND_ASSIGN_OR_RETURN(std::string bytes, ReadFileBytes(path, "data.tokenizer"));
  const Shim& shim = LoadShim();
  if (!shim.error.empty()) {
    return Status::FailedPrecondition("data.tokenizer: " + path + ": " + shim.error);
  }
  char err[512] = {0};
  void* handle = shim.load(bytes.data(), bytes.size(), err, sizeof(err));
  if (handle == nullptr) {
    return Malformed(path, std::string("not a SentencePiece model (") + err + ")");
  }
  const std::string fp = "sentencepiece:" + Hex16(Fnv1a(bytes, Fnv1a("sentencepiece")));
  return std::unique_ptr<Tokenizer>(std::make_unique<SentencePieceTokenizer>(shim, handle, fp));
}

}  // namespace traind::engine::tokenizers
