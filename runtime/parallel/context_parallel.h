// Context parallelism (the `cp` mesh axis): every activation's sequence cut
// over cp ranks, attention the only operator that needs the others'
// positions. Two algorithms (MindFormers' context_parallel_algo, Megatron's
// cp_comm_type):
//   - ulysses (DeepSpeed-Ulysses, a2a): an all-to-all turns the sequence
//     cut into a cut by heads, attention runs on whole sequences of 1/cp of
//     the heads, a second all-to-all turns it back. Each rank holds the
//     contiguous chunk `rank` of cp equal chunks.
//   - ring (ring attention, p2p): each rank keeps its queries and passes its
//     keys and values round the ring of cp ranks, one block per step, with
//     non-blocking sends while the block in hand computes; an online softmax
//     (running max and sum) folds the blocks. The zigzag split balances the
//     causal work: of 2 cp equal chunks, rank r holds chunks r and
//     2 cp - 1 - r (Megatron's load balancing), so every rank computes the
//     same number of scores.
// Header-only: the data loader (each rank reads its own positions) and the
// cost model use it without the kernels.
#ifndef TESSERA_RUNTIME_PARALLEL_CONTEXT_PARALLEL_H_
#define TESSERA_RUNTIME_PARALLEL_CONTEXT_PARALLEL_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace tessera {

enum class CpAlgo { kUlysses, kRing };

inline std::string_view CpAlgoName(CpAlgo a) { return a == CpAlgo::kRing ? "ring" : "ulysses"; }
inline Result<CpAlgo> ParseCpAlgo(std::string_view s) {
  if (s == "ring") return CpAlgo::kRing;
  if (s == "ulysses") return CpAlgo::kUlysses;
  return InvalidArgumentError("cp_algo '" + std::string(s) + "': expected ulysses or ring");
}

// The positions of a sequence of T tokens that cp rank `rank` holds, in
// the order it holds them (its local rows of each sequence).
struct SequenceSplit {
  int64_t T = 1;
  int cp = 1, rank = 0;
  bool zigzag = false;  // ring's split; contiguous chunks otherwise

  static SequenceSplit Of(CpAlgo algo, int64_t T, int cp, int rank) {
    return {T, cp, rank, algo == CpAlgo::kRing && cp > 1};
  }
  // Positions per rank (T / cp).
  int64_t local() const { return T / cp; }
  // The chunks it holds: the zigzag's two, or one.
  int chunks() const { return zigzag ? 2 : 1; }
  int64_t chunk_size() const { return zigzag ? T / (2 * cp) : T / cp; }
  // The global index of the chunk that local chunk `c` is (of 2 cp or cp).
  int ChunkIndex(int c) const { return zigzag ? (c == 0 ? rank : 2 * cp - 1 - rank) : rank; }
  // The position of local row t.
  int64_t Position(int64_t t) const {
    const int64_t c = chunk_size();
    return ChunkIndex(static_cast<int>(t / c)) * c + t % c;
  }
  // Local rows [t, RunEnd(t)) hold consecutive positions.
  int64_t RunEnd(int64_t t) const { return (t / chunk_size() + 1) * chunk_size(); }
  // (first position, count) of each run, in local order.
  std::vector<std::pair<int64_t, int64_t>> Runs() const {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (int c = 0; c < chunks(); ++c) out.emplace_back(ChunkIndex(c) * chunk_size(), chunk_size());
    return out;
  }
};

// Whether `algo` can cut a sequence of T over cp ranks: ulysses needs
// T % cp = 0, ring T % (2 cp) = 0. The error names `op` and the sizes.
inline Status CheckSequenceCut(CpAlgo algo, int64_t T, int cp, const std::string& op) {
  const int64_t parts = algo == CpAlgo::kRing ? 2 * static_cast<int64_t>(cp) : cp;
  if (cp > 1 && T % parts != 0) {
    return InvalidArgumentError(
        "operator '" + op + "': cp " + std::to_string(cp) + " with cp_algo " +
        std::string(CpAlgoName(algo)) + " cuts a sequence into " + std::to_string(parts) +
        " equal chunks" + (algo == CpAlgo::kRing ? " (the zigzag: 2 x cp)" : "") + ", but T is " +
        std::to_string(T) + "; use a sequence length that is a multiple of " +
        std::to_string(parts));
  }
  return Status::Ok();
}

}  // namespace tessera

#endif  // TESSERA_RUNTIME_PARALLEL_CONTEXT_PARALLEL_H_
