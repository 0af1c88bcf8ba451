// Trains a GPT-2 style model on a text file, byte by byte (single process).
//   train_gpt --data data/corpus.txt --steps 50 [--layers 4 --heads 4
//             --embed 256 --context 256 --batch 8] [--save DIR --save-every N]
//             [--resume] [--threads N]
// Logs the loss and tokens/s of every step. With --save it writes native
// checkpoints DIR/step-<N> (parameters, Adam moments, step, data position,
// config) and keeps DIR/latest on the newest; --resume continues from
// DIR/latest when there is one, bit for bit as if never stopped.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "ckpt/ops.h"
#include "runtime/data.h"
#include "runtime/gpt.h"
#include "runtime/gpt_checkpoint.h"
#include "runtime/kernels.h"

using namespace tessera;

namespace {

std::string ConfigString(const GptConfig& c, int batch, int seq, uint64_t seed) {
  return "layers=" + std::to_string(c.layers) + " heads=" + std::to_string(c.heads) +
         " embed=" + std::to_string(c.embed) + " context=" + std::to_string(c.context) +
         " vocab=" + std::to_string(c.vocab) + " batch=" + std::to_string(batch) +
         " seq=" + std::to_string(seq) + " seed=" + std::to_string(seed);
}

int Fail(const Status& s) {
  std::fprintf(stderr, "train_gpt: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  // See BetterBlasCore: restart once with the faster OpenBLAS kernels.
  if (const std::string core = kernels::BetterBlasCore(); !core.empty()) {
    setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
    execv("/proc/self/exe", argv);  // on failure, go on with what we have
  }
  CLI::App app{"Train a GPT-2 style model on a text file (byte-level)"};
  GptConfig config{.layers = 4, .heads = 4, .embed = 256, .context = 256, .vocab = kByteVocab};
  std::string data = "data/corpus.txt", save;
  int batch = 8, seq = 0, steps = 20, save_every = 0, threads = 0;
  uint64_t seed = 1;
  AdamWConfig adam{.lr = 3e-4f, .weight_decay = 0.1f};
  float max_norm = 1.0f;
  bool resume = false, quiet = false;
  app.add_option("--data", data,
                 "text file (one token per byte) or token file (llm.c's uint16/uint32 .bin)")
      ->check(CLI::ExistingFile);
  app.add_option("--layers", config.layers)->check(CLI::PositiveNumber);
  app.add_option("--heads", config.heads)->check(CLI::PositiveNumber);
  app.add_option("--embed", config.embed)->check(CLI::PositiveNumber);
  app.add_option("--context", config.context, "longest sequence")->check(CLI::PositiveNumber);
  app.add_option("--vocab", config.vocab, "vocabulary (>= 256; bytes use the first 256)")
      ->check(CLI::Range(kByteVocab, 1 << 20));
  app.add_option("--batch", batch)->check(CLI::PositiveNumber);
  app.add_option("--seq", seq, "sequence length (default: the context)");
  app.add_option("--steps", steps, "train until this step")->check(CLI::NonNegativeNumber);
  app.add_option("--lr", adam.lr);
  app.add_option("--weight-decay", adam.weight_decay);
  app.add_option("--max-norm", max_norm, "gradient clipping (0: none)");
  app.add_option("--seed", seed, "initialisation and data order");
  app.add_option("--threads", threads, "OpenBLAS threads (0: all cores)");
  app.add_option("--save", save, "checkpoint directory");
  app.add_option("--save-every", save_every, "save every N steps (and at the end)");
  app.add_flag("--resume", resume, "continue from the --save directory's latest checkpoint");
  std::string export_dir, export_dtype = "f32";
  app.add_option("--export", export_dir,
                 "at the end, write the weights alone (no optimizer state) as a checkpoint here");
  app.add_option("--export-dtype", export_dtype, "dtype of the exported weights")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  app.add_flag("--quiet", quiet, "log only the summary");
  CLI11_PARSE(app, argc, argv);
  if (seq <= 0) seq = config.context;
  if (resume && save.empty()) return Fail(InvalidArgumentError("--resume needs --save DIR"));
  kernels::SetComputeThreads(threads);
  if (const std::string advice = kernels::BlasCoreAdvice(); !advice.empty() && !quiet) {
    std::fprintf(stderr, "%s\n", advice.c_str());
  }

  Env* env = Env::Default();
  auto model = Gpt::Create(config);
  if (!model.ok()) return Fail(model.status());
  if (seq > config.context) return Fail(InvalidArgumentError("--seq is longer than --context"));
  auto tokens = OpenTokens(env, data);
  if (!tokens.ok()) return Fail(tokens.status());
  auto loader = TokenLoader::Create(std::move(*tokens), batch, seq, seed);
  if (!loader.ok()) return Fail(loader.status());
  const std::string config_text = ConfigString(config, batch, seq, seed);

  model->Init(seed);
  if (resume && env->FileExists(save + "/latest")) {
    auto checkpoint = OpenCheckpoint(env, save);  // the config first, then the tensors
    if (!checkpoint.ok()) return Fail(checkpoint.status());
    const auto& saved = (*checkpoint)->meta().metadata;
    const auto it = saved.find("config");
    if (it == saved.end() || it->second != config_text) {
      return Fail(InvalidArgumentError(
          "checkpoint '" + (*checkpoint)->path() + "' was trained with '" +
          (it == saved.end() ? std::string("?") : it->second) + "', not '" + config_text + "'"));
    }
    if (Status s = LoadGpt(**checkpoint, &*model); !s.ok()) return Fail(s);
    const auto pos = saved.find("data.position");
    auto position = DataPosition::Parse(pos == saved.end() ? "" : pos->second);
    if (!position.ok()) return Fail(position.status());
    if (Status s = loader->Restore(*position); !s.ok()) return Fail(s);
    std::printf("resumed from step %lld (data position %s)\n",
                static_cast<long long>(model->step()), position->ToString().c_str());
  }
  std::printf("model: %s, %lld parameters (OpenBLAS core %s)\n", config_text.c_str(),
              static_cast<long long>(model->num_params()), kernels::BlasCoreName().c_str());

  std::vector<int32_t> inputs(batch * seq), targets(batch * seq);
  double total_seconds = 0;
  int64_t timed_steps = 0;
  float loss_value = 0;
  while (model->step() < steps) {
    const auto t0 = std::chrono::steady_clock::now();
    if (Status s = loader->NextBatch(inputs.data(), targets.data()); !s.ok()) return Fail(s);
    auto loss = model->Forward(inputs.data(), targets.data(), batch, seq);
    if (!loss.ok()) return Fail(loss.status());
    model->ZeroGrad();
    if (Status s = model->Backward(); !s.ok()) return Fail(s);
    const float norm = model->Update(adam, max_norm);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    loss_value = *loss;
    if (model->step() > 1) {  // the first step warms caches and allocations
      total_seconds += seconds;
      ++timed_steps;
    }
    if (!quiet) {
      std::printf("step %5lld/%d  loss %.9g  norm %.4f  %8.0f tok/s  %7.1f ms\n",
                  static_cast<long long>(model->step()), steps, *loss, norm,
                  batch * seq / seconds, seconds * 1e3);
      std::fflush(stdout);
    }
    const bool last = model->step() == steps;
    if (!save.empty() && ((save_every > 0 && model->step() % save_every == 0) || last)) {
      const std::string name = "step-" + std::to_string(model->step());
      Status s = SaveGpt(env, *model, save, name,
                         {{"config", config_text},
                          {"data.position", loader->position().ToString()}});
      if (!s.ok()) return Fail(s);
      if (!quiet) std::printf("saved %s/%s\n", save.c_str(), name.c_str());
    }
  }
  if (!export_dir.empty()) {
    const SaveGptOptions options{.weights_dtype = *ParseDType(export_dtype),
                                 .optimizer_state = false};
    const std::string name = "step-" + std::to_string(model->step());
    Status s = SaveGpt(env, *model, export_dir, name, {{"config", config_text}}, options);
    if (!s.ok()) return Fail(s);
    if (!quiet) {
      std::printf("exported %s weights to %s/%s\n", export_dtype.c_str(), export_dir.c_str(),
                  name.c_str());
    }
  }
  if (timed_steps > 0) {
    // Model FLOPs per token: 6 per parameter (forward + backward) plus the
    // attention products, 12 * layers * seq * embed.
    const double flops_per_token =
        6.0 * model->num_params() + 12.0 * config.layers * seq * config.embed;
    const double tokens_per_s = batch * seq * timed_steps / total_seconds;
    std::printf("done: step %lld, loss %.4f, %.0f tokens/s, %.1f GFLOP/s "
                "(mean of %lld steps after the first)\n",
                static_cast<long long>(model->step()), loss_value, tokens_per_s,
                tokens_per_s * flops_per_token / 1e9, static_cast<long long>(timed_steps));
  }
  return 0;
}
