// Multi-copy parallelism (MindSpore's MicroBatchInterleaved, MindFormers'
// fine_grain_interleave; DeepSpeed Domino's batch split): each
// micro-batch's rows are cut into N copies of whole sequences, each run by
// operators of its own (an OpGpt per copy, all bound to the stage's one
// Gpt) on a thread of its own. One copy computes at a time, in turn; a copy
// hands the turn on while its tensor-parallel (and sequence-parallel)
// collective is in flight (runtime/parallel/copy_turns.h), so copy k's
// communication runs while copy k + 1 computes, forward and backward.
//
// The arithmetic: every row is computed as in one copy (rows are
// independent up to the loss's mean), the loss is the mean of the copies'
// means, and each parameter's gradient accumulates copy after copy, the
// same order on every rank. So N copies of a micro-batch run the same
// arithmetic as N micro-batches of its rows without copies (bit for bit
// when N is a power of two, whose 1/N scales exactly).
#ifndef TESSERA_RUNTIME_MODEL_MULTI_COPY_H_
#define TESSERA_RUNTIME_MODEL_MULTI_COPY_H_

#include <array>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "core/trace.h"
#include "runtime/kernels.h"
#include "runtime/model/op_gpt.h"
#include "runtime/model/stage_runner.h"
#include "runtime/parallel/copy_turns.h"

namespace tessera {

class MultiCopyRunner : public StageRunner {
 public:
  // Two or more copies of one stage's operators (the same graph), bound
  // (OpGpt::Bind) before the first step.
  explicit MultiCopyRunner(std::vector<std::unique_ptr<OpGpt>> copies);
  ~MultiCopyRunner() override;
  MultiCopyRunner(const MultiCopyRunner&) = delete;
  MultiCopyRunner& operator=(const MultiCopyRunner&) = delete;

  int copies() const { return static_cast<int>(copies_.size()); }
  const std::vector<std::unique_ptr<OpGpt>>& ops() const { return copies_; }

  void SetSlots(int n) override;
  int slots() const override { return copies_[0]->slots(); }
  // B (the micro-batch's sequences) must be a multiple of copies().
  Result<float> ForwardStage(int slot, const int32_t* tokens, const float* x,
                             const int32_t* targets, int B, int T) override;
  const float* StageOutput(int slot) const override { return out_[slot].data(); }
  Status BackwardStage(int slot, const float* dy, float dloss) override;
  const float* InputGradient() const override { return input_grad_.data(); }
  Status ReduceParamGradients() override { return copies_[0]->ReduceParamGradients(); }
  int64_t ActivationBytes() const override;
  int64_t CommBufferBytes() const override { return copies_[0]->CommBufferBytes(); }
  double comm_seconds() const override;
  int64_t plans_built() const override;

 private:
  // Runs fn(k) for every copy k in turns (copy 0 on the calling thread,
  // the others on the runner's threads); the first error.
  Status RunCopies(const std::function<Status(int)>& fn);
  Status RunCopy(int k);
  void Worker(int k);

  std::vector<std::unique_ptr<OpGpt>> copies_;
  int64_t width_ = 0;  // the residual stream's columns
  bool first_ = false, last_ = false;
  std::vector<std::vector<float>> out_;  // per slot: the copies' outputs, whole
  std::vector<float> input_grad_;
  std::vector<float> losses_;
  std::vector<std::pair<int, int>> shape_;  // per slot: B, T of its forward

  CopyTurns turns_;
  std::mutex mu_;
  std::condition_variable start_, done_;
  const std::function<Status(int)>* job_ = nullptr;
  // What the copies' threads take from the caller's: its trace, and
  // whether it tallies kernel units (kernels::CountUnits), each copy's
  // tally added to the caller's.
  Trace* trace_ = nullptr;
  bool counting_ = false;
  std::vector<std::array<double, kKernelCount>> units_;
  uint64_t generation_ = 0;
  int running_ = 0;
  bool stop_ = false;
  std::vector<Status> status_;
  std::vector<std::thread> threads_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_MULTI_COPY_H_
