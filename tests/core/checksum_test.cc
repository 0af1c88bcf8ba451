#include "core/checksum.h"

#include <catch2/catch.hpp>
#include <random>
#include <string>

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

}  // namespace
}  // namespace tessera
