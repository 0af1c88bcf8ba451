#include "runtime/model/matmul_choice.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>

#include "core/timer.h"
#include "runtime/matmul.h"
#include "runtime/model/gpt.h"

namespace tessera {

namespace {

// A GPT of `layers` x `embed` (vocabulary 256) and a batch of `batch`
// sequences of 256 tokens to time its training step on.
struct StepProbe {
  static constexpr int kSeq = 256;
  Gpt gpt;
  int batch;
  std::vector<int32_t> tokens, targets;

  static Result<StepProbe> Make(int layers, int embed, int batch) {
    GptConfig config;
    config.layers = layers;
    config.embed = embed;
    config.heads = embed / 64;
    config.context = kSeq;
    config.vocab = 256;
    ASSIGN_OR_RETURN(Gpt gpt, Gpt::Create(config));
    gpt.Init(1);
    const int n = batch * kSeq;
    StepProbe probe{std::move(gpt), batch, std::vector<int32_t>(n), std::vector<int32_t>(n)};
    for (int i = 0; i < n; ++i) {
      probe.tokens[i] = i % config.vocab;
      probe.targets[i] = (i * 7 + 3) % config.vocab;
    }
    return probe;
  }

  // FLOP/s of model work (6 per parameter and token, plus the attention's
  // 12 L T C per token) of one forward and backward on the current
  // library.
  Result<double> Flops() {
    const double t0 = SteadySeconds();
    gpt.ZeroGrad();
    ASSIGN_OR_RETURN(const float loss, gpt.Forward(tokens.data(), targets.data(), batch, kSeq));
    (void)loss;
    RETURN_IF_ERROR(gpt.Backward());
    const GptConfig& c = gpt.config();
    const double per_token = 6.0 * gpt.num_params() + 12.0 * c.layers * kSeq * c.embed;
    return per_token * batch * kSeq / (SteadySeconds() - t0);
  }
};

// Each library's figure (see ChooseMatmulLibrary), in kMatmulLibraries'
// order.
Status ScoreLibraries(double* score) {
  constexpr int kLibraries = std::size(kMatmulLibraries), kRounds = 5;
  ASSIGN_OR_RETURN(StepProbe small, StepProbe::Make(1, 256, 2));
  ASSIGN_OR_RETURN(StepProbe wide, StepProbe::Make(1, 768, 1));
  std::vector<double> rounds[kLibraries];
  // Round 0 warms each library up (its first products, its scratch
  // memory) and is not counted. The rounds interleave the libraries, so
  // that a slow spell of a shared host does not fall on one library only.
  for (int round = 0; round <= kRounds; ++round) {
    for (int l = 0; l < kLibraries; ++l) {
      kernels::SetMatmulLibrary(kMatmulLibraries[l]);
      ASSIGN_OR_RETURN(const double a, small.Flops());
      ASSIGN_OR_RETURN(const double b, wide.Flops());
      if (round > 0) rounds[l].push_back(std::sqrt(a * b));
    }
  }
  for (int l = 0; l < kLibraries; ++l) {
    std::sort(rounds[l].begin(), rounds[l].end());
    score[l] = rounds[l][kRounds / 2];
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<std::pair<MatmulLibrary, double>>> ChooseMatmulLibrary(Communicator& world) {
  constexpr int kLibraries = std::size(kMatmulLibraries);
  double score[kLibraries] = {};
  RETURN_IF_ERROR(world.Barrier());
  const Status scored = world.rank() == 0 ? ScoreLibraries(score) : Status::Ok();
  RETURN_IF_ERROR(world.Broadcast(score, kLibraries, DType::kF64, 0));
  RETURN_IF_ERROR(scored);
  if (!(score[0] > 0)) return InternalError("timing the matrix-product libraries failed on rank 0");
  std::vector<std::pair<MatmulLibrary, double>> figures;
  for (int l = 0; l < kLibraries; ++l) figures.emplace_back(kMatmulLibraries[l], score[l]);
  std::stable_sort(figures.begin(), figures.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  kernels::SetMatmulLibrary(figures.front().first);
  return figures;
}

}  // namespace tessera
