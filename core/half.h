// IEEE binary16 (f16) and bfloat16 (bf16) <-> f32 conversions. Storage is
// 16 bits; arithmetic happens in f32. Narrowing rounds to nearest, ties to
// even; NaN stays NaN (quiet), infinities and signed zeros are kept.
#ifndef TESSERA_CORE_HALF_H_
#define TESSERA_CORE_HALF_H_

#include <bit>
#include <cstdint>

namespace tessera {

inline float BF16ToFloat(uint16_t h) { return std::bit_cast<float>(uint32_t{h} << 16); }

inline uint16_t FloatToBF16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);

}  // namespace tessera

#endif  // TESSERA_CORE_HALF_H_
