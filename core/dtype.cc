#include "core/dtype.h"

#include <array>
#include <string>

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

}  // namespace tessera
