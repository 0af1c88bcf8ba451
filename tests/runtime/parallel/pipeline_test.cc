// The pipeline schedules as data (runtime/parallel/pipeline.h), checked as
// Megatron's schedule tests check theirs: every (micro-batch, chunk) has
// exactly one forward and one backward on every stage, no backward before
// its forward, at most in_flight() activations held at once, and the
// stages together finish: every rank's receives, sends and send-buffer
// waits, as RunPipeline issues them, simulated with sends that complete
// only once their receive is posted (no deadlock, every send matched).
#include "runtime/parallel/pipeline.h"

#include <catch2/catch.hpp>
#include <map>
#include <tuple>
#include <vector>

namespace tessera {
namespace {

TEST_CASE("1F1B: one forward and one backward per micro-batch, in order, bounded in flight") {
  for (int pp = 1; pp <= 6; ++pp) {
    for (int s = 0; s < pp; ++s) {
      for (int m = 1; m <= 10; ++m) {
        INFO("pp " << pp << " stage " << s << " micro-batches " << m);
        const PipelineSchedule schedule(pp, s, m);
        REQUIRE(schedule.tasks().size() == static_cast<size_t>(2 * m));
        int forwards = 0, backwards = 0, held = 0, most = 0, warm = 0;
        bool warming = true;
        for (const PipeTask& t : schedule.tasks()) {
          CHECK(t.chunk == 0);
          if (t.backward) {
            warming = false;
            CHECK(t.micro_batch == backwards);
            ++backwards;
            --held;
            CHECK(backwards <= forwards);  // micro-batch backwards-1's forward ran
          } else {
            CHECK(t.micro_batch == forwards);
            ++forwards;
            most = std::max(most, ++held);
            if (warming) ++warm;
          }
        }
        CHECK(forwards == m);
        CHECK(backwards == m);
        CHECK(most == schedule.in_flight(0));
        CHECK(schedule.slots() == std::min(m, pp - s));
        // The warm-up: the forwards before the first backward, less the
        // one that starts the steady phase (none when all are warm-up).
        CHECK(schedule.warm_up() == std::min(pp - s - 1, m));
        CHECK(warm == std::min(schedule.warm_up() + 1, m));
      }
    }
  }
}

TEST_CASE("interleaved 1F1B: each (micro-batch, chunk) once each way, forward first") {
  for (int pp = 2; pp <= 5; ++pp) {
    for (int v = 2; v <= 4; ++v) {
      for (int m = pp; m <= 3 * pp + 1; ++m) {
        for (int s = 0; s < pp; ++s) {
          INFO("pp " << pp << " chunks " << v << " stage " << s << " micro-batches " << m);
          const PipelineSchedule schedule(pp, s, m, v);
          REQUIRE(schedule.tasks().size() == static_cast<size_t>(2 * m * v));
          std::map<std::pair<int, int>, int> forward_at, backward_at;
          std::vector<int> held(v, 0);
          for (size_t k = 0; k < schedule.tasks().size(); ++k) {
            const PipeTask& t = schedule.tasks()[k];
            REQUIRE(t.chunk >= 0);
            REQUIRE(t.chunk < v);
            auto& at = t.backward ? backward_at : forward_at;
            CHECK(at.emplace(std::pair{t.micro_batch, t.chunk}, static_cast<int>(k)).second);
            if (t.backward) {
              CHECK(forward_at.count({t.micro_batch, t.chunk}) == 1);
              --held[t.chunk];
            } else {
              ++held[t.chunk];
              CHECK(held[t.chunk] <= schedule.in_flight(t.chunk));
            }
          }
          CHECK(forward_at.size() == static_cast<size_t>(m * v));
          CHECK(backward_at.size() == static_cast<size_t>(m * v));
          // Within a chunk both directions run in micro-batch order (what
          // SlotOf relies on), and the slots of different chunks differ.
          for (int c = 0; c < v; ++c) {
            for (int i = 1; i < m; ++i) {
              CHECK(forward_at[{i - 1, c}] < forward_at[{i, c}]);
              CHECK(backward_at[{i - 1, c}] < backward_at[{i, c}]);
            }
          }
          // Megatron's warm-up, with groups of micro-batches of at least pp
          // (M / pp groups, the remainder spread over the first ones).
          const int groups = m / pp, group = m / groups + (m % groups > 0 ? 1 : 0);
          CHECK(schedule.warm_up() == std::min((pp - s - 1) * 2 + (v - 1) * group, m * v));
          int slots = 0;
          bool receives = false, sends = false;
          for (int c = 0; c < v; ++c) {
            slots += schedule.in_flight(c);
            receives = receives || schedule.HasPrev(c);
            sends = sends || schedule.HasNext(c);
          }
          CHECK(schedule.slots() == slots);
          CHECK(schedule.Receives() == receives);
          CHECK(schedule.Sends() == sends);
          CHECK(PipelineSchedules(pp, m, v)[s].tasks().size() == schedule.tasks().size());
        }
      }
    }
  }
}

// Every rank's operations as RunPipeline issues them, run together: a
// receive waits for its send to be posted, a wait on a send buffer for
// the receive it matches to be posted (the strictest completion: MPI's
// rendezvous), computing always proceeds.
struct Op {
  enum Kind { kRecv, kSend, kWaitSend, kCompute } kind;
  int peer = 0, tag = 0;
  int buffer = -1;  // kSend, kWaitSend: which buffer (slot or gradient buffer)
};

std::vector<Op> Ops(const PipelineSchedule& p) {
  std::vector<Op> ops;
  const int v = p.chunks();
  const int dx_buffers = DxSendBuffers(p.micro_batches() * v);
  std::map<int, bool> pending;  // buffer -> a send from it is in flight
  int sent_dx = 0;
  constexpr int kDx = 1 << 20;  // gradient buffers apart from slots
  auto wait = [&](int buffer) {
    if (pending[buffer]) ops.push_back({Op::kWaitSend, 0, 0, buffer});
    pending[buffer] = false;
  };
  for (const PipeTask& t : p.tasks()) {
    if (!t.backward) {
      if (p.HasPrev(t.chunk)) {
        ops.push_back(
            {Op::kRecv, p.PrevStage(), PipelineSchedule::Tag(t.micro_batch, t.chunk, v, false)});
      }
      const int slot = p.SlotOf(t.micro_batch, t.chunk);
      wait(slot);
      ops.push_back({Op::kCompute});
      if (p.HasNext(t.chunk)) {
        ops.push_back({Op::kSend, p.NextStage(),
                       PipelineSchedule::Tag(t.micro_batch, p.NextChunk(t.chunk), v, false), slot});
        pending[slot] = true;
      }
    } else {
      if (p.HasNext(t.chunk)) {
        ops.push_back(
            {Op::kRecv, p.NextStage(), PipelineSchedule::Tag(t.micro_batch, t.chunk, v, true)});
      }
      ops.push_back({Op::kCompute});
      if (p.HasPrev(t.chunk)) {
        const int b = kDx + sent_dx++ % dx_buffers;
        wait(b);
        ops.push_back({Op::kSend, p.PrevStage(),
                       PipelineSchedule::Tag(t.micro_batch, p.PrevChunk(t.chunk), v, true), b});
        pending[b] = true;
      }
    }
  }
  return ops;
}

// Runs every stage's operations; returns whether all finished.
bool RunsToTheEnd(int pp, int m, int v) {
  std::vector<std::vector<Op>> ops;
  for (int s = 0; s < pp; ++s) ops.push_back(Ops(PipelineSchedule(pp, s, m, v)));
  std::vector<size_t> pc(pp, 0);
  // Posted sends and receives: (from, to, tag) -> position of the op.
  std::map<std::tuple<int, int, int>, bool> sent, received;
  std::map<std::pair<int, int>, std::tuple<int, int, int>> in_flight;  // (rank, buffer) -> message
  bool moved = true;
  while (moved) {
    moved = false;
    for (int s = 0; s < pp; ++s) {
      if (pc[s] == ops[s].size()) continue;
      const Op& op = ops[s][pc[s]];
      bool go = true;
      if (op.kind == Op::kRecv) {
        const auto key = std::tuple{op.peer, s, op.tag};
        received[key] = true;  // posted (it blocks here until the send is)
        go = sent.count(key) > 0;
      } else if (op.kind == Op::kSend) {
        const auto key = std::tuple{s, op.peer, op.tag};
        if (sent.count(key) > 0) return false;  // one message per tag
        sent[key] = true;
        in_flight[{s, op.buffer}] = key;
      } else if (op.kind == Op::kWaitSend) {
        go = received.count(in_flight.at({s, op.buffer})) > 0;
      }
      if (go) {
        ++pc[s];
        moved = true;
      }
    }
  }
  for (int s = 0; s < pp; ++s) {
    if (pc[s] != ops[s].size()) return false;
  }
  // Every send was received, every receive sent.
  for (const auto& [key, yes] : sent) {
    if (received.count(key) == 0) return false;
  }
  return sent.size() == received.size();
}

TEST_CASE("1F1B and interleaved 1F1B: the stages together finish, every send received") {
  for (int pp = 1; pp <= 6; ++pp) {
    for (int m = 1; m <= 10; ++m) {
      INFO("pp " << pp << " micro-batches " << m);
      CHECK(RunsToTheEnd(pp, m, 1));
    }
  }
  // P = 2 with V = 2 first: the case Megatron once got wrong.
  CHECK(RunsToTheEnd(2, 2, 2));
  // Micro-batches not divisible by pp included: groups of at least pp
  // (with one short last group of pp = 4, V = 3, M = 5, it deadlocks).
  for (int pp = 2; pp <= 8; ++pp) {
    for (int v = 2; v <= 4; ++v) {
      for (int m = pp; m <= 4 * pp + 3; ++m) {
        INFO("pp " << pp << " chunks " << v << " micro-batches " << m);
        CHECK(RunsToTheEnd(pp, m, v));
      }
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
