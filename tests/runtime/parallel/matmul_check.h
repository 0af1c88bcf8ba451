// Shared by the in-process and the mpirun tests of ParallelMatMul: the
// strategies and input layouts tried, and the check of one rank's output,
// input gradient and weight gradient against the definition (computed in
// double from the whole matrices, the same on every rank).
#ifndef TESSERA_TESTS_PARALLEL_MATMUL_CHECK_H_
#define TESSERA_TESTS_PARALLEL_MATMUL_CHECK_H_

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "runtime/parallel/parallel_ops.h"

namespace tessera::testing {

// Every shape of strategy on a (dp, tp) mesh: none, data parallel,
// Megatron's column and row (all-reduce and reduce-scatter), the inner
// dimension over dp, and the axes swapped.
inline const std::vector<std::string>& MatMulStrategies() {
  static const std::vector<std::string> all = {
      "((-,-),(-,-))",       "((dp,-),(-,-))",     "((dp,-),(-,tp))",  "((dp,tp),(tp,-))",
      "((dp,tp),(tp,-)):rs", "((-,tp),(tp,-))",    "((tp,dp),(dp,-))", "((-,dp),(dp,tp))",
      "((tp,-),(-,dp))",     "((-,tp),(tp,dp)):rs"};
  return all;
}

// The layouts x arrives in: as the strategy wants, replicated, and cut in
// ways that need a redistribution ("" = the strategy's own).
inline std::vector<std::vector<std::vector<std::string>>> MatMulInputCuts() {
  return {{}, {{}, {}}, {{"tp"}, {}}, {{}, {"dp"}}, {{"dp", "tp"}, {}}};
}

inline Layout CutMatrix(int64_t rows, int64_t cols,
                        const std::vector<std::vector<std::string>>& cut) {
  Layout layout = Layout::Replicated({rows, cols}, DType::kF32);
  if (!cut.empty() && (!cut[0].empty() || !cut[1].empty())) layout.dim_axes = cut;
  return layout;
}

struct MatMulData {
  int64_t M, K, N;
  std::vector<float> x, w, dy;
  std::vector<float> y, dx, dw;  // the definition
};

inline MatMulData MakeMatMulData(int64_t M, int64_t K, int64_t N, uint64_t seed) {
  MatMulData d{M, K, N, {}, {}, {}, {}, {}, {}};
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto [v, n] : {std::pair{&d.x, M * K}, {&d.w, K * N}, {&d.dy, M * N}}) {
    v->resize(n);
    for (float& f : *v) f = u(rng);
  }
  auto product = [](const float* a, bool at, const float* b, bool bt, int64_t m, int64_t k,
                    int64_t n, int64_t lda, int64_t ldb) {
    std::vector<float> out(m * n);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t l = 0; l < k; ++l) {
          s += static_cast<double>(at ? a[l * lda + i] : a[i * lda + l]) *
               (bt ? b[j * ldb + l] : b[l * ldb + j]);
        }
        out[i * n + j] = static_cast<float>(s);
      }
    }
    return out;
  };
  d.y = product(d.x.data(), false, d.w.data(), false, M, K, N, K, N);   // x w
  d.dx = product(d.dy.data(), false, d.w.data(), true, M, N, K, N, N);  // dy w^T
  d.dw = product(d.x.data(), true, d.dy.data(), false, K, M, N, K, N);  // x^T dy
  return d;
}

// Collective: runs the strategy with x arriving cut `x_cut` and dy in
// `dy_cut` ({} = the strategy's own layouts) and compares this rank's
// results with the definition's boxes.
inline Status CheckMatMul(const MeshCommunicators& comms, const MatMulData& d,
                          const std::string& strategy_text,
                          const std::vector<std::vector<std::string>>& x_cut,
                          const std::vector<std::vector<std::string>>& dy_cut) {
  const Mesh& mesh = comms.mesh();
  const int64_t rank = comms.world().rank();
  ASSIGN_OR_RETURN(MatMulStrategy strategy, MatMulStrategy::Parse(strategy_text));
  ASSIGN_OR_RETURN(ParallelMatMul op, ParallelMatMul::Create(comms, strategy, d.M, d.K, d.N));
  const Layout x_layout = x_cut.empty() ? op.x_layout() : CutMatrix(d.M, d.K, x_cut);
  const Layout dy_layout = dy_cut.empty() ? op.y_layout() : CutMatrix(d.M, d.N, dy_cut);
  const std::string where = strategy_text + " x " + ToString(x_layout) + " dy " +
                            ToString(dy_layout) + " rank " + std::to_string(rank);
  ASSIGN_OR_RETURN(DTensor x, DTensor::FromFull(mesh, x_layout, d.x.data(), rank));
  ASSIGN_OR_RETURN(DTensor dy, DTensor::FromFull(mesh, dy_layout, d.dy.data(), rank));
  ASSIGN_OR_RETURN(DTensor w, DTensor::FromFull(mesh, op.w_layout(), d.w.data(), rank));
  const float* wl = reinterpret_cast<const float*>(w.local().data());
  auto same = [&](const char* what, const std::vector<char>& got, const Layout& layout,
                  const std::vector<float>& full) -> Status {
    ASSIGN_OR_RETURN(DTensor want, DTensor::FromFull(mesh, layout, full.data(), rank));
    if (got.size() != want.local().size()) {
      return InternalError(where + ": " + what + " has " + std::to_string(got.size()) +
                           " bytes, the layout " + std::to_string(want.local().size()));
    }
    const float* g = reinterpret_cast<const float*>(got.data());
    const float* e = reinterpret_cast<const float*>(want.local().data());
    for (size_t i = 0; i < got.size() / 4; ++i) {
      if (std::fabs(g[i] - e[i]) > 1e-5f * (4.0f + std::fabs(e[i]))) {
        return InternalError(where + ": " + what + "[" + std::to_string(i) + "] " +
                             std::to_string(g[i]) + " vs " + std::to_string(e[i]));
      }
    }
    return Status::Ok();
  };
  const bool redistributes = !(x_cut.empty());
  DTensor y;
  RETURN_IF_ERROR(op.Forward(x, wl, &y));
  if (!redistributes && op.stats().redistributed_bytes != 0) {
    return InternalError(where + ": x in the strategy's layout was redistributed");
  }
  const bool partial = !strategy.x_cols.empty();
  // Column and data-parallel strategies need no communication forward.
  if (!partial && op.stats().reduced_bytes != 0) {
    return InternalError(where + ": forward reduced " + std::to_string(op.stats().reduced_bytes) +
                         " bytes");
  }
  if (y.layout() != op.y_layout()) return InternalError(where + ": y is " + ToString(y.layout()));
  RETURN_IF_ERROR(same("y", y.local(), op.y_layout(), d.y));
  DTensor dx;
  std::vector<float> dw(w.local().size() / 4, 0.5f);  // accumulated into
  RETURN_IF_ERROR(op.Backward(x, wl, dy, &dx, dw.data()));
  if (dx.layout() != x_layout) return InternalError(where + ": dx is " + ToString(dx.layout()));
  RETURN_IF_ERROR(same("dx", dx.local(), x_layout, d.dx));
  std::vector<float> dw_plus(d.dw);
  for (float& f : dw_plus) f += 0.5f;
  std::vector<char> dw_bytes(dw.size() * 4);
  if (!dw.empty()) std::memcpy(dw_bytes.data(), dw.data(), dw_bytes.size());
  return same("dw", dw_bytes, op.w_layout(), dw_plus);
}

// Every strategy with every input layout (dy in the strategy's own and
// replicated); returns the first failure.
inline Status CheckAllMatMuls(const MeshCommunicators& comms, const MatMulData& d) {
  for (const std::string& s : MatMulStrategies()) {
    for (const auto& x_cut : MatMulInputCuts()) {
      for (const auto& dy_cut : {std::vector<std::vector<std::string>>{},
                                 std::vector<std::vector<std::string>>{{}, {}}}) {
        RETURN_IF_ERROR(CheckMatMul(comms, d, s, x_cut, dy_cut));
      }
    }
  }
  return Status::Ok();
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_PARALLEL_MATMUL_CHECK_H_
