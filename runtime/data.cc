#include "runtime/data.h"

#include <charconv>
#include <numeric>

#include "core/random.h"

namespace tessera {

Result<std::vector<int32_t>> TokenizeBytesFile(Env* env, const std::string& path) {
  ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(env, path));
  return std::vector<int32_t>(reinterpret_cast<const unsigned char*>(bytes.data()),
                              reinterpret_cast<const unsigned char*>(bytes.data()) + bytes.size());
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

Result<TokenLoader> TokenLoader::Create(std::vector<int32_t> tokens, int B, int T, uint64_t seed) {
  if (B < 1 || T < 1) return InvalidArgumentError("batch and sequence length must be >= 1");
  TokenLoader l;
  l.windows_ = tokens.size() > static_cast<size_t>(T) ? (tokens.size() - 1) / T : 0;
  if (l.windows_ < B) {
    return InvalidArgumentError("the data has " + std::to_string(tokens.size()) +
                                " tokens: fewer than one batch of " + std::to_string(B) + " x " +
                                std::to_string(T + 1));
  }
  l.tokens_ = std::move(tokens);
  l.B_ = B;
  l.T_ = T;
  l.seed_ = seed;
  l.Shuffle();
  return l;
}

void TokenLoader::Shuffle() {
  order_.resize(windows_);
  std::iota(order_.begin(), order_.end(), 0);
  uint64_t state = seed_ * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(position_.epoch) + 1;
  for (int64_t i = windows_ - 1; i > 0; --i) {  // the same order on every platform
    std::swap(order_[i], order_[SplitMix64(state) % static_cast<uint64_t>(i + 1)]);
  }
}

void TokenLoader::NextBatch(int32_t* inputs, int32_t* targets) {
  for (int b = 0; b < B_; ++b) {
    if (position_.index >= windows_) {
      ++position_.epoch;
      position_.index = 0;
      Shuffle();
    }
    const int32_t* w = tokens_.data() + order_[position_.index++] * T_;
    std::copy(w, w + T_, inputs + b * T_);
    std::copy(w + 1, w + T_ + 1, targets + b * T_);
  }
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
