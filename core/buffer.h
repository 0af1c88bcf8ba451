// Large byte buffers whose allocation can fail politely: sizes come from
// files (a manifest may claim a terabyte), so running out of memory is an
// error naming what was being allocated, never an exception or abort.
#ifndef TESSERA_CORE_BUFFER_H_
#define TESSERA_CORE_BUFFER_H_

#include <cstddef>
#include <memory>
#include <new>
#include <string>

#include "core/status.h"

namespace tessera {

// Uninitialised bytes (at least one, so a zero-size buffer is valid).
inline Result<std::unique_ptr<char[]>> AllocateBytes(size_t size, const std::string& what) {
  std::unique_ptr<char[]> p(new (std::nothrow) char[size == 0 ? 1 : size]);
  if (!p) {
    return ResourceExhaustedError("cannot allocate " + std::to_string(size) + " bytes for " + what);
  }
  return p;
}

}  // namespace tessera

#endif  // TESSERA_CORE_BUFFER_H_
