#include "core/dtype.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/half.h"
#include "core/shape.h"

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

TEST_CASE("float conversions: exact widening, one rounding when narrowing") {
  const std::vector<float> f = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 1e-8f, 3.1415927f, INFINITY};
  std::vector<uint16_t> h(f.size()), b(f.size());
  REQUIRE(ConvertFloats(DType::kF32, f.data(), DType::kF16, h.data(), f.size()).ok());
  REQUIRE(ConvertFloats(DType::kF32, f.data(), DType::kBF16, b.data(), f.size()).ok());
  for (size_t i = 0; i < f.size(); ++i) {
    CHECK(h[i] == FloatToHalf(f[i]));
    CHECK(b[i] == FloatToBF16(f[i]));
  }
  std::vector<double> d(f.size());
  REQUIRE(ConvertFloats(DType::kF16, h.data(), DType::kF64, d.data(), h.size()).ok());
  for (size_t i = 0; i < f.size(); ++i) CHECK(d[i] == static_cast<double>(HalfToFloat(h[i])));

  // Just above the halfway point between two halves (bfloat16s): through a
  // plain f32 the 2^-40 is lost, the value becomes a tie and rounds down to
  // even; the right answer rounds up.
  const double above_half_f16 = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  const double above_half_bf16 = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
  const double below_half_f16 = 1.0 + std::ldexp(1.0, -11) - std::ldexp(1.0, -40);
  uint16_t out = 0;
  REQUIRE(ConvertFloats(DType::kF64, &above_half_f16, DType::kF16, &out, 1).ok());
  CHECK(out == 0x3C01);  // 1 + 2^-10
  REQUIRE(ConvertFloats(DType::kF64, &below_half_f16, DType::kF16, &out, 1).ok());
  CHECK(out == 0x3C00);
  REQUIRE(ConvertFloats(DType::kF64, &above_half_bf16, DType::kBF16, &out, 1).ok());
  CHECK(out == 0x3F81);      // 1 + 2^-7
  const double huge = 1e39;  // beyond f32: infinity in both
  REQUIRE(ConvertFloats(DType::kF64, &huge, DType::kBF16, &out, 1).ok());
  CHECK(out == 0x7F80);

  const int32_t i32 = 7;
  float x = 0;
  const Status s = ConvertFloats(DType::kI32, &i32, DType::kF32, &x, 1);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("i32") != std::string::npos);
}

TEST_CASE("shape element counts are checked") {
  CHECK(*ShapeElements({}, DType::kF32) == 1);
  CHECK(*ShapeElements({3, 0, 5}, DType::kF32) == 0);
  CHECK(*ShapeElements({768, 3072}, DType::kBF16) == 768 * 3072);
  CHECK(ShapeToString({768, 3072}) == "[768, 3072]");
  const auto negative = ShapeElements({4, -1}, DType::kF32);
  REQUIRE_FALSE(negative.ok());
  CHECK(negative.status().message().find("dimension 1") != std::string::npos);
  CHECK_FALSE(ShapeElements({int64_t{1} << 40, int64_t{1} << 40}, DType::kF32).ok());
  CHECK_FALSE(ShapeElements({int64_t{1} << 31, int64_t{1} << 31}, DType::kF64).ok());
}

}  // namespace
}  // namespace tessera
