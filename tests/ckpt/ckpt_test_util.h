// Helpers shared by the ckpt tests: write options with a codec, memory
// budget and thread count, and opening a checkpoint that must open.
#ifndef TESSERA_TESTS_CKPT_CKPT_TEST_UTIL_H_
#define TESSERA_TESTS_CKPT_CKPT_TEST_UTIL_H_

#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "ckpt/ops.h"

namespace tessera::testing {

inline WriteOptions Options(Codec codec, int64_t budget = kDefaultMemoryBudget, int threads = 2) {
  WriteOptions o;
  o.native.codec = codec;
  o.native.level = 1;
  o.transform.memory_budget = budget;
  o.transform.threads = threads;
  return o;
}

inline std::unique_ptr<CheckpointReader> Open(Env* env, const std::string& path) {
  auto r = OpenCheckpoint(env, path);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return std::move(*r);
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_CKPT_CKPT_TEST_UTIL_H_
