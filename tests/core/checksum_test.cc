#include "core/checksum.h"

#include <array>
#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

namespace tessera {
namespace {

TEST_CASE("XXH3 matches the reference value and streaming equals one-shot") {
  // XXH3_64bits of the empty input (seed 0), from the xxHash specification.
  CHECK(Xxh3("", 0) == 0x2D06800538D394C2ULL);
  CHECK(ChecksumToHex(0x2D06800538D394C2ULL) == "2d06800538d394c2");

  std::mt19937_64 rng(7);
  std::string data(100000, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  Xxh3Hasher h;
  size_t pos = 0;
  while (pos < data.size()) {
    size_t n = std::min<size_t>(data.size() - pos, rng() % 5000);
    h.Update(data.data() + pos, n);
    pos += n;
  }
  CHECK(h.Digest() == Xxh3(data.data(), data.size()));
  // A flipped byte changes the checksum.
  std::string flipped = data;
  flipped[4321] ^= 1;
  CHECK(Xxh3(flipped.data(), flipped.size()) != Xxh3(data.data(), data.size()));
}

TEST_CASE("the dispatching XXH3 gives the plain function's digests at every length and alignment") {
  std::mt19937_64 rng(11);
  std::vector<unsigned char> buf((1 << 20) + 64);
  for (auto& c : buf) c = static_cast<unsigned char>(rng());
  // Lengths across XXH3's code paths (0-16, 17-128, 129-240, long inputs
  // of one or more stripes and blocks) at every offset modulo 64.
  std::vector<size_t> lengths = {0, 1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1024, 1025, 65536};
  for (int i = 0; i < 60; ++i) lengths.push_back(rng() % (1 << 20));
  for (size_t n : lengths) {
    for (size_t off : {size_t{0}, size_t{1}, size_t{7}, size_t{31}, size_t(rng() % 64)}) {
      const unsigned char* p = buf.data() + off;
      INFO("length " << n << " at offset " << off);
      REQUIRE(Xxh3(p, n) == Xxh3Plain(p, n));
      Xxh3Hasher h;
      size_t pos = 0;
      while (pos < n) {
        size_t k = std::min<size_t>(n - pos, 1 + rng() % 300000);
        h.Update(p + pos, k);
        pos += k;
      }
      REQUIRE(h.Digest() == Xxh3Plain(p, n));
    }
  }
}

// The CRC-32 of zlib and Python's binascii.crc32, bit by bit: the reference
// ISA-L's folded implementation must equal.
uint32_t BitwiseCrc32(const unsigned char* p, size_t n, uint32_t crc) {
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc & 1) ? 0xEDB88320u ^ (crc >> 1) : crc >> 1;
  }
  return ~crc;
}

TEST_CASE("CRC-32 is zlib's: the check value, random lengths and alignments, continued") {
  CHECK(Crc32("123456789", 9) == 0xCBF43926u);
  CHECK(Crc32("", 0) == 0u);
  std::mt19937_64 rng(5);
  std::vector<unsigned char> buf(200000);
  for (auto& c : buf) c = static_cast<unsigned char>(rng());
  for (int i = 0; i < 200; ++i) {
    size_t off = rng() % 64, n = rng() % (i < 100 ? 300 : buf.size() - 64);
    const unsigned char* p = buf.data() + off;
    uint32_t whole = BitwiseCrc32(p, n, 0);
    REQUIRE(Crc32(p, n) == whole);
    size_t cut = n ? rng() % n : 0;
    REQUIRE(Crc32(p + cut, n - cut, Crc32(p, cut)) == whole);
  }
}

}  // namespace
}  // namespace tessera
