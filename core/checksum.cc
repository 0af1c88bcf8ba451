#include "core/checksum.h"

#include <xxhash.h>

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

}  // namespace tessera
