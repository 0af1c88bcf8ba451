#include "core/checksum.h"

#include <isa-l/crc.h>
#include <xxhash.h>
#if TESSERA_XXH_DISPATCH
// The run-time dispatching entry points (AVX2 / AVX-512 where the CPU has
// them; libxxhash's plain XXH3_64bits is its SSE2 build): about 3x the
// plain function's speed over large blocks, the same digests. Named
// explicitly, not through the header's macro replacement.
#define XXH_DISPATCH_DISABLE_REPLACE
#include <xxh_x86dispatch.h>
#endif

#include <cstdio>

namespace tessera {

struct Xxh3Hasher::State {
  XXH3_state_t* s = XXH3_createState();
  ~State() { XXH3_freeState(s); }
};

#if TESSERA_XXH_DISPATCH
uint64_t Xxh3(const void* data, size_t size) { return XXH3_64bits_dispatch(data, size); }
#else
uint64_t Xxh3(const void* data, size_t size) { return XXH3_64bits(data, size); }
#endif
uint64_t Xxh3Plain(const void* data, size_t size) { return XXH3_64bits(data, size); }

Xxh3Hasher::Xxh3Hasher() : state_(std::make_unique<State>()) { Reset(); }
Xxh3Hasher::~Xxh3Hasher() = default;

void Xxh3Hasher::Reset() { XXH3_64bits_reset(state_->s); }
void Xxh3Hasher::Update(const void* data, size_t size) {
#if TESSERA_XXH_DISPATCH
  XXH3_64bits_update_dispatch(state_->s, data, size);
#else
  XXH3_64bits_update(state_->s, data, size);
#endif
}
uint64_t Xxh3Hasher::Digest() const { return XXH3_64bits_digest(state_->s); }

std::string ChecksumToHex(uint64_t checksum) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(checksum));
  return buf;
}

uint32_t Crc32(const void* data, size_t size, uint32_t crc) {
  // ISA-L's reflected CRC-32 (zlib's crc32(), with PCLMULQDQ where present).
  return crc32_gzip_refl(crc, static_cast<const unsigned char*>(data), size);
}

}  // namespace tessera
