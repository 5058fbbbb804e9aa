// The value-log store's on-disk format: value_log_format.h.
#include "value_log_format.h"

#include <algorithm>
#include <cstdio>

#include "crc32c.h"
#include "format.h"

namespace traind::offload {

std::string SegmentName(uint32_t number) {
  char name[32];
  std::snprintf(name, sizeof(name), "seg-%06u.vlog", number);
  return name;
}

bool ParseSegmentName(const std::string& name, uint32_t* number) {
  unsigned n = 0;
  int end = 0;
  if (std::sscanf(name.c_str(), "seg-%6u.vlog%n", &n, &end) != 1 || static_cast<size_t>(end) != name.size())
    return false;
  *number = n;
  return n > 0;
}

uint64_t Capacity(uint64_t bytes) { return RoundUp(std::max<uint64_t>(bytes, 1)); }

std::string EncodeEntry(const Entry& e) {
  std::string v(kIndexValueBytes, '\0');
  char* p = v.data();
  PutFixed32(p, kIndexMagic);
  PutFixed32(p + 4, static_cast<uint32_t>(e.current));
  PutFixed64(p + 8, e.bytes);
  PutFixed64(p + 16, e.capacity);
  PutFixed32(p + 24, e.slot[0].file);
  PutFixed32(p + 28, e.slot[1].file);
  PutFixed64(p + 32, e.slot[0].offset);
  PutFixed64(p + 40, e.slot[1].offset);
  PutFixed32(p + 48, e.crc);
  PutFixed32(p + 52, Crc32c(0, p, 52));
  return v;
}

bool DecodeEntry(std::string_view v, Entry* e) {
  if (v.size() != kIndexValueBytes) return false;
  const char* p = v.data();
  if (GetFixed32(p) != kIndexMagic || GetFixed32(p + 52) != Crc32c(0, p, 52)) return false;
  const uint32_t current = GetFixed32(p + 4);
  if (current > 1) return false;
  e->current = static_cast<int>(current);
  e->bytes = GetFixed64(p + 8);
  e->capacity = GetFixed64(p + 16);
  e->slot[0].file = GetFixed32(p + 24);
  e->slot[1].file = GetFixed32(p + 28);
  e->slot[0].offset = GetFixed64(p + 32);
  e->slot[1].offset = GetFixed64(p + 40);
  e->crc = GetFixed32(p + 48);
  return e->capacity == Capacity(e->bytes) && e->slot[0].offset % kAlign == 0 &&
         e->slot[1].offset % kAlign == 0;
}

}  // namespace traind::offload
