// Byte counts as people write and read them.
#ifndef TESSERA_CORE_BYTE_SIZE_H_
#define TESSERA_CORE_BYTE_SIZE_H_

#include <cstdint>
#include <string>

#include "core/status.h"

namespace tessera {

// "256MiB", "1G", "1.5gb", "4096" -> bytes (binary units, case-insensitive).
Result<int64_t> ParseByteSize(const std::string& text);
// 1536 -> "1.5 KiB".
std::string HumanBytes(int64_t bytes);
// `n` rounded up to a multiple of `to` (> 0).
inline uint64_t RoundUp(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }
// n / d, rounded up (the number of blocks of `d` that hold `n`).
inline uint64_t CeilDiv(uint64_t n, uint64_t d) { return (n + d - 1) / d; }

}  // namespace tessera

#endif  // TESSERA_CORE_BYTE_SIZE_H_
