// What one pipeline stage runs on one rank, whoever runs it: the GPT
// whole (data parallelism alone: every operator replicated) or its
// operators with shard strategies (OpGpt). ParallelGpt drives either one
// through this interface: slots of micro-batches in flight, a forward and
// a backward of each, and what the stage's own parallelism adds after a
// step's backwards.
#ifndef TESSERA_RUNTIME_MODEL_STAGE_RUNNER_H_
#define TESSERA_RUNTIME_MODEL_STAGE_RUNNER_H_

#include <cstdint>

#include "core/status.h"
#include "runtime/model/gpt.h"

namespace tessera {

class StageRunner {
 public:
  virtual ~StageRunner() = default;
  // Micro-batches in flight at once, each in its own activation slot.
  virtual void SetSlots(int n) = 0;
  virtual int slots() const = 0;
  // As Gpt::ForwardStage / BackwardStage (tokens and targets are the
  // replica's [B, T]; x the previous stage's whole output).
  virtual Result<float> ForwardStage(int slot, const int32_t* tokens, const float* x,
                                     const int32_t* targets, int B, int T) = 0;
  virtual const float* StageOutput(int slot) const = 0;
  virtual Status BackwardStage(int slot, const float* dy, float dloss) = 0;
  virtual const float* InputGradient() const = 0;
  // After the last backward of a step: the sums the stage's own
  // parallelism needs (tp's partial parameter gradients).
  virtual Status ReduceParamGradients() = 0;
  // Bytes held in activations (the peak of a step) and in the buffers of
  // ReduceParamGradients.
  virtual int64_t ActivationBytes() const = 0;
  virtual int64_t CommBufferBytes() const = 0;
  // Seconds spent in the stage's own collectives.
  virtual double comm_seconds() const = 0;
  // Redistributions planned so far (each distinct one once).
  virtual int64_t plans_built() const { return 0; }
};

// The GPT run whole: every operator replicated, nothing to reduce.
class WholeGptRunner : public StageRunner {
 public:
  // `model` must outlive this.
  explicit WholeGptRunner(Gpt* model) : model_(*model) {}
  void SetSlots(int n) override { model_.SetSlots(n); }
  int slots() const override { return model_.slots(); }
  Result<float> ForwardStage(int slot, const int32_t* tokens, const float* x,
                             const int32_t* targets, int B, int T) override {
    return model_.ForwardStage(slot, tokens, x, targets, B, T);
  }
  const float* StageOutput(int slot) const override { return model_.StageOutput(slot); }
  Status BackwardStage(int slot, const float* dy, float dloss) override {
    return model_.BackwardStage(slot, dy, dloss);
  }
  const float* InputGradient() const override { return model_.InputGradient(); }
  Status ReduceParamGradients() override { return Status::Ok(); }
  int64_t ActivationBytes() const override { return model_.ActivationBytes(); }
  int64_t CommBufferBytes() const override { return 0; }
  double comm_seconds() const override { return 0; }

 private:
  Gpt& model_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_STAGE_RUNNER_H_
