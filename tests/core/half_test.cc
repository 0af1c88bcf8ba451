#include "core/half.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

namespace tessera {
namespace {

// Reference narrowing: the nearest representable half, ties to even, found
// by comparing against the two neighbouring halves in double precision.
uint16_t ReferenceHalf(float f) {
  if (std::isnan(f)) return 0x7e00;
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  uint16_t best = 0;
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    if (HalfToFloat(static_cast<uint16_t>(h)) <= a) best = static_cast<uint16_t>(h);
  }
  const double lo = HalfToFloat(best);
  if (lo == a) return sign | best;
  const double hi = best + 1 == 0x7c00 ? 65536.0 : HalfToFloat(static_cast<uint16_t>(best + 1));
  if (a - lo < hi - a) return sign | best;
  if (a - lo > hi - a) return sign | static_cast<uint16_t>(best + 1);
  return sign | static_cast<uint16_t>((best & 1) ? best + 1 : best);
}

TEST_CASE("f16 widening is exact and narrowing round-trips every half") {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      CHECK((h & 0x7c00) == 0x7c00);
      CHECK(std::isnan(HalfToFloat(FloatToHalf(f))));
      continue;
    }
    REQUIRE(FloatToHalf(f) == h);
  }
  CHECK(HalfToFloat(0x3c00) == 1.0f);
  CHECK(HalfToFloat(0x0001) == std::ldexp(1.0f, -24));
  CHECK(HalfToFloat(0x7bff) == 65504.0f);
}

TEST_CASE("f16 narrowing rounds to nearest even, including subnormals") {
  const float samples[] = {1.0f + std::ldexp(1.0f, -11),  // tie -> even (1.0)
                           1.0f + 3 * std::ldexp(1.0f, -11),
                           65519.0f,
                           65520.0f,
                           1e9f,
                           std::ldexp(1.0f, -25),
                           std::ldexp(1.5f, -25),
                           std::ldexp(3.0f, -25),
                           6.1e-5f,
                           3.3e-7f,
                           -2.71828f,
                           0.1f,
                           1234.567f};
  for (float f : samples) {
    INFO(f);
    if (std::fabs(f) >= 65520.0f) {
      CHECK((FloatToHalf(f) & 0x7fff) == 0x7c00);
    } else {
      CHECK(FloatToHalf(f) == ReferenceHalf(f));
    }
  }
}

TEST_CASE("bf16 keeps the f32 exponent and rounds the mantissa to even") {
  CHECK(BF16ToFloat(FloatToBF16(1.0f)) == 1.0f);
  CHECK(FloatToBF16(1.0f + std::ldexp(1.0f, -8)) == FloatToBF16(1.0f));  // tie -> even
  CHECK(BF16ToFloat(FloatToBF16(1.0f + 3 * std::ldexp(1.0f, -8))) == 1.0f + std::ldexp(1.0f, -6));
  CHECK(std::isnan(BF16ToFloat(FloatToBF16(std::nanf("")))));
  CHECK(std::isinf(BF16ToFloat(FloatToBF16(3.4e38f))));  // rounds up past max
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = BF16ToFloat(static_cast<uint16_t>(h));
    if (!std::isnan(f)) REQUIRE(FloatToBF16(f) == h);
  }
}

}  // namespace
}  // namespace tessera
