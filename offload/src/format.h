// The byte layout of the nvme store's RocksDB keys and values (spec: offload/README.md "On-disk
// format"), and the key checks both stores share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "traind/engine/optimizer_state_store.h"
#include "traind/engine/status.h"

namespace traind::offload {

using engine::StateKey;

// OK or INVALID_ARGUMENT naming the key and what is wrong with it.
Status ValidateKey(const StateKey& key);

// 'd' + group + '\0' + kind + '\0' + be64(chunk): the chunk's identity without its version.
std::string KeyId(const StateKey& key);
// Data record key: 'd' id-rest + be64(epoch). Index record key: the same with 'i'.
std::string DataKey(const StateKey& key, uint64_t epoch);
std::string IndexKey(const StateKey& key, uint64_t epoch);
// Parses an index (or data) record key back; false if it is not one.
bool ParseRecordKey(std::string_view rk, StateKey* key, uint64_t* epoch);

// Data record value: a 16-byte header, then the payload.
//   0  u32 magic "TOD1"   4  u32 crc32c(KeyId || payload)   8  u64 payload bytes   (little endian)
constexpr size_t kValueHeaderBytes = 16;
constexpr uint32_t kValueMagic = 0x31444f54;  // "TOD1"
// Fills header (kValueHeaderBytes) for a payload already copied behind it at header + 16.
void EncodeValueHeader(const std::string& key_id, char* header, size_t payload_bytes);
// OK, or DATA_LOSS "<what>: ..." when the record is short, has a wrong magic/length or checksum.
Status CheckValue(const std::string& key_id, std::string_view value, size_t expected_bytes,
                  const std::string& what);

// Index record value: u64 payload bytes, u32 crc32c(KeyId || payload) (12 bytes).
std::string EncodeIndexValue(uint64_t bytes, uint32_t crc);
bool DecodeIndexValue(std::string_view v, uint64_t* bytes, uint32_t* crc);

// The commit record, key "c": u32 magic "TOC1", u32 crc32c of the next 16 bytes, u64 epoch,
// i64 step (24 bytes).
constexpr char kCommitKey[] = "c";
std::string EncodeCommit(uint64_t epoch, int64_t step);
bool DecodeCommit(std::string_view v, uint64_t* epoch, int64_t* step);

void PutFixed32(char* p, uint32_t v);
void PutFixed64(char* p, uint64_t v);
uint32_t GetFixed32(const char* p);
uint64_t GetFixed64(const char* p);

}  // namespace traind::offload
