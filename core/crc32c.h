// CRC-32C (Castagnoli, polynomial 0x1EDC6F41, reflected), the checksum
// checkpoints record for every file they write. Chosen because x86-64's
// SSE4.2 computes it in hardware (several GB/s per core), and because it is
// the checksum storage systems (iSCSI, ext4 metadata, LevelDB) use, so
// `crc32c` tools elsewhere agree with ours.
//
//   uint32_t crc = 0;
//   crc = Crc32cExtend(crc, first_bytes, n1);   // any chunking gives
//   crc = Crc32cExtend(crc, more_bytes, n2);    // the same value
//
// Pure functions; thread-safe.
#ifndef ZE_CORE_CRC32C_H_
#define ZE_CORE_CRC32C_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace ze {

// The CRC-32C of (the data `crc` was computed over) followed by `data`.
// Crc32cExtend(0, data, n) is the CRC-32C of `data` alone; "123456789"
// gives 0xE3069283.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);

inline uint32_t Crc32c(const void* data, size_t size) {
  return Crc32cExtend(0, data, size);
}

// The CRC-32C of A followed by B, from crc_a = Crc32c(A), crc_b = Crc32c(B)
// and B's length, without the bytes: lets threads checksum pieces of one
// file in parallel. O(log length_b).
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b);

// "crc32c:" followed by 8 lowercase hex digits: how manifests write it.
std::string Crc32cToString(uint32_t crc);

// Whether Crc32cExtend uses the CPU's crc32 instruction (for benchmarks'
// records).
bool Crc32cIsHardwareAccelerated();

}  // namespace ze

#endif  // ZE_CORE_CRC32C_H_
