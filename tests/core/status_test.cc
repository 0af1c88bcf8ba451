#include "core/status.h"

#include <catch2/catch.hpp>

namespace tessera {
namespace {

Result<int> Half(int x) {
  if (x % 2) return InvalidArgumentError("odd: " + std::to_string(x));
  return x / 2;
}

Result<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int h, Half(x));
  ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status CheckEven(int x) {
  RETURN_IF_ERROR(Half(x).status());
  return Status::Ok();
}

TEST_CASE("Status carries code and message, Annotate prefixes context") {
  Status s = NotFoundError("file 'a' missing");
  CHECK_FALSE(s.ok());
  CHECK(s.code() == StatusCode::kNotFound);
  CHECK(s.ToString() == "NotFound: file 'a' missing");
  CHECK(s.Annotate("tensor 'w'").message() == "tensor 'w': file 'a' missing");
  CHECK(Status::Ok().Annotate("x").ok());
  CHECK(Status::Ok().ToString() == "OK");
}

TEST_CASE("Result and the macros propagate the first error") {
  CHECK(*Quarter(8) == 2);
  Result<int> r = Quarter(6);  // 6 -> 3 -> odd
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message() == "odd: 3");
  CHECK(CheckEven(4).ok());
  CHECK(CheckEven(5).code() == StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera
