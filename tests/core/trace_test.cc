// The timeline recorder: spans only on a thread with a trace, one thread id
// per recording thread, and JSON that a Chrome trace viewer parses (names
// escaped).
#include "core/trace.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <thread>

namespace tessera {
namespace {

TEST_CASE("trace spans record on the threads that trace, and the JSON parses") {
  { TraceSpan untraced("comm", "nobody records this"); }
  Trace trace(3);
  {
    ScopedTrace scoped(&trace);
    {
      TraceSpan outer("step", "step 1");
      TraceSpan inner("forward", "h.0 \"quoted\" \\ \x01", "\"bytes\": 64");
    }
    std::thread helper([t = Trace::Current()] {
      ScopedTrace on_helper(t);
      TraceSpan span("checkpoint", "async write");
    });
    helper.join();
  }
  CHECK(Trace::Current() == nullptr);
  { TraceSpan after("comm", "not recorded either"); }
  REQUIRE(trace.size() == 3);
  const nlohmann::json j = nlohmann::json::parse(trace.Json());
  int spans = 0, threads = 0;
  for (const auto& e : j.at("traceEvents")) {
    CHECK(e.at("pid") == 3);
    if (e.at("ph") == "M" && e.at("name") == "thread_name") ++threads;
    if (e.at("ph") != "X") continue;
    ++spans;
    CHECK(e.at("dur").get<double>() >= 0);
    if (e.at("cat") == "forward") {
      CHECK(e.at("name") == "h.0 \"quoted\" \\ \x01");
      CHECK(e.at("args").at("bytes") == 64);
      CHECK(e.at("tid") == 0);
    }
    if (e.at("cat") == "checkpoint") CHECK(e.at("tid") == 1);
  }
  CHECK(spans == 3);
  CHECK(threads == 2);
}

}  // namespace
}  // namespace tessera
