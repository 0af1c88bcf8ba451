#include "samples/synthetic_checkpoint.h"

#include <cstring>

#include "core/checksum.h"
#include "core/random.h"

namespace tessera::samples {
namespace {

// Bytes of one element: floats in [-0.02, 0.02) like an initialised
// model; other types take the hash's low bytes.
void Element(uint64_t h, DType dtype, char* out) {
  const float f = (static_cast<float>(h >> 40) / static_cast<float>(1 << 24) - 0.5f) * 0.04f;
  switch (dtype) {
    case DType::kF32:
      std::memcpy(out, &f, 4);
      return;
    case DType::kF64: {
      const double d = f;
      std::memcpy(out, &d, 8);
      return;
    }
    case DType::kBF16: {
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      const uint16_t b = static_cast<uint16_t>(bits >> 16);
      std::memcpy(out, &b, 2);
      return;
    }
    case DType::kBool:
      out[0] = static_cast<char>(h & 1);
      return;
    default:
      std::memcpy(out, &h, static_cast<size_t>(DTypeSize(dtype)));
  }
}

}  // namespace

SyntheticCheckpoint::SyntheticCheckpoint(Strategy strategy, uint64_t seed, int64_t step)
    : path_("<synthetic seed " + std::to_string(seed) + ">"), strategy_(std::move(strategy)) {
  meta_.step = step;
  meta_.metadata["synthetic_seed"] = std::to_string(seed);
  for (const TensorStrategy& t : strategy_.tensors()) {
    keys_.push_back(Mix64(seed ^ Xxh3(t.name.data(), t.name.size())));
  }
}

Status SyntheticCheckpoint::ReadRegion(size_t index, const Box& region, void* dst,
                                       const std::vector<int64_t>& dst_extents,
                                       const Box& dst_box) const {
  const Layout& l = strategy_.tensors()[index].layout;
  const int rank = l.rank();
  const int64_t es = DTypeSize(l.dtype);
  if (NumElements(region) == 0) return Status::Ok();
  // Walk the region row by row (last dimension innermost).
  std::vector<int64_t> idx(rank, 0);
  char* out = static_cast<char*>(dst);
  while (true) {
    int64_t global = 0, local = 0;
    for (int d = 0; d < rank - 1; ++d) {
      global = global * l.shape[d] + region[d].begin + idx[d];
      local = local * dst_extents[d] + dst_box[d].begin + idx[d];
    }
    const int64_t row = rank > 0 ? region[rank - 1].size() : 1;
    if (rank > 0) {
      global = global * l.shape[rank - 1] + region[rank - 1].begin;
      local = local * dst_extents[rank - 1] + dst_box[rank - 1].begin;
    }
    for (int64_t j = 0; j < row; ++j) {
      Element(Mix64(keys_[index] + static_cast<uint64_t>(global + j)), l.dtype,
              out + (local + j) * es);
    }
    int d = rank - 2;
    while (d >= 0 && ++idx[d] == region[d].size()) idx[d--] = 0;
    if (d < 0) break;
  }
  return Status::Ok();
}

}  // namespace tessera::samples
