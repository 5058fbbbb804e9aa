// SentencePiece .model files through libsentencepiece (Debian's libsentencepiece-dev): the
// library does the encoding; we add the id checks, special-token handling and the fingerprint.
#include <sentencepiece_processor.h>

#include "data/tokenizers/internal.h"

namespace traind::engine::tokenizers {
namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(std::unique_ptr<sentencepiece::SentencePieceProcessor> sp,
                         std::string fingerprint)
      : sp_(std::move(sp)), fingerprint_(std::move(fingerprint)) {}

  std::string kind() const override { return "sentencepiece"; }
  int64_t vocab_size() const override { return sp_->GetPieceSize(); }
  std::optional<int32_t> eos_id() const override { return Opt(sp_->eos_id()); }
  std::optional<int32_t> bos_id() const override { return Opt(sp_->bos_id()); }
  std::optional<int32_t> pad_id() const override { return Opt(sp_->pad_id()); }
  std::string fingerprint() const override { return fingerprint_; }

  Result<std::vector<int32_t>> Encode(std::string_view text,
                                      bool add_special_tokens) const override {
    std::vector<int> ids;
    const auto st = sp_->Encode(text, &ids);
    if (!st.ok()) return Status::InvalidArgument("sentencepiece: encode failed: " + st.ToString());
    std::vector<int32_t> out;
    out.reserve(ids.size() + 1);
    // As LLaMA's tokenizer: <s> first (when the model has one), no </s>.
    if (add_special_tokens && sp_->bos_id() >= 0) out.push_back(sp_->bos_id());
    out.insert(out.end(), ids.begin(), ids.end());
    return out;
  }

  Result<std::string> Decode(const std::vector<int32_t>& ids,
                             bool skip_special_tokens) const override {
    TRAIND_RETURN_IF_ERROR(CheckIds(ids, vocab_size()));
    // SentencePiece renders control pieces (<s>, </s>, <pad>) as nothing in either case.
    (void)skip_special_tokens;
    std::vector<int> in(ids.begin(), ids.end());
    std::string out;
    const auto st = sp_->Decode(in, &out);
    if (!st.ok()) return Status::InvalidArgument("sentencepiece: decode failed: " + st.ToString());
    return out;
  }

 private:
  static std::optional<int32_t> Opt(int id) {
    return id >= 0 ? std::optional<int32_t>(id) : std::nullopt;
  }
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string fingerprint_;
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> MakeSentencePiece(const std::string& path) {
  TRAIND_ASSIGN_OR_RETURN(std::string bytes, ReadFileBytes(path, "data.tokenizer"));
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto st = sp->LoadFromSerializedProto(bytes);
  if (!st.ok()) {
    return Malformed(path, "not a SentencePiece model (" + st.ToString() + ")");
  }
  const std::string fp = "sentencepiece:" + Hex16(Fnv1a(bytes, Fnv1a("sentencepiece")));
  return std::unique_ptr<Tokenizer>(std::make_unique<SentencePieceTokenizer>(std::move(sp), fp));
}

}  // namespace traind::engine::tokenizers
