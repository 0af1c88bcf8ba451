// The collective suite over in-process ranks (1..8), meshes, and the
// failure cases: a mismatch, a rank that leaves, a rank that never comes.
#include "runtime/comm/inprocess.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <mutex>
#include <thread>

#include "runtime/comm/launch.h"
#include "runtime/comm/reduce.h"
#include "tests/runtime/comm/collective_suite.h"

namespace tessera {
namespace {

using std::chrono::milliseconds;

// Runs fn on `n` ranks and gathers the failure strings every rank returns.
std::vector<std::string> OnRanks(int n,
                                 const std::function<std::vector<std::string>(Communicator&)>& fn,
                                 CommOptions options = {}) {
  std::mutex mu;
  std::vector<std::string> failures;
  Status s = RunInProcess(
      n,
      [&](Communicator& comm) {
        auto f = fn(comm);
        std::lock_guard<std::mutex> lock(mu);
        failures.insert(failures.end(), f.begin(), f.end());
        return Status::Ok();
      },
      options);
  if (!s.ok()) failures.push_back(s.ToString());
  return failures;
}

TEST_CASE("in-process: every collective on 1..8 ranks") {
  for (int n = 1; n <= 8; ++n) {
    INFO(n << " ranks");
    const auto failures = OnRanks(n, [](Communicator& c) {
      return testing::RunCollectiveSuite(c, {.bitwise_order = true, .reports_mismatch = true});
    });
    for (const auto& f : failures) UNSCOPED_INFO(f);
    CHECK(failures.empty());
  }
}

TEST_CASE("in-process: sub-communicators along every set of mesh axes") {
  for (int n : {1, 2, 4, 8}) {
    INFO(n << " ranks");
    const auto failures = OnRanks(n, [](Communicator& c) { return testing::RunMeshSuite(c); });
    for (const auto& f : failures) UNSCOPED_INFO(f);
    CHECK(failures.empty());
  }
}

TEST_CASE("in-process: a rank that fails aborts its peers at once, naming it") {
  const auto start = std::chrono::steady_clock::now();
  Status s = RunInProcess(4,
                          [](Communicator& c) -> Status {
                            if (c.rank() == 2)
                              return DataLossError("checkpoint shard 2 is corrupt");
                            float x = 1;
                            RETURN_IF_ERROR(c.AllReduce(&x, &x, 1, DType::kF32, ReduceOp::kSum));
                            return c.Barrier();
                          },
                          {.timeout = std::chrono::minutes(5)});
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == StatusCode::kDataLoss);  // the root cause, not the peers' aborts
  CHECK(s.message() == "rank 2: checkpoint shard 2 is corrupt");
}

TEST_CASE("in-process: a rank that finished early is named, no hang") {
  Status s = RunInProcess(3,
                          [](Communicator& c) -> Status {
                            if (c.rank() == 1) return Status::Ok();  // skips the collective
                            int64_t v = 1;
                            return c.AllReduce(&v, &v, 1, DType::kI64, ReduceOp::kSum);
                          },
                          {.timeout = std::chrono::minutes(5)});
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == StatusCode::kAborted);
  CHECK_THAT(s.message(), Catch::Contains("rank(s) 1 already finished"));
}

TEST_CASE("in-process: a collective past the timeout fails naming the missing rank") {
  std::atomic<bool> release{false};
  const auto start = std::chrono::steady_clock::now();
  Status s = RunInProcess(2,
                          [&](Communicator& c) -> Status {
                            if (c.rank() == 1) {  // stuck elsewhere, then comes late
                              while (!release) std::this_thread::sleep_for(milliseconds(5));
                              float x = 0;
                              return c.AllReduce(&x, &x, 1, DType::kF32, ReduceOp::kSum);
                            }
                            std::vector<float> x(1024, 1.0f);
                            Status r =
                                c.AllReduce(x.data(), x.data(), 1024, DType::kF32, ReduceOp::kSum);
                            release = true;
                            return r;
                          },
                          {.timeout = milliseconds(300)});
  const auto waited = std::chrono::steady_clock::now() - start;
  CHECK(waited >= milliseconds(300));
  CHECK(waited < std::chrono::seconds(10));
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == StatusCode::kDeadlineExceeded);
  CHECK_THAT(s.message(), Catch::Contains("rank 0 of 'world' (inprocess, 2 ranks): allreduce "
                                          "of 1024 f32 waited 300 ms for rank(s) 1"));
}

TEST_CASE("in-process: a receive nobody sends times out naming peer and tag") {
  Status s = RunInProcess(2,
                          [&](Communicator& c) -> Status {
                            if (c.rank() == 1) {
                              std::this_thread::sleep_for(milliseconds(500));
                              return Status::Ok();
                            }
                            float x;
                            return c.Recv(&x, 1, DType::kF32, 1, 42);
                          },
                          {.timeout = milliseconds(200)});
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == StatusCode::kDeadlineExceeded);
  CHECK_THAT(s.message(), Catch::Contains("receive of 1 f32 from rank 1 (tag 42)"));
}

TEST_CASE("LaunchRanks runs in-process without mpirun, RankTableFromEnv reads the table") {
  std::atomic<int> seen{0};
  REQUIRE(LaunchRanks({.backend = CommBackend::kInProcess, .ranks = 3}, [&](Communicator& c) {
            seen += c.size();
            return c.Barrier();
          }).ok());
  CHECK(seen == 9);

  unsetenv("OMPI_COMM_WORLD_RANK");
  unsetenv("OMPI_COMM_WORLD_SIZE");
  unsetenv("TESSERA_RANK");
  unsetenv("TESSERA_WORLD_SIZE");
  unsetenv("TESSERA_MASTER");
  CHECK(RankTableFromEnv().status().code() == StatusCode::kNotFound);
  setenv("TESSERA_RANK", "2", 1);
  setenv("TESSERA_WORLD_SIZE", "4", 1);
  setenv("TESSERA_MASTER", "node-0:29500", 1);
  auto t = RankTableFromEnv();
  REQUIRE(t.ok());
  CHECK(t->rank == 2);
  CHECK(t->world_size == 4);
  CHECK(t->master_host == "node-0");
  CHECK(t->master_port == 29500);
  setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  CHECK_THAT(RankTableFromEnv().status().message(), Catch::Contains("disagree with mpirun"));
  setenv("TESSERA_MASTER", "node-0", 1);
  setenv("OMPI_COMM_WORLD_RANK", "2", 1);
  CHECK_THAT(RankTableFromEnv().status().message(), Catch::Contains("TESSERA_MASTER='node-0'"));
  setenv("TESSERA_RANK", "x", 1);
  CHECK_THAT(RankTableFromEnv().status().message(), Catch::Contains("TESSERA_RANK='x'"));
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "TESSERA_RANK",
                        "TESSERA_WORLD_SIZE", "TESSERA_MASTER"}) {
    unsetenv(v);
  }
}

TEST_CASE("ReduceRankOrder folds left in rank order, f16/bf16 rounded once") {
  // 1 + 2^-11 + 2^-11 in f16: pairwise rounding loses both halves (ties to
  // even), accumulating in f32 and rounding once keeps them.
  const uint16_t one = 0x3c00, tiny = 0x1000;  // 1.0 and 2^-11
  const uint16_t in0[] = {one}, in1[] = {tiny}, in2[] = {tiny};
  const void* inputs[] = {in0, in1, in2};
  uint16_t out = 0;
  ReduceRankOrder(DType::kF16, ReduceOp::kSum, inputs, &out, 1);
  CHECK(out == 0x3c01);  // 1 + 2^-10
  // i8 sums wrap rather than overflow (no UB under UBSan).
  const int8_t a[] = {100}, b[] = {100};
  const void* ints[] = {a, b};
  int8_t s = 0;
  ReduceRankOrder(DType::kI8, ReduceOp::kSum, ints, &s, 1);
  CHECK(s == static_cast<int8_t>(200 - 256));
  CHECK(ParseReduceOp("avg").value() == ReduceOp::kAvg);
  CHECK_FALSE(ParseReduceOp("prod").ok());
}

}  // namespace
}  // namespace tessera
