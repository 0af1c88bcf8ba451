#include "transform/box.h"

#include <catch2/catch.hpp>
#include <numeric>
#include <random>

#include "tests/test_util.h"

namespace tessera {
namespace {

std::vector<Interval> AllIntervals(int64_t n) {
  std::vector<Interval> out;
  for (int64_t b = 0; b <= n; ++b) {
    for (int64_t e = b; e <= n; ++e) out.push_back({b, e});
  }
  return out;
}

bool In(const Interval& iv, int64_t x) { return x >= iv.begin && x < iv.end; }

TEST_CASE("Interval: Intersect and Contains agree with brute force on all placements") {
  const int64_t n = 6;
  for (const Interval& a : AllIntervals(n)) {
    for (const Interval& b : AllIntervals(n)) {
      Interval i = Intersect(a, b);
      bool contains = true;
      for (int64_t x = 0; x < n; ++x) {
        CHECK(In(i, x) == (In(a, x) && In(b, x)));
        if (In(b, x) && !In(a, x)) contains = false;
      }
      CHECK(Contains(a, b) == contains);
      CHECK(i.size() >= 0);
    }
  }
}

TEST_CASE("ChunkOf follows torch.chunk") {
  // torch.chunk(torch.arange(10), 4): sizes 3, 3, 3, 1
  CHECK(ChunkOf({0, 10}, 4, 0) == Interval{0, 3});
  CHECK(ChunkOf({0, 10}, 4, 3) == Interval{9, 10});
  // torch.chunk(torch.arange(5), 4): sizes 2, 2, 1 and a missing fourth
  CHECK(ChunkOf({0, 5}, 4, 2) == Interval{4, 5});
  CHECK(ChunkOf({0, 5}, 4, 3).empty());
  // torch.chunk(torch.arange(6), 4): sizes 2, 2, 2 and an empty fourth
  CHECK(ChunkOf({0, 6}, 4, 3).empty());
  CHECK(ChunkOf({10, 16}, 3, 1) == Interval{12, 14});
  // The pieces always tile the interval, in order.
  for (int64_t size = 0; size <= 20; ++size) {
    for (int64_t n = 1; n <= 9; ++n) {
      int64_t next = 0;
      for (int64_t i = 0; i < n; ++i) {
        Interval c = ChunkOf({0, size}, n, i);
        CHECK(c.begin == next);
        next = c.end;
        CHECK(c.size() <= (size + n - 1) / n);
      }
      CHECK(next == size);
    }
  }
}

TEST_CASE("Box: Intersect, Contains, IsEmpty on all 2-D placements") {
  const int64_t n = 3;
  auto ivs = AllIntervals(n);
  std::vector<Box> boxes;
  for (const Interval& a : ivs) {
    for (const Interval& b : ivs) boxes.push_back(Box{a, b});
  }
  for (const Box& a : boxes) {
    CHECK(IsEmpty(a) == (NumElements(a) == 0));
    for (const Box& b : boxes) {
      Box i = Intersect(a, b);
      bool contains = true;
      int64_t count = 0;
      for (int64_t x = 0; x < n; ++x) {
        for (int64_t y = 0; y < n; ++y) {
          const bool ina = In(a[0], x) && In(a[1], y);
          const bool inb = In(b[0], x) && In(b[1], y);
          const bool ini = In(i[0], x) && In(i[1], y);
          CHECK(ini == (ina && inb));
          if (inb && !ina) contains = false;
          count += ini;
        }
      }
      CHECK(NumElements(i) == count);
      CHECK(Contains(a, b) == contains);
    }
  }
  CHECK(ToString(Box{{0, 512}, {0, 3072}}) == "[0:512, 0:3072]");
  CHECK(ToString(Box(0)) == "[]");
  CHECK(NumElements(Box(0)) == 1);  // a scalar
  CHECK(RelativeTo(Box{{4, 6}, {2, 3}}, Box{{4, 8}, {1, 3}}) == Box{{0, 2}, {1, 2}});
}

TEST_CASE("Box: copies, moves and assignments across inline and heap ranks (0..8)") {
  auto make = [](int rank, int64_t seed) {
    Box b(rank);
    for (int d = 0; d < rank; ++d) b[d] = {seed + d, seed + 2 * d + 3};
    return b;
  };
  for (int a = 0; a <= kMaxRank; ++a) {
    const Box x = make(a, 10);
    CHECK(x.rank() == a);
    CHECK(Box(a) == Box(a));
    for (int d = 0; d < a; ++d) CHECK(Box(a)[d] == Interval{0, 0});
    Box copy = x;
    CHECK(copy == x);
    copy[0 < a ? a - 1 : 0] = a > 0 ? Interval{-1, 7} : Interval{};
    if (a > 0) CHECK(copy != x);  // a deep copy: x is untouched
    CHECK(x == make(a, 10));
    Box moved = std::move(copy);
    CHECK(moved.rank() == a);
    CHECK(copy.rank() == 0);  // NOLINT(bugprone-use-after-move): moved-from is empty
    for (int b = 0; b <= kMaxRank; ++b) {
      INFO("rank " << a << " assigned rank " << b);
      Box y = make(b, 100);
      y = x;
      CHECK(y == x);
      CHECK(ToString(y) == ToString(x));
      Box z = make(b, 200);
      Box w = x;
      z = std::move(w);
      CHECK(z == x);
      CHECK(NumElements(z) == NumElements(x));
      CHECK(Intersect(z, x) == x);
      Box self = make(b, 300);
      const Box before = self;
      self = *&self;
      CHECK(self == before);
    }
  }
  CHECK(Box({{1, 2}, {3, 4}, {5, 6}, {7, 8}, {9, 10}, {11, 12}}).extents() ==
        std::vector<int64_t>{1, 1, 1, 1, 1, 1});
  CHECK(sizeof(Box) <= 80);
}

TEST_CASE("CompactBox: every rank and bound a Box holds, inline or on the heap, back unchanged") {
  const int64_t big = int64_t{1} << 40;
  const std::vector<Interval> bounds{{0, 0},         {3, 7},           {-5, 2},
                                     {0, INT32_MAX}, {INT32_MIN, 0},   {0, int64_t{INT32_MAX} + 1},
                                     {big, big + 9}, {-big, INT64_MAX}};
  std::mt19937_64 rng(7);
  for (int rank = 0; rank <= kMaxRank; ++rank) {
    for (int trial = 0; trial < 40; ++trial) {
      Box b(rank);
      for (int d = 0; d < rank; ++d) b[d] = bounds[rng() % bounds.size()];
      INFO(ToString(b));
      const CompactBox c = b;
      CHECK(c.rank() == rank);
      CHECK(Box(c) == b);
      CHECK(c == b);
      CHECK(b == c);
      for (int d = 0; d < rank; ++d) CHECK(c[d] == b[d]);
      CHECK(c.extents() == b.extents());
      CHECK(c.origin() == b.origin());
      CompactBox copy = c;  // deep: the original outlives it unchanged
      CHECK(copy == c);
      CompactBox moved = std::move(copy);
      CHECK(moved == c);
      CompactBox assigned = Box({{1, 2}});
      assigned = c;
      CHECK(assigned == c);
      assigned = moved;  // over a value of the same kind
      CHECK(assigned == b);
      if (rank > 0) {
        Box other = b;
        other[rank - 1].end += 1;
        CHECK(c != CompactBox(other));
        CHECK(c != other);
      }
      assigned = *&assigned;
      CHECK(assigned == b);
    }
  }
  CHECK(CompactBox(Box({{1, 2}})) != CompactBox(Box({{1, 2}, {0, 1}})));
  CHECK(sizeof(CompactBox) == 32);
}

TEST_CASE("OriginLess orders boxes as their origin vectors compare") {
  std::mt19937_64 rng(7);
  std::vector<Box> boxes;
  for (int i = 0; i < 300; ++i) {
    Box b(static_cast<int>(rng() % 7));  // ranks 0..6: inline and heap
    for (int d = 0; d < b.rank(); ++d) {
      const int64_t lo = static_cast<int64_t>(rng() % 3);
      b[d] = {lo, lo + 1 + static_cast<int64_t>(rng() % 2)};
    }
    boxes.push_back(std::move(b));
  }
  for (const Box& a : boxes) {
    for (const Box& b : boxes) {
      INFO(ToString(a) << " < " << ToString(b));
      CHECK(OriginLess(a, b) == (a.origin() < b.origin()));
    }
  }
}

TEST_CASE("CopyBox moves exactly the box, for random boxes of rank 0..4") {
  std::mt19937_64 rng(testing::TestSeed());
  for (int iter = 0; iter < 300; ++iter) {
    const int rank = static_cast<int>(testing::Uniform(rng, 0, 4));
    std::vector<int64_t> se(rank), de(rank);
    Box sb(rank), db(rank);
    for (int d = 0; d < rank; ++d) {
      const int64_t len = testing::Uniform(rng, 0, 4);
      se[d] = len + testing::Uniform(rng, 0, 3);
      de[d] = len + testing::Uniform(rng, 0, 3);
      const int64_t so = testing::Uniform(rng, 0, se[d] - len);
      const int64_t dof = testing::Uniform(rng, 0, de[d] - len);
      sb[d] = {so, so + len};
      db[d] = {dof, dof + len};
    }
    const int64_t sn = std::accumulate(se.begin(), se.end(), int64_t{1}, std::multiplies<>());
    const int64_t dn = std::accumulate(de.begin(), de.end(), int64_t{1}, std::multiplies<>());
    std::vector<int32_t> src(sn), dst(dn, -1), want(dn, -1);
    std::iota(src.begin(), src.end(), 0);
    // Brute force: visit every element of the box.
    std::vector<int64_t> idx(rank, 0);
    if (!IsEmpty(sb)) {
      for (;;) {
        int64_t so = 0, dof = 0;
        for (int d = 0; d < rank; ++d) {
          so = so * se[d] + sb[d].begin + idx[d];
          dof = dof * de[d] + db[d].begin + idx[d];
        }
        want[dof] = src[so];
        int d = rank - 1;
        for (; d >= 0; --d) {
          if (++idx[d] < sb[d].size()) break;
          idx[d] = 0;
        }
        if (d < 0) break;
      }
    }
    CopyBox(src.data(), se, sb, dst.data(), de, db, sizeof(int32_t));
    INFO("seed " << testing::TestSeed() << " iteration " << iter);
    REQUIRE(dst == want);
  }
}

}  // namespace
}  // namespace tessera
