#include "core/half.h"

namespace tessera {

float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // inf/NaN
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
  if (mant == 0) return std::bit_cast<float>(sign);  // signed zero
  // Subnormal: normalise the mantissa.
  int e = -1;
  do {
    mant <<= 1;
    ++e;
  } while ((mant & 0x400u) == 0);
  return std::bit_cast<float>(sign | ((112 - e) << 23) | ((mant & 0x3ffu) << 13));
}

uint16_t FloatToHalf(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // overflows to inf
  if (abs >= 0x38800000u) {                       // normal half
    uint32_t r = abs - 0x38000000u;               // rebias exponent
    r += 0xfffu + ((r >> 13) & 1);                // round to nearest even
    return sign | static_cast<uint16_t>(r >> 13);
  }
  if (abs < 0x33000000u) return sign;  // below half of min subnormal
  // Subnormal half: shift the full mantissa right with rounding.
  const uint32_t exp = abs >> 23;
  const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
  const int shift = 126 - static_cast<int>(exp);  // 14..24
  const uint32_t halfway = 1u << (shift - 1);
  uint32_t r = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1);
  if (rem > halfway || (rem == halfway && (r & 1))) ++r;
  return sign | static_cast<uint16_t>(r);
}

}  // namespace tessera
