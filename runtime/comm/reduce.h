// Element-wise reductions shared by the backends: the rank-order left fold
// the in-process backend (and deterministic MPI) computes, and the final
// divide of an average.
#ifndef TESSERA_RUNTIME_COMM_REDUCE_H_
#define TESSERA_RUNTIME_COMM_REDUCE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "runtime/comm/communicator.h"

namespace tessera {

// InvalidArgument when `op` is not defined on `dtype` (avg of bool).
Status CheckReduction(DType dtype, ReduceOp op);

// out[i] = fold(inputs[0][i], inputs[1][i], ...) left to right, for i in
// [0, count). `out` may be one of the inputs. f16/bf16 accumulate in f32 and
// round once; avg divides the sum by inputs.size() at the end.
void ReduceRankOrder(DType dtype, ReduceOp op, std::span<const void* const> inputs, void* out,
                     int64_t count);

// `blocks`: n blocks of `count` elements one after another, block i from
// rank i (what an alltoall of a reduce-scatter delivers); `out` = their
// ReduceRankOrder fold.
void FoldBlocks(const void* blocks, int n, int64_t count, DType dtype, ReduceOp op, void* out);

// Rank r's share of `count` elements cut over n ranks in order, as the
// rank-order allreduces (MPI's and Gloo's deterministic ones) cut them.
std::vector<int64_t> RankChunks(int64_t count, int n);

// out[i] = op(a[i], b[i]) for i in [0, n): one step of a reduction, for
// the libraries that reduce through a function of two buffers (Gloo's
// reduce functions, MPI's user ops) on the dtypes they lack. f16/bf16 go
// through f32, rounded at each step; bool: or / and. kAvg sums (the caller
// divides once at the end). `out` may be `a` or `b`.
using PairwiseReduceFn = void (*)(void* out, const void* a, const void* b, size_t n);
PairwiseReduceFn PairwiseReduce(DType dtype, ReduceOp op);

// buf[i] /= n, for a buffer that holds sums (the second half of an average
// computed as a sum by a library).
void DivideInPlace(DType dtype, void* buf, int64_t count, int n);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_COMM_REDUCE_H_
