// GPT parity with PyTorch. Writes the model's initial weights and a fixed
// batch to safetensors, runs tests/parity/gpt_parity.py (the same model in
// PyTorch) on them, then runs our model and compares: step-0 logits and
// loss (<= 1e-5 relative), every step-0 gradient (<= 1e-4 relative L2 norm
// per tensor), and the losses of 10 AdamW steps with clipping (<= 1e-5
// relative each), with every matrix-product library (runtime/matmul.h).
// Prints the first differing elements on failure.
//   gpt_parity PYTHON SCRIPT WORKDIR
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/env.h"
#include "formats/safetensors.h"
#include "runtime/matmul.h"
#include "runtime/model/gpt.h"

using namespace tessera;

namespace {

int failures = 0;

void Fail(const std::string& what) {
  std::printf("FAIL %s\n", what.c_str());
  ++failures;
}

// Relative L2 norm of (got - want); on failure prints the first elements
// that differ most.
void CompareTensor(const std::string& name, const float* got, const std::vector<float>& want,
                   double tol) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += std::pow(static_cast<double>(got[i]) - want[i], 2);
    norm += static_cast<double>(want[i]) * want[i];
  }
  const double rel = std::sqrt(diff / std::max(norm, 1e-30));
  if (rel <= tol) return;
  Fail(name + ": relative difference " + std::to_string(rel) + " > " + std::to_string(tol));
  int shown = 0;
  for (size_t i = 0; i < want.size() && shown < 5; ++i) {
    if (std::fabs(got[i] - want[i]) > tol * (std::fabs(want[i]) + 1e-6)) {
      std::printf("  [%zu] ours %.9g  torch %.9g\n", i, got[i], want[i]);
      ++shown;
    }
  }
}

std::vector<float> ReadF32(const SafetensorsFile& f, const std::string& name) {
  const SafetensorsEntry* e = f.Find(name);
  if (e == nullptr) {
    Fail("reference has no tensor '" + name + "'");
    return {};
  }
  std::vector<float> v((e->end - e->begin) / 4);
  if (!f.Read(*e, 0, e->end - e->begin, v.data()).ok()) Fail("cannot read '" + name + "'");
  return v;
}

}  // namespace

constexpr int kSteps = 10;
constexpr AdamWConfig kAdam{.lr = 1e-3f, .weight_decay = 0.1f};
constexpr float kMaxNorm = 1.0f;

// kSteps of AdamW with clipping on one batch, compared with PyTorch's
// reference step by step; failures prefixed with `label`.
void Train(Gpt& model, const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets,
           int B, int T, const SafetensorsFile& reference, const std::vector<float>& torch_losses,
           const std::string& label) {
  std::vector<float> losses;
  int clipped = 0;
  for (int step = 0; step < kSteps; ++step) {
    auto loss = model.Forward(tokens.data(), targets.data(), B, T);
    model.ZeroGrad();
    if (!loss.ok() || !model.Backward().ok()) {
      Fail(label + "step " + std::to_string(step) + " failed");
      return;
    }
    if (step == 0) {
      CompareTensor(label + "step-0 logits", model.logits().data(), ReadF32(reference, "logits"),
                    1e-5);
      for (const ParamInfo& p : model.params()) {
        CompareTensor(label + "step-0 gradient of " + p.name, model.grads().data() + p.offset,
                      ReadF32(reference, "grad." + p.name), 1e-4);
      }
    }
    const float norm = model.Update(kAdam, kMaxNorm);
    clipped += norm > kMaxNorm;
    losses.push_back(*loss);
    const double rel = std::fabs(*loss - torch_losses[step]) / std::fabs(torch_losses[step]);
    std::printf("step %2d  loss %.7f  torch %.7f  relative difference %.2e  grad norm %.3f\n", step,
                *loss, torch_losses[step], rel, norm);
    if (rel > 1e-5) Fail(label + "loss of step " + std::to_string(step));
  }
  if (!(losses.back() < losses.front())) Fail(label + "the loss did not go down");
  if (clipped == 0) Fail(label + "no step was clipped: the test would not cover clipping");
}

// The model (tied, or with its own output projection) against PyTorch's.
int Parity(const std::string& python, const std::string& script, const std::string& dir,
           bool untied) {
  std::printf("%s output projection:\n", untied ? "untied" : "tied");
  const GptConfig config{
      .layers = 2, .heads = 4, .embed = 64, .context = 32, .vocab = 97, .untied = untied};
  const int B = 4, T = 32;
  auto model = Gpt::Create(config);
  if (!model.ok()) return 1;
  model->Init(1234);

  // A fixed batch: a repeating pattern with some noise, targets shifted by one.
  std::vector<int32_t> stream(B * (T + 1));
  uint32_t x = 42;
  for (size_t i = 0; i < stream.size(); ++i) {
    x = x * 1664525u + 1013904223u;
    stream[i] = static_cast<int32_t>((i % 7 == 0 ? x >> 16 : i * 5) % config.vocab);
  }
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      tokens[b * T + t] = stream[b * (T + 1) + t];
      targets[b * T + t] = stream[b * (T + 1) + t + 1];
    }
  }

  Env* env = Env::Default();
  if (!env->CreateDirs(dir).ok()) return 1;
  const std::string init = dir + "/init.safetensors", ref = dir + "/torch.safetensors";
  std::vector<SafetensorsTensor> out;
  for (const ParamInfo& p : model->params()) {
    out.push_back({p.name, DType::kF32, p.shape, model->weights().data() + p.offset});
  }
  out.push_back({"tokens", DType::kI32, {B, T}, tokens.data()});
  out.push_back({"targets", DType::kI32, {B, T}, targets.data()});
  Status s = WriteSafetensors(env, init, out,
                              {{"layers", std::to_string(config.layers)},
                               {"heads", std::to_string(config.heads)},
                               {"embed", std::to_string(config.embed)},
                               {"steps", std::to_string(kSteps)},
                               {"lr", std::to_string(kAdam.lr)},
                               {"weight_decay", std::to_string(kAdam.weight_decay)},
                               {"max_norm", std::to_string(kMaxNorm)}});
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  const std::string cmd = python + " " + script + " " + init + " " + ref;
  if (std::system(cmd.c_str()) != 0) {
    std::fprintf(stderr, "the PyTorch reference failed: %s\n", cmd.c_str());
    return 1;
  }
  auto reference = SafetensorsFile::Open(env, ref);
  if (!reference.ok()) {
    std::fprintf(stderr, "%s\n", reference.status().ToString().c_str());
    return 1;
  }
  const std::vector<float> torch_losses = ReadF32(*reference, "loss");
  if (torch_losses.size() != kSteps) return 1;

  // Every matrix-product library (runtime/matmul.h) against the same
  // reference, from the same initial weights.
  for (MatmulLibrary library : kMatmulLibraries) {
    std::printf("matrix products: %s\n", kernels::DescribeMatmulLibrary(library).c_str());
    kernels::SetMatmulLibrary(library);
    model = Gpt::Create(config);
    if (!model.ok()) return 1;
    model->Init(1234);
    Train(*model, tokens, targets, B, T, *reference, torch_losses,
          std::string(MatmulLibraryName(library)) + ": ");
  }
  kernels::SetMatmulLibrary(MatmulLibrary::kOpenBlas);
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: gpt_parity PYTHON SCRIPT WORKDIR\n");
    return 2;
  }
  const std::string python = argv[1], script = argv[2], dir = argv[3];
  if (Parity(python, script, dir + "/tied", false) != 0) return 1;
  if (Parity(python, script, dir + "/untied", true) != 0) return 1;
  std::printf(failures ? "%d failures\n" : "parity with PyTorch: ok\n", failures);
  return failures ? 1 : 0;
}
