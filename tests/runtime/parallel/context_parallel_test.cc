// Context parallelism's attention (context_parallel.h, AttentionOp under
// cp > 1) against the unsplit attention, as TransformerEngine tests its CP
// attention: random q|k|v and output gradients, the whole sequences run by
// one rank, the same split over cp in-process ranks by each algorithm;
// every rank's outputs and dq, dk, dv at its positions within 1e-5
// relative, for several sequence lengths (not only powers of two), head
// sizes and cp. The zigzag split's positions and balance are checked from
// Megatron's rule (rank i holds chunks i and 2 cp - 1 - i).
#include "runtime/parallel/context_parallel.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <vector>

#include "runtime/comm/inprocess.h"
#include "runtime/kernels.h"
#include "runtime/parallel/operators.h"

namespace tessera {
namespace {

std::vector<float> Random(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

OpStrategy Strategy(std::vector<DimAxes> dims) { return OpStrategy{{std::move(dims)}}; }

// The largest |a - b| over the largest |b|: 1e-5 is fp32's agreement.
double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  return diff / scale;
}

TEST_CASE("SequenceSplit: the zigzag holds chunks r and 2 cp - 1 - r", "[context_parallel]") {
  const SequenceSplit r0 = SequenceSplit::Of(CpAlgo::kRing, 8, 2, 0);
  const SequenceSplit r1 = SequenceSplit::Of(CpAlgo::kRing, 8, 2, 1);
  std::vector<int64_t> p0, p1;
  for (int t = 0; t < 4; ++t) {
    p0.push_back(r0.Position(t));
    p1.push_back(r1.Position(t));
  }
  CHECK(p0 == std::vector<int64_t>{0, 1, 6, 7});
  CHECK(p1 == std::vector<int64_t>{2, 3, 4, 5});
  CHECK(r0.Runs() == std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {6, 2}});
  const SequenceSplit u = SequenceSplit::Of(CpAlgo::kUlysses, 12, 3, 2);
  CHECK(u.Runs() == std::vector<std::pair<int64_t, int64_t>>{{8, 4}});
  CHECK(u.Position(3) == 11);
  // Every rank's queries see the same number of causal scores.
  for (int cp : {2, 3, 4}) {
    const int64_t T = 24;
    std::vector<int64_t> seen(cp, 0);
    for (int r = 0; r < cp; ++r) {
      const SequenceSplit s = SequenceSplit::Of(CpAlgo::kRing, T, cp, r);
      for (int64_t t = 0; t < s.local(); ++t) seen[r] += s.Position(t) + 1;
    }
    for (int r = 1; r < cp; ++r) CHECK(seen[r] == seen[0]);
  }
  CHECK(CheckSequenceCut(CpAlgo::kRing, 12, 4, "h.0.attn.attention").ok() == false);
  CHECK_THAT(CheckSequenceCut(CpAlgo::kRing, 12, 4, "h.0.attn.attention").message(),
             Catch::Contains("'h.0.attn.attention'") && Catch::Contains("T is 12") &&
                 Catch::Contains("multiple of 8"));
  CHECK(CheckSequenceCut(CpAlgo::kUlysses, 12, 4, "a").ok());
}

TEST_CASE("ring and Ulysses attention equal the unsplit attention, forward and backward",
          "[context_parallel]") {
  struct Case {
    int64_t T;
    int heads, hs, cp;
  };
  int runs = 0;
  for (const Case& c : {Case{8, 2, 4, 2}, Case{24, 2, 8, 2}, Case{24, 6, 4, 3}, Case{48, 4, 16, 4},
                        Case{96, 2, 32, 2}, Case{36, 4, 8, 4}}) {
    const int64_t B = 2, C = static_cast<int64_t>(c.heads) * c.hs, T = c.T, N = B * T;
    const std::vector<float> qkv = Random(N * 3 * C, T + c.hs), dy = Random(N * C, T * 7 + c.cp);
    // The reference: whole sequences on one rank.
    auto whole = AttentionOp::Create("attn", Strategy({{"dp"}, {}}), c.heads, C, 1, 1);
    REQUIRE(whole.ok());
    OpContext one(nullptr);
    std::vector<float> q1 = qkv, y1(N * C), att1(whole->AttSize(one, N, static_cast<int>(T))),
                       dy1 = dy, dq1(N * 3 * C);
    Act qa{q1.data(), N, 3 * C, {-1}}, ya{y1.data(), N, C, {-1}}, dya{dy1.data(), N, C, {-1}},
        dqa{dq1.data(), N, 3 * C, {-1}};
    REQUIRE(whole->Forward(one, qa, static_cast<int>(T), att1.data(), &ya).ok());
    REQUIRE(whole->Backward(one, qa, att1.data(), static_cast<int>(T), dya, &dqa).ok());
    for (CpAlgo algo : {CpAlgo::kRing, CpAlgo::kUlysses}) {
      if (!CheckSequenceCut(algo, T, c.cp, "attn").ok()) continue;
      if (algo == CpAlgo::kUlysses && c.heads % c.cp != 0) continue;
      INFO("T " << T << " heads " << c.heads << " x " << c.hs << " cp " << c.cp << " "
                << CpAlgoName(algo));
      const OpStrategy s =
          algo == CpAlgo::kRing ? Strategy({{"dp", "cp"}, {}}) : Strategy({{"dp"}, {"cp"}});
      auto op = AttentionOp::Create("attn", s, c.heads, C, 1, 1, c.cp);
      REQUIRE(op.ok());
      CHECK(op->cp_mode() ==
            (algo == CpAlgo::kRing ? AttentionOp::Cp::kRing : AttentionOp::Cp::kUlysses));
      const int64_t Tl = T / c.cp, n = B * Tl;
      std::vector<double> errors(4 * c.cp, 0);
      std::vector<int64_t> att_sizes(c.cp);
      const Status st = RunInProcess(c.cp, [&](Communicator& comm) -> Status {
        OpContext ctx(nullptr);
        ctx.SetContextParallel(&comm, algo);
        const int r = comm.rank();
        const SequenceSplit split = ctx.Split(Tl);
        // This rank's positions of every input and of the references.
        auto local = [&](const std::vector<float>& all, int64_t width) {
          std::vector<float> out(n * width);
          for (int64_t b = 0; b < B; ++b) {
            for (int64_t t = 0; t < Tl; ++t) {
              const float* from = all.data() + (b * T + split.Position(t)) * width;
              std::copy(from, from + width, out.data() + (b * Tl + t) * width);
            }
          }
          return out;
        };
        std::vector<float> q = local(qkv, 3 * C), d = local(dy, C), y(n * C), dq(n * 3 * C);
        att_sizes[r] = op->AttSize(ctx, n, static_cast<int>(Tl));
        std::vector<float> att(att_sizes[r]);
        Act qi{q.data(), n, 3 * C, {-1}}, yo{y.data(), n, C, {-1}}, di{d.data(), n, C, {-1}},
            dqo{dq.data(), n, 3 * C, {-1}};
        RETURN_IF_ERROR(op->Forward(ctx, qi, static_cast<int>(Tl), att.data(), &yo));
        RETURN_IF_ERROR(op->Backward(ctx, qi, att.data(), static_cast<int>(Tl), di, &dqo));
        const std::vector<float> y_ref = local(y1, C), dq_ref = local(dq1, 3 * C);
        errors[4 * r] = RelativeError(y, y_ref);
        // dq, dk, dv apart.
        for (int g = 0; g < 3; ++g) {
          std::vector<float> mine, ref;
          for (int64_t i = 0; i < n; ++i) {
            mine.insert(mine.end(), dq.begin() + i * 3 * C + g * C,
                        dq.begin() + i * 3 * C + (g + 1) * C);
            ref.insert(ref.end(), dq_ref.begin() + i * 3 * C + g * C,
                       dq_ref.begin() + i * 3 * C + (g + 1) * C);
          }
          errors[4 * r + 1 + g] = RelativeError(mine, ref);
        }
        return Status::Ok();
      });
      INFO(st.ToString());
      REQUIRE(st.ok());
      for (int r = 0; r < c.cp; ++r) {
        INFO("cp rank " << r);
        CHECK(errors[4 * r] < 1e-5);      // y
        CHECK(errors[4 * r + 1] < 1e-5);  // dq
        CHECK(errors[4 * r + 2] < 1e-5);  // dk
        CHECK(errors[4 * r + 3] < 1e-5);  // dv
        if (algo == CpAlgo::kRing) {
          // The output and a log-sum-exp per row and head: nothing of T^2.
          CHECK(att_sizes[r] == n * C + n * c.heads);
        } else {
          // Whole sequences of heads / cp: their weights and gathered q|k|v.
          CHECK(att_sizes[r] == B * (c.heads / c.cp) * T * T + B * T * 3 * (C / c.cp));
        }
      }
      ++runs;
    }
  }
  CHECK(runs == 11);
}

TEST_CASE("AttentionOp refuses cp cuts it cannot run, by name", "[context_parallel]") {
  auto both =
      AttentionOp::Create("h.1.attn.attention", Strategy({{"dp", "cp"}, {"cp"}}), 4, 8, 1, 1, 2);
  REQUIRE(!both.ok());
  CHECK_THAT(both.status().message(),
             Catch::Contains("'h.1.attn.attention'") && Catch::Contains("choose one"));
  auto heads =
      AttentionOp::Create("h.0.attn.attention", Strategy({{"dp"}, {"tp", "cp"}}), 4, 8, 2, 1, 4);
  REQUIRE(!heads.ok());
  CHECK_THAT(heads.status().message(), Catch::Contains("'h.0.attn.attention'") &&
                                           Catch::Contains("4 heads") &&
                                           Catch::Contains("tp 2 x cp 4"));
  auto rows =
      AttentionOp::Create("h.0.attn.attention", Strategy({{"dp", "cp", "tp"}, {}}), 4, 8, 2, 1, 2);
  REQUIRE(!rows.ok());
  CHECK_THAT(rows.status().message(), Catch::Contains("ring attention"));
}

}  // namespace
}  // namespace tessera
