// The TCP rendezvous over loopback: ranks as threads with their own rank
// tables, as separate processes would have.
#include "runtime/comm/rendezvous.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <thread>

#include "runtime/comm/kv_store.h"
#include "tests/runtime/comm/free_port.h"

namespace tessera {
namespace {

using std::chrono::milliseconds;

using testing::FreePort;

// Runs ranks[i] on its own thread with its own table; returns the results.
std::vector<Result<std::vector<std::string>>> Meet(const std::vector<int>& ranks, int world,
                                                   int port, milliseconds timeout) {
  std::vector<Result<std::vector<std::string>>> out(ranks.size(), InternalError("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] {
      RankTable t{ranks[i], world, "localhost", port, "test"};
      out[i] = RendezvousAllGather(t, "blob of rank " + std::to_string(ranks[i]), timeout);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

TEST_CASE("rendezvous: every rank gets every blob in rank order") {
  const int port = FreePort();
  // Rank 0 last: the others retry until it listens.
  const auto results = Meet({3, 1, 2, 0}, 4, port, std::chrono::seconds(20));
  for (const auto& r : results) {
    REQUIRE(r.ok());
    REQUIRE(r->size() == 4);
    for (int k = 0; k < 4; ++k) CHECK((*r)[k] == "blob of rank " + std::to_string(k));
  }
  RankTable alone{0, 1, "", 0, "test"};
  CHECK(RendezvousAllGather(alone, "x", milliseconds(10)).value() == std::vector<std::string>{"x"});
}

TEST_CASE("rendezvous: a rank that never comes is named") {
  const auto results = Meet({0, 1}, 3, FreePort(), milliseconds(700));
  REQUIRE_FALSE(results[0].ok());
  CHECK(results[0].status().code() == StatusCode::kDeadlineExceeded);
  CHECK_THAT(results[0].status().message(), Catch::Contains("rank(s) 2 did not connect"));
  CHECK_FALSE(results[1].ok());
}

TEST_CASE("rendezvous: duplicate ranks and bad tables are refused") {
  const auto results = Meet({0, 1, 1}, 3, FreePort(), std::chrono::seconds(5));
  REQUIRE_FALSE(results[0].ok());
  CHECK_THAT(results[0].status().message(), Catch::Contains("rank 1 connected twice"));
  RankTable no_master{1, 2, "", 0, "test"};
  CHECK_THAT(RendezvousAllGather(no_master, "", milliseconds(10)).status().message(),
             Catch::Contains("TESSERA_MASTER"));
  RankTable big{0, 2, "localhost", 1, "test"};
  CHECK_FALSE(RendezvousAllGather(big, std::string(100000, 'x'), milliseconds(10)).ok());
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

TEST_CASE("key-value store: set, get waiting for a later set, add, many clients") {
  auto server = KvServer::Start(0);
  REQUIRE(server.ok());
  const int port = (*server)->port();
  auto a = KvClient::Connect("127.0.0.1", port, milliseconds(5000));
  auto b = KvClient::Connect("localhost", port, milliseconds(5000));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE((*a)->Set("k", std::string("v\0w", 3)).ok());
  auto got = (*b)->Get("k", milliseconds(1000));
  REQUIRE(got.ok());
  CHECK(*got == std::string("v\0w", 3));
  CHECK(!*(*b)->Has("later"));
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(100));
    CHECK((*a)->Set("later", "x").ok());
  });
  auto later = (*b)->Get("later", milliseconds(5000));
  setter.join();
  REQUIRE(later.ok());
  CHECK(*later == "x");
  std::vector<std::thread> adders;
  for (int i = 0; i < 8; ++i) {
    adders.emplace_back([&] {
      auto c = KvClient::Connect("127.0.0.1", port, milliseconds(5000));
      REQUIRE(c.ok());
      for (int j = 0; j < 10; ++j) CHECK((*c)->Add("n", 1).ok());
    });
  }
  for (auto& t : adders) t.join();
  CHECK(*(*a)->Add("n", 0) == 80);
}

TEST_CASE("key-value store: a key never set times out naming it, no server is named") {
  auto server = KvServer::Start(0);
  REQUIRE(server.ok());
  auto c = KvClient::Connect("127.0.0.1", (*server)->port(), milliseconds(5000));
  REQUIRE(c.ok());
  auto r = (*c)->Get("rank3/address", milliseconds(200));
  CHECK(r.status().code() == StatusCode::kDeadlineExceeded);
  CHECK_THAT(r.status().message(), Catch::Contains("rank3/address"));
  const int port = (*server)->port();
  server->reset();
  auto none = KvClient::Connect("127.0.0.1", port, milliseconds(200));
  CHECK(none.status().code() == StatusCode::kDeadlineExceeded);
  CHECK_THAT(none.status().message(), Catch::Contains(std::to_string(port)));
}

}  // namespace
}  // namespace tessera
