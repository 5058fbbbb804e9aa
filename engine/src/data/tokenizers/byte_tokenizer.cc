// The byte tokenizer: each UTF-8 byte of the text is one token, its value the id (vocab 256).
#include "data/tokenizers/internal.h"

namespace traind::engine::tokenizers {
namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  std::string kind() const override { return "byte"; }
  int64_t vocab_size() const override { return 256; }
  std::optional<int32_t> eos_id() const override { return std::nullopt; }
  std::string fingerprint() const override { return "byte:" + Hex16(Fnv1a("byte")); }
  Result<std::vector<int32_t>> Encode(std::string_view text, bool) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  Result<std::vector<int32_t>> EncodeWithOffsets(std::string_view text,
                                                 std::vector<int64_t>* starts) const override {
    starts->resize(text.size());
    for (size_t i = 0; i < text.size(); ++i) (*starts)[i] = static_cast<int64_t>(i);
    return Encode(text, false);
  }
  Result<std::vector<int32_t>> EncodeLarge(std::string_view text, int,
                                           std::atomic<int64_t>* bytes_done) const override {
    Result<std::vector<int32_t>> ids = Encode(text, false);
    if (bytes_done != nullptr) bytes_done->fetch_add(static_cast<int64_t>(text.size()));
    return ids;
  }
  Result<std::string> Decode(const std::vector<int32_t>& ids, bool) const override {
    TRAIND_RETURN_IF_ERROR(CheckIds(ids, 256));
    std::string out(ids.size(), '\0');
    for (size_t i = 0; i < ids.size(); ++i) out[i] = static_cast<char>(ids[i]);
    return out;
  }
};

}  // namespace

std::unique_ptr<Tokenizer> MakeByteTokenizer() { return std::make_unique<ByteTokenizer>(); }

}  // namespace traind::engine::tokenizers
