// Element types of tensors, their sizes and their names.
#ifndef TESSERA_CORE_DTYPE_H_
#define TESSERA_CORE_DTYPE_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "core/status.h"

namespace tessera {

enum class DType : uint8_t {
  kF32 = 0,
  kF16,
  kBF16,
  kF64,
  kI8,
  kU8,
  kI16,
  kU16,
  kI32,
  kU32,
  kI64,
  kU64,
  kBool,
};

inline constexpr int kNumDTypes = 13;

// Bytes per element.
int64_t DTypeSize(DType dtype);
// Canonical short name: "f32", "bf16", "i64", "bool", ...
std::string_view DTypeName(DType dtype);
// Accepts the short names and the long ones ("float32", "bfloat16", "int64").
Result<DType> ParseDType(std::string_view name);
bool IsFloatingPoint(DType dtype);

// Another format's names for dtypes ("F32", "Float32", ...): a table and
// its two lookups ("?" / nullopt when absent).
struct DTypeNaming {
  DType dtype;
  const char* name;
};
std::string_view DTypeNameIn(std::span<const DTypeNaming> table, DType dtype);
std::optional<DType> DTypeNamedIn(std::span<const DTypeNaming> table, std::string_view name);

// Converts n floating-point values (f32, f16, bf16, f64) from one dtype to
// another: widening is exact; narrowing rounds to nearest even (f64 -> f32
// as the hardware does, f32 -> f16/bf16 as core/half.h). src and dst must
// not overlap unless they are the same buffer of the same dtype.
Status ConvertFloats(DType from, const void* src, DType to, void* dst, int64_t n);

}  // namespace tessera

#endif  // TESSERA_CORE_DTYPE_H_
