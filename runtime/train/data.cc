#include "runtime/train/data.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <charconv>
#include <cstring>
#include <numeric>

#include "core/random.h"

namespace tessera {
namespace {

static_assert(std::endian::native == std::endian::little, "token files are little-endian");

Status CheckRange(const TokenSource& source, int64_t begin, int64_t n) {
  if (begin >= 0 && n >= 0 && begin <= source.size() - n) return Status::Ok();
  return OutOfRangeError(source.Describe() + ": tokens [" + std::to_string(begin) + ", " +
                         std::to_string(begin + n) + ") of " + std::to_string(source.size()));
}

class MemorySource : public TokenSource {
 public:
  MemorySource(std::vector<int32_t> tokens, std::string description)
      : tokens_(std::move(tokens)), description_(std::move(description)) {}
  int64_t size() const override { return static_cast<int64_t>(tokens_.size()); }
  Status Read(int64_t begin, int64_t n, int32_t* out) const override {
    RETURN_IF_ERROR(CheckRange(*this, begin, n));
    std::copy_n(tokens_.data() + begin, n, out);
    return Status::Ok();
  }
  std::string Describe() const override { return description_; }

 private:
  std::vector<int32_t> tokens_;
  std::string description_;
};

class FileSource : public TokenSource {
 public:
  FileSource(std::unique_ptr<RandomAccessFile> file, std::string path, int width, int64_t count)
      : file_(std::move(file)), path_(std::move(path)), width_(width), count_(count) {}
  int64_t size() const override { return count_; }
  Status Read(int64_t begin, int64_t n, int32_t* out) const override {
    RETURN_IF_ERROR(CheckRange(*this, begin, n));
    const uint64_t offset = kTokenFileHeaderBytes + static_cast<uint64_t>(begin) * width_;
    bytes_read_.fetch_add(n * width_, std::memory_order_relaxed);
    if (width_ == 4) {
      RETURN_IF_ERROR(file_->Read(offset, n * 4, out));
      for (int64_t i = 0; i < n; ++i) {
        if (out[i] < 0) {  // a uint32 token beyond int32
          return DataLossError(Describe() + ": token " + std::to_string(begin + i) + " is " +
                               std::to_string(static_cast<uint32_t>(out[i])) +
                               ", beyond any vocabulary this runtime supports");
        }
      }
      return Status::Ok();
    }
    std::vector<uint16_t> narrow(n);  // per call: sources may be shared by threads
    RETURN_IF_ERROR(file_->Read(offset, n * 2, narrow.data()));
    std::copy_n(narrow.data(), n, out);
    return Status::Ok();
  }
  std::string Describe() const override {
    return "token file '" + path_ + "' (" + (width_ == 2 ? "uint16" : "uint32") + ")";
  }
  int64_t bytes_read() const override { return bytes_read_.load(std::memory_order_relaxed); }

 private:
  mutable std::atomic<int64_t> bytes_read_{0};
  std::unique_ptr<RandomAccessFile> file_;
  std::string path_;
  int width_;
  int64_t count_;
};

// The token width a header announces, 0 when the bytes are no token file
// header, or an error when they claim to be one and are inconsistent.
Result<int> TokenFileWidth(const std::string& path, const int32_t* header, uint64_t file_size) {
  if (header[0] != kTokenFileMagic) return 0;
  const int width = header[1] == 1 ? 2 : header[1] == 2 ? 4 : 0;
  if (width == 0) {
    return InvalidArgumentError("token file '" + path + "': unknown version " +
                                std::to_string(header[1]) + " (1: uint16, 2: uint32)");
  }
  const uint64_t count = static_cast<uint32_t>(header[2]);
  const uint64_t expected = kTokenFileHeaderBytes + count * width;
  if (header[2] < 0 || expected != file_size) {
    return DataLossError("token file '" + path + "': the header announces " +
                         std::to_string(header[2]) + " tokens (" + std::to_string(expected) +
                         " bytes) but the file has " + std::to_string(file_size) + " bytes");
  }
  return width;
}

}  // namespace

std::unique_ptr<TokenSource> MemoryTokens(std::vector<int32_t> tokens, std::string description) {
  return std::make_unique<MemorySource>(std::move(tokens), std::move(description));
}

Result<std::unique_ptr<TokenSource>> OpenTokenFile(Env* env, const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, env->NewRandomAccessFile(path));
  ASSIGN_OR_RETURN(uint64_t size, file->Size());
  int32_t header[256] = {};
  if (size < static_cast<uint64_t>(kTokenFileHeaderBytes)) {
    return DataLossError("token file '" + path + "' has " + std::to_string(size) +
                         " bytes: shorter than the 1024-byte header");
  }
  RETURN_IF_ERROR(file->Read(0, sizeof(header), header));
  ASSIGN_OR_RETURN(int width, TokenFileWidth(path, header, size));
  if (width == 0) {
    return InvalidArgumentError("'" + path + "' is not a token file: its first int32 is " +
                                std::to_string(header[0]) + ", not the magic " +
                                std::to_string(kTokenFileMagic));
  }
  return std::unique_ptr<TokenSource>(
      std::make_unique<FileSource>(std::move(file), path, width, header[2]));
}

Result<std::unique_ptr<TokenSource>> OpenTokens(Env* env, const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, env->NewRandomAccessFile(path));
  ASSIGN_OR_RETURN(uint64_t size, file->Size());
  if (size >= static_cast<uint64_t>(kTokenFileHeaderBytes)) {
    int32_t header[256];
    RETURN_IF_ERROR(file->Read(0, sizeof(header), header));
    if (header[0] == kTokenFileMagic) return OpenTokenFile(env, path);
  }
  ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(env, path));
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  return MemoryTokens(std::vector<int32_t>(b, b + bytes.size()), "text file '" + path + "'");
}

Status WriteTokenFile(Env* env, const std::string& path, std::span<const int32_t> tokens) {
  if (tokens.size() > static_cast<size_t>(INT32_MAX)) {
    return InvalidArgumentError("token file '" + path + "': " + std::to_string(tokens.size()) +
                                " tokens exceed the header's int32 count");
  }
  int32_t max_token = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0) {
      return InvalidArgumentError("token file '" + path + "': token " + std::to_string(i) +
                                  " is negative");
    }
    max_token = std::max(max_token, tokens[i]);
  }
  const bool narrow = max_token < 65536;
  int32_t header[256] = {kTokenFileMagic, narrow ? 1 : 2, static_cast<int32_t>(tokens.size())};
  std::string body;
  if (narrow) {
    std::vector<uint16_t> t(tokens.begin(), tokens.end());
    body.assign(reinterpret_cast<const char*>(t.data()), t.size() * 2);
  } else {
    body.assign(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 4);
  }
  const std::string_view parts[] = {{reinterpret_cast<const char*>(header), sizeof(header)}, body};
  return WriteFileAtomically(env, path, parts);
}

std::string DataPosition::ToString() const {
  return std::to_string(epoch) + ":" + std::to_string(index);
}

Result<DataPosition> DataPosition::Parse(const std::string& text) {
  DataPosition p;
  const size_t colon = text.find(':');
  const char* end = text.data() + text.size();
  if (colon == std::string::npos ||
      std::from_chars(text.data(), text.data() + colon, p.epoch).ptr != text.data() + colon ||
      std::from_chars(text.data() + colon + 1, end, p.index).ptr != end || p.epoch < 0 ||
      p.index < 0) {
    return InvalidArgumentError("data position '" + text + "' is not epoch:index");
  }
  return p;
}

Result<TokenLoader> TokenLoader::Create(std::shared_ptr<const TokenSource> source, int B, int T,
                                        uint64_t seed) {
  if (B < 1 || T < 1) return InvalidArgumentError("batch and sequence length must be >= 1");
  TokenLoader l;
  const int64_t n = source->size();
  l.windows_ = n > T ? (n - 1) / T : 0;
  if (l.windows_ < B) {
    return InvalidArgumentError(source->Describe() + " has " + std::to_string(n) +
                                " tokens: fewer than one batch of " + std::to_string(B) + " x " +
                                std::to_string(T + 1));
  }
  l.source_ = std::move(source);
  l.B_ = B;
  l.T_ = T;
  l.seed_ = seed;
  l.window_.resize(static_cast<size_t>(T) + 1);
  l.Shuffle();
  return l;
}

Result<TokenLoader> TokenLoader::Create(std::vector<int32_t> tokens, int B, int T, uint64_t seed) {
  return Create(MemoryTokens(std::move(tokens), "token list"), B, T, seed);
}

void TokenLoader::Shuffle() {
  order_.resize(windows_);
  std::iota(order_.begin(), order_.end(), 0);
  uint64_t state = seed_ * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(position_.epoch) + 1;
  for (int64_t i = windows_ - 1; i > 0; --i) {  // the same order on every platform
    std::swap(order_[i], order_[SplitMix64(state) % static_cast<uint64_t>(i + 1)]);
  }
}

Status TokenLoader::NextBatch(int32_t* inputs, int32_t* targets) {
  return NextBatchRows(0, B_, inputs, targets);
}

Status TokenLoader::NextBatchRows(int first, int rows, int32_t* inputs, int32_t* targets) {
  return NextBatchShare(first, rows, {{0, T_}}, inputs, targets);  // every position
}

Status TokenLoader::NextBatchShare(int first, int rows,
                                   const std::vector<std::pair<int64_t, int64_t>>& runs,
                                   int32_t* inputs, int32_t* targets) {
  if (first < 0 || rows < 0 || first + rows > B_) {
    return InvalidArgumentError("rows [" + std::to_string(first) + ", " +
                                std::to_string(first + rows) + ") are not inside a batch of " +
                                std::to_string(B_));
  }
  int64_t width = 0;
  for (const auto& [pos, n] : runs) {
    if (pos < 0 || n < 0 || pos + n > T_) {
      return InvalidArgumentError("positions [" + std::to_string(pos) + ", " +
                                  std::to_string(pos + n) + ") are not inside a sequence of " +
                                  std::to_string(T_));
    }
    width += n;
  }
  for (int b = 0; b < B_; ++b) {
    if (position_.index >= windows_) {
      ++position_.epoch;
      position_.index = 0;
      Shuffle();
    }
    const int64_t window = order_[position_.index++];
    if (b < first || b >= first + rows) continue;  // another replica's row
    int64_t at = (b - first) * width;
    for (const auto& [pos, n] : runs) {
      // Tokens pos .. pos + n of the window: n inputs, and their targets
      // one token on.
      RETURN_IF_ERROR(source_->Read(window * T_ + pos, n + 1, window_.data()));
      std::copy(window_.begin(), window_.begin() + n, inputs + at);
      std::copy(window_.begin() + 1, window_.begin() + n + 1, targets + at);
      at += n;
    }
  }
  return Status::Ok();
}

Status TokenLoader::Restore(const DataPosition& position) {
  if (position.index > windows_) {
    return InvalidArgumentError("data position " + position.ToString() + " is past the " +
                                std::to_string(windows_) + " windows of an epoch");
  }
  position_ = position;
  Shuffle();
  return Status::Ok();
}

}  // namespace tessera
