// XXH3 (64-bit) checksums: one-shot and streaming. The only file that
// includes xxhash.h is checksum.cc.
#ifndef TESSERA_CORE_CHECKSUM_H_
#define TESSERA_CORE_CHECKSUM_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace tessera {

uint64_t Xxh3(const void* data, size_t size);
// libxxhash's XXH3_64bits, without run-time dispatch: the same digest as
// Xxh3() (tests compare the two; benchmarks time both).
uint64_t Xxh3Plain(const void* data, size_t size);

// Streaming XXH3: Update() any number of times, Digest() any time; the
// result equals Xxh3() of the concatenated input.
class Xxh3Hasher {
 public:
  Xxh3Hasher();
  ~Xxh3Hasher();
  Xxh3Hasher(const Xxh3Hasher&) = delete;
  Xxh3Hasher& operator=(const Xxh3Hasher&) = delete;

  void Reset();
  void Update(const void* data, size_t size);
  uint64_t Digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// CRC-32 (IEEE 802.3, zlib's and Python's binascii.crc32), continuing from
// `crc` (the CRC of the bytes before, 0 at the start).
uint32_t Crc32(const void* data, size_t size, uint32_t crc = 0);

// 16 lowercase hex digits.
std::string ChecksumToHex(uint64_t checksum);

}  // namespace tessera

#endif  // TESSERA_CORE_CHECKSUM_H_
