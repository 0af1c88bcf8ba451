#include "transform/mesh.h"

#include <catch2/catch.hpp>

namespace tessera {
namespace {

TEST_CASE("Mesh numbers ranks row-major, first axis outermost") {
  auto m = Mesh::Create({"pp", "dp", "tp"}, {2, 3, 4});
  REQUIRE(m.ok());
  CHECK(m->world_size() == 24);
  CHECK(m->Coordinates(0) == std::vector<int64_t>{0, 0, 0});
  CHECK(m->Coordinates(1) == std::vector<int64_t>{0, 0, 1});  // tp neighbours
  CHECK(m->Coordinates(4) == std::vector<int64_t>{0, 1, 0});
  CHECK(m->Coordinates(23) == std::vector<int64_t>{1, 2, 3});
  for (int64_t r = 0; r < 24; ++r) {
    CHECK(m->RankOf(m->Coordinates(r)) == r);
    for (int a = 0; a < 3; ++a) CHECK(m->Coordinate(r, a) == m->Coordinates(r)[a]);
  }
  CHECK(m->FindAxis("dp") == 1);
  CHECK(m->FindAxis("ep") == -1);
  CHECK(m->ToString() == "[pp=2, dp=3, tp=4]");
  CHECK(Mesh().world_size() == 1);
}

TEST_CASE("Mesh::Parse reads the CLI form") {
  auto m = Mesh::Parse("dp=2,tp=4,pp=1");
  REQUIRE(m.ok());
  CHECK(m->axis_names() == std::vector<std::string>{"dp", "tp", "pp"});
  CHECK(m->axis_sizes() == std::vector<int64_t>{2, 4, 1});
  CHECK_FALSE(Mesh::Parse("dp2").ok());
  CHECK_FALSE(Mesh::Parse("dp=x").ok());
}

TEST_CASE("Mesh rejects bad axes with a named error") {
  auto dup = Mesh::Create({"dp", "dp"}, {2, 2});
  REQUIRE_FALSE(dup.ok());
  CHECK(dup.status().message().find("'dp' appears twice") != std::string::npos);
  auto zero = Mesh::Create({"tp"}, {0});
  REQUIRE_FALSE(zero.ok());
  CHECK(zero.status().message().find("'tp' has size 0") != std::string::npos);
  CHECK_FALSE(Mesh::Create({"tp"}, {-3}).ok());
  CHECK_FALSE(Mesh::Create({"1x"}, {2}).ok());
  CHECK_FALSE(Mesh::Create({"a", "b"}, {2}).ok());
  CHECK_FALSE(Mesh::Create({"a", "b", "c"}, {1 << 12, 1 << 12, 2}).ok());
}

}  // namespace
}  // namespace tessera
