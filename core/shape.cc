#include "core/shape.h"

#include <limits>

namespace tessera {

std::string ShapeToString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Result<int64_t> ShapeElements(const std::vector<int64_t>& shape, DType dtype) {
  int64_t elements = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    const int64_t n = shape[d];
    if (n < 0) {
      return InvalidArgumentError("shape " + ShapeToString(shape) + " has negative dimension " +
                                  std::to_string(d));
    }
    if (n > 0 && elements > std::numeric_limits<int64_t>::max() / n) {
      return InvalidArgumentError("shape " + ShapeToString(shape) +
                                  " overflows a 64-bit element count");
    }
    elements *= n;
  }
  if (elements > std::numeric_limits<int64_t>::max() / DTypeSize(dtype)) {
    return InvalidArgumentError("shape " + ShapeToString(shape) + " of " +
                                std::string(DTypeName(dtype)) + " overflows a 64-bit byte count");
  }
  return elements;
}

}  // namespace tessera
