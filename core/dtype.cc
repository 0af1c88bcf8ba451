#include "core/dtype.h"

#include <array>
#include <cmath>
#include <cstring>
#include <string>

#include "core/half.h"

namespace tessera {
namespace {

struct DTypeInfo {
  DType dtype;
  int64_t size;
  std::string_view name;
  std::string_view long_name;
  bool floating;
};

constexpr std::array<DTypeInfo, kNumDTypes> kInfo = {{
    {DType::kF32, 4, "f32", "float32", true},
    {DType::kF16, 2, "f16", "float16", true},
    {DType::kBF16, 2, "bf16", "bfloat16", true},
    {DType::kF64, 8, "f64", "float64", true},
    {DType::kI8, 1, "i8", "int8", false},
    {DType::kU8, 1, "u8", "uint8", false},
    {DType::kI16, 2, "i16", "int16", false},
    {DType::kU16, 2, "u16", "uint16", false},
    {DType::kI32, 4, "i32", "int32", false},
    {DType::kU32, 4, "u32", "uint32", false},
    {DType::kI64, 8, "i64", "int64", false},
    {DType::kU64, 8, "u64", "uint64", false},
    {DType::kBool, 1, "bool", "bool", false},
}};

const DTypeInfo& Info(DType d) { return kInfo[static_cast<int>(d)]; }

}  // namespace

int64_t DTypeSize(DType dtype) { return Info(dtype).size; }
std::string_view DTypeName(DType dtype) { return Info(dtype).name; }
bool IsFloatingPoint(DType dtype) { return Info(dtype).floating; }

Result<DType> ParseDType(std::string_view name) {
  for (const DTypeInfo& info : kInfo) {
    if (name == info.name || name == info.long_name) return info.dtype;
  }
  return InvalidArgumentError("unknown dtype '" + std::string(name) +
                              "' (expected one of f32, f16, bf16, f64, i8, u8, "
                              "i16, u16, i32, u32, i64, u64, bool)");
}

namespace {

// f32 is the pivot: every supported dtype converts to and from it exactly
// or with one rounding.
float LoadF32(DType dtype, const void* src, int64_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(src)[i];
    case DType::kF16:
      return HalfToFloat(static_cast<const uint16_t*>(src)[i]);
    case DType::kBF16:
      return BF16ToFloat(static_cast<const uint16_t*>(src)[i]);
    default:
      return static_cast<float>(static_cast<const double*>(src)[i]);
  }
}

void StoreF32(DType dtype, void* dst, int64_t i, float v) {
  switch (dtype) {
    case DType::kF32:
      static_cast<float*>(dst)[i] = v;
      break;
    case DType::kF16:
      static_cast<uint16_t*>(dst)[i] = FloatToHalf(v);
      break;
    case DType::kBF16:
      static_cast<uint16_t*>(dst)[i] = FloatToBF16(v);
      break;
    default:
      static_cast<double*>(dst)[i] = v;
      break;
  }
}

}  // namespace

Status ConvertFloats(DType from, const void* src, DType to, void* dst, int64_t n) {
  if (!IsFloatingPoint(from) || !IsFloatingPoint(to)) {
    return InvalidArgumentError("cannot convert " + std::string(DTypeName(from)) + " to " +
                                std::string(DTypeName(to)) + ": only f32, f16, bf16 and f64");
  }
  if (n < 0) return InvalidArgumentError("negative element count");
  if (from == to) {
    if (src != dst) std::memmove(dst, src, static_cast<size_t>(n * DTypeSize(from)));
    return Status::Ok();
  }
  if (from == DType::kF64 && (to == DType::kF16 || to == DType::kBF16)) {
    // Through f32 rounded to odd (truncate, then set the lowest bit when
    // inexact), so the second rounding is the only one: f32 carries more
    // than two extra bits over f16 and bf16.
    const double* in = static_cast<const double*>(src);
    for (int64_t i = 0; i < n; ++i) {
      const double d = in[i];
      float f = static_cast<float>(d);
      if (std::isfinite(d) && static_cast<double>(f) != d) {
        uint32_t u;
        std::memcpy(&u, &f, 4);
        if (std::fabs(static_cast<double>(f)) > std::fabs(d)) --u;  // truncate toward zero
        u |= 1u;
        std::memcpy(&f, &u, 4);
      }
      StoreF32(to, dst, i, f);
    }
    return Status::Ok();
  }
  for (int64_t i = 0; i < n; ++i) StoreF32(to, dst, i, LoadF32(from, src, i));
  return Status::Ok();
}

std::string_view DTypeNameIn(std::span<const DTypeNaming> table, DType dtype) {
  for (const DTypeNaming& n : table) {
    if (n.dtype == dtype) return n.name;
  }
  return "?";
}

std::optional<DType> DTypeNamedIn(std::span<const DTypeNaming> table, std::string_view name) {
  for (const DTypeNaming& n : table) {
    if (name == n.name) return n.dtype;
  }
  return std::nullopt;
}

}  // namespace tessera
