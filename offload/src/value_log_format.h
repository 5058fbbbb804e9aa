// The value-log store's on-disk format (offload/README.md "The value-log store"), shared by the
// store (value_log_store.cc) and offload_inspect: segment file names, slots, and the 56-byte index
// record of one chunk. The index keys and the commit record are the RocksDB store's (format.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace traind::offload {

inline constexpr size_t kAlign = 4096;  // O_DIRECT alignment of offsets, lengths and buffers
inline constexpr uint32_t kIndexMagic = 0x31564f54;  // "TOV1"
inline constexpr size_t kIndexValueBytes = 56;

inline uint64_t RoundUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// "seg-000001.vlog" for 1; ParseSegmentName is its inverse (false for other names and 0).
std::string SegmentName(uint32_t number);
bool ParseSegmentName(const std::string& name, uint32_t* number);

// A slot: `capacity` bytes at `offset` of segment file `file`.
struct Loc {
  uint32_t file = 0;
  uint64_t offset = 0;
};

// One chunk's slots and its committed (or pending) version.
struct Entry {
  uint64_t bytes = 0;     // payload bytes
  uint64_t capacity = 0;  // slot size: RoundUp(bytes)
  Loc slot[2];
  int current = 0;  // committed: the slot holding the committed data; pending: the slot written
  uint32_t crc = 0;  // crc32c(KeyId || payload) of slot[current]
};

// The slot size of a payload of `bytes` (at least one 4 KiB block).
uint64_t Capacity(uint64_t bytes);

// Index record value (56 bytes, little endian): u32 magic "TOV1", u32 committed slot (0 = A,
// 1 = B), u64 payload bytes, u64 slot capacity, u32 file A, u32 file B, u64 offset A, u64 offset B,
// u32 crc32c(KeyId || payload) of the committed slot, u32 crc32c of the 52 bytes before it.
std::string EncodeEntry(const Entry& e);
// False when `v` is not such a record (length, magic, checksum, slot, capacity or alignment).
bool DecodeEntry(std::string_view v, Entry* e);

}  // namespace traind::offload
