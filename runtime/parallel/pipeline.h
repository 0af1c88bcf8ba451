// The pipeline schedule a stage runs, as data: what ParallelGpt executes
// (runtime/model/parallel_gpt.cc: RunPipeline) and what the cost model
// simulates (runtime/cost/pipeline_cost.cc) are the same tasks in the same
// order.
#ifndef TESSERA_RUNTIME_PARALLEL_PIPELINE_H_
#define TESSERA_RUNTIME_PARALLEL_PIPELINE_H_

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

namespace tessera {

// One task of a stage: the forward or the backward of one micro-batch
// through one of the stage's chunks.
struct PipeTask {
  bool backward = false;
  int micro_batch = 0;
  int chunk = 0;
};

// 1F1B on stage `stage` of `pp` over `micro_batches`, each stage holding
// `chunks` chunks of layers (virtual stages): chunk c of stage s is
// virtual stage c x pp + s, so a micro-batch goes through stages 0..pp-1
// `chunks` times, and the last stage's chunk c hands on to the first
// stage's chunk c + 1.
//
// One chunk is PipeDream-Flush (Megatron's non-interleaved schedule):
// min(pp - stage - 1, micro_batches) warm-up forwards, then one forward
// and one backward alternately, then the remaining backwards; a stage
// holds the activations of at most pp - stage micro-batches at once.
//
// Several chunks are Megatron's interleaved 1F1B: forwards run the
// micro-batches in groups, each group through chunk 0, then chunk 1, ...,
// backwards the same groups through the chunks in reverse;
// (pp - stage - 1) x 2 + (chunks - 1) x (the first group's size) warm-up
// forwards, then alternately, then the remaining backwards. The groups
// are M / pp of at least pp micro-batches each, the remainder of M / pp
// spread one each over the first ones: Megatron's groups of exactly pp
// with a short last one deadlock when pp does not divide M (pp 4, 3
// chunks, 5 micro-batches: tests/runtime/parallel/pipeline_test.cc
// simulates every case). M >= pp. The bubble shrinks from (pp - 1) / M to
// (pp - 1) / (chunks x M) of the compute; more activations are in flight
// (in_flight()).
class PipelineSchedule {
 public:
  PipelineSchedule(int pp, int stage, int micro_batches, int chunks = 1)
      : pp_(pp), stage_(stage), m_(micro_batches), chunks_(std::max(1, chunks)) {
    const int total = m_ * chunks_;
    // Groups of micro-batches that go through the chunks together: one
    // without chunks; else M / pp groups, the first M % (M / pp) a
    // micro-batch larger (each at least pp).
    const int groups = chunks_ == 1 ? 1 : std::max(1, m_ / pp_);
    const int group = m_ / groups + (m_ % groups > 0 ? 1 : 0);  // the first, largest
    warm_ = chunks_ == 1 ? std::min(pp_ - stage_ - 1, m_)
                         : std::min((pp_ - stage_ - 1) * 2 + (chunks_ - 1) * group, total);
    warm_ = std::max(0, warm_);
    std::vector<PipeTask> forwards, backwards;
    for (int g = 0, begin = 0; g < groups; ++g) {
      const int end = begin + m_ / groups + (g < m_ % groups ? 1 : 0);
      for (int c = 0; c < chunks_; ++c) {
        for (int i = begin; i < end; ++i) forwards.push_back({false, i, c});
        for (int i = begin; i < end; ++i) backwards.push_back({true, i, chunks_ - 1 - c});
      }
      begin = end;
    }
    size_t f = 0, b = 0;
    for (; f < static_cast<size_t>(warm_); ++f) tasks_.push_back(forwards[f]);
    while (f < forwards.size()) {
      tasks_.push_back(forwards[f++]);
      tasks_.push_back(backwards[b++]);
    }
    while (b < backwards.size()) tasks_.push_back(backwards[b++]);
    // The most activations each chunk holds at once, and its slots.
    in_flight_.assign(chunks_, 0);
    std::vector<int> held(chunks_, 0);
    for (const PipeTask& t : tasks_) {
      int& h = held[t.chunk];
      h += t.backward ? -1 : 1;
      in_flight_[t.chunk] = std::max(in_flight_[t.chunk], h);
    }
    for (int c = 0; c < chunks_; ++c) {
      slot_base_.push_back(slots_);
      slots_ += in_flight_[c];
    }
  }

  int pp() const { return pp_; }
  int stage() const { return stage_; }
  int micro_batches() const { return m_; }
  int chunks() const { return chunks_; }
  const std::vector<PipeTask>& tasks() const { return tasks_; }
  // Forwards before the steady phase's first (the warm-up).
  int warm_up() const { return warm_; }
  // Micro-batches whose activations chunk `c` holds at once, and all the
  // stage's chunks together: the activation slots it needs.
  int in_flight(int c) const { return in_flight_[c]; }
  int slots() const { return slots_; }
  // The slot of micro-batch i in chunk c: each chunk's slots in turn (its
  // forwards and backwards both run in micro-batch order, so slot
  // i % in_flight(c) is free again when micro-batch i starts).
  int SlotOf(int micro_batch, int chunk) const {
    return slot_base_[chunk] + LocalSlot(micro_batch, chunk);
  }
  // The same among chunk c's own slots.
  int LocalSlot(int micro_batch, int chunk) const { return micro_batch % in_flight_[chunk]; }
  int VirtualStage(int chunk) const { return chunk * pp_ + stage_; }
  int virtual_stages() const { return chunks_ * pp_; }
  // Whether chunk c receives activations from the previous virtual stage
  // (it is not the model's first) and sends its output to the next (it is
  // not the last); the previous and next stage, around the ring of pp.
  bool HasPrev(int chunk) const { return VirtualStage(chunk) > 0; }
  bool HasNext(int chunk) const { return VirtualStage(chunk) < virtual_stages() - 1; }
  int PrevStage() const { return (stage_ + pp_ - 1) % pp_; }
  int NextStage() const { return (stage_ + 1) % pp_; }
  // The chunk of the previous (next) stage that chunk c receives from
  // (sends to): the ring wraps from the last stage's chunk c to the first
  // stage's chunk c + 1.
  int PrevChunk(int chunk) const { return stage_ == 0 ? chunk - 1 : chunk; }
  int NextChunk(int chunk) const { return stage_ == pp_ - 1 ? chunk + 1 : chunk; }
  // Whether any chunk receives activations (and so sends gradients back),
  // or sends activations (and receives their gradients).
  bool Receives() const { return Receives(stage_, chunks_); }
  bool Sends() const { return Sends(pp_, stage_, chunks_); }
  static bool Receives(int stage, int chunks) { return stage > 0 || chunks > 1; }
  static bool Sends(int pp, int stage, int chunks) { return stage < pp - 1 || chunks > 1; }
  // The tag of the message into chunk c of the receiving stage carrying
  // micro-batch i's activations (forward) or gradient (backward). Between
  // two stages each (micro-batch, receiving chunk, direction) is one
  // message; for pp = 2 the same pair of ranks carries both directions.
  static int Tag(int micro_batch, int chunk, int chunks, bool backward) {
    return 2 * (micro_batch * chunks + chunk) + (backward ? 1 : 0);
  }

 private:
  int pp_, stage_, m_, chunks_;
  int warm_ = 0, slots_ = 0;
  std::vector<PipeTask> tasks_;
  std::vector<int> in_flight_, slot_base_;
};

// Every stage's schedule of `pp` stages, `micro_batches` and `chunks`,
// built once per thread and shape: what the cost model replays for many
// plans of one shape.
inline const std::vector<PipelineSchedule>& PipelineSchedules(int pp, int micro_batches,
                                                              int chunks) {
  thread_local std::map<std::tuple<int, int, int>, std::vector<PipelineSchedule>> memo;
  auto it = memo.find({pp, micro_batches, chunks});
  if (it == memo.end()) {
    std::vector<PipelineSchedule> all;
    for (int s = 0; s < pp; ++s) all.emplace_back(pp, s, micro_batches, chunks);
    it = memo.emplace(std::tuple{pp, micro_batches, chunks}, std::move(all)).first;
  }
  return it->second;
}

// Buffers a pipeline stage sends its input gradients from, reused in turn:
// the gradient of micro-batch j waits for that of j - 2 to have left. One
// per micro-batch would hold M activations' worth: 100 GiB a rank for the
// 512 micro-batches of the SC'21 Megatron paper's 1T-parameter run.
inline int DxSendBuffers(int micro_batches) { return micro_batches < 2 ? micro_batches : 2; }

}  // namespace tessera

#endif  // TESSERA_RUNTIME_PARALLEL_PIPELINE_H_
