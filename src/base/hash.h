#pragma once
// A fast 64-bit hash for checksums of large blobs (session KV files) and keys (token blocks).
// Not cryptographic: it detects truncation and corruption, not an adversary. Four independent
// multiply-xor lanes over 8-byte words keep the multiplier busy, so a checksum runs at several
// GB/s and never bounds a restore.
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ellm {

inline uint64_t hash_mix(uint64_t x) {
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ull;
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ull;
  x ^= x >> 32;
  return x;
}

// seed chains calls: hash_bytes(b, nb, hash_bytes(a, na)) hashes a then b.
inline uint64_t hash_bytes(const void* data, size_t bytes, uint64_t seed = 0) {
  constexpr uint64_t kMul = 0x9e3779b97f4a7c15ull;
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t lane[4] = {seed ^ 0x243f6a8885a308d3ull, seed ^ 0x13198a2e03707344ull,
                      seed ^ 0xa4093822299f31d0ull, seed ^ 0x082efa98ec4e6c89ull};
  size_t i = 0;
  for (; i + 32 <= bytes; i += 32)
    for (int k = 0; k < 4; ++k) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * k, 8);
      lane[k] = (lane[k] ^ w) * kMul;
      lane[k] ^= lane[k] >> 29;
    }
  uint64_t h = bytes;
  for (int k = 0; k < 4; ++k) h = hash_mix(h ^ lane[k]) * kMul;
  for (; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return hash_mix(h);
}

}  // namespace ellm
