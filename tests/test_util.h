// Helpers shared by the tests: seeded randomness that can be replayed.
#ifndef TESSERA_TESTS_TEST_UTIL_H_
#define TESSERA_TESTS_TEST_UTIL_H_

#include <stdlib.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>

#include "core/env.h"

namespace tessera::testing {

// TESSERA_TEST_SEED overrides the seed of every property test; failures print
// the seed so a run can be replayed.
inline uint64_t TestSeed(uint64_t fallback = 20261123) {
  const char* s = std::getenv("TESSERA_TEST_SEED");
  return s ? std::strtoull(s, nullptr, 10) : fallback;
}

// TESSERA_TEST_ITERATIONS overrides how many random cases property tests run.
inline int TestIterations(int fallback) {
  const char* s = std::getenv("TESSERA_TEST_ITERATIONS");
  return s ? std::atoi(s) : fallback;
}

inline int64_t Uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// A fresh directory under /tmp, removed with everything in it afterwards.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/tessera-test-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { (void)DeleteRecursively(Env::Default(), path); }
};

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TEST_UTIL_H_
