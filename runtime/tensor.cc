#include "runtime/tensor.h"

namespace tessera {

Result<Tensor> Tensor::Zeros(DType dtype, std::vector<int64_t> shape) {
  ASSIGN_OR_RETURN(int64_t n, ShapeElements(shape, dtype));
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.numel_ = n;
  t.storage_.assign(static_cast<size_t>(n * DTypeSize(dtype)), std::byte{0});
  return t;
}

Result<Tensor> Tensor::FromF32(std::span<const float> values, std::vector<int64_t> shape,
                               DType dtype) {
  if (!IsFloatingPoint(dtype)) {
    return InvalidArgumentError("a tensor of " + std::string(DTypeName(dtype)) +
                                " cannot be made from f32 values");
  }
  ASSIGN_OR_RETURN(Tensor t, Zeros(dtype, std::move(shape)));
  if (static_cast<int64_t>(values.size()) != t.numel_) {
    return InvalidArgumentError(std::to_string(values.size()) + " values for a tensor " +
                                t.Describe() + " of " + std::to_string(t.numel_) + " elements");
  }
  RETURN_IF_ERROR(t.AssignF32(values));
  return t;
}

float* Tensor::f32() {
  return dtype_ == DType::kF32 ? reinterpret_cast<float*>(storage_.data()) : nullptr;
}

const float* Tensor::f32() const {
  return dtype_ == DType::kF32 ? reinterpret_cast<const float*>(storage_.data()) : nullptr;
}

Status Tensor::CheckRange(int64_t offset, int64_t n) const {
  if (offset >= 0 && offset <= numel_ && n <= numel_ - offset) return Status::Ok();
  return OutOfRangeError("elements [" + std::to_string(offset) + ", " + std::to_string(offset + n) +
                         ") of tensor " + Describe());
}

Status Tensor::CopyToF32(std::span<float> out, int64_t offset) const {
  const int64_t n = static_cast<int64_t>(out.size());
  RETURN_IF_ERROR(CheckRange(offset, n));
  return ConvertFloats(dtype_, storage_.data() + offset * DTypeSize(dtype_), DType::kF32,
                       out.data(), n);
}

Status Tensor::AssignF32(std::span<const float> in, int64_t offset) {
  const int64_t n = static_cast<int64_t>(in.size());
  RETURN_IF_ERROR(CheckRange(offset, n));
  return ConvertFloats(DType::kF32, in.data(), dtype_, storage_.data() + offset * DTypeSize(dtype_),
                       n);
}

Result<Tensor> Tensor::To(DType dtype) const {
  if (dtype == dtype_) return *this;
  ASSIGN_OR_RETURN(Tensor t, Zeros(dtype, shape_));
  RETURN_IF_ERROR(ConvertFloats(dtype_, storage_.data(), dtype, t.storage_.data(), numel_));
  return t;
}

Status Tensor::Reshape(std::vector<int64_t> shape) {
  ASSIGN_OR_RETURN(int64_t n, ShapeElements(shape, dtype_));
  if (n != numel_) {
    return InvalidArgumentError("cannot reshape tensor " + Describe() + " to " +
                                ShapeToString(shape) + ": " + std::to_string(n) + " elements");
  }
  shape_ = std::move(shape);
  return Status::Ok();
}

std::string Tensor::Describe() const {
  return std::string(DTypeName(dtype_)) + ShapeToString(shape_);
}

}  // namespace tessera
