// The save plan's redundancy groups (ckpt/save_plan.h): every data file in
// exactly one group, and host-aware placement: over two or more hosts no
// host holds more than M files of a Reed-Solomon group (so one lost host
// is always repairable), and at most one where the hosts allow it; the
// manifest-side check (HostLossRisks) that verify reports.
#include "ckpt/save_plan.h"

#include <catch2/catch.hpp>
#include <map>
#include <random>
#include <set>

namespace tessera {
namespace {

// The most files of one group on one host.
int64_t MostOnOneHost(const std::vector<int64_t>& hosts, const PlannedGroup& g) {
  std::map<int64_t, int64_t> count;
  int64_t most = 0;
  for (int64_t r : g.members) most = std::max(most, ++count[hosts[r]]);
  for (int64_t r : g.writers) most = std::max(most, ++count[hosts[r]]);
  return most;
}

// Every data file in exactly one group, members sorted, writers in range.
void CheckCovers(const std::vector<int64_t>& hosts, const std::vector<PlannedGroup>& groups,
                 size_t parity_files) {
  std::vector<int> seen(hosts.size(), 0);
  for (const PlannedGroup& g : groups) {
    REQUIRE_FALSE(g.members.empty());
    CHECK(std::is_sorted(g.members.begin(), g.members.end()));
    CHECK(g.writers.size() == parity_files);
    for (int64_t r : g.members) ++seen.at(r);
    for (int64_t w : g.writers) CHECK((w >= 0 && w < static_cast<int64_t>(hosts.size())));
  }
  for (size_t r = 0; r < seen.size(); ++r) {
    INFO("data file " << r);
    CHECK(seen[r] == 1);
  }
}

}  // namespace

TEST_CASE("redundancy texts: replicas, parity, rs and their combinations") {
  auto r = Redundancy::Parse("replicas:2,rs:4+2");
  REQUIRE(r.ok());
  CHECK(r->replicas == 2);
  CHECK(r->erasure.k == 4);
  CHECK(r->erasure.m == 2);
  CHECK(r->ToString() == "replicas:2,rs:4+2");
  CHECK(Redundancy::Parse("rs:8+3")->ToString() == "rs:8+3");
  CHECK(Redundancy::Parse("none")->none());
  for (const char* bad : {"rs:4", "rs:0+2", "rs:4+0", "rs:200+56", "parity:2,rs:4+2",
                          "rs:4+2,rs:2+1", "replicas:2,replicas:3", "rs:4+2,"}) {
    INFO(bad);
    auto p = Redundancy::Parse(bad);
    REQUIRE_FALSE(p.ok());
    CHECK_THAT(p.status().message(), Catch::Contains(bad));
  }
}

TEST_CASE("rs groups over 4 ranks on 2 hosts: rs:2+2 keeps K, rs:4+2 shrinks to 2 data files") {
  const std::vector<int64_t> hosts = {0, 0, 1, 1};
  auto plan = PlanGroups(hosts, *Redundancy::Parse("rs:2+2"));
  REQUIRE(plan.ok());
  REQUIRE(plan->size() == 2);
  CheckCovers(hosts, *plan, 2);
  for (const PlannedGroup& g : *plan) {
    // One member on each host, one parity file on each host.
    CHECK(hosts[g.members[0]] != hosts[g.members[1]]);
    CHECK(hosts[g.writers[0]] != hosts[g.writers[1]]);
    CHECK(MostOnOneHost(hosts, g) == 2);
  }
  // 4 + 2 files over 2 hosts would put 3 on one: groups of 2 data files.
  auto wide = PlanGroups(hosts, *Redundancy::Parse("rs:4+2"));
  REQUIRE(wide.ok());
  REQUIRE(wide->size() == 2);
  CheckCovers(hosts, *wide, 2);
  for (const PlannedGroup& g : *wide) CHECK(MostOnOneHost(hosts, g) <= 2);
  // Every rank writes one parity file: the work is spread.
  std::map<int64_t, int> writes;
  for (const PlannedGroup& g : *plan) {
    for (int64_t w : g.writers) ++writes[w];
  }
  CHECK(writes.size() == 4);
}

TEST_CASE("rs groups on one host (in-process ranks): K data files in rank order") {
  const std::vector<int64_t> hosts(10, 7);
  auto plan = PlanGroups(hosts, *Redundancy::Parse("rs:4+2"));
  REQUIRE(plan.ok());
  REQUIRE(plan->size() == 3);
  CheckCovers(hosts, *plan, 2);
  CHECK((*plan)[0].members == std::vector<int64_t>{0, 1, 2, 3});
  CHECK((*plan)[2].members == std::vector<int64_t>{8, 9});  // a smaller last group
  // Parity writers outside their group where there is room.
  for (const PlannedGroup& g : *plan) {
    for (int64_t w : g.writers) {
      CHECK_FALSE(std::binary_search(g.members.begin(), g.members.end(), w));
    }
  }
  // XOR: a last group of one joins the one before.
  auto xor_plan = PlanGroups(hosts, *Redundancy::Parse("parity:3"));
  REQUIRE(xor_plan.ok());
  REQUIRE(xor_plan->size() == 3);
  CHECK(xor_plan->back().members.size() == 4);
  CheckCovers(hosts, *xor_plan, 1);
}

TEST_CASE("rs groups over random host layouts: no host ever holds more than M of a group") {
  std::mt19937 rng(20261124);
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t ranks = std::uniform_int_distribution<int64_t>(1, 40)(rng);
    const int64_t host_count = std::uniform_int_distribution<int64_t>(1, 12)(rng);
    std::vector<int64_t> hosts(ranks);
    for (int64_t& h : hosts)
      h = std::uniform_int_distribution<int64_t>(0, host_count - 1)(rng) * 11;
    const bool even = trial % 2 == 0;  // half the trials: ranks spread evenly, in host blocks
    if (even) {
      for (int64_t r = 0; r < ranks; ++r) hosts[r] = r * host_count / ranks;
    }
    const int k = std::uniform_int_distribution<int>(1, 8)(rng);
    const int m = std::uniform_int_distribution<int>(1, 3)(rng);
    const Redundancy red = *Redundancy::Parse("rs:" + std::to_string(k) + "+" + std::to_string(m));
    INFO("trial " << trial << ": " << ranks << " ranks, rs:" << k << "+" << m);
    auto plan = PlanGroups(hosts, red);
    REQUIRE(plan.ok());
    CheckCovers(hosts, *plan, static_cast<size_t>(m));
    const size_t distinct = std::set<int64_t>(hosts.begin(), hosts.end()).size();
    for (const PlannedGroup& g : *plan) {
      CHECK(static_cast<int>(g.members.size()) <= k);
      if (distinct >= 2) CHECK(MostOnOneHost(hosts, g) <= m);
      // Enough hosts, evenly filled: at most one file of a group per host.
      if (even && distinct >= static_cast<size_t>(k + m) &&
          ranks % static_cast<int64_t>(distinct) == 0) {
        CHECK(MostOnOneHost(hosts, g) == 1);
      }
    }
    // The groups keep K data files wherever the hosts allow it: with hosts
    // of equal size and at least K / M + 1 of them.
    if (even && distinct >= 2 && ranks % static_cast<int64_t>(distinct) == 0 &&
        static_cast<int64_t>(distinct) * m >= k + m && ranks >= k) {
      CHECK(static_cast<int>((*plan)[0].members.size()) == k);
    }
  }
}

TEST_CASE("host loss risks are read from the manifest's recorded hosts") {
  Manifest m;
  for (const char* name : {"data-0", "data-1", "data-2", "data-3", "rs-0-0", "rs-0-1"}) {
    m.files.push_back({name, 10, 0, ""});
  }
  m.erasure_groups.push_back({kRsCauchy, {0, 1, 2, 3}, {4, 5}});
  CHECK(HostLossRisks(m).empty());  // no hosts recorded: nothing to judge
  const char* hosts[] = {"a", "a", "b", "b", "a", "b"};
  for (size_t f = 0; f < 6; ++f) m.files[f].host = hosts[f];
  auto risks = HostLossRisks(m);
  REQUIRE(risks.size() == 2);
  CHECK_THAT(risks[0], Catch::Contains("erasure group 0: host 'a' holds 3 of its 6 files") &&
                           Catch::Contains("'data-0', 'data-1', 'rs-0-0'") &&
                           Catch::Contains("2 can be rebuilt"));
  m.files[1].host = "c";
  m.files[3].host = "c";
  CHECK(HostLossRisks(m).empty());
}

}  // namespace tessera
