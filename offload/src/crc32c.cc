// CRC32C: the reflected Castagnoli polynomial 0x82F63B78, slicing-by-8 table or SSE4.2.
#include "crc32c.h"

#include <array>
#include <cstring>

namespace traind::offload {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;

struct Tables {
  uint32_t t[8][256];
  Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
};
const Tables& T() {
  static const Tables tables;
  return tables;
}

// Multiplication of two polynomials modulo the CRC polynomial, in the reflected bit order the CRC
// uses (bit 31 is x^0): the algebra that shifts a CRC over zero bytes.
uint32_t MulModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t m = 1u << 31; m != 0; m >>= 1) {
    if (a & m) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return product;
}

// x^(8 * bytes) mod P: multiplying a CRC register by it appends `bytes` zero bytes.
uint32_t ShiftOperator(size_t bytes) {
  uint32_t result = 1u << 31;  // x^0
  uint32_t square = 1u << 23;  // x^8: one byte
  for (; bytes != 0; bytes >>= 1) {
    if (bytes & 1) result = MulModP(result, square);
    square = MulModP(square, square);
  }
  return result;
}

#if defined(__x86_64__)
// Three independent crc32 chains over three consecutive lanes of kLane bytes, joined by shifting
// the first two registers over the lanes after them: the instruction's latency is 3 cycles and
// its throughput 1 per cycle, so one chain runs at a third of what the core can do (~8 GB/s on
// the 2-core VM, slower than the disk this checksums for; three chains ~3x that).
constexpr size_t kLane = 32768;

__attribute__((target("sse4.2"))) uint64_t Chain(uint64_t c, const uint8_t* p, size_t n) {
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = __builtin_ia32_crc32di(c, v);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return c32;
}

__attribute__((target("sse4.2"))) uint32_t Crc32cSse42(uint32_t crc, const uint8_t* p, size_t n) {
  static const uint32_t shift_one = ShiftOperator(kLane), shift_two = ShiftOperator(2 * kLane);
  uint64_t c = static_cast<uint32_t>(~crc);
  for (; n >= 3 * kLane; p += 3 * kLane, n -= 3 * kLane) {
    uint64_t c1 = 0, c2 = 0;  // registers of lanes that start from nothing (the shift adds them)
    for (size_t i = 0; i < kLane; i += 8) {
      uint64_t v0, v1, v2;
      std::memcpy(&v0, p + i, 8);
      std::memcpy(&v1, p + kLane + i, 8);
      std::memcpy(&v2, p + 2 * kLane + i, 8);
      c = __builtin_ia32_crc32di(c, v0);
      c1 = __builtin_ia32_crc32di(c1, v1);
      c2 = __builtin_ia32_crc32di(c2, v2);
    }
    c = MulModP(shift_two, static_cast<uint32_t>(c)) ^ MulModP(shift_one, static_cast<uint32_t>(c1)) ^
        static_cast<uint32_t>(c2);
  }
  return ~static_cast<uint32_t>(Chain(c, p, n));
}
bool HaveSse42() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}
#endif

}  // namespace

uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  const Tables& t = T();
  uint32_t c = ~crc;
  while (n >= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;  // little-endian hosts only (x86-64, aarch64)
    c = t.t[7][lo & 0xff] ^ t.t[6][(lo >> 8) & 0xff] ^ t.t[5][(lo >> 16) & 0xff] ^ t.t[4][lo >> 24] ^
        t.t[3][hi & 0xff] ^ t.t[2][(hi >> 8) & 0xff] ^ t.t[1][(hi >> 16) & 0xff] ^ t.t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ t.t[0][(c ^ *p++) & 0xff];
  return ~c;
}

uint32_t Crc32c(uint32_t crc, const void* data, size_t n) {
#if defined(__x86_64__)
  if (HaveSse42()) return Crc32cSse42(crc, static_cast<const uint8_t*>(data), n);
#endif
  return Crc32cPortable(crc, data, n);
}

}  // namespace traind::offload
