// Training data: a byte-level tokenizer (each byte is a token, vocabulary
// 256) and a loader that serves [B, T] batches of inputs with next-token
// targets from a token stream, in an order shuffled per epoch from a seed,
// with a position that a checkpoint records and a resumed run restores.
#ifndef TESSERA_RUNTIME_DATA_H_
#define TESSERA_RUNTIME_DATA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/status.h"

namespace tessera {

inline constexpr int kByteVocab = 256;

// The bytes of the file at `path` as tokens.
Result<std::vector<int32_t>> TokenizeBytesFile(Env* env, const std::string& path);

// Where the loader is: epoch and the next window within the epoch's order.
struct DataPosition {
  int64_t epoch = 0;
  int64_t index = 0;
  std::string ToString() const;  // "epoch:index"
  static Result<DataPosition> Parse(const std::string& text);
};

class TokenLoader {
 public:
  // Windows of T+1 tokens start every T tokens; each epoch visits them in a
  // permutation drawn from (seed, epoch). Needs at least B windows.
  static Result<TokenLoader> Create(std::vector<int32_t> tokens, int B, int T, uint64_t seed);

  // inputs, targets: [B, T].
  void NextBatch(int32_t* inputs, int32_t* targets);
  const DataPosition& position() const { return position_; }
  Status Restore(const DataPosition& position);
  int64_t windows() const { return windows_; }

 private:
  void Shuffle();
  std::vector<int32_t> tokens_;
  int B_ = 0, T_ = 0;
  uint64_t seed_ = 0;
  int64_t windows_ = 0;
  std::vector<int64_t> order_;
  DataPosition position_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_DATA_H_
