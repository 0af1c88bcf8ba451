// Training data: token sources (a text file's bytes, or a pre-tokenized
// token file read on demand) and a loader that serves [B, T] batches of
// inputs with next-token targets, in an order shuffled per epoch from a
// seed, with a position that a checkpoint records and a resumed run
// restores.
//
// Token files use llm.c's layout, which its data scripts (and others that
// copied them) write: a header of 256 little-endian int32 — magic 20240520,
// version (1: uint16 tokens, 2: uint32 tokens), token count — followed by
// the tokens, little-endian. Files are told apart by content: a file that
// starts with the magic and whose size matches its header is a token file;
// anything else is text, one token per byte.
#ifndef TESSERA_RUNTIME_TRAIN_DATA_H_
#define TESSERA_RUNTIME_TRAIN_DATA_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/env.h"
#include "core/status.h"

namespace tessera {

inline constexpr int kByteVocab = 256;
inline constexpr int32_t kTokenFileMagic = 20240520;
inline constexpr int64_t kTokenFileHeaderBytes = 256 * 4;

// A sequence of tokens that can be read in ranges, from several threads at
// once.
class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual int64_t size() const = 0;
  // Tokens [begin, begin + n) into out; an error names the file at fault.
  virtual Status Read(int64_t begin, int64_t n, int32_t* out) const = 0;
  // Where the tokens come from ("token file 'x.bin' (uint16)", ...).
  virtual std::string Describe() const = 0;
  // Bytes Read has taken from the file (0 for tokens in memory).
  virtual int64_t bytes_read() const { return 0; }
};

std::unique_ptr<TokenSource> MemoryTokens(std::vector<int32_t> tokens, std::string description);
// A token file, validated (magic, version, size against the header's count)
// and then read window by window: memory stays flat in the file's size.
Result<std::unique_ptr<TokenSource>> OpenTokenFile(Env* env, const std::string& path);
// A token file if `path` holds one, else its bytes as tokens (kByteVocab).
Result<std::unique_ptr<TokenSource>> OpenTokens(Env* env, const std::string& path);

// Writes `tokens` as a token file, atomically: uint16 when every token is
// below 65536 (version 1), else uint32 (version 2). Tokens must be >= 0.
Status WriteTokenFile(Env* env, const std::string& path, std::span<const int32_t> tokens);

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
  static Result<TokenLoader> Create(std::shared_ptr<const TokenSource> source, int B, int T,
                                    uint64_t seed);
  static Result<TokenLoader> Create(std::vector<int32_t> tokens, int B, int T, uint64_t seed);

  // inputs, targets: [B, T].
  Status NextBatch(int32_t* inputs, int32_t* targets);
  // Rows [first, first + rows) of the next batch only ([rows, T] each): a
  // data-parallel replica reads its own rows. The position moves past the
  // whole batch, as on every other rank.
  Status NextBatchRows(int first, int rows, int32_t* inputs, int32_t* targets);
  // Of those rows, only the positions `runs` lists ((first position,
  // count) pairs, a context-parallel rank's: SequenceSplit::Runs), each
  // row's runs one after another ([rows, sum of counts] each): a rank
  // reads its own share of the token file and nothing else.
  Status NextBatchShare(int first, int rows, const std::vector<std::pair<int64_t, int64_t>>& runs,
                        int32_t* inputs, int32_t* targets);
  const DataPosition& position() const { return position_; }
  Status Restore(const DataPosition& position);
  int64_t windows() const { return windows_; }
  // Bytes read from the token file so far (TokenSource::bytes_read).
  int64_t bytes_read() const { return source_->bytes_read(); }

 private:
  void Shuffle();
  std::shared_ptr<const TokenSource> source_;
  int B_ = 0, T_ = 0;
  uint64_t seed_ = 0;
  int64_t windows_ = 0;
  std::vector<int64_t> order_;
  std::vector<int32_t> window_;
  DataPosition position_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_TRAIN_DATA_H_
