#include "core/thread_pool.h"

#include <atomic>
#include <catch2/catch.hpp>

namespace tessera {
namespace {

TEST_CASE("ThreadPool runs every task and Wait blocks until done") {
  ThreadPool pool(3);
  std::atomic<int> sum{0};
  for (int i = 1; i <= 100; ++i) pool.Submit([&sum, i] { sum += i; });
  pool.Wait();
  CHECK(sum == 5050);
}

TEST_CASE("ParallelFor covers every index once and reports the first error") {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> hits(1000);
  REQUIRE(pool.ParallelFor(1000,
                           [&](int64_t i) {
                             hits[i]++;
                             return Status::Ok();
                           })
              .ok());
  for (auto& h : hits) CHECK(h == 1);
  Status s = pool.ParallelFor(
      100, [](int64_t i) { return i == 37 ? DataLossError("piece 37 corrupt") : Status::Ok(); });
  CHECK(s.code() == StatusCode::kDataLoss);
  CHECK(s.message() == "piece 37 corrupt");
}

}  // namespace
}  // namespace tessera
