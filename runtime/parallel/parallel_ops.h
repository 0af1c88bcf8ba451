// Operators with shard strategies (semi-automatic parallelism, after
// MindSpore's `shard` on primitives): an operator is given, for each input,
// the mesh axis cutting each of its dimensions; it derives the layout of
// its output and the communication that makes the result right, and
// redistributes an input that arrives in another layout.
//
// MatMul, y[M, N] = x[M, K] @ w[K, N], strategy ((a, b), (b, c)) in
// MindSpore's notation ("-" or "1": not cut):
//   - x rows cut over a (data parallel), x columns and w rows over b, w
//     columns over c;
//   - each rank multiplies its blocks. With b set the products are partial
//     sums over b: they are all-reduced over b (the output is replicated
//     over b), or reduce-scattered over b into rows (sequence parallel:
//     the output's rows are cut over a, then b);
//   - the output is [M, N] cut (a, c) (rows (a, b) after a reduce-scatter).
// Megatron's layers are two of these: a column-parallel linear is
// ((dp, -), (-, tp)) and a row-parallel one ((dp, tp), (tp, -)).
//
// Backward uses the dual communication of each forward step: the partial
// sums' all-reduce has an identity backward, a reduce-scatter an
// all-gather of the output gradient; x is used by every c column, so its
// gradient is all-reduced over c; w is used by every a row block, so its
// gradient is all-reduced over a (the data-parallel reduction). An input
// that forward redistributed gets its gradient redistributed back to the
// layout it came in.
#ifndef TESSERA_RUNTIME_PARALLEL_PARALLEL_OPS_H_
#define TESSERA_RUNTIME_PARALLEL_PARALLEL_OPS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "runtime/comm/mesh_comms.h"
#include "runtime/parallel/dtensor.h"
#include "transform/layout.h"

namespace tessera {

struct MatMulStrategy {
  // Mesh axes, "" for none: x is cut (x_rows, x_cols), w (x_cols, w_cols).
  std::string x_rows, x_cols, w_cols;
  // What becomes of the partial sums when x_cols is set.
  bool reduce_scatter = false;

  // "((dp,-),(-,tp))", "((dp,tp),(tp,1))"; a trailing ":rs" asks for the
  // reduce-scatter. The two inner dimensions must name the same axis.
  static Result<MatMulStrategy> Parse(std::string_view text);
  // An operator without a strategy runs data parallel: rows over `axis`
  // when the mesh has it, else nothing is cut.
  static MatMulStrategy DataParallel(const Mesh& mesh, const std::string& axis = "dp");
  std::string ToString() const;
};

struct ParallelOpStats {
  int64_t redistributed_bytes = 0;  // sent by Redistribute (inputs, gradients)
  int64_t reduced_bytes = 0;        // this rank's data in reductions and gathers
};

class ParallelMatMul {
 public:
  // Checks the strategy against the mesh (axes exist, none used twice)
  // and derives the layouts. `comms` must outlive the operator.
  static Result<ParallelMatMul> Create(const MeshCommunicators& comms,
                                       const MatMulStrategy& strategy, int64_t M, int64_t K,
                                       int64_t N);

  const MatMulStrategy& strategy() const { return strategy_; }
  // What the strategy needs of x, where w's shard lies, what y comes out as.
  const Layout& x_layout() const { return x_layout_; }
  const Layout& w_layout() const { return w_layout_; }
  const Layout& y_layout() const { return y_layout_; }
  // This rank's box of w (its shard is dense over the box's extents).
  const Box& w_box() const { return w_box_; }

  // Collective. x: [M, K] f32 in any layout on this mesh (redistributed to
  // x_layout() when it differs); w: this rank's shard. y is reset to
  // y_layout().
  Status Forward(const DTensor& x, const float* w, DTensor* y);
  // Collective, after Forward with the same x and w. dy: [M, N] in any
  // layout (redistributed to y_layout()). dx receives x's gradient in the
  // layout x had; dw (this rank's shard) is accumulated (+=), summed over
  // every rank that used the shard.
  Status Backward(const DTensor& x, const float* w, const DTensor& dy, DTensor* dx, float* dw);

  const ParallelOpStats& stats() const { return stats_; }

 private:
  ParallelMatMul() = default;
  // `t` in `layout`, redistributing into `*scratch` when it is not.
  Result<const DTensor*> In(const DTensor& t, const Layout& layout, DTensor* scratch);
  Status SumOver(const std::string& axis, float* data, int64_t n);

  const MeshCommunicators* comms_ = nullptr;
  MatMulStrategy strategy_;
  int64_t M_ = 0, K_ = 0, N_ = 0;
  Layout x_layout_, w_layout_, y_layout_;
  Box x_box_, w_box_, y_box_;
  int64_t rows_ = 0;  // this rank's rows of x (and of the partial product)
  // The row chunks of the partial product over x_cols (reduce-scatter).
  std::vector<int64_t> chunk_rows_;
  DTensor x_in_, dy_in_, dx_out_;
  bool x_redistributed_ = false;  // by the last Forward (into x_in_)
  bool forwarded_ = false;
  std::vector<float> partial_, send_, dy_rows_, dw_;
  ParallelOpStats stats_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_PARALLEL_PARALLEL_OPS_H_
