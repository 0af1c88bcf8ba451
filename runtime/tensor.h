// A dense host tensor: dtype, shape and the contiguous row-major storage it
// owns. Floating-point tensors may be stored as f16, bf16 or f64 while the
// kernels compute in f32: CopyToF32 widens a range of elements and
// AssignF32 rounds f32 values into the storage (to nearest even), so a
// bf16 weight takes half the memory of its f32 copy and is widened a slice
// at a time where it is used.
//
// Checkpoint I/O, data and (later) distributed tensors are expressed with
// it; the single-process GPT keeps its parameters in flat f32 vectors and
// exchanges them as Tensors at those edges.
#ifndef TESSERA_RUNTIME_TENSOR_H_
#define TESSERA_RUNTIME_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"
#include "core/status.h"

namespace tessera {

class Tensor {
 public:
  // An empty f32 tensor of shape [0].
  Tensor() : shape_{0} {}

  // Zero-filled. Dimensions must be >= 0 and the byte size must fit in
  // int64; a scalar has shape {}.
  static Result<Tensor> Zeros(DType dtype, std::vector<int64_t> shape);
  // `values` (as many as the shape holds) rounded into `dtype`, which must
  // be a floating-point type.
  static Result<Tensor> FromF32(std::span<const float> values, std::vector<int64_t> shape,
                                DType dtype = DType::kF32);

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return numel_; }
  int64_t nbytes() const { return static_cast<int64_t>(storage_.size()); }
  std::byte* bytes() { return storage_.data(); }
  const std::byte* bytes() const { return storage_.data(); }
  // The storage as floats: null unless the dtype is f32.
  float* f32();
  const float* f32() const;

  // Elements [offset, offset + out.size()) as f32 (floating dtypes only).
  Status CopyToF32(std::span<float> out, int64_t offset = 0) const;
  // Rounds `in` into elements [offset, offset + in.size()).
  Status AssignF32(std::span<const float> in, int64_t offset = 0);
  // A copy in another floating dtype (this tensor's own when equal).
  Result<Tensor> To(DType dtype) const;
  // The same elements under another shape with as many elements.
  Status Reshape(std::vector<int64_t> shape);

  // "bf16[4, 256]"
  std::string Describe() const;
  // Same dtype, shape and bytes.
  bool operator==(const Tensor& other) const = default;

 private:
  // OutOfRange naming the elements and this tensor unless [offset,
  // offset + n) lies within it.
  Status CheckRange(int64_t offset, int64_t n) const;

  DType dtype_ = DType::kF32;
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  std::vector<std::byte> storage_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_TENSOR_H_
