// Key and value encodings of the nvme store (offload/README.md "On-disk format").
#include "format.h"

#include <cstring>

#include "crc32c.h"

namespace traind::offload {
namespace {

void PutBigEndian64(std::string* s, uint64_t v) {
  for (int i = 7; i >= 0; --i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t GetBigEndian64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
std::string RecordKey(char tag, const StateKey& key, uint64_t epoch) {
  std::string s = KeyId(key);
  s[0] = tag;
  PutBigEndian64(&s, epoch);
  return s;
}

}  // namespace

Status ValidateKey(const StateKey& key) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("offload key " + key.ToString() + ": " + why);
  };
  if (key.group.empty() || key.group.size() > 255) return bad("group must be 1..255 bytes");
  if (key.kind.empty() || key.kind.size() > 255) return bad("kind must be 1..255 bytes");
  if (key.group.find('\0') != std::string::npos || key.kind.find('\0') != std::string::npos)
    return bad("group and kind must not contain NUL bytes");
  if (key.chunk < 0) return bad("chunk index must be >= 0");
  return Status::Ok();
}

std::string KeyId(const StateKey& key) {
  std::string s;
  s.reserve(key.group.size() + key.kind.size() + 11);
  s.push_back('d');
  s += key.group;
  s.push_back('\0');
  s += key.kind;
  s.push_back('\0');
  PutBigEndian64(&s, static_cast<uint64_t>(key.chunk));
  return s;
}

std::string DataKey(const StateKey& key, uint64_t epoch) { return RecordKey('d', key, epoch); }
std::string IndexKey(const StateKey& key, uint64_t epoch) { return RecordKey('i', key, epoch); }

bool ParseRecordKey(std::string_view rk, StateKey* key, uint64_t* epoch) {
  if (rk.size() < 1 + 2 + 16 || (rk[0] != 'd' && rk[0] != 'i')) return false;
  const std::string_view body = rk.substr(1, rk.size() - 1 - 16);
  const size_t nul1 = body.find('\0');
  if (nul1 == std::string_view::npos || nul1 + 1 >= body.size() || body.back() != '\0') return false;
  key->group = std::string(body.substr(0, nul1));
  key->kind = std::string(body.substr(nul1 + 1, body.size() - nul1 - 2));
  key->chunk = static_cast<int64_t>(GetBigEndian64(rk.data() + rk.size() - 16));
  *epoch = GetBigEndian64(rk.data() + rk.size() - 8);
  return !key->group.empty() && !key->kind.empty() && key->kind.find('\0') == std::string::npos;
}

void PutFixed32(char* p, uint32_t v) { std::memcpy(p, &v, 4); }  // little-endian hosts
void PutFixed64(char* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint32_t GetFixed32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t GetFixed64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

void EncodeValueHeader(const std::string& key_id, char* header, size_t payload_bytes) {
  const uint32_t crc =
      Crc32c(Crc32c(0, key_id.data(), key_id.size()), header + kValueHeaderBytes, payload_bytes);
  PutFixed32(header, kValueMagic);
  PutFixed32(header + 4, crc);
  PutFixed64(header + 8, payload_bytes);
}

Status CheckValue(const std::string& key_id, std::string_view value, size_t expected_bytes,
                  const std::string& what) {
  if (value.size() < kValueHeaderBytes || GetFixed32(value.data()) != kValueMagic)
    return Status::DataLoss(what + ": record header is damaged (" + std::to_string(value.size()) +
                            " bytes, bad magic or short)");
  const uint64_t n = GetFixed64(value.data() + 8);
  if (n != value.size() - kValueHeaderBytes || n != expected_bytes)
    return Status::DataLoss(what + ": record holds " + std::to_string(value.size() - kValueHeaderBytes) +
                            " payload bytes, header says " + std::to_string(n) + ", index says " +
                            std::to_string(expected_bytes));
  const uint32_t stored = GetFixed32(value.data() + 4);
  const uint32_t actual = Crc32c(Crc32c(0, key_id.data(), key_id.size()),
                                 value.data() + kValueHeaderBytes, n);
  if (stored != actual) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "crc32c mismatch (stored %08x, computed %08x)", stored, actual);
    return Status::DataLoss(what + ": " + buf);
  }
  return Status::Ok();
}

std::string EncodeIndexValue(uint64_t bytes, uint32_t crc) {
  std::string v(12, '\0');
  PutFixed64(v.data(), bytes);
  PutFixed32(v.data() + 8, crc);
  return v;
}

bool DecodeIndexValue(std::string_view v, uint64_t* bytes, uint32_t* crc) {
  if (v.size() != 12) return false;
  *bytes = GetFixed64(v.data());
  *crc = GetFixed32(v.data() + 8);
  return true;
}

std::string EncodeCommit(uint64_t epoch, int64_t step) {
  std::string v(24, '\0');
  PutFixed32(v.data(), 0x31434f54);  // "TOC1"
  PutFixed64(v.data() + 8, epoch);
  PutFixed64(v.data() + 16, static_cast<uint64_t>(step));
  PutFixed32(v.data() + 4, Crc32c(0, v.data() + 8, 16));
  return v;
}

bool DecodeCommit(std::string_view v, uint64_t* epoch, int64_t* step) {
  if (v.size() != 24 || GetFixed32(v.data()) != 0x31434f54) return false;
  if (GetFixed32(v.data() + 4) != Crc32c(0, v.data() + 8, 16)) return false;
  *epoch = GetFixed64(v.data() + 8);
  *step = static_cast<int64_t>(GetFixed64(v.data() + 16));
  return true;
}

}  // namespace traind::offload
