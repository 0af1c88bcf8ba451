#include "core/dtype.h"

#include <catch2/catch.hpp>

namespace tessera {
namespace {

TEST_CASE("every dtype round-trips through its name and has the right size") {
  const int64_t sizes[kNumDTypes] = {4, 2, 2, 8, 1, 1, 2, 2, 4, 4, 8, 8, 1};
  for (int i = 0; i < kNumDTypes; ++i) {
    DType d = static_cast<DType>(i);
    CHECK(DTypeSize(d) == sizes[i]);
    auto parsed = ParseDType(DTypeName(d));
    REQUIRE(parsed.ok());
    CHECK(*parsed == d);
  }
  CHECK(*ParseDType("bfloat16") == DType::kBF16);
  CHECK(*ParseDType("float32") == DType::kF32);
  CHECK(IsFloatingPoint(DType::kBF16));
  CHECK_FALSE(IsFloatingPoint(DType::kI32));
  auto bad = ParseDType("f8");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("'f8'") != std::string::npos);
}

}  // namespace
}  // namespace tessera
