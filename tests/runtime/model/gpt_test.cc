// The GPT model end to end on a tiny configuration: its gradients against
// finite differences of its loss, AdamW against the closed form of a first
// step, and training that drives the loss down.
#include "runtime/model/gpt.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <random>

#include "ckpt/ops.h"
#include "core/half.h"
#include "runtime/model/gpt_checkpoint.h"

namespace tessera {
namespace {

const GptConfig kTiny{.layers = 2, .heads = 2, .embed = 8, .context = 6, .vocab = 11};

std::vector<int32_t> Tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

TEST_CASE("GPT: parameter names and shapes are GPT-2's") {
  auto g = Gpt::Create(kTiny);
  REQUIRE(g.ok());
  CHECK(g->params().size() == 2 + 12 * 2 + 2);
  CHECK(g->FindParam("wte")->shape == std::vector<int64_t>{11, 8});
  CHECK(g->FindParam("h.1.attn.c_attn.weight")->shape == std::vector<int64_t>{8, 24});
  CHECK(g->FindParam("h.0.mlp.c_proj.weight")->shape == std::vector<int64_t>{32, 8});
  CHECK(g->FindParam("ln_f.bias")->shape == std::vector<int64_t>{8});
  CHECK_FALSE(g->FindParam("h.0.ln_1.bias")->decay);
  CHECK(g->FindParam("h.0.mlp.c_fc.weight")->decay);
  // 12 C^2 L + C(V + T) + 13 C L + 2 C
  CHECK(g->num_params() == 12 * 64 * 2 + 8 * (11 + 6) + 13 * 8 * 2 + 2 * 8);
  CHECK_FALSE(Gpt::Create({.layers = 1, .heads = 3, .embed = 8}).ok());
}

TEST_CASE("GPT: init is deterministic and follows the GPT-2 scheme") {
  auto a = Gpt::Create(kTiny), b = Gpt::Create(kTiny);
  a->Init(7);
  b->Init(7);
  CHECK(a->weights() == b->weights());
  b->Init(8);
  CHECK(a->weights() != b->weights());
  const ParamInfo* ln = a->FindParam("h.0.ln_2.weight");
  CHECK(a->weights()[ln->offset] == 1.0f);
  auto big = Gpt::Create({.layers = 2, .heads = 4, .embed = 64, .context = 32, .vocab = 512});
  big->Init(1);
  auto stddev = [&](const std::string& name) {
    const ParamInfo* p = big->FindParam(name);
    double s = 0;
    for (int64_t i = 0; i < p->numel; ++i) s += std::pow(big->weights()[p->offset + i], 2);
    return std::sqrt(s / p->numel);
  };
  CHECK(stddev("wte") == Approx(0.02).epsilon(0.05));
  CHECK(stddev("h.1.attn.c_proj.weight") == Approx(0.02 / std::sqrt(4.0)).epsilon(0.05));
}

TEST_CASE("GPT: backward matches finite differences of the loss") {
  auto g = Gpt::Create(kTiny);
  REQUIRE(g.ok());
  g->Init(3);
  // Larger weights than the init, so that every path carries gradient.
  std::mt19937 rng(9);
  std::normal_distribution<float> noise(0.0f, 0.3f);
  for (float& w : g->weights()) w += noise(rng);
  const int B = 2, T = 5;
  const auto tokens = Tokens(B * T, 11, 1), targets = Tokens(B * T, 11, 2);
  REQUIRE(g->Forward(tokens.data(), targets.data(), B, T).ok());
  g->ZeroGrad();
  REQUIRE(g->Backward().ok());
  const std::vector<float> analytic = g->grads();
  double diff = 0, norm = 0;
  int checked = 0;
  for (const ParamInfo& p : g->params()) {
    for (int64_t i = 0; i < p.numel; i += std::max<int64_t>(1, p.numel / 7)) {
      float& w = g->weights()[p.offset + i];
      const float saved = w;
      const float h = 1e-2f;
      w = saved + h;
      const double up = *g->Forward(tokens.data(), targets.data(), B, T);
      w = saved - h;
      const double down = *g->Forward(tokens.data(), targets.data(), B, T);
      w = saved;
      const double numeric = (up - down) / (2 * h);
      diff += std::pow(numeric - analytic[p.offset + i], 2);
      norm += numeric * numeric;
      ++checked;
    }
  }
  INFO(checked << " elements checked");
  CHECK(std::sqrt(diff / norm) < 1e-2);
  CHECK(norm > 1e-4);  // the check compared real gradients, not zeros
}

TEST_CASE("AdamW: the first step moves each weight by lr against its gradient") {
  auto g = Gpt::Create(kTiny);
  g->Init(1);
  const std::vector<float> before = g->weights();
  std::mt19937 rng(4);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  for (float& x : g->grads()) x = noise(rng);
  const std::vector<float> grads = g->grads();
  const AdamWConfig c{.lr = 1e-3f, .weight_decay = 0.1f};
  g->Update(c, /*max_norm=*/0.0f);
  CHECK(g->step() == 1);
  for (const ParamInfo& p : g->params()) {
    for (int64_t i = p.offset; i < p.offset + p.numel; ++i) {
      const double decayed = before[i] * (p.decay ? 1.0 - 1e-3 * 0.1 : 1.0);
      // m_hat = g, v_hat = g^2: the step is lr * g / (|g| + eps)
      const double expect = decayed - 1e-3 * grads[i] / (std::fabs(grads[i]) + 1e-8);
      REQUIRE(g->weights()[i] == Approx(expect).margin(1e-6));
    }
  }
}

TEST_CASE("GPT: training overfits a fixed batch, clipping bounds the norm") {
  auto g = Gpt::Create(kTiny);
  g->Init(5);
  const auto tokens = Tokens(12, 11, 3), targets = Tokens(12, 11, 4);
  float first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    auto loss = g->Forward(tokens.data(), targets.data(), 2, 6);
    REQUIRE(loss.ok());
    if (step == 0) first = *loss;
    last = *loss;
    g->ZeroGrad();
    REQUIRE(g->Backward().ok());
    g->Update({.lr = 1e-2f}, 1.0f);
  }
  CHECK(first == Approx(std::log(11.0)).epsilon(0.05));  // near uniform at init
  CHECK(last < 0.5f * first);
  // A clipped update: the gradients are scaled to the max norm.
  g->ZeroGrad();
  REQUIRE(g->Forward(tokens.data(), targets.data(), 2, 6).ok());
  REQUIRE(g->Backward().ok());
  const float norm = g->Update({.lr = 0.0f}, 1e-3f);
  CHECK(norm > 1e-3f);
  CHECK(std::sqrt(SquaredNorm(g->grads().data(), g->num_params())) == Approx(1e-3).epsilon(1e-3));
}

TEST_CASE("GPT checkpoints: resume state exactly, exports in bf16 without optimizer state") {
  std::unique_ptr<Env> env = NewMemEnv();
  auto g = Gpt::Create(kTiny);
  g->Init(9);
  const auto tokens = Tokens(12, 11, 3), targets = Tokens(12, 11, 4);
  for (int step = 0; step < 3; ++step) {  // non-zero moments
    REQUIRE(g->Forward(tokens.data(), targets.data(), 2, 6).ok());
    g->ZeroGrad();
    REQUIRE(g->Backward().ok());
    g->Update({.lr = 1e-2f}, 1.0f);
  }
  REQUIRE(SaveGpt(env.get(), *g, "/ck", "full", {}).ok());
  REQUIRE(SaveGpt(env.get(), *g, "/ck", "export", {},
                  {.weights_dtype = DType::kBF16, .optimizer_state = false})
              .ok());

  auto full = OpenCheckpoint(env.get(), "/ck/full");
  REQUIRE(full.ok());
  auto resumed = Gpt::Create(kTiny);
  REQUIRE(LoadGpt(**full, &*resumed).ok());
  CHECK(resumed->weights() == g->weights());
  CHECK(resumed->adam_m() == g->adam_m());
  CHECK(resumed->adam_v() == g->adam_v());
  CHECK(resumed->step() == 3);

  auto exported = OpenCheckpoint(env.get(), "/ck/export");
  REQUIRE(exported.ok());
  CHECK((*exported)->strategy().tensors().size() == g->params().size());
  CHECK((*exported)->strategy().tensors()[0].layout.dtype == DType::kBF16);
  auto fresh = Gpt::Create(kTiny);
  fresh->Init(1);
  fresh->Update({.lr = 0.0f}, 0.0f);  // step 1, to see it reset
  REQUIRE(LoadGpt(**exported, &*fresh).ok());
  for (int64_t i = 0; i < g->num_params(); ++i) {
    REQUIRE(fresh->weights()[i] == BF16ToFloat(FloatToBF16(g->weights()[i])));
  }
  CHECK(fresh->step() == 0);
  CHECK(
      std::all_of(fresh->adam_m().begin(), fresh->adam_m().end(), [](float x) { return x == 0; }));

  // Another model's shapes: refused, naming the tensor and both shapes.
  auto other = Gpt::Create({.layers = 2, .heads = 2, .embed = 8, .context = 6, .vocab = 12});
  const Status s = LoadGpt(**full, &*other);
  CHECK_THAT(s.message(),
             Catch::Contains("'wte'") && Catch::Contains("[11, 8]") && Catch::Contains("[12, 8]"));
}

TEST_CASE("GPT: bad input is refused by name") {
  auto g = Gpt::Create(kTiny);
  g->Init(1);
  std::vector<int32_t> tokens = {1, 2, 3, 11};
  auto r = g->Forward(tokens.data(), nullptr, 1, 4);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains("position 3"));
  CHECK_FALSE(g->Forward(tokens.data(), nullptr, 1, 7).ok());  // longer than the context
  CHECK(g->Backward().code() == StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tessera
