#include "core/checksum.h"

#include <xxhash.h>

#include <array>
#include <cstdio>

namespace tessera {

struct Xxh3Hasher::State {
  XXH3_state_t* s = XXH3_createState();
  ~State() { XXH3_freeState(s); }
};

uint64_t Xxh3(const void* data, size_t size) { return XXH3_64bits(data, size); }

Xxh3Hasher::Xxh3Hasher() : state_(std::make_unique<State>()) { Reset(); }
Xxh3Hasher::~Xxh3Hasher() = default;

void Xxh3Hasher::Reset() { XXH3_64bits_reset(state_->s); }
void Xxh3Hasher::Update(const void* data, size_t size) {
  XXH3_64bits_update(state_->s, data, size);
}
uint64_t Xxh3Hasher::Digest() const { return XXH3_64bits_digest(state_->s); }

std::string ChecksumToHex(uint64_t checksum) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(checksum));
  return buf;
}

uint32_t Crc32(const void* data, size_t size, uint32_t crc) {
  static const auto kTable = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const unsigned char* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = kTable[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

}  // namespace tessera
