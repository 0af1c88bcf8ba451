// Little-endian integers in byte buffers, for file headers.
#ifndef TESSERA_CORE_ENDIAN_H_
#define TESSERA_CORE_ENDIAN_H_

#include <cstdint>

namespace tessera {

template <typename T>
inline void PutLittleEndian(char* p, T v) {
  for (unsigned i = 0; i < sizeof(T); ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

template <typename T>
inline T GetLittleEndian(const char* p) {
  T v = 0;
  for (unsigned i = 0; i < sizeof(T); ++i) {
    v |= static_cast<T>(static_cast<unsigned char>(p[i])) << (8 * i);
  }
  return v;
}

}  // namespace tessera

#endif  // TESSERA_CORE_ENDIAN_H_
