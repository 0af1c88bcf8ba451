// splitmix64 (Steele, Lea and Flood, 2014): a tiny generator whose output
// is the same on every platform and standard library, for seeded
// initialisation, shuffles and synthetic data.
#ifndef TESSERA_CORE_RANDOM_H_
#define TESSERA_CORE_RANDOM_H_

#include <cstdint>

namespace tessera {

// The finaliser: a bijective mix of 64 bits (also a good integer hash).
inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The next number of the sequence that `state` walks.
inline uint64_t SplitMix64(uint64_t& state) { return Mix64(state += 0x9e3779b97f4a7c15ull); }

}  // namespace tessera

#endif  // TESSERA_CORE_RANDOM_H_
