#include "runtime/tensor.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/half.h"

namespace tessera {
namespace {

TEST_CASE("tensors hold any dtype, floats convert to and from f32") {
  auto zeros = Tensor::Zeros(DType::kI64, {2, 3});
  REQUIRE(zeros.ok());
  CHECK(zeros->numel() == 6);
  CHECK(zeros->nbytes() == 48);
  CHECK(zeros->Describe() == "i64[2, 3]");
  CHECK(zeros->f32() == nullptr);
  std::vector<float> out(6);
  CHECK(zeros->CopyToF32(out).code() == StatusCode::kInvalidArgument);  // not floating

  const std::vector<float> values = {1.0f, -2.0f, 0.1f, 3.0e-6f, 1000.5f, -0.0f};
  auto bf = Tensor::FromF32(values, {2, 3}, DType::kBF16);
  REQUIRE(bf.ok());
  CHECK(bf->nbytes() == 12);
  CHECK(bf->f32() == nullptr);
  REQUIRE(bf->CopyToF32(out).ok());
  for (size_t i = 0; i < values.size(); ++i) {
    CHECK(out[i] == BF16ToFloat(FloatToBF16(values[i])));  // f32 math on bf16 storage
  }
  // A range: elements [4, 6).
  std::vector<float> tail(2);
  REQUIRE(bf->CopyToF32(tail, 4).ok());
  CHECK(tail[0] == out[4]);
  CHECK(bf->CopyToF32(tail, 5).code() == StatusCode::kOutOfRange);
  REQUIRE(bf->AssignF32(std::vector<float>{7.0f}, 5).ok());
  REQUIRE(bf->CopyToF32(tail, 4).ok());
  CHECK(tail[1] == 7.0f);

  // f32 -> f16 -> f32 keeps values that f16 represents exactly.
  auto f32 = Tensor::FromF32(std::vector<float>{0.5f, 2048.0f, -3.25f}, {3});
  REQUIRE(f32.ok());
  REQUIRE(f32->f32() != nullptr);
  auto half = f32->To(DType::kF16);
  REQUIRE(half.ok());
  auto back = half->To(DType::kF32);
  REQUIRE(back.ok());
  CHECK(*back == *f32);
  CHECK_FALSE(*half == *f32);
}

TEST_CASE("tensor shapes: reshape keeps elements, bad shapes are named") {
  auto t = Tensor::FromF32(std::vector<float>(12, 1.0f), {3, 4});
  REQUIRE(t.ok());
  REQUIRE(t->Reshape({2, 2, 3}).ok());
  CHECK(t->Describe() == "f32[2, 2, 3]");
  const Status s = t->Reshape({5, 2});
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("f32[2, 2, 3]") != std::string::npos);
  CHECK(Tensor::Zeros(DType::kF32, {2, -1}).status().message().find("negative") !=
        std::string::npos);
  CHECK_FALSE(Tensor::FromF32(std::vector<float>(5), {2, 3}).ok());  // 5 values for 6
  CHECK_FALSE(Tensor::FromF32(std::vector<float>(6), {2, 3}, DType::kI32).ok());
  auto scalar = Tensor::Zeros(DType::kF64, {});
  REQUIRE(scalar.ok());
  CHECK(scalar->numel() == 1);
}

}  // namespace
}  // namespace tessera
