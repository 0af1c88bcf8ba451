// The checkpoint interfaces' helpers (ckpt/checkpoint.h): ForEachCoarsePart.
#include "ckpt/checkpoint.h"

#include <catch2/catch.hpp>
#include <functional>
#include <random>
#include <utility>
#include <vector>

#include "tests/test_util.h"

namespace tessera {
namespace {

// Row-major linear index of `idx` in `shape`.
int64_t Linear(const std::vector<int64_t>& shape, const std::vector<int64_t>& idx) {
  int64_t at = 0;
  for (size_t d = 0; d < shape.size(); ++d) at = at * shape[d] + idx[d];
  return at;
}

// Calls fn(index) for every index of `box`, row-major.
void ForEachIndex(const Box& box, const std::function<void(const std::vector<int64_t>&)>& fn) {
  std::vector<int64_t> idx(box.rank());
  for (int d = 0; d < box.rank(); ++d) idx[d] = box[d].begin;
  if (IsEmpty(box)) return;
  for (;;) {
    fn(idx);
    int d = box.rank() - 1;
    while (d >= 0 && ++idx[d] == box[d].end) {
      idx[d] = box[d].begin;
      --d;
    }
    if (d < 0) return;
  }
}

TEST_CASE("ForEachCoarsePart: a box over a view is exactly its coarse parts") {
  // Elements are their row-major index, the same in every shape of the
  // tensor: each part's bytes, cut at `at` from the box's dense buffer,
  // must be the coarse box's elements, and the parts must cover the box once.
  std::mt19937_64 rng(testing::TestSeed() + 80);
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> shapes = {
      {{4, 3, 4}, {4, 12}},   {{2, 3, 2, 5}, {6, 10}}, {{3, 1, 4, 1}, {12}},
      {{2, 2, 3}, {2, 2, 3}}, {{1, 6, 2}, {12}},       {{5, 2, 2, 2}, {5, 8}}};
  for (const auto& [fine, coarse] : shapes) {
    for (int iter = 0; iter < 40; ++iter) {
      Box box(static_cast<int>(fine.size()));
      for (size_t d = 0; d < fine.size(); ++d) {
        const int64_t a = testing::Uniform(rng, 0, fine[d] - 1);
        box[d] = {a, testing::Uniform(rng, a + 1, fine[d])};
      }
      INFO(ShapeToString(fine) << " over " << ShapeToString(coarse) << ": " << ToString(box));
      std::vector<int64_t> dense;  // the box's dense buffer
      ForEachIndex(box, [&](const std::vector<int64_t>& i) { dense.push_back(Linear(fine, i)); });
      int64_t covered = 0;
      bool exact = true;
      const Status s = ForEachCoarsePart(
          box, fine, coarse,
          [&](const Box& part, const std::vector<int64_t>& extents, const Box& at) -> Status {
            if (NumElements(Box::FromShape(extents)) != static_cast<int64_t>(dense.size())) {
              return InternalError("extents " + ShapeToString(extents));
            }
            std::vector<int64_t> got(NumElements(part)), want;
            CopyBox(dense.data(), extents, at, got.data(), part.extents(),
                    Box::FromShape(part.extents()), 8);
            ForEachIndex(part,
                         [&](const std::vector<int64_t>& i) { want.push_back(Linear(coarse, i)); });
            exact = exact && got == want;
            covered += NumElements(part);
            return Status::Ok();
          });
      REQUIRE(s.ok());
      CHECK(exact);
      CHECK(covered == NumElements(box));
    }
  }
  CHECK_FALSE(ForEachCoarsePart(Box({{0, 1}, {0, 1}}), {12, 4}, {4, 12}, [](auto&, auto&, auto&) {
                return Status::Ok();
              }).ok());
}

}  // namespace
}  // namespace tessera
