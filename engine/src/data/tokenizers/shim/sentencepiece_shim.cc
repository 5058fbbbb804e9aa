// libtraind_sentencepiece.so: a C interface over libsentencepiece, loaded by the engine with
// dlopen(RTLD_LOCAL | RTLD_DEEPBIND). Debian's libsentencepiece carries its own copy of
// protobuf-lite 3.14 with exported symbols; linked into a process that also has the system
// libprotobuf (gRPC: trainctl, traind, the job runner) the two collide and sentencepiece aborts
// at load. Deep binding keeps sentencepiece on its own copy. See sentencepiece_tokenizer.cc.
#include <sentencepiece_processor.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

void SetError(const std::string& msg, char* err, size_t err_len) {
  if (err == nullptr || err_len == 0) return;
  std::strncpy(err, msg.c_str(), err_len - 1);
  err[err_len - 1] = '\0';
}

}  // namespace

extern "C" {

// A processor for the serialized model, or nullptr with the reason in err.
__attribute__((visibility("default"))) void* traind_spm_load(const char* bytes, size_t len,
                                                             char* err, size_t err_len) {
  auto* sp = new sentencepiece::SentencePieceProcessor();
  const auto st = sp->LoadFromSerializedProto(std::string(bytes, len));
  if (!st.ok()) {
    SetError(st.ToString(), err, err_len);
    delete sp;
    return nullptr;
  }
  return sp;
}

__attribute__((visibility("default"))) void traind_spm_free(void* handle) {
  delete static_cast<sentencepiece::SentencePieceProcessor*>(handle);
}

// piece count, bos, eos, pad (-1 when absent).
__attribute__((visibility("default"))) void traind_spm_info(void* handle, int* info4) {
  auto* sp = static_cast<sentencepiece::SentencePieceProcessor*>(handle);
  info4[0] = sp->GetPieceSize();
  info4[1] = sp->bos_id();
  info4[2] = sp->eos_id();
  info4[3] = sp->pad_id();
}

// 0 and a malloc'ed array in *ids (free with traind_spm_release), or -1 and err.
__attribute__((visibility("default"))) int traind_spm_encode(void* handle, const char* text,
                                                            size_t len, int** ids, size_t* n,
                                                            char* err, size_t err_len) {
  auto* sp = static_cast<sentencepiece::SentencePieceProcessor*>(handle);
  std::vector<int> out;
  const auto st = sp->Encode(std::string_view(text, len), &out);
  if (!st.ok()) {
    SetError(st.ToString(), err, err_len);
    return -1;
  }
  *n = out.size();
  *ids = static_cast<int*>(std::malloc((out.size() + 1) * sizeof(int)));
  if (*ids == nullptr) return -1;
  if (!out.empty()) std::memcpy(*ids, out.data(), out.size() * sizeof(int));
  return 0;
}

// 0 and a malloc'ed string in *text (free with traind_spm_release), or -1 and err.
__attribute__((visibility("default"))) int traind_spm_decode(void* handle, const int* ids,
                                                            size_t n, char** text,
                                                            size_t* text_len, char* err,
                                                            size_t err_len) {
  auto* sp = static_cast<sentencepiece::SentencePieceProcessor*>(handle);
  std::string out;
  const auto st = sp->Decode(std::vector<int>(ids, ids + n), &out);
  if (!st.ok()) {
    SetError(st.ToString(), err, err_len);
    return -1;
  }
  *text_len = out.size();
  *text = static_cast<char*>(std::malloc(out.size() + 1));
  if (*text == nullptr) return -1;
  std::memcpy(*text, out.data(), out.size());
  return 0;
}

__attribute__((visibility("default"))) void traind_spm_release(void* p) { std::free(p); }

}  // extern "C"
