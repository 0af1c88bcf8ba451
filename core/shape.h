// Tensor shapes as lists of dimensions: printing and checked element counts.
#ifndef TESSERA_CORE_SHAPE_H_
#define TESSERA_CORE_SHAPE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace tessera {

// "[768, 3072]"
std::string ShapeToString(const std::vector<int64_t>& shape);

// The number of elements of `shape` (1 for a scalar), or an error naming
// the negative dimension, or saying that the element count or the byte
// size of `dtype` overflows int64.
Result<int64_t> ShapeElements(const std::vector<int64_t>& shape, DType dtype);

}  // namespace tessera

#endif  // TESSERA_CORE_SHAPE_H_
