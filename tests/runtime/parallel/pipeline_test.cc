// The 1F1B schedule as data (runtime/parallel/pipeline.h), checked as
// Megatron's schedule tests check theirs: every micro-batch has exactly one
// forward and one backward on every stage, no backward before its forward,
// at most in_flight() activations held at once, and the stages together
// finish (every receive is matched by the neighbour's send: no deadlock).
#include "runtime/parallel/pipeline.h"

#include <catch2/catch.hpp>
#include <vector>

namespace tessera {
namespace {

TEST_CASE("1F1B: one forward and one backward per micro-batch, in order, bounded in flight") {
  for (int pp = 1; pp <= 6; ++pp) {
    for (int s = 0; s < pp; ++s) {
      for (int m = 1; m <= 10; ++m) {
        INFO("pp " << pp << " stage " << s << " micro-batches " << m);
        const OneFOneB schedule{pp, s, m};
        REQUIRE(schedule.tasks() == 2 * m);
        int forwards = 0, backwards = 0, held = 0, most = 0, warm = 0;
        bool warming = true;
        for (int k = 0; k < schedule.tasks(); ++k) {
          if (schedule.IsBackward(k)) {
            warming = false;
            ++backwards;
            --held;
            CHECK(backwards <= forwards);  // micro-batch backwards-1's forward ran
          } else {
            ++forwards;
            most = std::max(most, ++held);
            if (warming) ++warm;
          }
        }
        CHECK(forwards == m);
        CHECK(backwards == m);
        CHECK(most == schedule.in_flight());
        // The warm-up: the forwards before the first backward, less the
        // one that starts the steady phase (none when all are warm-up).
        CHECK(schedule.warm_up() == std::min(pp - s - 1, m));
        CHECK(warm == std::min(schedule.warm_up() + 1, m));
      }
    }
  }
}

TEST_CASE("1F1B: the stages together finish (sends matched by receives, no deadlock)") {
  for (int pp = 1; pp <= 6; ++pp) {
    for (int m = 1; m <= 10; ++m) {
      INFO("pp " << pp << " micro-batches " << m);
      // Each stage runs its tasks in order; a forward of micro-batch i
      // waits for the previous stage's, a backward for the next stage's.
      std::vector<int> next(pp, 0), forwards(pp, 0), backwards(pp, 0);
      bool moved = true;
      while (moved) {
        moved = false;
        for (int s = 0; s < pp; ++s) {
          const OneFOneB schedule{pp, s, m};
          if (next[s] == schedule.tasks()) continue;
          const bool backward = schedule.IsBackward(next[s]);
          const bool ready = backward ? (s == pp - 1 || backwards[s + 1] > backwards[s])
                                      : (s == 0 || forwards[s - 1] > forwards[s]);
          if (!ready) continue;
          ++(backward ? backwards[s] : forwards[s]);
          ++next[s];
          moved = true;
        }
      }
      for (int s = 0; s < pp; ++s) CHECK(next[s] == 2 * m);
    }
  }
}

TEST_CASE("pipeline send buffers: at most two, whatever the micro-batches") {
  CHECK(DxSendBuffers(0) == 0);
  CHECK(DxSendBuffers(1) == 1);
  for (int m = 2; m < 600; m += 7) CHECK(DxSendBuffers(m) == 2);
}

}  // namespace
}  // namespace tessera
