#include "runtime/train/offload.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <numeric>

#include "core/pages.h"

namespace tessera {
namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/tessera_offload_XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

// Weights of 4 units: unit 0 two ranges (the ends of the vector, as wte and
// ln_f are), units 1..3 a block each, of sizes that cut pages anywhere.
std::vector<std::vector<OffloadedWeights::Range>> Units() {
  return {{{0, 5000, 0}, {95000, 5000, 0}},
          {{5000, 30000, 0}},
          {{35000, 30000, 0}},
          {{65000, 30000, 0}}};
}

TEST_CASE("ReturnPages frees only whole pages inside the range") {
  std::vector<float> v(100000, 1.0f);
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  REQUIRE(ReturnPages(v.data() + 10, 40000 * 4).ok());
  // Bytes outside the range keep their values; whole pages inside read zero.
  CHECK(v[9] == 1.0f);
  CHECK(v[40010] == 1.0f);
  CHECK(v[20000] == 0.0f);
  CHECK(ReturnablePageBytes(v.data() + 10, 40000 * 4) % page == 0);
  CHECK(ReturnablePageBytes(v.data() + 10, 100) == 0);  // no whole page inside
}

TEST_CASE("OffloadedWeights: units out of memory come back with their values") {
  TempDir dir;
  std::vector<float> w(100000);
  const auto units = Units();
  auto made = OffloadedWeights::Create(dir.path, 0, w.data(), 100000, units);
  REQUIRE(made.ok());
  OffloadedWeights& off = **made;
  CHECK(std::filesystem::exists(dir.path + "/weights.rank0.bin"));
  // Initialise unit by unit, as ParallelGpt::Init does.
  for (int u = 0; u < 4; ++u) {
    REQUIRE(off.Need(u, true).ok());
    for (const auto& r : units[u]) {
      std::iota(w.begin() + r.begin, w.begin() + r.begin + r.n, static_cast<float>(r.begin));
    }
  }
  REQUIRE(off.Evict().ok());
  CHECK(off.resident_bytes() == 0);
  CHECK(w[50000] == 0.0f);  // its pages were given back
  // A "step": forward 0 1 2 3 0, backward 0 3 2 1 0, recorded, then again
  // with every unit read ahead; the values always are the ones written.
  const std::vector<int> order = {0, 1, 2, 3, 0, 3, 2, 1, 0};
  for (int step = 0; step < 3; ++step) {
    if (step == 0) off.BeginOrder();
    for (int u : order) {
      REQUIRE(off.Need(u, false).ok());
      for (const auto& r : units[u]) {
        for (int64_t i = r.begin; i < r.begin + r.n; i += 997)
          REQUIRE(w[i] == static_cast<float>(i));
      }
      // At most the unit in use, the one read ahead and one written back.
      CHECK(off.resident_bytes() <= 5000 * 8 + 2 * 30000 * 4);
    }
    if (step == 0) off.EndOrder();
  }
  CHECK(off.peak_resident_bytes() <= 5000 * 8 + 2 * 30000 * 4);
  CHECK(off.bytes_read() >= 3 * 400000);
  // Changes are written back when the unit leaves and read again later.
  REQUIRE(off.Need(2, true).ok());
  w[40000] = -1.0f;
  REQUIRE(off.Need(3, false).ok());
  REQUIRE(off.Need(1, false).ok());
  REQUIRE(off.Evict().ok());
  REQUIRE(off.Need(2, false).ok());
  CHECK(w[40000] == -1.0f);
  // NeedAll: everything in memory (a save); StoreAll after a load.
  REQUIRE(off.NeedAll().ok());
  CHECK(w[99999] == 99999.0f);
  CHECK(w[5] == 5.0f);
  std::fill(w.begin(), w.end(), 3.0f);
  REQUIRE(off.StoreAll().ok());
  CHECK(off.resident_bytes() == 0);
  REQUIRE(off.Need(1, false).ok());
  CHECK(w[20000] == 3.0f);
  CHECK(!off.Need(4, false).ok());
}

TEST_CASE("OffloadedWeights: a missing directory is named") {
  std::vector<float> w(10);
  auto made = OffloadedWeights::Create("/nonexistent/dir", 3, w.data(), 10, {{{0, 10, 0}}});
  REQUIRE(!made.ok());
  CHECK_THAT(std::string(made.status().message()),
             Catch::Contains("/nonexistent/dir/weights.rank3.bin"));
}

TEST_CASE("OffloadedMoments: buckets aligned for direct I/O, parts written keep the rest") {
  TempDir dir;
  const int64_t n = 5000;  // buckets of 1024 floats (1000 asked, whole 4 KiB blocks)
  auto made = OffloadedMoments::Create(dir.path, 1, n, 1000);
  REQUIRE(made.ok());
  OffloadedMoments& off = **made;
  CHECK(off.bucket_floats() == 1024);
  std::vector<float> m(n), v(n);
  std::iota(m.begin(), m.end(), 0.0f);
  std::iota(v.begin(), v.end(), 10000.0f);
  REQUIRE(off.Write(0, n, m.data(), v.data()).ok());
  // A part across a bucket boundary (1024 and 2048).
  std::vector<float> pm(300, -1.0f), pv(300, -2.0f);
  REQUIRE(off.Write(2000, 300, pm.data(), pv.data()).ok());
  std::vector<float> rm(n), rv(n);
  REQUIRE(off.Read(0, n, rm.data(), rv.data()).ok());
  for (int64_t i = 0; i < n; ++i) {
    const bool part = i >= 2000 && i < 2300;
    REQUIRE(rm[i] == (part ? -1.0f : static_cast<float>(i)));
    REQUIRE(rv[i] == (part ? -2.0f : static_cast<float>(10000 + i)));
  }
  // Streaming: every moment once, in order, and the changes kept.
  int64_t seen = 0;
  REQUIRE(off.Stream([&](int64_t begin, int64_t count, float* bm, float* bv) {
               CHECK(begin == seen);
               seen += count;
               for (int64_t i = 0; i < count; ++i) {
                 bm[i] += 1.0f;
                 bv[i] = bm[i] * 2.0f;
               }
             })
              .ok());
  CHECK(seen == n);
  REQUIRE(off.Read(4990, 10, rm.data(), rv.data()).ok());
  CHECK(rm[0] == 4991.0f);
  CHECK(rv[9] == 2.0f * 5000.0f);
  CHECK(!off.Read(4990, 11, rm.data(), rv.data()).ok());
}

}  // namespace
}  // namespace tessera
