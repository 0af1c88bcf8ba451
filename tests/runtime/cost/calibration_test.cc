// Calibration (runtime/cost/calibration.h): the kernels and collectives
// measured on this machine, rank 0's figures on every rank, tables that
// never price more bytes cheaper.
#include "runtime/cost/calibration.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <mutex>

#include "runtime/comm/inprocess.h"
#include "runtime/matmul.h"
#include "runtime/model/matmul_choice.h"
#include "tests/runtime/cost/test_profiles.h"

namespace tessera {
namespace {

using testing::TestProfile;

TEST_CASE("calibration measures every kernel, rank 0's figures on every rank") {
  std::vector<MachineProfile> by_rank(2);
  std::mutex mu;
  const Status s = RunInProcess(2, [&](Communicator& world) -> Status {
    // With a directory: the disk's direct-I/O figures too (rank 0's).
    ASSIGN_OR_RETURN(MachineProfile p, CalibrateMachine(world, "/tmp"));
    std::lock_guard<std::mutex> lock(mu);
    by_rank[world.rank()] = p;
    return Status::Ok();
  });
  INFO(s.ToString());
  REQUIRE(s.ok());
  for (int k = 0; k < kKernelCount; ++k) {
    INFO(KernelName(static_cast<Kernel>(k)));
    CHECK(std::isfinite(by_rank[0].kernel_seconds[k]));
    CHECK(by_rank[0].kernel_seconds[k] > 0);
    CHECK(by_rank[1].kernel_seconds[k] == by_rank[0].kernel_seconds[k]);
  }
  CHECK(by_rank[0].disk_read > 0);
  CHECK(by_rank[0].disk_write > 0);
  CHECK(by_rank[1].ToJson() == by_rank[0].ToJson());
  CHECK(by_rank[0].ToJson().find("\"disk\"") != std::string::npos);
  MachineProfile none;
  const Status missing = MeasureDisk("/nonexistent/dir", &none);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.message().find("/nonexistent/dir/tessera-calibrate.") != std::string::npos);
  auto parsed = MachineProfile::Parse(by_rank[0].ToJson(), "<calibrated>");
  REQUIRE(parsed.ok());
  CHECK(parsed->ToJson() == by_rank[0].ToJson());
}

TEST_CASE("calibration chooses the fastest matrix-product library, the same on every rank") {
  std::vector<std::vector<std::pair<MatmulLibrary, double>>> by_rank(2);
  std::vector<MatmulLibrary> used(2);
  std::mutex mu;
  const Status s = RunInProcess(2, [&](Communicator& world) -> Status {
    ASSIGN_OR_RETURN(auto figures, ChooseMatmulLibrary(world));
    std::lock_guard<std::mutex> lock(mu);
    by_rank[world.rank()] = figures;
    used[world.rank()] = kernels::CurrentMatmulLibrary();
    return Status::Ok();
  });
  kernels::SetMatmulLibrary(MatmulLibrary::kOpenBlas);
  INFO(s.ToString());
  REQUIRE(s.ok());
  REQUIRE(by_rank[0].size() == std::size(kMatmulLibraries));
  CHECK(by_rank[1] == by_rank[0]);
  for (size_t i = 0; i < by_rank[0].size(); ++i) {
    CHECK(by_rank[0][i].second > 0);
    if (i > 0) CHECK(by_rank[0][i].second <= by_rank[0][i - 1].second);  // fastest first
  }
  CHECK(used[0] == by_rank[0][0].first);
  CHECK(used[1] == by_rank[0][0].first);
}

TEST_CASE("Ascending: the least-squares ascending fit, an outlier pooled with its neighbours") {
  CHECK(Ascending({1, 2, 3}) == std::vector<double>{1, 2, 3});
  CHECK(Ascending({1, 3, 2, 4}) == std::vector<double>{1, 2.5, 2.5, 4});
  // One slow early outlier is averaged in, not carried to every later size.
  CHECK(Ascending({1, 9, 2, 3, 20}) == std::vector<double>{1, 14.0 / 3, 14.0 / 3, 14.0 / 3, 20});
  CHECK(Ascending({3, 2, 1}) == std::vector<double>{2, 2, 2});
  CHECK(Ascending({}).empty());
}

TEST_CASE("calibration times collectives at every size and group size, never less for more bytes") {
  // 3: rank 2 sits out the ping-pong; 4: groups of 2 (two at once) and 4.
  for (int n : {2, 3, 4}) {
    INFO(n << " ranks");
    std::vector<std::vector<CollectiveTable>> by_rank(n);
    std::mutex mu;
    const Status s = RunInProcess(n, [&](Communicator& world) -> Status {
      ASSIGN_OR_RETURN(std::vector<CollectiveTable> t, MeasureCollectives(world, int64_t{1} << 20));
      std::lock_guard<std::mutex> lock(mu);
      by_rank[world.rank()] = t;
      return Status::Ok();
    });
    INFO(s.ToString());
    REQUIRE(s.ok());
    const std::vector<CollectiveTable>& tables = by_rank[1];
    const std::vector<int> groups = n == 4 ? std::vector<int>{2, 4} : std::vector<int>{n};
    REQUIRE(tables.size() == 3 * groups.size() + 1);
    for (int r = 0; r < n; ++r) {
      REQUIRE(by_rank[r].size() == tables.size());
      for (size_t k = 0; k < tables.size(); ++k)
        CHECK(by_rank[r][k].seconds == tables[k].seconds);  // rank 0's
    }
    for (size_t i = 0; i < groups.size(); ++i) {
      CHECK(tables[3 * i].kind == CollectiveKind::kAllReduce);
      CHECK(tables[3 * i + 1].kind == CollectiveKind::kAllGather);
      CHECK(tables[3 * i + 2].kind == CollectiveKind::kReduceScatter);
      for (int k = 0; k < 3; ++k) CHECK(tables[3 * i + k].group == groups[i]);
    }
    CHECK(tables.back().kind == CollectiveKind::kSendRecv);  // a ping-pong of ranks 0 and 1
    CHECK(tables.back().group == 2);
    CHECK(tables.back().bytes == std::vector<double>{4096, 16384, 65536, 262144, 1048576});
    for (const CollectiveTable& t : tables) {
      REQUIRE(t.bytes.size() == 5);
      // A whole block per rank: 4 KiB rounded down to a multiple of the group's floats.
      CHECK(t.bytes.front() == 4 * (1024 / t.group * t.group));
      REQUIRE(t.seconds.size() == t.bytes.size());
      CHECK(t.seconds.front() > 0);
      CHECK(std::is_sorted(t.seconds.begin(), t.seconds.end()));
    }
    // The profile prices each group's collectives from its own table.
    const MachineProfile line = TestProfile();
    MachineProfile p = line;
    p.collectives = tables;
    for (const CollectiveTable& t : tables) {
      CHECK(p.CollectiveSeconds(t.kind, t.bytes[2], t.group, false) ==
            Approx(std::max(t.seconds[2],
                            line.CollectiveSeconds(t.kind, t.bytes[2], t.group, false))));
    }
  }
}

}  // namespace
}  // namespace tessera
