// CRC32C (Castagnoli), the per-chunk checksum of the offload stores. SSE4.2 `crc32` instructions
// when the CPU has them (about 10+ GB/s per core), a table otherwise; both give the same values
// (tests/offload/crc32c_test.cc checks the RFC 3720 vectors).
#pragma once

#include <cstddef>
#include <cstdint>

namespace traind::offload {

// CRC32C of data[0, n) continuing from `crc` (0 to start): Crc32c(Crc32c(0, a), b) == Crc32c(0, ab).
uint32_t Crc32c(uint32_t crc, const void* data, size_t n);

// The table version, for tests that compare both paths.
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t n);

}  // namespace traind::offload
